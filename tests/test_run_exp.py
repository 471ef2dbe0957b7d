"""run_exp.py end to end on the tests' tiny built-in corpus, as a user runs it: a subprocess per run.

The experiment is tests/data/tiny_liBRU.cfg (a 2 x 24 Li-BRU with dropout and batch norm, 3 chunks
per epoch); ``$MINI_TIMIT`` points it at the session's tiny corpus and ``$BRU_TEST_EXP`` at a
temporary experiment folder.
"""

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import kaldiio
import pytest
import torch

from data_io import read_transition_model

pytestmark = pytest.mark.slow  # runs run_exp.py end to end on the tiny corpus, many times

ROOT = Path(__file__).resolve().parents[1]
CFG = ROOT / "tests" / "data" / "tiny_liBRU.cfg"
NO_DECODE = "--forward,require_decoding=False"
SPLITS = ("train", "dev", "test")


def environment(corpus, exp_dir) -> dict:
    # One OpenMP thread: these models are tiny, and on a loaded machine (CI, other test processes)
    # OpenMP threads spinning against each other slowed a run from 10 s to 90 s.
    return dict(os.environ, MINI_TIMIT=str(corpus.root), BRU_TEST_EXP=str(exp_dir), PYTHONUNBUFFERED="1",
                OMP_NUM_THREADS="1")


def run(corpus, exp_dir, *arguments, config=CFG, expect=0, launcher=(), timeout=300) -> subprocess.CompletedProcess:
    command = [*launcher] if launcher else [sys.executable]
    # its own process group, so that a run that hangs is killed with every worker torchrun started
    process = subprocess.Popen([*command, "run_exp.py", str(config), *arguments], cwd=ROOT, env=environment(corpus, exp_dir),
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
        raise
    result = subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)
    assert result.returncode == expect, f"exit code {result.returncode}\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result


def weights(exp_dir) -> dict:
    return torch.load(Path(exp_dir) / "final.pt", map_location="cpu", weights_only=True)["model"]


def epoch_values(exp_dir) -> list[str]:
    """The res.res epoch lines without their timing."""
    return [re.sub(r" time=\S+", "", line) for line in (Path(exp_dir) / "res.res").read_text().splitlines()
            if line.startswith("epoch=")]


def test_end_to_end_train_forward_decode_score(tiny_corpus, tmp_path):
    exp_dir = tmp_path / "exp"
    result = run(tiny_corpus, exp_dir)

    res = (exp_dir / "res.res").read_text().splitlines()
    assert [line.split()[0] for line in res[:2]] == ["epoch=001", "epoch=002"]
    decoded = {line.split(":")[0]: line for line in res[2:]}
    assert set(decoded) == {"dev", "test"}
    for line in decoded.values():
        assert re.search(r"%WER \d+\.\d\d \[ \d+ / \d+, \d+ ins, \d+ del, \d+ sub \]", line), line
    # the scale is chosen on dev and applied unchanged to test
    scale = re.search(r"acwt=(\S+)", decoded["dev"]).group(1)
    assert f"acwt={scale}" in decoded["test"]
    assert "%WER" in result.stdout

    # one row of log-likelihoods per frame for every test utterance
    loglikes = kaldiio.load_scp(str(exp_dir / "forward_test" / "loglikes.scp"))
    frames = {line.split()[0]: int(line.split()[1]) for line in (tiny_corpus.data("test") / "utt2num_frames").read_text().splitlines()}
    assert {key: m.shape[0] for key, m in loglikes.items()} == frames
    assert {m.shape[1] for m in loglikes.values()} == {read_transition_model(tiny_corpus.model).num_pdfs}
    for name in ("learning_curve.png", "final.pt", "checkpoint.pt", "config.resolved.cfg", "log.txt", "pdf_counts"):
        assert (exp_dir / name).is_file(), name
    # where it ran, as compare.py reads it back
    from bru_kaldi.comparison.runs import read_run

    assert re.match(r".+, \d+ cores, 1 thread, torch \S+, device cpu$", read_run(exp_dir).machine), read_run(exp_dir).machine

    # a finished experiment is left alone, and says so
    before = (exp_dir / "final.pt").stat().st_mtime_ns
    again = run(tiny_corpus, exp_dir)
    assert "already finished" in again.stdout
    assert (exp_dir / "final.pt").stat().st_mtime_ns == before

    # forward-only: the trained model on new features without alignments, into another folder
    new_data = tmp_path / "new.cfg"
    text = CFG.read_text().replace("$BRU_TEST_EXP", str(tmp_path / "forward_only"))
    text = re.sub(r"(\[dataset3\].*?)lab = .*?\n\n", r"\1\n", text, flags=re.S)  # the test set without labels
    new_data.write_text(text)
    run(tiny_corpus, exp_dir, "--forward-only", "--model", str(exp_dir), NO_DECODE, "--data_use,forward_with=test",
        config=new_data)
    assert kaldiio.load_scp(str(tmp_path / "forward_only" / "forward_test" / "loglikes.scp")).keys() == loglikes.keys()


@pytest.mark.parametrize("objective", ["ce", "lfmmi"])
def test_sigkill_mid_training_then_resume_gives_identical_weights(objective, tiny_corpus, tmp_path):
    options = (NO_DECODE, "--exp,n_epochs_tr=4", f"--model,objective={objective}")
    run(tiny_corpus, tmp_path / "uninterrupted", *options)

    killed = tmp_path / "killed"
    process = subprocess.Popen([sys.executable, "run_exp.py", str(CFG), *options], cwd=ROOT,
                               env=environment(tiny_corpus, killed), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while process.poll() is None and time.time() < deadline:  # until a chunk past the initial weights is saved
        if (killed / "checkpoint.pt").is_file():
            try:
                progress = torch.load(killed / "checkpoint.pt", weights_only=True)["progress"]
            except Exception:  # replaced while read
                continue
            if progress["chunk"] or progress["epoch"]:
                break
        time.sleep(0.01)
    process.send_signal(signal.SIGKILL)
    process.wait()
    progress = torch.load(killed / "checkpoint.pt", weights_only=True)["progress"]
    assert (progress["epoch"], progress["chunk"]) < (4, 0), "the run was not killed in the middle of training"
    assert not (killed / "final.pt").exists()

    resumed = run(tiny_corpus, killed, *options)
    assert "resuming from" in resumed.stdout
    uninterrupted, after_crash = weights(tmp_path / "uninterrupted"), weights(killed)
    assert uninterrupted.keys() == after_crash.keys()
    for name in uninterrupted:
        assert torch.equal(uninterrupted[name], after_crash[name]), name
    assert epoch_values(killed) == epoch_values(tmp_path / "uninterrupted")


@pytest.mark.parametrize("objective", ["ce", "lfmmi"])
def test_distributed_two_processes_match_one(objective, tiny_corpus, tmp_path):
    """torchrun, gloo, 2 processes on the CPU against one process on the same global batches, with either
    objective (LF-MMI: each process's utterances through the denominator, the sums reduced as for CE).

    Without dropout and batch norm the two compute the same gradients up to float summation order:
    losses agree to 1e-4 (relative) and the weights after 2 epochs to 1e-3.
    """
    options = (NO_DECODE, "--architecture1,dropout=0.0", "--architecture1,norm=none", f"--model,objective={objective}")
    run(tiny_corpus, tmp_path / "single", *options)
    launcher = (sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2")
    run(tiny_corpus, tmp_path / "ddp", *options, launcher=launcher)
    single, ddp = weights(tmp_path / "single"), weights(tmp_path / "ddp")
    for name in single:
        assert torch.allclose(single[name], ddp[name], atol=1e-3, rtol=0), name
    for a, b in zip(epoch_values(tmp_path / "single"), epoch_values(tmp_path / "ddp")):
        values_a = [float(v) for v in re.findall(r"loss=(\S+)", a)]
        values_b = [float(v) for v in re.findall(r"loss=(\S+)", b)]
        assert values_a == pytest.approx(values_b, rel=1e-4)


@pytest.mark.parametrize("override, message", [
    ("--architecture1,unit=lbru2", "did you mean 'lbru'"),
    ("--batches,batch_size_trian=3", "did you mean 'batch_size_train'"),
    ("--dataset1,n_chunks=zero", "expected an integer"),
])
def test_bad_config_exits_non_zero_naming_the_option(tiny_corpus, tmp_path, override, message):
    result = run(tiny_corpus, tmp_path / "exp", override, expect=1)
    assert message in result.stderr


def test_missing_features_name_the_file(tiny_corpus, tmp_path):
    result = run(tiny_corpus, tmp_path / "exp", NO_DECODE, "--exp,n_epochs_tr=1",
                 f"--dataset2,fea=fea_name=fbank\n fea_lst={tmp_path}/nowhere/feats.scp", expect=1)
    assert f"{tmp_path}/nowhere/feats.scp" in result.stderr


def test_changed_config_is_refused_on_resume(tiny_corpus, tmp_path):
    run(tiny_corpus, tmp_path / "exp", NO_DECODE, "--exp,n_epochs_tr=1")
    result = run(tiny_corpus, tmp_path / "exp", NO_DECODE, "--exp,n_epochs_tr=1", "--architecture1,sizes=16,16", expect=1)
    assert "[architecture1] sizes: '24,24' -> '16,16'" in result.stderr
    forced = run(tiny_corpus, tmp_path / "exp", NO_DECODE, "--exp,n_epochs_tr=1", "--architecture1,sizes=16,16", "--force")
    assert "already finished" not in forced.stdout
    assert weights(tmp_path / "exp")["senone.weight"].shape[1] == 16


def test_decode_only_changes_redo_the_decode_not_the_training(tiny_corpus, tmp_path):
    """Beams, scales, the graph or the references changed on a finished folder: decoded again, not refused."""
    import shutil

    exp_dir = tmp_path / "exp"
    run(tiny_corpus, exp_dir, "--exp,n_epochs_tr=1", "--decoding,acwt_sweep=0.1,0.2")
    trained = (exp_dir / "final.pt").read_bytes()
    again = run(tiny_corpus, exp_dir, "--exp,n_epochs_tr=1", "--decoding,acwt_sweep=0.7")
    assert "decode stale: running it again" in again.stdout and "acwt=0.7" in (exp_dir / "res.res").read_text()
    graph = tmp_path / "graph_copy"
    shutil.copytree(tiny_corpus.graph, graph)
    moved = run(tiny_corpus, exp_dir, "--exp,n_epochs_tr=1", "--decoding,acwt_sweep=0.7",
                *(f"--dataset{i},lab=lab_name=lab_cd\n lab_folder={tiny_corpus.ali(s)}\n lab_opts=ali-to-pdf\n"
                  f" lab_data_folder={tiny_corpus.data(s)}\n lab_graph={graph}" for i, s in enumerate(SPLITS, 1)))
    assert "decode stale: running it again" in moved.stdout and "already finished" not in moved.stdout
    assert (exp_dir / "final.pt").read_bytes() == trained  # never trained again
    assert "resuming" not in again.stdout + moved.stdout

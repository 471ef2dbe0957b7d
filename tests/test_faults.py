"""Faults a long run meets on a shared machine, and that nothing is lost to them: two runs on one folder,
SIGTERM, a full disk, a damaged or planted checkpoint, a kill between a checkpoint and res.res, and
training data that changed under a derived file. Each run is run_exp.py in a subprocess, as a user runs
it, on the tests' tiny built-in corpus."""

import os
import pickle
import re
import resource
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from bru_kaldi.experiment import Experiment
from tests.test_run_exp import CFG, NO_DECODE, ROOT, environment, run, weights

pytestmark = pytest.mark.slow  # kills and resumes whole runs

TRAIN_ONLY = ("--stop-stage", "train")


def start(corpus, exp_dir, *arguments, limit_bytes=None) -> subprocess.Popen:
    """run_exp.py in the background; ``limit_bytes``: a file-size limit for it (as a full disk would)."""
    def limit():
        if limit_bytes:
            resource.setrlimit(resource.RLIMIT_FSIZE, (limit_bytes, limit_bytes))

    return subprocess.Popen([sys.executable, "run_exp.py", str(CFG), *arguments], cwd=ROOT,
                            env=environment(corpus, exp_dir), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=limit)


def test_a_second_run_on_a_folder_in_use_is_refused_and_a_dead_runs_lock_is_free(tiny_corpus, tmp_path):
    exp_dir = tmp_path / "exp"
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; sys.path.insert(0, sys.argv[1]); "
         "from bru_kaldi.experiment import Experiment\nwith Experiment(sys.argv[2]).lock():\n"
         "    print('locked', flush=True); time.sleep(60)", str(ROOT), str(exp_dir)], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "locked"
    refused = run(tiny_corpus, exp_dir, *TRAIN_ONLY, expect=1)
    assert f"is in use by process {holder.pid}" in refused.stderr and "another [exp] out_folder" in refused.stderr
    assert not (exp_dir / "checkpoint.pt").exists()
    os.kill(holder.pid, signal.SIGKILL)  # a run killed while holding the folder never leaves it locked
    holder.wait()
    run(tiny_corpus, exp_dir, *TRAIN_ONLY, "--exp,n_epochs_tr=1")
    assert (exp_dir / ".done" / "train").exists()


def test_sigterm_stops_cleanly_and_the_run_resumes_to_the_same_weights(tiny_corpus, tmp_path):
    reference = tmp_path / "uninterrupted"
    run(tiny_corpus, reference, *TRAIN_ONLY)
    exp_dir = tmp_path / "exp"
    process = start(tiny_corpus, exp_dir, *TRAIN_ONLY)
    deadline = time.time() + 120
    while time.time() < deadline and process.poll() is None:  # until a chunk of epoch 1 is checkpointed
        log = exp_dir / "log.txt"
        if log.is_file() and (exp_dir / "checkpoint.pt").is_file() and "model:" in log.read_text():
            try:
                progress = torch.load(exp_dir / "checkpoint.pt", weights_only=True)["progress"]
            except Exception:  # being replaced right now
                continue
            if progress["chunk"] >= 1 or progress["epoch"] >= 1:
                break
        time.sleep(0.05)
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 128 + signal.SIGTERM, stderr
    assert "stopped by SIGTERM" in stderr and "run the same command again" in stderr
    assert not list(exp_dir.glob(".*.tmp.*")), "a temporary file was left behind"
    run(tiny_corpus, exp_dir, *TRAIN_ONLY)
    expected, got = weights(reference), weights(exp_dir)
    assert all(torch.equal(expected[k], got[k]) for k in expected)


def test_disk_full_keeps_the_previous_files_names_the_file_and_resumes(tiny_corpus, tmp_path):
    exp_dir = tmp_path / "exp"
    # Layers of 64 units: the initial checkpoint (~200 kB) and the copy of final.mdl (~130 kB) fit under
    # a 300 kB limit, a checkpoint with the optimiser's state (~600 kB) does not.
    wider = "--architecture1,sizes=64,64"
    full = start(tiny_corpus, exp_dir, NO_DECODE, wider, limit_bytes=300_000)
    _, stderr = full.communicate(timeout=120)
    assert full.returncode == 1, stderr
    assert "cannot write" in stderr and "checkpoint.pt" in stderr and "no room left" in stderr, stderr
    assert torch.load(exp_dir / "checkpoint.pt", weights_only=True)["progress"]["chunk"] == 0  # the previous one, whole
    assert not list(exp_dir.glob(".*.tmp.*")), "a temporary file was left behind"
    # room for training, not for the log-likelihood archives (~1.1 MB): the trained files stay as they were
    full = start(tiny_corpus, exp_dir, NO_DECODE, wider, limit_bytes=800_000)
    _, stderr = full.communicate(timeout=300)
    assert full.returncode == 1 and "loglikes.ark" in stderr and "no room left" in stderr, stderr
    kept = {name: (exp_dir / name).read_bytes() for name in ("checkpoint.pt", "final.pt")}
    assert not list((exp_dir / "forward_dev").glob("*")), "a truncated archive was left behind"
    # space freed: the same command finishes from where it stopped, with the weights of a run never stopped
    resumed = run(tiny_corpus, exp_dir, NO_DECODE, wider)
    assert "has already finished" not in resumed.stdout
    assert {name: (exp_dir / name).read_bytes() for name in kept} == kept
    assert (exp_dir / "forward_test" / "loglikes.scp").is_file()
    reference = tmp_path / "never_stopped"
    run(tiny_corpus, reference, *TRAIN_ONLY, wider)
    expected, got = weights(reference), weights(exp_dir)
    assert all(torch.equal(expected[k], got[k]) for k in expected)


class _Planted:
    """What a pickle planted in an experiment folder would run, if it were ever unpickled."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def test_a_damaged_or_planted_checkpoint_is_named_and_never_executed(tiny_corpus, tmp_path):
    exp_dir = tmp_path / "exp"
    run(tiny_corpus, exp_dir, *TRAIN_ONLY, "--exp,n_epochs_tr=1")
    checkpoint = exp_dir / "checkpoint.pt"
    (exp_dir / ".done" / "train").unlink()  # as if the run had been killed before its end

    data = checkpoint.read_bytes()
    checkpoint.write_bytes(data[: len(data) // 2])  # damaged
    damaged = run(tiny_corpus, exp_dir, *TRAIN_ONLY, "--exp,n_epochs_tr=1", expect=1)
    assert f"{checkpoint} cannot be read as a checkpoint" in damaged.stderr and "--force" in damaged.stderr

    marker = tmp_path / "the_pickle_ran"
    with open(checkpoint, "wb") as f:  # planted: a pickle that would create a file
        pickle.dump({"model": _Planted(marker), "progress": {}}, f)
    planted = run(tiny_corpus, exp_dir, *TRAIN_ONLY, "--exp,n_epochs_tr=1", expect=1)
    assert "cannot be read as a checkpoint" in planted.stderr
    assert not marker.exists(), "a pickle in the experiment folder was executed"


def test_a_kill_between_the_checkpoint_and_res_res_loses_no_epoch_line(tiny_corpus, tmp_path):
    exp_dir = tmp_path / "exp"
    run(tiny_corpus, exp_dir, *TRAIN_ONLY)
    lines = (exp_dir / "res.res").read_text().splitlines()
    assert len(lines) == 2
    (exp_dir / "res.res").write_text(lines[0] + "\n")  # the epoch-2 checkpoint was written, res.res was not
    for stale in (exp_dir / ".done" / "train", exp_dir / "final.pt"):
        stale.unlink()
    run(tiny_corpus, exp_dir, *TRAIN_ONLY)
    assert (exp_dir / "res.res").read_text().splitlines() == lines


def test_derived_files_are_redone_when_their_training_data_changed(tiny_corpus, tmp_path):
    corpus = tmp_path / "corpus"
    shutil.copytree(tiny_corpus.root, corpus, symlinks=True)
    copy = type(tiny_corpus)(corpus)
    exp_dir = tmp_path / "exp"
    run(copy, exp_dir, *TRAIN_ONLY, "--exp,n_epochs_tr=1")
    before = (exp_dir / "feature_norm.npz").read_bytes()
    # killed right after the derived files, before any training; then the training list changes
    shutil.rmtree(exp_dir / ".done")
    for path in (exp_dir / "checkpoint.pt", exp_dir / "final.pt", exp_dir / "res.res"):
        path.unlink()
    cmvn = corpus / "data" / "train" / "cmvn.scp"

    def swap_two_speakers():  # their CMVN statistics trade places: the same keys, other features
        lines = cmvn.read_text().splitlines()
        (k0, v0), (k1, v1) = (line.split(" ", 1) for line in lines[:2])
        cmvn.write_text("\n".join([f"{k0} {v1}", f"{k1} {v0}", *lines[2:]]) + "\n")

    swap_two_speakers()
    redone = run(copy, exp_dir, *TRAIN_ONLY, "--exp,n_epochs_tr=1")
    assert "computed from other training data" in redone.stdout
    assert (exp_dir / "feature_norm.npz").read_bytes() != before
    # once training has used them, changed data is refused rather than mixed in
    (exp_dir / ".done" / "train").unlink()
    swap_two_speakers()  # back: another change all the same
    refused = run(copy, exp_dir, *TRAIN_ONLY, "--exp,n_epochs_tr=1", expect=1)
    assert "the training data changed since this experiment started" in refused.stderr
    assert Experiment(exp_dir).derived_from("anything") is False


def test_the_training_norm_is_kept_recomputed_or_refused_as_its_data_and_the_training_say(tmp_path):
    """Experiment.training_norm alone: computed when there is none; kept when computed from these inputs;
    computed again when the inputs changed before training began; refused once training has begun; kept
    in a folder older than the record (no derived.json) whose training has begun."""
    import numpy as np
    import torch

    from bru_kaldi.config import ConfigError
    from bru_kaldi.feature_transforms import GlobalNorm

    exp = Experiment(tmp_path / "exp")
    exp.folder.mkdir()
    norms = iter(GlobalNorm(np.full(2, v, np.float32), np.ones(2, np.float32)) for v in (1.0, 2.0, 3.0))
    calls = []

    def compute():
        calls.append(1)
        return next(norms)

    norm, current = exp.training_norm("v1", compute)
    assert (current, norm.mean[0], len(calls)) == (False, 1.0, 1) and exp.norm.is_file()
    exp.record_derived("v1")
    norm, current = exp.training_norm("v1", compute)
    assert (current, norm.mean[0], len(calls)) == (True, 1.0, 1)  # loaded from the folder, not computed
    norm, current = exp.training_norm("v2", compute)  # the data changed before any training: computed again
    assert (current, norm.mean[0], GlobalNorm.load(exp.norm).mean[0]) == (False, 2.0, 2.0)
    exp.record_derived("v2")
    torch.save({"progress": {"epoch": 1, "chunk": 0}}, exp.checkpoint)  # training has begun
    with pytest.raises(ConfigError, match="the training data changed since this experiment started"):
        exp.training_norm("v3", compute)
    exp.derived.unlink()  # a folder from before the record: its files are kept as they are
    norm, current = exp.training_norm("v3", compute)
    assert (current, norm.mean[0], len(calls)) == (True, 2.0, 2)


def _when(point: str, exp_dir: Path, corpus_root: Path):
    """A test for the moment to kill a run at ``point``: a file that exists only while it is there."""
    return {
        "writing a checkpoint": lambda: any(exp_dir.glob(".checkpoint.pt.tmp.*")),
        "writing log-likelihoods": lambda: any((exp_dir / "forward_dev").glob(".loglikes.ark.tmp.*")),
        "decoding": lambda: (exp_dir / "decode_dev" / "scoring").is_dir(),
        "building the corpus": lambda: (corpus_root / "data" / "wav").is_dir(),
    }[point]


@pytest.mark.parametrize("point", ["writing a checkpoint", "writing log-likelihoods", "decoding", "building the corpus"])
def test_kill_at_a_point_then_the_same_command_gives_the_uninterrupted_result(point, tiny_corpus, tmp_path):
    """SIGKILL at each point where a run writes something lasting, then the same command: the result is
    that of a run never killed, and no truncated file is ever taken as complete."""
    corpus = tiny_corpus
    if point == "building the corpus":  # the run builds its own (tiny) corpus, and is killed doing it
        from recipes.mini_timit.corpus import Corpus

        corpus = Corpus(tmp_path / "corpus")  # $MINI_TIMIT: the run builds the tiny size in corpus/tiny
    reference = tmp_path / "reference"
    arguments = ["--exp,builtin_corpus=tiny", f"--exp,builtin_corpus_dir={corpus.root}"] if corpus is not tiny_corpus else []
    run(tiny_corpus, reference)  # the uninterrupted run, on the session's corpus (the same bytes as a rebuild)
    exp_dir = tmp_path / "exp"
    env = environment(corpus, exp_dir)
    process = subprocess.Popen([sys.executable, "run_exp.py", str(CFG), *arguments], cwd=ROOT, env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    built = corpus.root / "tiny" if corpus is not tiny_corpus else corpus.root
    happening, deadline = _when(point, exp_dir, built), time.time() + 240
    while process.poll() is None and not happening() and time.time() < deadline:
        time.sleep(0.002)
    assert process.poll() is None, f"the run ended before {point}"
    os.killpg(process.pid, signal.SIGKILL)  # the run and whatever it started (decoding workers, stages)
    process.wait()
    run(corpus, exp_dir, *arguments)
    expected, got = weights(reference), weights(exp_dir)
    assert all(torch.equal(expected[k], got[k]) for k in expected)
    def results(folder):  # the error lines, without the decoding speed
        return [re.sub(r" rtf=\S+", "", line) for line in (folder / "res.res").read_text().splitlines() if ": %WER" in line]

    assert results(exp_dir) == results(reference) and len(results(reference)) == 2
    assert not list(exp_dir.rglob(".*.tmp.*")), "a temporary file was left behind"


def test_sigterm_while_decoding_stops_at_once_and_the_decode_is_done_again(tiny_corpus, tmp_path):
    """Decoding workers leave the signal to their run, which stops them at once (not after each one's
    utterance in hand); the same command decodes again and finishes."""
    exp_dir = tmp_path / "exp"
    sweep = "--decoding,acwt_sweep=" + ",".join(f"{0.05 + i / 100:.2f}" for i in range(60))  # a long decode
    arguments = ("--exp,n_epochs_tr=1", sweep, "--decoding,num_jobs=2")
    process = start(tiny_corpus, exp_dir, *arguments)
    deadline = time.time() + 240
    while process.poll() is None and not (exp_dir / "decode_dev" / "scoring").is_dir() and time.time() < deadline:
        time.sleep(0.01)
    assert process.poll() is None, "the run ended before decoding"
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 128 + signal.SIGTERM and "stopped by SIGTERM" in stderr, stderr
    assert not (exp_dir / "decode_dev" / "scoring" / "summary.txt").exists()  # it stopped within the decode
    finished = run(tiny_corpus, exp_dir, *arguments)
    assert "%WER" in (exp_dir / "res.res").read_text() and "already finished" not in finished.stdout

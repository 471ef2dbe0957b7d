"""recipes/mini_timit/run_kaldi.sh with real Kaldi on the tests' tiny corpus: the two commands for TIMIT users,
run as the recipe's README writes them (only the corpus, the folders and the sizes changed): Kaldi's
own GMM systems up to tri3 SAT, fMLLR alignments of every utterance and features; then cfg/TIMIT_liBRU.cfg
trains on those outputs and decodes with both decoders, which agree. Skipped, saying so, without KALDI_ROOT."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
KALDI_ROOT = os.environ.get("KALDI_ROOT", "")
pytestmark = pytest.mark.skipif(not KALDI_ROOT or not Path(KALDI_ROOT, "src", "gmmbin").is_dir(),
                                reason="KALDI_ROOT is not set to a Kaldi build: the tests against real Kaldi are skipped "
                                       "(README, 'Testing against Kaldi')")
SMALL = ("--exp,n_epochs_tr=2", "--architecture1,sizes=32,32", "--decoding,num_jobs=2", "--dataset1,n_chunks=1")


def dev_errors(log: str, setting: str) -> tuple[int, int]:
    """(errors, words) of the dev pass at ``setting`` in a run's log."""
    match = re.search(rf"dev {setting}: %WER \S+ \[ (\d+) / (\d+),", log)
    assert match, f"no dev pass '{setting}' in the log"
    return int(match.group(1)), int(match.group(2))


# Where the docs keep the worked example for TIMIT users: the README points there, the recipe's README holds it.
WORKED_EXAMPLE = ROOT / "recipes" / "mini_timit" / "README.md"


def readme_commands(readme: Path = WORKED_EXAMPLE, heading: str = "## Kaldi's own GMM systems") -> list[str]:
    """The shell commands of the first ``sh`` block in the section of ``readme`` whose heading starts with
    ``heading``, continuation lines joined. A missing section or block fails the test, naming the file."""
    text = readme.read_text()
    section = re.search(rf"^{re.escape(heading)}.*?$(.*?)(?=^#{{1,{heading.count('#')}}} |\Z)", text, re.M | re.S)
    assert section, f"{readme} has no section headed {heading!r}"
    block = re.search(r"```sh\n(.*?)```", section.group(1), re.S)
    assert block, f"{readme}: no sh block in the section {heading!r}"
    return [line.strip() for line in block.group(1).replace("\\\n", " ").splitlines() if line.strip()]


def test_the_readme_commands_for_timit_users_then_both_decoders(tiny_corpus, tmp_path):
    kaldi_command, timit_command = readme_commands()
    # as written, on the tests' corpus, with folders under tmp_path and sizes for 24 utterances; the
    # alignments' retry beam is the recipe's default, which must align every utterance
    assert kaldi_command.startswith("KALDI_ROOT=/path/to/kaldi recipes/mini_timit/run_kaldi.sh recipes/mini_timit "), kaldi_command
    assert timit_command.startswith("TIMIT_FMLLR=exp/"), timit_command
    kaldi_command = (kaldi_command.replace("/path/to/kaldi", KALDI_ROOT)
                     .replace("run_kaldi.sh recipes/mini_timit ", f"run_kaldi.sh --nj 2 --leaves 100 --gauss 600 {tiny_corpus.root} "))
    commands = [re.sub(r"(?<![\w/])exp/", f"{tmp_path}/exp/", c) for c in (kaldi_command, timit_command + " " + " ".join(SMALL))]
    kaldi_dir, exp = tmp_path / "exp" / "kaldi_mini_timit", tmp_path / "exp" / "TIMIT_liBRU_mini"
    recipe = subprocess.run(["bash", "-c", commands[0]], cwd=ROOT, capture_output=True, text=True,
                            env=dict(os.environ, PYTHON=sys.executable))
    assert recipe.returncode == 0, recipe.stdout[-4000:] + recipe.stderr[-4000:]
    from bru_kaldi.kaldi.alignments import read_alignments

    for split in ("train", "dev", "test"):
        utterances = {line.split()[0] for line in (tiny_corpus.data(split) / "feats.scp").read_text().splitlines()}
        aligned = dict(read_alignments(str(kaldi_dir / "exp" / ("tri3_ali" + ("" if split == "train" else f"_{split}")))))
        assert set(aligned) == utterances, f"{split}: {len(utterances - set(aligned))} utterances not aligned"
    timit = subprocess.run(["bash", "-c", commands[1]], cwd=ROOT, capture_output=True, text=True)
    assert timit.returncode == 0, timit.stderr[-4000:]
    assert re.search(r"^test: %WER [\d.]+ \[", (exp / "res.res").read_text(), re.M)
    assert "are not in every stream" not in (exp / "log.txt").read_text()  # every utterance had its alignment

    per = (kaldi_dir / "exp" / "tri3" / "PER").read_text()
    assert re.search(r"dev %WER [\d.]+ .* test %WER [\d.]+", per), per
    for split in ("train", "dev", "test"):
        assert (kaldi_dir / "data-fmllr-tri3" / split / "feats.scp").is_file()
        assert list((kaldi_dir / "exp" / ("tri3_ali" + ("" if split == "train" else f"_{split}"))).glob("ali.*.gz"))
    # our TransitionModel reader on a model Kaldi trained (tri3: a tree of context-dependent pdfs) equals
    # ali-to-pdf and ali-to-phones on every transition-id of its alignments
    from bru_kaldi.kaldi.transition_model import read_transition_model

    tri3, ali = kaldi_dir / "exp" / "tri3" / "final.mdl", kaldi_dir / "exp" / "tri3_ali"
    tm = read_transition_model(tri3)
    env_kaldi = dict(os.environ, PATH=os.pathsep.join([str(Path(KALDI_ROOT, "src", "bin")), os.environ["PATH"]]))
    for tool, table in (("ali-to-pdf", tm.tid2pdf), ("ali-to-phones --per-frame=true", tm.tid2phone)):
        out = subprocess.run(["bash", "-c", f"{tool} {tri3} 'ark:gunzip -c {ali}/ali.*.gz |' ark,t:-"],
                             capture_output=True, text=True, env=env_kaldi, check=True).stdout
        theirs = {line.split()[0]: [int(v) for v in line.split()[1:]] for line in out.splitlines()}
        ours = dict(read_alignments(str(ali)))
        assert theirs.keys() == ours.keys() and all(table[ours[u]].tolist() == theirs[u] for u in ours), tool
    from tests.kaldi.test_kaldi_conformance import check_against_show_transitions

    check_against_show_transitions(tri3, kaldi_dir / "exp" / "tri3" / "graph" / "phones.txt")
    # again: every stage finished, nothing is redone
    again = subprocess.run(["bash", str(ROOT / "recipes" / "mini_timit" / "run_kaldi.sh"), str(tiny_corpus.root),
                            str(kaldi_dir)], capture_output=True, text=True)
    assert again.returncode == 0 and again.stdout.count("finished before, skipped") == 7, again.stdout

    # then both decoders on the same outputs: the Kaldi scripts' (Kaldi on PATH) and ours
    env = dict(os.environ, TIMIT_FMLLR=str(kaldi_dir / "data-fmllr-tri3"), TIMIT_EXP=str(kaldi_dir / "exp"),
               PATH=os.pathsep.join([*(str(Path(KALDI_ROOT, "src", d)) for d in ("bin", "latbin", "fstbin")),
                                     os.environ["PATH"]]))
    exp = tmp_path / "TIMIT_liBRU"
    logs = {}
    for decoder, extra in (("kaldi", ()), ("python", ("--decoding,acwt_sweep=0.1,0.2,0.5", "--decoding,wip_sweep=0.0"))):
        run = subprocess.run([sys.executable, "run_exp.py", "cfg/TIMIT_liBRU.cfg", f"--exp,out_folder={exp}", *SMALL,
                              f"--decoding,decoder={decoder}", *extra], cwd=ROOT, capture_output=True, text=True, env=env)
        assert run.returncode == 0, run.stderr[-4000:]
        logs[decoder] = (exp / "log.txt").read_text()
        assert re.search(r"^test: %WER [\d.]+ \[", (exp / "res.res").read_text(), re.M)
    # the lattices are made at acwt 0.2 (LM weight 5): their best path is the Python decoder's at 0.2
    assert dev_errors(logs["kaldi"], r"lmwt=5 wip=0\.0") == dev_errors(logs["python"], r"acwt=0\.2")


def test_wsj_libru_on_the_word_task_decodes_the_same_words_with_both_decoders(tiny_words, tmp_path):
    """cfg/WSJ_liBRU.cfg on the word task (the Kaldi names linked to it, sizes and epochs overridden), decoded
    by the Kaldi scripts and by the Python decoder: the same dev WER at the lattices' own scale (0.1, LM
    weight 10), and both write a test %WER line."""
    from recipes.mini_timit.local.kaldi_view import make_view

    env = dict(os.environ, PATH=os.pathsep.join([*(str(Path(KALDI_ROOT, "src", d)) for d in ("bin", "latbin", "fstbin")),
                                                 os.environ["PATH"]]))
    env.update({variable: str(folder) for variable, folder in make_view(tmp_path / "view", tiny_words.root, "words").items()})
    exp = tmp_path / "exp"
    common = (f"--exp,out_folder={exp}", "--exp,n_epochs_tr=1", "--architecture1,sizes=24", "--batches,batch_size_train=4",
              "--dataset1,n_chunks=2", "--decoding,num_jobs=2", "--decoding,acwt=0.1", "--decoding,max_active=2000")
    logs = {}
    for decoder, extra in (("kaldi", ()), ("python", ("--decoding,acwt_sweep=0.1", "--decoding,wip_sweep=0.0"))):
        run = subprocess.run([sys.executable, "run_exp.py", "cfg/WSJ_liBRU.cfg", *common, f"--decoding,decoder={decoder}",
                              *extra], cwd=ROOT, capture_output=True, text=True, env=env)
        assert run.returncode == 0, run.stderr[-4000:]
        logs[decoder] = (exp / "log.txt").read_text()
        assert re.search(rf"^test: %WER [\d.]+ \[.* decoder={decoder}", (exp / "res.res").read_text(), re.M)
        # word timings from the chosen best paths (lattice-best-path's alignments on the Kaldi path)
        ctm = (exp / "decode_test" / "ctm").read_text().splitlines()
        words = sum(len(line.split()) - 1 for line in (exp / "decode_test" / "text").read_text().splitlines())
        assert len(ctm) >= words and all(len(line.split()) == 5 for line in ctm), (words, ctm[:3])  # text: filtered
    assert dev_errors(logs["kaldi"], r"lmwt=10 wip=0\.0") == dev_errors(logs["python"], r"acwt=0\.1")


def test_transcribe_decodes_the_same_words_with_kaldis_decoder(tiny_word_model, tiny_words):
    """transcribe.py with Kaldi's binaries on PATH (decode_dnn.sh's lattices, their best path at the recorded
    scale) and with the Python decoder: the same words for the test set."""
    env = dict(os.environ, PATH=os.pathsep.join([*(str(Path(KALDI_ROOT, "src", d)) for d in ("bin", "latbin", "fstbin")),
                                                 os.environ["PATH"]]))
    outs = {}
    for decoder in ("kaldi", "python"):
        run = subprocess.run([sys.executable, "transcribe.py", str(tiny_word_model), "--decoder", decoder,
                              f"scp:{tiny_words.data('test') / 'wav.scp'}"], cwd=ROOT, capture_output=True, text=True,
                             env=env)
        assert run.returncode == 0, run.stderr[-4000:]
        outs[decoder] = run.stdout
    assert outs["kaldi"] == outs["python"] and len(outs["python"].splitlines()) == 6

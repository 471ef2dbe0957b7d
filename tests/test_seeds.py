"""Every seed trains: each unit type, with the optimiser settings of the MINI configs, finishes its first
epoch with a finite loss at several seeds, without needing a rollback. (``bench/seeds.py`` checks the
MINI configs themselves at seeds 1-10 on the default corpus; this is its quick form on the tiny one.)"""

import importlib.util
import logging
import math
import re
from pathlib import Path

import pytest

import run_exp
from bru_kaldi.training import chance_frame_error
from data_io import read_counts

pytestmark = pytest.mark.slow  # trains every unit at three seeds

ROOT = Path(__file__).resolve().parents[1]
CFG = ROOT / "tests" / "data" / "tiny_liBRU.cfg"
# the optimiser of cfg/MINI_*.cfg: RMSprop at 0.002, alpha 0.95; the square average bias-corrected as in
# MINI_liBRU and MINI_liGRU, plain as in the other units' configs (where plain RMSprop trained every seed)
MINI_OPTIMISER = ("--architecture1,arch_lr=0.002", "--architecture1,opt_alpha=0.95")
CORRECTED, PLAIN = "--architecture1,opt_bias_correction=True", "--architecture1,opt_bias_correction=False"
UNITS = [("libru", [CORRECTED]), ("ligru", [CORRECTED]), ("lbru", ["--architecture1,backward=layer", PLAIN]),
         ("ubru", ["--architecture1,backward=kalman", PLAIN]), ("gru", [PLAIN]), ("lstm", [PLAIN]), ("mgu", [PLAIN])]


EPOCHS = 4  # on the tiny corpus (12 utterances) one epoch is too few updates for any unit to beat chance


@pytest.mark.parametrize("unit, options", UNITS, ids=[u for u, _ in UNITS])
def test_every_seed_learns(unit, options, tiny_corpus, tmp_path, monkeypatch, one_thread):
    """Seeds 1-3 of every unit with the MINI configs' optimiser: no rollback, and after a few epochs a dev
    frame error below chance, the error of always answering the most frequent training pdf (a network
    that learned nothing, with a finite loss, stays above it)."""
    monkeypatch.setenv("MINI_TIMIT", str(tiny_corpus.root))
    for seed in (1, 2, 3):
        exp_dir = tmp_path / f"{unit}_seed{seed}"
        monkeypatch.setenv("BRU_TEST_EXP", str(exp_dir))
        code = run_exp.main([str(CFG), "--stop-stage", "train", f"--exp,n_epochs_tr={EPOCHS}", f"--exp,seed={seed}",
                             f"--architecture1,unit={unit}", *options, *MINI_OPTIMISER])
        logging.shutdown()
        log = (exp_dir / "log.txt").read_text()
        assert code == 0, log
        assert "rolling back" not in log, f"seed {seed} needed a rollback:\n{log}"
        last = (exp_dir / "res.res").read_text().splitlines()[EPOCHS - 1]
        loss, dev_error = (float(re.search(rf"{name}=(\S+)", last).group(1)) for name in ("train_loss", "dev_err"))
        chance = chance_frame_error(read_counts(str(exp_dir / "pdf_counts")))
        assert math.isfinite(loss) and dev_error < chance, (seed, loss, dev_error, chance)


def _seeds_bench():
    """bench/seeds.py as a module (bench/ is a folder of scripts, not a package)."""
    spec = importlib.util.spec_from_file_location("seeds_bench", ROOT / "bench" / "seeds.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _finished_run(folder: Path, dev_err: str | None, counts: str = "[ 10 30 60 ]\n") -> Path:
    folder.mkdir()
    dev = f" dev_loss=1.0 dev_err={dev_err}" if dev_err is not None else ""
    (folder / "res.res").write_text(f"epoch=001 train_loss=2.5 train_err=0.70{dev} lr_x=0.002 time=3.0s\n")
    (folder / "pdf_counts").write_text(counts)
    (folder / "bench_status").write_text("trained (3 s)\n")
    return folder


def test_a_seed_trains_only_below_chance(tmp_path):
    """The seeds bench's verdict: a finite loss is not enough; epoch 1's dev frame error must beat always
    answering the most frequent training pdf (here 60 of 100 frames: chance errs on 0.4)."""
    bench = _seeds_bench()
    assert bench.chance_error(_finished_run(tmp_path / "counts", None) / "pdf_counts") == pytest.approx(0.4)
    assert bench.outcome(_finished_run(tmp_path / "good", "0.3500")) == "trained (3 s)"
    dead = bench.outcome(_finished_run(tmp_path / "dead", "0.4000"))
    assert dead.startswith("NOT LEARNING") and "0.400" in dead and "trained (3 s)" in dead
    assert bench.outcome(_finished_run(tmp_path / "no_dev", None)) == "trained (3 s)"  # nothing to judge by
    assert bench.outcome(tmp_path / "not_run") is None
    failed = tmp_path / "failed"
    failed.mkdir()
    (failed / "bench_status").write_text("FAILED: the loss is nan (9 s)\n")
    assert bench.outcome(failed) == "FAILED: the loss is nan (9 s)"  # a failure is not re-judged
    with pytest.raises(ValueError, match="pdf_counts"):
        bench.outcome(_finished_run(tmp_path / "bad_counts", "0.3", counts="[ ]\n"))


def test_the_seeds_summary_alone_runs_nothing(tmp_path, capsys):
    """``--no-run``: the summary of the runs finished so far, the others listed as not run (and no run started)."""
    bench = _seeds_bench()
    _finished_run(tmp_path / "MINI_x_seed1", "0.30")
    _finished_run(tmp_path / "MINI_x_seed2", "0.50")
    code = bench.main(["--out", str(tmp_path), "--no-run", "--seeds", "1-3", "cfg/MINI_x.cfg"])
    summary = capsys.readouterr().out.splitlines()[-1]
    assert code == 1
    assert summary.split() == ["MINI_x", "1/2", "dev", "0.300", "[1];", "not", "learning:", "[2];", "not", "run",
                               "yet:", "[3]"]
    assert not (tmp_path / "MINI_x_seed3").exists()


@pytest.mark.parametrize("chance, warned", [(1.0, False), (0.0, True)])
def test_a_run_that_has_not_learned_says_so(chance, warned, tiny_corpus, tmp_path, monkeypatch, one_thread):
    """Each epoch's dev frame error is held against chance (``chance_frame_error`` of the training pdf
    counts, here replaced by a fixed level): at or above it the log says the network has learned nothing."""
    monkeypatch.setenv("MINI_TIMIT", str(tiny_corpus.root))
    monkeypatch.setenv("BRU_TEST_EXP", str(tmp_path / "run"))
    monkeypatch.setattr(run_exp, "chance_frame_error", lambda counts: chance)
    code = run_exp.main([str(CFG), "--stop-stage", "train", "--exp,n_epochs_tr=1"])
    logging.shutdown()
    log = (tmp_path / "run" / "log.txt").read_text()
    assert code == 0, log
    dev_err = float(re.search(r"dev_err=(\S+)", (tmp_path / "run" / "res.res").read_text()).group(1))
    message = (f"epoch 1: the dev frame error {dev_err:.4f} is no better than always answering the most frequent "
               f"pdf ({chance:.4f})")
    assert (message in log) == warned, log

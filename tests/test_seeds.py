"""Every seed trains: each unit type, with the optimiser settings of the MINI configs, finishes its first
epoch with a finite loss at several seeds, without needing a rollback. (``bench/seeds.py`` checks the
MINI configs themselves at seeds 1-10 on the default corpus; this is its quick form on the tiny one.)"""

import logging
import math
import re
from pathlib import Path

import pytest
import torch

import run_exp

ROOT = Path(__file__).resolve().parents[1]
CFG = ROOT / "tests" / "data" / "tiny_liBRU.cfg"
# the optimiser of cfg/MINI_*.cfg: RMSprop at 0.002, alpha 0.95, the square average bias-corrected
MINI_OPTIMISER = ("--architecture1,arch_lr=0.002", "--architecture1,opt_alpha=0.95",
                  "--architecture1,opt_bias_correction=True")
UNITS = [("libru", []), ("ligru", []), ("lbru", ["--architecture1,backward=layer"]),
         ("ubru", ["--architecture1,backward=kalman"]), ("gru", []), ("lstm", []), ("mgu", [])]


@pytest.mark.parametrize("unit, options", UNITS, ids=[u for u, _ in UNITS])
def test_every_seed_trains_its_first_epoch(unit, options, tiny_corpus, tmp_path, monkeypatch):
    monkeypatch.setenv("MINI_TIMIT", str(tiny_corpus.root))
    torch.set_num_threads(1)
    for seed in (1, 2, 3):
        exp_dir = tmp_path / f"{unit}_seed{seed}"
        monkeypatch.setenv("BRU_TEST_EXP", str(exp_dir))
        code = run_exp.main([str(CFG), "--stop-stage", "train", "--exp,n_epochs_tr=1", f"--exp,seed={seed}",
                             f"--architecture1,unit={unit}", *options, *MINI_OPTIMISER])
        logging.shutdown()
        log = (exp_dir / "log.txt").read_text()
        assert code == 0, log
        assert "rolling back" not in log, f"seed {seed} needed a rollback:\n{log}"
        loss = float(re.search(r"train_loss=(\S+)", (exp_dir / "res.res").read_text()).group(1))
        assert math.isfinite(loss) and loss < 6.0, (seed, loss)  # below log(119) = 4.78 plus a margin

"""Which seeds train: every config's first epoch at several seeds, and the seeds that finish it.

A comparison over seeds needs every seed to train. For each config and seed this runs
``run_exp.py CFG --exp,seed=N --exp,n_epochs_tr=1`` into its own folder (training only: no forward
pass, no decode) and reads the outcome: ``trained`` (epoch 1 finished with a finite loss and a dev
frame error below chance, see below), ``trained, N rollback(s)`` (a blow-up was caught and the run went
back to its last checkpoint with a halved learning rate), ``NOT LEARNING`` (a finite loss, but the dev
frame error is no better than always answering the most frequent pdf), or ``FAILED`` (the run stopped;
its error line is printed). Finished runs are not run again, so a killed bench resumes.

Why the dev error: a finite loss is not enough. A seed whose recurrent matrix blew up in its first steps
can end the epoch with a finite training loss and a network that answers one pdf everywhere (plain
RMSprop, ``MINI_liGRU`` seeds 2 and 4: dev frame error 0.977, where always answering the most frequent
training pdf errs on 0.965 of the frames). That chance level comes from the run's own ``pdf_counts``.

Usage: python bench/seeds.py [--seeds 1-10] [--out DIR] [--no-run] [CFG ...] [--section,option=value ...]
  e.g. python bench/seeds.py cfg/MINI_liGRU.cfg cfg/MINI_liBRU.cfg --seeds 1-10
       python bench/seeds.py --seeds 1,2 cfg/MINI_liBRU.cfg --architecture1,arch_warmup_steps=0

With no CFG, every ``cfg/MINI_*.cfg``. One epoch each: 25-100 s per (config, seed) with one thread and
two runs sharing 2 cores (AMD EPYC, 2026-11-26), the UBRU configs the shortest, the bidirectional and
3-layer ones the longest.
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bru_kaldi.training import chance_frame_error  # noqa: E402
from data_io import read_counts  # noqa: E402


def parse_seeds(text: str) -> list[int]:
    """``"1-10"`` or ``"1,2,5"`` (or both, ``"1-3,7"``) as a sorted list of seeds."""
    seeds = set()
    for part in text.split(","):
        low, _, high = part.partition("-")
        seeds.update(range(int(low), int(high or low) + 1))
    return sorted(seeds)


def outcome(folder: Path) -> str | None:
    """What a finished run in ``folder`` gave, or None when it has not finished: the run's own outcome
    (``bench_status``), judged by :func:`learned` when it trained."""
    status = folder / "bench_status"
    if not status.is_file():
        return None
    state = status.read_text().strip()
    return state if not state.startswith("trained") else learned(folder, state)


def chance_error(counts_file: Path) -> float:
    """The frame error of always answering the most frequent pdf of a run's ``pdf_counts``
    (``bru_kaldi.training.chance_frame_error``, which the training log also checks each epoch)."""
    try:
        return chance_frame_error(read_counts(str(counts_file)))
    except ValueError as error:
        raise ValueError(f"{counts_file}: {error}") from None


def dev_error(folder: Path) -> float | None:
    """Epoch 1's dev frame error of the run in ``folder`` (``res.res``), or None where it has none."""
    res = folder / "res.res"
    found = re.search(r"dev_err=(\S+)", res.read_text().split("\n", 1)[0]) if res.is_file() else None
    return float(found.group(1)) if found else None


def learned(folder: Path, state: str) -> str:
    """``state`` as it is when epoch 1's dev frame error (``res.res``) is below :func:`chance_error`,
    else ``NOT LEARNING`` with both numbers. A config without a dev set or pdf counts keeps ``state``."""
    dev = dev_error(folder)
    if dev is None or not (folder / "pdf_counts").is_file():
        return state
    chance = chance_error(folder / "pdf_counts")
    if dev < chance:
        return state
    return (f"NOT LEARNING: dev frame error {dev:.3f} after epoch 1, always answering the most frequent pdf "
            f"errs on {chance:.3f} ({state})")


def run_one(cfg: Path, seed: int, folder: Path, overrides: list[str]) -> None:
    """Train ``cfg``'s first epoch at ``seed`` into ``folder`` and write the run's outcome (``bench_status``,
    read back by :func:`outcome`) with the seconds it took."""
    start = time.time()
    command = [sys.executable, str(ROOT / "run_exp.py"), str(cfg), f"--exp,seed={seed}", "--exp,n_epochs_tr=1",
               f"--exp,out_folder={folder}", "--stop-stage", "train", *overrides]
    result = subprocess.run(command, capture_output=True, text=True, cwd=ROOT)
    log = (result.stdout + result.stderr).splitlines()
    rollbacks = sum("rolling back" in line for line in log)
    res = folder / "res.res"
    epoch = res.read_text().splitlines()[0] if res.is_file() else ""
    loss = re.search(r"train_loss=(\S+)", epoch)
    if result.returncode == 0 and loss and loss.group(1) not in ("nan", "inf"):
        state = "trained" + (f", {rollbacks} rollback(s)" if rollbacks else "")
    else:
        errors = [line for line in log if "error" in line.lower()]
        state = "FAILED: " + (errors[-1].split("error: ", 1)[-1] if errors else f"exit status {result.returncode}")
    (folder / "bench_status").write_text(f"{state} ({time.time() - start:.0f} s)\n")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     usage=__doc__.split("\n\n")[2].replace("Usage: ", "", 1),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("cfgs", nargs="*", type=Path, help="configs (default: cfg/MINI_*.cfg)")
    parser.add_argument("--seeds", default="1-10", help="seeds, e.g. 1-10 or 1,2,4")
    parser.add_argument("--out", type=Path, default=ROOT / "exp" / "seeds", help="one folder per run under it")
    parser.add_argument("--no-run", dest="run", action="store_false",
                        help="only the summary of the runs finished so far (while a bench is still running)")
    args, overrides = parser.parse_known_args(argv)
    cfgs = args.cfgs or sorted((ROOT / "cfg").glob("MINI_*.cfg"))
    seeds = parse_seeds(args.seeds)
    print(f"bench/seeds.py: {platform.processor() or platform.machine()}, {os.cpu_count()} cores; "
          f"{len(cfgs)} config(s) x seeds {args.seeds}; overrides: {' '.join(overrides) or 'none'}")
    summary = {}
    for cfg in cfgs:
        states = {}
        for seed in seeds:
            folder = args.out / f"{cfg.stem}_seed{seed}"
            state = outcome(folder)
            if state is None and not args.run:
                continue
            if state is None:
                run_one(cfg, seed, folder, overrides)
                state = outcome(folder)
            states[seed] = state
            print(f"  {cfg.stem} seed {seed}: {state}", flush=True)
        summary[cfg.stem] = states
    print("\nseeds that finished epoch 1 with a finite loss and a dev frame error below chance (dev: their mean "
          "dev frame error after epoch 1):")
    failed = False
    for name, states in summary.items():
        good = [s for s, state in states.items() if state.startswith("trained")]
        errors = [dev_error(args.out / f"{name}_seed{s}") for s in good]
        dev = f"{sum(errors) / len(errors):.3f}" if good and None not in errors else "-"
        rolled = [s for s, state in states.items() if "rollback" in state]
        dead = [s for s, state in states.items() if state.startswith("NOT LEARNING")]
        failed |= len(good) < len(states) or len(states) < len(seeds)
        note = (f"; rolled back: {rolled}" if rolled else "") + (f"; not learning: {dead}" if dead else "")
        missing = [s for s in seeds if s not in states]
        note += f"; not run yet: {missing}" if missing else ""
        print(f"  {name:24s} {len(good):2d}/{len(states)}  dev {dev:5s}  {good}{note}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

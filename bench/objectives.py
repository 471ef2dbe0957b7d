#!/usr/bin/env python3
"""What LF-MMI costs against cross-entropy in training: the same network's step on the same utterances.

Usage: python bench/objectives.py [--ce cfg/MINIW_liGRU.cfg] [--lfmmi cfg/MINIW_liGRU_lfmmi.cfg]
                                  [--repeats 10] [--threads 1] [--smoke]

Each config's training data and network are set up as ``run_exp.py`` sets them up (``load_training_data``,
``build_network``, in a scratch folder), and ``run_exp.train_step`` (forward, loss, backward, clipping,
optimiser step) is timed on the largest batch of the utterances both training sets hold, taken
from each set, so that both step over the same frames. The steps of the two objectives alternate
within each repeat, so that a change in the machine's load falls on both alike; medians of
``--repeats`` after one warm-up each. Printed: ms a step, *input* frames/s (a chain model's output has a
third of them: the frames/s that ``run_exp.py`` logs for it count output frames) and LF-MMI's time against
cross-entropy's. The configs' own options apply (the chain config at ``frame_subsampling_factor = 3``,
its frame shift taken as in the epoch). ``--smoke``: the tiny corpus, one repeat.

Decoding's real-time factor is each run's own (``rtf=`` on the ``test:`` line of ``res.res``): RESULTS.md
gives the command that collects it from the archived runs.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

import run_exp  # noqa: E402
from bru_kaldi.config import parse_config  # noqa: E402
from bru_kaldi.corpus import loader_options  # noqa: E402
from bru_kaldi.distributed import Distributed  # noqa: E402
from bru_kaldi.experiment import Experiment  # noqa: E402
from bru_kaldi.machine import cpu_model, load_average  # noqa: E402
from bru_kaldi.torch_state import run_settings  # noqa: E402


def setup(config_path: str, overrides: list[str], folder: Path):
    """``run_exp.py``'s training run of a config, up to its first step, in ``folder``."""
    config = parse_config(config_path, [*overrides, f"--exp,out_folder={folder}"])
    exp = Experiment(config.exp.out_folder)
    run = run_exp.load_training_data(config, exp, torch.device("cpu"), Distributed.from_environment("cpu"))
    run_exp.build_network(run)
    run.train_set.options = loader_options(config, "train", 0)
    run.model.train()
    return run


def batch_of(run, keys: set[str]):
    """The batch of ``run``'s first epoch with the most frames among utterances in ``keys``."""
    batches = [b for b in run.train_set.batches(0) if all(k.split("#")[0] in keys for k in b.keys)]
    if not batches:
        raise SystemExit(f"{run.config.source}: no training batch holds only utterances of both training sets")
    return max(batches, key=lambda b: int(b.lengths.sum()))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ce", default=str(ROOT / "cfg" / "MINIW_liGRU.cfg"))
    parser.add_argument("--lfmmi", default=str(ROOT / "cfg" / "MINIW_liGRU_lfmmi.cfg"))
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--threads", type=int, default=1, help="torch's threads (the study's runs had one each)")
    parser.add_argument("--smoke", action="store_true", help="the tiny corpus, one repeat")
    args = parser.parse_args(argv)
    overrides = []
    if args.smoke:
        from recipes.mini_timit.corpus import ensure_corpus

        root = Path(os.environ.get("BRU_BENCH_TINY", "/tmp/bru_kaldi_bench_tiny"))
        for task in ("phones", "words"):
            ensure_corpus(root / "tiny", size="tiny", seed=1, task=task, log=lambda line: None)
        os.environ["MINI_TIMIT"] = str(root)
        overrides = ["--exp,builtin_corpus=tiny"]
        args.repeats = 1
    # run_exp.py's settings (subnormals flushed), put back at the end
    with run_settings(threads=args.threads, flush_denormal=True), \
            tempfile.TemporaryDirectory(prefix="bench_objectives_") as scratch:
        runs = {name: setup(path, overrides, Path(scratch, name))
                for name, path in (("cross-entropy", args.ce), ("LF-MMI", args.lfmmi))}
        shared = set.intersection(*(set(r.train_set.keys) for r in runs.values()))
        batches = {name: batch_of(run, shared) for name, run in runs.items()}
        times = {name: [] for name in runs}
        for _ in range(args.repeats + 1):
            for name, run in runs.items():
                start = time.perf_counter()
                run_exp.train_step(run, batches[name], {a.arch_name: a.arch_lr for a in run.archs}, "bench")
                times[name].append(time.perf_counter() - start)
    print(f"{cpu_model()}, {args.threads} thread(s), load average {load_average()}, medians of {args.repeats}")
    ms = {name: statistics.median(values[1:]) * 1000 for name, values in times.items()}
    for name, run in runs.items():
        frames = int(batches[name].lengths.sum())
        print(f"{name:>13} ({Path(run.config.source).name}): {len(batches[name].keys)} sequences, {frames} input "
              f"frames, {ms[name]:.0f} ms a step, {1000 * frames / ms[name]:.0f} input frames/s")
    same = batches["cross-entropy"].keys == batches["LF-MMI"].keys
    print(f"the same utterances in both batches: {'yes' if same else 'no (the largest batch of each)'}")
    print(f"LF-MMI's step takes {ms['LF-MMI'] / ms['cross-entropy']:.2f} times cross-entropy's")
    return 0


if __name__ == "__main__":
    sys.exit(main())

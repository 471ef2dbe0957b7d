"""Speed of set-level decoding: real-time factor and utterances per second of the Python
decoder, one worker against several, and against the number of utterances decoded.

Decodes the built-in corpus's test set through ``decode.decode_sets`` (what run_exp.py calls) with
log-likelihoods made from its alignments: ``noisy`` (the aligned pdf raised by 2 over unit Gaussian
scores, about 5 % PER at the default scale: the search has real competitors, as on a trained model's
output) or ``oracle`` (all the mass on the aligned pdf). For each number of utterances (the first N
of the test set) and each number of jobs, prints the decode's wall time (graphs loaded, checks done,
the pool started), the RTF (decode time / audio, 10 ms frames), utterances per second, the speed-up
over one job measured in the same run, and the CPU cores actually used (CPU time / wall time: on a
shared machine, fewer than the jobs asked for means the others' load, not the decoder, set the speed-up).
Jobs are timed in turn within each repeat (so that all see the same load); medians of ``--repeats``.

Usage: python bench/decoding.py [--corpus DIR] [--size default|tiny] [--jobs 1 2] [--utts 5 10 20 all]
  e.g. python bench/decoding.py --corpus recipes/mini_timit --posteriors oracle --jobs 1 2 4 --repeats 3
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bru_kaldi import decoding as decode  # noqa: E402
from bru_kaldi.config import Decoding  # noqa: E402
from data_io import LoglikeWriter  # noqa: E402
from recipes.mini_timit.corpus import ensure_corpus  # noqa: E402
from recipes.mini_timit.local.check import read_alignments  # noqa: E402
from bru_kaldi.kaldi.transition_model import read_transition_model  # noqa: E402


def write_loglikes(corpus, out: Path, kind: str, seed: int) -> tuple[Path, dict[str, int]]:
    """All test utterances' log-likelihoods (T, num_pdfs) in one ark; returns its scp and frame counts."""
    tm = read_transition_model(corpus.model)
    rng = np.random.default_rng(seed)
    frames = {}
    with LoglikeWriter(out / "test.ark", out / "test.scp") as writer:
        for utt, ali in sorted(read_alignments(corpus.ali("test")).items()):
            pdfs = tm.tid2pdf[ali]
            if kind == "oracle":
                loglikes = np.full((len(pdfs), tm.num_pdfs), np.log(1e-30), dtype=np.float32)
                loglikes[np.arange(len(pdfs)), pdfs] = 0.0
            else:
                loglikes = rng.normal(0.0, 1.0, (len(pdfs), tm.num_pdfs)).astype(np.float32)
                loglikes[np.arange(len(pdfs)), pdfs] += 2.0
            writer.write(utt, loglikes)
            frames[utt] = len(pdfs)
    return out / "test.scp", frames


def time_decode(corpus, scp: Path, text: Path, out: Path, jobs: int,
                acwt: float) -> tuple[float, float, decode.SetResult]:
    """One decode_sets call (checks, pool start, decoding, scoring, writing): wall seconds, CPU seconds
    (this process and its workers, which the pool has reaped when decode_sets returns) and the result."""
    job = decode.DecodeJob("test", scp, corpus.graph, corpus.model, text, out)
    decoding = Decoding(decoder="python", scoring="timit", acwt=acwt, num_jobs=jobs)
    before, start = os.times(), time.perf_counter()
    result = decode.decode_sets([job], decoding, tune_on=None, log=lambda line: None)["test"]
    wall, after = time.perf_counter() - start, os.times()
    cpu = sum(getattr(after, f) - getattr(before, f) for f in ("user", "system", "children_user", "children_system"))
    return wall, cpu, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--corpus", type=Path, help="a built mini_timit corpus (else one is built in a temp dir)")
    parser.add_argument("--size", choices=("default", "tiny"), default="default", help="size of the corpus to build")
    parser.add_argument("--posteriors", choices=("noisy", "oracle"), default="noisy")
    parser.add_argument("--jobs", type=int, nargs="+", default=[1, 2], help="numbers of jobs (the first: baseline)")
    parser.add_argument("--utts", nargs="+", default=["5", "10", "20", "all"], help="numbers of utterances")
    parser.add_argument("--acwt", type=float, default=1.0, help="acoustic scale")
    parser.add_argument("--repeats", type=int, default=3, help="timings per point (median kept)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, a few seconds: what the tests run, so that the bench cannot rot (numbers meaningless)")
    args = parser.parse_args()
    if args.smoke:
        args.size, args.jobs, args.utts, args.repeats = "tiny", [1, 2], ["2", "all"], 1
    print(" ".join([os.path.basename(sys.argv[0])] + sys.argv[1:]))
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"python {platform.python_version()}, {os.cpu_count()} CPU cores, load average {load:.2f} at start")

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        start = time.perf_counter()
        corpus = ensure_corpus(args.corpus or tmp / "mini_timit", size=args.size, seed=1, log=lambda line: None)
        print(f"corpus {corpus.root} ready in {time.perf_counter() - start:.1f} s")
        scp, frames = write_loglikes(corpus, tmp, args.posteriors, args.seed)
        utts = sorted(frames)
        counts = sorted({len(utts) if n == "all" else min(int(n), len(utts)) for n in args.utts})
        print(f"test set: {len(utts)} utterances, {sum(frames.values()) / 100:.1f} s of audio; "
              f"{args.posteriors} posteriors, acwt {args.acwt}")
        print(f"{'utts':>5} {'audio s':>8} {'jobs':>4} {'wall s':>7} {'decode s':>8} {'RTF':>6} {'utt/s':>6} "
              f"{'speed-up':>8} {'cores':>5} {'PER':>6}")
        for count in counts:
            subset, text = tmp / f"first{count}.scp", tmp / f"first{count}.text"  # the references of those only
            subset.write_text("".join(line + "\n" for line in scp.read_text().splitlines()[:count]))
            refs = dict(line.split(" ", 1) for line in (corpus.data("test") / "text").read_text().splitlines())
            text.write_text("".join(f"{u} {refs[u]}\n" for u in utts[:count]))
            timings: dict[int, list[tuple[float, float, decode.SetResult]]] = {j: [] for j in args.jobs}
            for _ in range(args.repeats):
                for jobs in args.jobs:  # in turn, so that every job count sees the same load
                    timings[jobs].append(time_decode(corpus, subset, text, tmp / f"decode_{count}_{jobs}", jobs,
                                                     args.acwt))
            baseline = None
            for jobs in args.jobs:
                wall = statistics.median(t for t, _, _ in timings[jobs])
                cores = statistics.median(c / t for t, c, _ in timings[jobs])
                result = timings[jobs][-1][2]
                decode_s = statistics.median(r.seconds for _, _, r in timings[jobs])
                baseline = baseline or wall
                print(f"{count:5d} {result.audio_seconds:8.1f} {jobs:4d} {wall:7.2f} {decode_s:8.2f} "
                      f"{decode_s / result.audio_seconds:6.3f} {count / wall:6.1f} {baseline / wall:7.2f}x "
                      f"{cores:5.2f} {result.score.total.rate:6.2f}")
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"load average {load:.2f} at the end")


if __name__ == "__main__":
    main()

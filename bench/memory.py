"""Peak memory (resident set size) of the data pipeline and of the main job.

1. pipeline: a synthetic Kaldi corpus (as bench/data_pipeline.py builds it) read chunk by chunk, once
   with the corpus in 1 chunk and once the same corpus 10 times larger in 10 chunks: the peak must
   follow the chunk, not the corpus. Each reading runs in its own process, whose peak RSS
   (``ru_maxrss``) is reported beside its baseline (the same process after its imports).
2. main job (``--main-job``): ``python run_exp.py cfg/MINI_liBRU.cfg`` (the README's main command,
   the corpus built), its peak RSS and that of its decoding workers.

Usage: python bench/memory.py [--utts 300] [--frames 200] [--main-job]
  e.g. python bench/memory.py --utts 600 --main-job
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

READ = """
import resource, sys
sys.path.insert(0, {root!r})
sys.path.insert(0, {bench!r})
from data_pipeline import make_corpus
import argparse
args = argparse.Namespace(n_chunks={chunks}, batch_size=8, seed=1)
from pathlib import Path
corpus = make_corpus(Path({folder!r}), args)
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
frames = sum(int(b.lengths.sum()) for b in corpus.batches(epoch=0))
print(base, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, frames)
"""


def read_peak(folder: Path, chunks: int) -> tuple[float, float, int]:
    """(MB after imports and indexing, peak MB, frames read) of reading ``folder`` in ``chunks`` chunks."""
    code = READ.format(root=str(ROOT), bench=str(ROOT / "bench"), folder=str(folder), chunks=chunks)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    return int(out[0]) / 1024, int(out[1]) / 1024, int(out[2])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--utts", type=int, default=300, help="utterances of the small corpus (the large has 10x)")
    parser.add_argument("--frames", type=int, default=200, help="mean frames per utterance")
    parser.add_argument("--main-job", action="store_true", help="also measure python run_exp.py cfg/MINI_liBRU.cfg")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, a few seconds: what the tests run, so that the bench cannot rot (numbers meaningless)")
    args = parser.parse_args()
    if args.smoke:
        args.utts, args.frames = 6, 40
    sys.path.insert(0, str(ROOT / "bench"))
    from data_pipeline import build_corpus

    print(f"bench/memory.py: {platform.processor() or platform.machine()}, {os.cpu_count()} cores")
    with tempfile.TemporaryDirectory() as tmp:
        rows = []
        for scale, chunks in ((1, 1), (10, 10)):
            folder = Path(tmp) / f"x{scale}"
            frames = build_corpus(folder, args.utts * scale, args.frames, speakers=20, seed=1)
            base, peak, read = read_peak(folder, chunks)
            assert read > 0.9 * frames, (read, frames)
            rows.append((scale, chunks, frames, base, peak))
            print(f"  corpus x{scale:<2d} ({frames:8d} frames, {chunks:2d} chunk(s)): {base:7.0f} MB after indexing, "
                  f"peak {peak:7.0f} MB (+{peak - base:.0f} MB while reading)")
        growth = (rows[1][4] - rows[1][3]) / max(rows[0][4] - rows[0][3], 1e-9)
        print(f"  a corpus 10x larger in 10x as many chunks: {growth:.2f}x the memory while reading (two chunks are "
              "alive at a time, the one read and the next one being prepared, against one for a single chunk)")
    if args.main_job:
        start = time.time()
        result = subprocess.run([sys.executable, "run_exp.py", "cfg/MINI_liBRU.cfg", "--exp,out_folder=exp/bench_memory",
                                 "--force"], cwd=ROOT, capture_output=True, text=True)
        usage = resource.getrusage(resource.RUSAGE_CHILDREN)
        print(f"  main job (run_exp.py cfg/MINI_liBRU.cfg, exit {result.returncode}, {time.time() - start:.0f} s): "
              f"peak RSS {usage.ru_maxrss / 1024:.0f} MB (largest of the job and its decoding workers)")


if __name__ == "__main__":
    main()

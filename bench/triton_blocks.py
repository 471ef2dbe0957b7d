"""How the Triton kernels' block sizes move their speed on this GPU: forward + backward of one layer per
setting of ``models.fast.triton_loops`` ``BLOCK_H`` (units per program), ``BLOCK_K`` (rows of the recurrent
matrix per product slice) and ``NUM_WARPS``, against ``nn.LSTM`` (cuDNN) in the same run, in the
configuration of the configs (batch norm, dropout 0.2), T frames. The launcher's defaults are the
first row. Needs a GPU.

Usage: python bench/triton_blocks.py [--units libru lstm] [--hidden 256] [--batch 16] [--bidirectional]
                                     [--block-h 8 16 32] [--block-k 32 64 128] [--warps 2 4 8]
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import models  # noqa: E402
from bench.recurrences import forward_backward, parse_unit, timed  # noqa: E402
from models.fast import triton_loops  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--units", nargs="+", default=["libru", "lstm"])
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--frames", type=int, default=400)
    parser.add_argument("--bidirectional", action="store_true")
    parser.add_argument("--block-h", nargs="+", type=int, default=[8, 16, 32])
    parser.add_argument("--block-k", nargs="+", type=int, default=[32, 64, 128])
    parser.add_argument("--warps", nargs="+", type=int, default=[2, 4, 8])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--smoke", action="store_true", help="on the CPU, through Triton's interpreter, tiny sizes: "
                        "what the tests run, so that the bench cannot rot (numbers meaningless)")
    args = parser.parse_args()
    if args.smoke:
        args.units, args.hidden, args.batch, args.frames, args.repeats = args.units[:1], 8, 2, 3, 1
        args.block_h, args.block_k, args.warps = [4], [16], [4]
    # a setting that cannot build raises (and is reported), no fallback
    os.environ["BRU_KALDI_TRITON"] = "interpret" if args.smoke else "1"
    if args.smoke:
        os.environ["BRU_KALDI_NATIVE"] = "0"  # on the CPU the C++ kernels would run instead
    if not torch.cuda.is_available() and not args.smoke:
        parser.error("this bench needs a GPU (or --smoke)")
    device = torch.device("cpu" if args.smoke else "cuda")
    x = torch.randn(args.batch, args.frames, 40, device=device)
    lengths = torch.full((args.batch,), args.frames, device=device)
    lstm = torch.nn.LSTM(40, args.hidden, batch_first=True, bidirectional=args.bidirectional).to(device)
    for _ in range(3):
        forward_backward(lstm, x)
    lstm_ms = statistics.median(timed(lambda: forward_backward(lstm, x), device) for _ in range(args.repeats))
    name = torch.cuda.get_device_name() if device.type == "cuda" else "CPU, Triton's interpreter"
    print(f"{name}, H={args.hidden} B={args.batch} T={args.frames} "
          f"{'bi' if args.bidirectional else 'uni'}: nn.LSTM {lstm_ms:.2f} ms forward + backward")
    settings = [(None, None, None)] + list(itertools.product(args.block_h, args.block_k, args.warps))
    for spec in args.units:
        unit, options = parse_unit(spec)
        layer = models.build(unit, 40, args.hidden, bidirectional=args.bidirectional, norm="batch", dropout=0.2,
                             **options).to(device).train()
        for block_h, block_k, warps in settings:
            triton_loops.BLOCK_H, triton_loops.BLOCK_K, triton_loops.NUM_WARPS = block_h, block_k, warps
            try:
                for _ in range(2):
                    forward_backward(layer, x, lengths)
                ms = statistics.median(timed(lambda: forward_backward(layer, x, lengths), device)
                                       for _ in range(args.repeats))
                print(f"{spec:<10} BLOCK_H={block_h or 'default':<7} BLOCK_K={block_k or 'default':<7} "
                      f"warps={warps or 'default':<7} {ms:8.2f} ms  {ms / lstm_ms:5.2f} x nn.LSTM", flush=True)
            except Exception as error:  # a setting this GPU cannot run
                print(f"{spec:<10} {block_h} {block_k} {warps}: {error!r}"[:300], flush=True)
    triton_loops.BLOCK_H = triton_loops.BLOCK_K = triton_loops.NUM_WARPS = None


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""The Triton kernels under stress on a GPU: many production-sized passes, each checked.

Usage: python bench/stress.py [--units libru lstm ...] [--hidden 550] [--frames 1000] [--batch 32]
                              [--passes 100] [--smoke]

For each unit, a bidirectional layer of ``--hidden`` units (float32, no dropout) runs ``--passes``
forward and backward passes in training on one random batch of ``--batch`` sequences of ``--frames``
frames, with ``BRU_KALDI_TRITON=1``: a kernel that cannot run, a pass refused, a barrier that gave up,
all raise instead of falling back. Every pass's output and input gradient must be finite, and every
pass must give the first pass's output and gradient to 1e-5 of their largest values (the kernels are
deterministic, cuBLAS's products around them nearly so: a race, or a barrier that let a program through
early, would show). Prints the milliseconds a pass per unit and, at the end, ``stress: ... passed`` (exit
code 0) or what failed (exit code 1). ``bench/cuda_check.sh`` runs it alone and as two processes on one
GPU at once (each process's grids beside the other's).

``--smoke``: on the CPU through Triton's interpreter at tiny sizes (numbers meaningless): what the tests
run, so that the script cannot rot where no GPU is.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import models  # noqa: E402
from bench.recurrences import parse_unit  # noqa: E402
from models.fast import triton_loops  # noqa: E402
from models.recurrent import set_implementation  # noqa: E402

# every kernel with a grid barrier, and the scans: the gated family's forward and backward kernels (each
# KIND a variant), the LBRU's and its smoothing's, the UBRU's elementwise ones
UNITS = ["libru", "ligru", "lstm", "gru", "mgu", "rnn", "bru", "lbru:layer", "ubru:hmm"]


def stress(spec: str, args, device: torch.device) -> str:
    """Run one unit's passes; returns its result line, raises AssertionError on a bad pass."""
    unit, options = parse_unit(spec)
    torch.manual_seed(0)
    layer = set_implementation(models.build(unit, 40, args.hidden, bidirectional=True, **options), "fast")
    layer = layer.to(device).train()
    x = torch.randn(args.batch, args.frames, 40, device=device)
    lengths = torch.full((args.batch,), args.frames, device=device)
    lengths[1::2] = max(1, args.frames - 7)  # ragged: the padding's handling under stress too
    first = None
    start = time.perf_counter()
    for done in range(args.passes):
        inputs = x.clone().requires_grad_()
        out = layer(inputs, lengths)
        out.square().mean().backward()
        result = (out.detach(), inputs.grad)
        finite = all(bool(torch.isfinite(t).all()) for t in result)
        assert finite, f"{spec}: pass {done + 1} is not finite"
        if first is None:
            first = result
        else:
            gap = max(float((a - b).abs().max() / a.abs().max().clamp_min(1e-30)) for a, b in zip(first, result))
            assert gap <= 1e-5, f"{spec}: pass {done + 1} differs from pass 1 by {gap:.1e} of its largest value"
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    ms = (time.perf_counter() - start) * 1000 / args.passes
    launches = sum(triton_loops.LAUNCHES.values())
    return f"{spec:<11} {args.passes} passes, {ms:8.2f} ms a pass (the first compiles), all finite and alike; " \
           f"{launches} kernel launches so far"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--units", nargs="+", default=UNITS)
    parser.add_argument("--hidden", type=int, default=550)
    parser.add_argument("--frames", type=int, default=1000)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--passes", type=int, default=100)
    parser.add_argument("--smoke", action="store_true",
                        help="on the CPU through Triton's interpreter, tiny sizes (numbers meaningless)")
    args = parser.parse_args(argv)
    if args.smoke:
        args.units, args.hidden, args.frames, args.batch, args.passes = args.units[:2], 8, 3, 2, 2
        os.environ["BRU_KALDI_NATIVE"] = "0"  # on the CPU the C++ kernels would run instead
    elif not torch.cuda.is_available():
        parser.error("this bench needs a GPU (or --smoke)")
    os.environ["BRU_KALDI_TRITON"] = "interpret" if args.smoke else "1"  # no fallback: a failure raises
    device = torch.device("cpu") if args.smoke else torch.device("cuda", torch.cuda.current_device())
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU, Triton's interpreter"
    print(f"{name} (pid {os.getpid()}): H={args.hidden} both ways, B={args.batch}, T={args.frames}, float32",
          flush=True)
    failed = []
    for spec in args.units:
        try:
            print(stress(spec, args, device), flush=True)
        except Exception as error:  # noqa: BLE001 (each unit's failure is reported, then the next runs)
            failed.append(spec)
            print(f"{spec:<11} FAILED: {error!r}"[:1000], flush=True)
    print(f"stress: {len(args.units) - len(failed)} of {len(args.units)} units passed"
          + (f"; failed: {' '.join(failed)}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

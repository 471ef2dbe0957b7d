"""Speed of the recurrent layers: fast path vs. the reference loop vs. ``torch.nn.LSTM``.

For each unit and size, prints milliseconds for the forward pass (no gradients) and for forward +
backward (float32, ``B`` sequences of ``T`` frames, ``F`` inputs, full lengths), and the ratios to
``torch.nn.LSTM`` (oneDNN on the CPU, cuDNN on a GPU) of the same sizes and to the unit's own reference
loop, all measured in one run. Each timing is the median of ``--repeats`` runs after a warm-up, and the
fast path and the LSTM are timed in turn within each repeat so that both see the same load.

By default (about 1-2 minutes on 2 CPU cores) every unit at H=256 unidirectional, plus one
bidirectional row (Li-BRU, H=256); ``--full`` runs the whole grid (H=256 and 550, uni and bi).

Usage: python bench/recurrences.py [--full] [--hidden 256 550] [--directions uni bi] [--units libru ...]
  e.g. python bench/recurrences.py --hidden 256 --directions uni --units libru ubru:kalman --repeats 3
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import models  # noqa: E402
from models.recurrent import set_implementation  # noqa: E402

UNITS = ["libru", "ligru", "lbru", "ubru", "ubru:kalman", "ubru:hmm"]


def parse_unit(spec: str):
    """``"ubru:kalman"`` -> ``("ubru", {"backward": "kalman"})``."""
    unit, _, backward = spec.partition(":")
    return unit, ({"backward": backward} if backward else {})


def synchronize(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def timed(fn, device) -> float:
    synchronize(device)
    start = time.perf_counter()
    fn()
    synchronize(device)
    return (time.perf_counter() - start) * 1e3


def forward_only(module, x, *args):
    with torch.no_grad():
        module(x, *args)


def forward_backward(module, x, *args):
    x = x.detach().requires_grad_()
    out = module(x, *args)
    out = out[0] if isinstance(out, tuple) else out
    out.sum().backward()
    module.zero_grad(set_to_none=True)


def measure(module, x, args, device, repeats, warm_up=True):
    """(median ms forward, median ms forward + backward), after one warm-up of each if ``warm_up``;
    ``repeats=0`` only warms up."""
    if warm_up or not repeats:
        forward_only(module, x, *args)
        forward_backward(module, x, *args)
    if not repeats:
        return None
    fwd = [timed(lambda: forward_only(module, x, *args), device) for _ in range(repeats)]
    both = [timed(lambda: forward_backward(module, x, *args), device) for _ in range(repeats)]
    return statistics.median(fwd), statistics.median(both)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--units", nargs="+", default=UNITS, help="unit[:backward], e.g. ubru:kalman")
    parser.add_argument("--full", action="store_true", help="H=256 and 550, uni and bi, every unit")
    parser.add_argument("--hidden", nargs="+", type=int, help="hidden sizes (default 256; --full: 256 550)")
    parser.add_argument("--directions", nargs="+", choices=["uni", "bi"],
                        help="directions (default uni plus one bi row; --full: uni bi)")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--frames", type=int, default=400)
    parser.add_argument("--features", type=int, default=40)
    parser.add_argument("--repeats", type=int, default=3, help="timed runs of the fast path and the LSTM")
    parser.add_argument("--reference-repeats", type=int, default=1, help="timed runs of the (slow) reference loop; 0 skips it")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()
    print(" ".join(sys.argv))
    for spec in args.units:
        unit, _ = parse_unit(spec)
        if unit not in models.UNITS:
            parser.error(f"unknown unit {unit!r}; expected one of {', '.join(models.UNITS)}")

    rows = [(h, d, spec) for h in (args.hidden or ([256, 550] if args.full else [256]))
            for d in (args.directions or (["uni", "bi"] if args.full else ["uni"])) for spec in args.units]
    if not (args.full or args.hidden or args.directions):
        rows.append((256, "bi", args.units[0]))  # the default run's one bidirectional row

    device = torch.device(args.device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or platform.machine()
    print(f"torch {torch.__version__}, device {device} ({name}), {torch.get_num_threads()} threads, "
          f"B={args.batch} T={args.frames} F={args.features}, float32, medians of {args.repeats} "
          f"(reference loop: {args.reference_repeats})")
    torch.manual_seed(0)
    x = torch.randn(args.batch, args.frames, args.features, device=device)
    lengths = torch.full((args.batch,), args.frames, device=device)
    header = (f"{'unit':<12} {'H':>4} {'dir':<4} {'fast fwd':>9} {'fast f+b':>9} {'ref fwd':>9} {'ref f+b':>9} "
              f"{'LSTM fwd':>9} {'LSTM f+b':>9} {'f+b/LSTM':>9} {'fwd/LSTM':>9} {'ref/fast':>9}")
    print(header)
    print("-" * len(header))
    lstms = {}
    for hidden, direction, spec in rows:
        bidirectional = direction == "bi"
        if (hidden, direction) not in lstms:
            lstms[hidden, direction] = torch.nn.LSTM(args.features, hidden, batch_first=True,
                                                     bidirectional=bidirectional).to(device)
        lstm = lstms[hidden, direction]
        unit, options = parse_unit(spec)
        layer = models.build(unit, args.features, hidden, bidirectional=bidirectional, **options).to(device)
        fast = set_implementation(layer, "fast")
        measure(fast, x, (lengths,), device, 0)  # warm-up of both, once
        measure(lstm, x, (), device, 0)
        fast_f, fast_b, lstm_f, lstm_b = [], [], [], []
        for _ in range(args.repeats):  # alternate, so that both see the same load
            f, b = measure(fast, x, (lengths,), device, 1, warm_up=False)
            fast_f.append(f), fast_b.append(b)
            f, b = measure(lstm, x, (), device, 1, warm_up=False)
            lstm_f.append(f), lstm_b.append(b)
        # The fast path has warmed up the same kernels; the reference loop is too slow to run twice.
        ref_f = ref_b = float("nan")  # --reference-repeats 0 skips the reference loop
        if args.reference_repeats:
            ref_f, ref_b = measure(set_implementation(layer, "reference"), x, (lengths,), device,
                                   args.reference_repeats, warm_up=False)
        fast_f, fast_b = statistics.median(fast_f), statistics.median(fast_b)
        lstm_f, lstm_b = statistics.median(lstm_f), statistics.median(lstm_b)
        print(f"{spec:<12} {hidden:>4} {direction:<4} {fast_f:>9.1f} {fast_b:>9.1f} {ref_f:>9.1f} {ref_b:>9.1f} "
              f"{lstm_f:>9.1f} {lstm_b:>9.1f} {fast_b / lstm_b:>9.2f} {fast_f / lstm_f:>9.2f} "
              f"{ref_b / fast_b:>9.1f}", flush=True)


if __name__ == "__main__":
    main()

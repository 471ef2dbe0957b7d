"""Speed of the recurrent layers: fast path vs. the reference loop vs. ``torch.nn.LSTM``.

For each unit, configuration and size, prints milliseconds for the forward pass (no gradients) and for
forward + backward (float32, ``B`` sequences of ``T`` frames, ``F`` inputs, full lengths), and the ratios
to ``torch.nn.LSTM`` (oneDNN on the CPU, cuDNN on a GPU) of the same sizes and to the unit's own reference
loop, all measured in one run. Each timing is the median of ``--repeats`` runs after a warm-up, and the
fast path and the LSTM are timed in turn within each repeat so that both see the same load (the load
average is printed before and after: on a shared machine a ratio moves by 0.1-0.2 between runs).

Two configurations of our layers (``torch.nn.LSTM`` is always the plain layer):

* ``plain``: ``models.build(unit, F, H)``, no norm, no dropout;
* ``cfg``: as the configs train them, ``norm="batch"`` on the projections and ``dropout=0.2``, in training mode.

By default (about 1-2 minutes on 2 idle CPU cores) every unit at H=256 unidirectional, B=16, in both
configurations, without the reference loops (``--reference-repeats 1`` adds them: minutes more, the
baselines' loops take 5-20 s a pass); ``--targets`` runs the sizes the baselines' targets are set at,
in the ``cfg`` configuration (H=256 uni B=16 and H=550 bi B=8, with the target column); ``--full`` the
whole grid (H=256 and 550, uni and bi, B=16, both configurations).

Usage: python bench/recurrences.py [--targets | --full] [--hidden 256 550] [--directions uni bi]
                                   [--configs plain cfg] [--units lstm rnn:relu ubru:kalman ...]
  e.g. python bench/recurrences.py --hidden 256 --directions uni --units libru ubru:kalman --reference-repeats 1
       python bench/recurrences.py --targets --repeats 7   (on a loaded machine: more repeats)
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

UNITS = ["lstm", "gru", "mgu", "rnn", "rnn:relu", "ligru", "libru", "bru", "lbru", "ubru", "ubru:kalman", "ubru:hmm"]
CONFIGS = {"plain": {}, "cfg": {"norm": "batch", "dropout": 0.2}}
# forward + backward / nn.LSTM, in the cfg configuration at the --targets sizes
TARGETS = {"lstm": 1.2, "gru": 1.0, "mgu": 0.6, "rnn": 0.4, "rnn:relu": 0.4}


def parse_unit(spec: str):
    """``"ubru:kalman"`` -> ``("ubru", {"backward": "kalman"})``, ``"rnn:relu"`` -> ``("rnn", {"activation": "relu"})``:
    the value goes to the unit's first option among ``backward``, ``activation``, ``form``."""
    unit, _, value = spec.partition(":")
    if not value:
        return unit, {}
    option = next((o for o in ("backward", "activation", "form") if o in models.cell_options(unit)), None)
    if option is None:
        raise ValueError(f"{unit} takes no option for {value!r}")
    return unit, {option: value}


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def load_average() -> str:
    try:
        return " ".join(f"{v:.2f}" for v in os.getloadavg())
    except OSError:
        return "n/a"


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


def plan(args) -> list[tuple[str, int, str, int, str]]:
    """The rows, ``(config, H, direction, B, unit spec)``."""
    if args.targets:
        shapes = [(256, "uni", 16), (550, "bi", 8)]
        configs = args.configs or ["cfg"]
    else:
        hidden = args.hidden or ([256, 550] if args.full else [256])
        directions = args.directions or (["uni", "bi"] if args.full else ["uni"])
        shapes = [(h, d, args.batch or 16) for h in hidden for d in directions]
        configs = args.configs or list(CONFIGS)
    return [(c, h, d, b, spec) for c in configs for h, d, b in shapes for spec in args.units]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--units", nargs="+", default=UNITS, help="unit[:option], e.g. ubru:kalman, rnn:relu")
    grid = parser.add_mutually_exclusive_group()
    grid.add_argument("--full", action="store_true", help="H=256 and 550, uni and bi, B=16, both configurations")
    grid.add_argument("--targets", action="store_true", help="cfg configuration at H=256 uni B=16 and H=550 bi B=8")
    parser.add_argument("--hidden", nargs="+", type=int, help="hidden sizes (default 256; --full: 256 550)")
    parser.add_argument("--directions", nargs="+", choices=["uni", "bi"], help="directions (default uni; --full: uni bi)")
    parser.add_argument("--configs", nargs="+", choices=list(CONFIGS), help="configurations (default: both; --targets: cfg)")
    parser.add_argument("--batch", type=int, help="B (default 16; --targets sets its own)")
    parser.add_argument("--frames", type=int, default=400)
    parser.add_argument("--features", type=int, default=40)
    parser.add_argument("--repeats", type=int, default=3, help="timed runs of the fast path and the LSTM")
    parser.add_argument("--reference-repeats", type=int, default=0, help="timed runs of the (slow) reference loop")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()
    if args.targets and (args.hidden or args.directions or args.batch):
        parser.error("--targets sets its own sizes: leave out --hidden, --directions and --batch")
    print(" ".join(sys.argv))
    try:
        for spec in args.units:
            if parse_unit(spec)[0] not in models.UNITS:
                parser.error(f"unknown unit in {spec!r}; expected one of {', '.join(models.UNITS)}")
    except ValueError as error:
        parser.error(str(error))

    device = torch.device(args.device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_model()
    print(f"torch {torch.__version__}, device {device} ({name}), {torch.get_num_threads()} threads, "
          f"T={args.frames} F={args.features}, float32, medians of {args.repeats}; load average {load_average()}")
    torch.manual_seed(0)
    header = (f"{'unit':<12} {'config':<6} {'H':>4} {'dir':<4} {'B':>3} {'fast fwd':>9} {'fast f+b':>9} {'ref fwd':>9} "
              f"{'ref f+b':>9} {'LSTM fwd':>9} {'LSTM f+b':>9} {'f+b/LSTM':>9} {'fwd/LSTM':>9} {'ref/fast':>9} "
              f"{'target':>7}")
    print(header)
    print("-" * len(header))
    lstms, inputs = {}, {}
    for config, hidden, direction, batch, spec in plan(args):
        bidirectional = direction == "bi"
        if batch not in inputs:
            inputs[batch] = (torch.randn(batch, args.frames, args.features, device=device),
                             torch.full((batch,), args.frames, device=device))
        x, lengths = inputs[batch]
        if (hidden, direction) not in lstms:
            lstms[hidden, direction] = torch.nn.LSTM(args.features, hidden, batch_first=True,
                                                     bidirectional=bidirectional).to(device)
        lstm = lstms[hidden, direction]
        unit, options = parse_unit(spec)
        layer = models.build(unit, args.features, hidden, bidirectional=bidirectional, **CONFIGS[config], **options)
        fast = set_implementation(layer.to(device).train(), "fast")
        measure(fast, x, (lengths,), device, 0)  # warm-up of both, once
        measure(lstm, x, (), device, 0)
        fast_f, fast_b, lstm_f, lstm_b = [], [], [], []
        for _ in range(args.repeats):  # alternate, so that both see the same load
            f, b = measure(fast, x, (lengths,), device, 1, warm_up=False)
            fast_f.append(f), fast_b.append(b)
            f, b = measure(lstm, x, (), device, 1, warm_up=False)
            lstm_f.append(f), lstm_b.append(b)
        # The fast path has warmed up the same kernels; the reference loop is too slow to run twice.
        ref_f = ref_b = float("nan")  # printed when the reference loop is skipped
        if args.reference_repeats:
            ref_f, ref_b = measure(set_implementation(layer, "reference"), x, (lengths,), device,
                                   args.reference_repeats, warm_up=False)
        fast_f, fast_b = statistics.median(fast_f), statistics.median(fast_b)
        lstm_f, lstm_b = statistics.median(lstm_f), statistics.median(lstm_b)
        target = TARGETS.get(spec) if config == "cfg" else None
        print(f"{spec:<12} {config:<6} {hidden:>4} {direction:<4} {batch:>3} {fast_f:>9.1f} {fast_b:>9.1f} "
              f"{ref_f:>9.1f} {ref_b:>9.1f} {lstm_f:>9.1f} {lstm_b:>9.1f} {fast_b / lstm_b:>9.2f} "
              f"{fast_f / lstm_f:>9.2f} {ref_b / fast_b:>9.1f} {f'<= {target}' if target else '':>7}", flush=True)
    print(f"load average {load_average()}")


if __name__ == "__main__":
    main()

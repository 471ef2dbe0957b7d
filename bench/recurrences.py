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

For the units with a recurrent matrix two more columns show how far the layer is from the limit its
per-step products set: ``GF/s mm`` is what ``torch.mm`` reaches on one step's product (``B x H`` times
``H x G*H``, ``T`` of them in a row, in this run), ``GF/s fwd`` the same products' flops divided by the
whole forward pass of the layer (projection, norm, elementwise work and all). The header names the CPU,
the vector ISA torch dispatches to, the BLAS and the build of our C++ kernels.

Then a whole training step (``--step``, on by default): ``cfg/TIMIT_liBRU.cfg``'s network (4 x 550 Li-BRU
both ways, batch norm, dropout 0.2, senone and monophone outputs, cross-entropy, RMSprop) against the same
network with ``nn.LSTM`` layers (dropout, no norm: the LSTM fuses its input projection), B=8, T frames.

By default (about 3-4 minutes on 2 idle CPU cores) every unit in the ``plain`` configuration at H=256 one
way, B=16, and in the ``cfg`` configuration at the target sizes (H=256 one way B=16, H=550 both ways B=8,
with the target column), then the whole step; ``--targets`` only the ``cfg`` rows and the step;
``--full`` the whole grid (H=256 and 550, uni and bi, B=16, both configurations). ``--reference-repeats 1``
adds the reference loops (minutes more: the baselines' loops take 5-20 s a pass). ``--markdown F`` also
writes the ratios as a Markdown table; with ``--section NAME`` the table replaces the block between
``<!-- bench NAME -->`` and ``<!-- /bench NAME -->`` of F instead (how RESULTS.md gets its speed tables).

Usage: python bench/recurrences.py [--targets | --full] [--hidden 256 550] [--directions uni bi]
                                   [--configs plain cfg] [--units lstm rnn:relu ubru:kalman ...] [--no-step]
                                   [--markdown F [--section NAME]]
  e.g. python bench/recurrences.py --hidden 256 --directions uni --units libru ubru:kalman --reference-repeats 1
       python bench/recurrences.py --targets --repeats 7   (on a loaded machine: more repeats)
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import models  # noqa: E402
from bru_kaldi.atomic import write_text_atomically  # noqa: E402
from bru_kaldi.comparison.report import splice  # noqa: E402
from bru_kaldi.machine import cpu_model, load_average  # noqa: E402
from models.recurrent import set_implementation  # noqa: E402

UNITS = ["lstm", "gru", "mgu", "rnn", "rnn:relu", "ligru", "libru", "bru", "lbru", "ubru", "ubru:kalman", "ubru:hmm"]
CONFIGS = {"plain": {}, "cfg": {"norm": "batch", "dropout": 0.2}}
# forward + backward / nn.LSTM, in the cfg configuration at the --targets sizes, on a CPU (oneDNN's LSTM)
# and on a GPU (cuDNN's), where the Li-BRU and the Li-GRU do half an LSTM's recurrent work (a limit of
# about 0.5) and the UBRU none
TARGETS = {"cpu": {"lstm": 1.2, "gru": 1.0, "mgu": 0.6, "rnn": 0.4, "rnn:relu": 0.4,
                   "libru": 0.6, "ligru": 0.6, "lbru": 0.8, "ubru:kalman": 0.3},
           "cuda": {"lstm": 1.5, "gru": 1.5, "mgu": 1.5, "libru": 1.0, "ligru": 1.0, "lbru": 1.2,
                    "ubru:kalman": 0.3, "ubru:hmm": 0.3}}
# the whole TIMIT_liBRU training step / the same network with nn.LSTM layers
STEP_TARGET = {"cpu": 0.6, "cuda": 1.0}
TARGET_SHAPES = [(256, "uni", 16), (550, "bi", 8)]


def parse_unit(spec: str):
    """``"ubru:kalman"`` -> ``("ubru", {"backward": "kalman"})``, ``"rnn:relu"`` -> ``("rnn", {"activation": "relu"})``:
    the value goes to the unit's first option (``models.unit_options``), as text."""
    unit, _, value = spec.partition(":")
    if not value:
        return unit, {}
    option = next(iter(models.unit_options(unit)), None)
    if option is None:
        raise ValueError(f"{unit} takes no option for {value!r}")
    return unit, {option: value}


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
    """(median ms forward, median ms forward + backward), after warming up each if ``warm_up``;
    ``repeats=0`` only warms up.

    One warm-up on the CPU; three on CUDA, where TorchScript profiles and optimises a loop over its
    first calls: with one, an H200 once timed the LSTM's forward + backward at 314 ms, and at 62 ms in
    the next run."""
    if warm_up or not repeats:
        for _ in range(3 if device.type == "cuda" else 1):
            forward_only(module, x, *args)
            forward_backward(module, x, *args)
    if not repeats:
        return None
    fwd = [timed(lambda: forward_only(module, x, *args), device) for _ in range(repeats)]
    both = [timed(lambda: forward_backward(module, x, *args), device) for _ in range(repeats)]
    return statistics.median(fwd), statistics.median(both)


def plan(args) -> list[tuple[str, int, str, int, str]]:
    """The rows, ``(config, H, direction, B, unit spec)``."""
    if args.full or args.hidden or args.directions or args.batch:
        hidden = args.hidden or ([256, 550] if args.full else [256])
        directions = args.directions or (["uni", "bi"] if args.full else ["uni"])
        shapes = [(h, d, args.batch or 16) for h in hidden for d in directions]
        rows = [(c, shape) for c in (args.configs or list(CONFIGS)) for shape in shapes]
    else:  # the defaults: plain at H=256 (unless --targets), cfg at the target sizes
        configs = args.configs or (["cfg"] if args.targets else list(CONFIGS))
        rows = [(c, shape) for c in configs for shape in ([TARGET_SHAPES[0]] if c == "plain" else TARGET_SHAPES)]
    return [(c, h, d, b, spec) for c, (h, d, b) in rows for spec in args.units]


def recurrent_gates(layer) -> int:
    """``G`` of a layer's per-step product ``h_{t-1} U`` (``U`` is ``H x G*H``), 0 without one."""
    cell = getattr(layer, "cells", [None])[0]
    recurrent = getattr(cell, "recurrent", None)
    return recurrent.weight.size(0) // recurrent.weight.size(1) if isinstance(recurrent, torch.nn.Linear) else 0


def mm_ms(batch, hidden, gates, frames, device, repeats) -> float:
    """Median ms of ``frames`` products ``(B, H) @ (H, G*H)`` in a row, each fed the previous result's
    first ``H`` columns, as a recurrence's products are."""
    h, weight = torch.randn(batch, hidden, device=device), torch.randn(hidden, gates * hidden, device=device) / hidden

    def chain():
        x = h
        for _ in range(frames):
            x = torch.mm(x, weight)[:, :hidden]
    chain()
    return statistics.median(timed(chain, device) for _ in range(repeats))


def build_flags_name() -> str:
    try:
        from models.fast import native
        return native.loaded_build() if native.native_ops(torch.zeros(1)) is not None else "TorchScript only"
    except Exception as error:  # pragma: no cover - printed, not fatal
        return f"not built ({error})"


def triton_name(device) -> str:
    """The kernels the fast paths run on ``device``, and the precision of cuDNN's products."""
    from models.fast import triton_loops
    try:
        import triton
        version = f"Triton {triton.__version__}"
    except ImportError:
        version = "no Triton"
    route = "Triton kernels" if triton_loops.route(torch.zeros(1, device=device)) is not None else "TorchScript loops"
    tf32 = "TF32" if torch.backends.cudnn.allow_tf32 else "float32"
    return f"{route} ({version}); cuDNN's LSTM products in {tf32}"


def blas_name() -> str:
    for line in torch.__config__.show().splitlines():
        if "BLAS_INFO" in line:
            return line.split("BLAS_INFO=")[1].split(",")[0]
    return "unknown"


def training_step_ms(args, device) -> tuple[float, float]:
    """Median ms of one training step of TIMIT_liBRU's network and of the same with ``nn.LSTM`` layers."""
    from models.acoustic import AcousticModel
    batch, num_senones, num_mono = 8, 1920, 48  # about TIMIT tri3's pdfs; its 48 monophones
    x = torch.randn(batch, args.frames, args.features, device=device)
    lengths = torch.full((batch,), args.frames, device=device)
    senones = torch.randint(num_senones, (batch * args.frames,), device=device)
    mono = torch.randint(num_mono, (batch * args.frames,), device=device)
    nets = {}
    for name, unit, norm in (("libru", "libru", "batch"), ("lstm", "cudnn_lstm", None)):
        stack = models.build_stack(unit, args.features, [550] * 4, bidirectional=True, dropout=0.2, norm=norm)
        net = AcousticModel([stack], num_senones, num_mono).to(device).train()
        nets[name] = (net, torch.optim.RMSprop(net.parameters(), lr=4e-4, alpha=0.95, eps=1e-8))

    def step(name):
        net, optimiser = nets[name]
        out = net(x, lengths)
        loss = (torch.nn.functional.cross_entropy(out["senone"].flatten(0, 1), senones)
                + torch.nn.functional.cross_entropy(out["mono"].flatten(0, 1), mono))
        optimiser.zero_grad(set_to_none=True)
        loss.backward()
        optimiser.step()

    for name in nets:
        step(name)  # warm-up
    times = {name: [] for name in nets}
    for _ in range(args.repeats):
        for name in nets:
            times[name].append(timed(lambda: step(name), device))
    return statistics.median(times["libru"]), statistics.median(times["lstm"])


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
    parser.add_argument("--no-step", dest="step", action="store_false", help="leave out the whole training step")
    parser.add_argument("--markdown", help="also write the ratios to this file as a Markdown table")
    parser.add_argument("--section", help="with --markdown F: replace that section of F (between "
                                         "<!-- bench SECTION --> and <!-- /bench SECTION -->)")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, a few seconds: what the tests run, so that "
                        "the bench cannot rot (numbers meaningless)")
    args = parser.parse_args()
    if args.smoke:
        args.units, args.hidden, args.directions, args.frames, args.repeats = ["libru", "ubru:kalman"], [8], ["bi"], 6, 1
        args.configs, args.step = ["cfg"], False
    if args.section and not args.markdown:
        parser.error("--section needs --markdown FILE (the file whose section is replaced)")
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
    targets = TARGETS["cuda" if device.type == "cuda" else "cpu"]
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_model()
    kernels = build_flags_name() if device.type == "cpu" else triton_name(device)
    machine = (f"torch {torch.__version__}, device {device} ({name}), {torch.get_num_threads()} threads, "
               f"ISA {torch.backends.cpu.get_cpu_capability()}, BLAS {blas_name()}, our kernels {kernels}")
    print(machine)
    print(f"T={args.frames} F={args.features}, float32, medians of {args.repeats}; load average {load_average()}")
    table = ["| unit | config | H | dir | B | fwd+bwd / nn.LSTM | target |", "| --- | --- | ---: | --- | ---: | ---: | ---: |"]
    torch.manual_seed(0)
    header = (f"{'unit':<12} {'config':<6} {'H':>4} {'dir':<4} {'B':>3} {'fast fwd':>9} {'fast f+b':>9} {'ref fwd':>9} "
              f"{'ref f+b':>9} {'LSTM fwd':>9} {'LSTM f+b':>9} {'f+b/LSTM':>9} {'fwd/LSTM':>9} {'ref/fast':>9} "
              f"{'GF/s mm':>8} {'GF/s fwd':>8} {'target':>7}")
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
        measure(fast, x, (lengths,), device, 0)  # the warm-ups of both
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
        target = targets.get(spec) if config == "cfg" and (hidden, direction, batch) in TARGET_SHAPES else None
        gates, mm_rate, fwd_rate = recurrent_gates(layer), float("nan"), float("nan")
        if gates:
            flops = 2 * batch * hidden * gates * hidden * args.frames * (2 if bidirectional else 1)
            mm_rate = flops / (2 if bidirectional else 1) / mm_ms(batch, hidden, gates, args.frames, device, 3) / 1e6
            fwd_rate = flops / fast_f / 1e6
        met = "" if target is None else (" met" if fast_b / lstm_b <= target else " MISSED")
        print(f"{spec:<12} {config:<6} {hidden:>4} {direction:<4} {batch:>3} {fast_f:>9.1f} {fast_b:>9.1f} "
              f"{ref_f:>9.1f} {ref_b:>9.1f} {lstm_f:>9.1f} {lstm_b:>9.1f} {fast_b / lstm_b:>9.2f} "
              f"{fast_f / lstm_f:>9.2f} {ref_b / fast_b:>9.1f} {mm_rate:>8.1f} {fwd_rate:>8.1f} "
              f"{f'<= {target}{met}' if target else '':>7}", flush=True)
        table.append(f"| {spec} | {config} | {hidden} | {direction} | {batch} | {fast_b / lstm_b:.2f} | "
                     f"{f'<= {target}{met}' if target else ''} |")
    if args.step:
        libru_ms, lstm_ms = training_step_ms(args, device)
        step_target = STEP_TARGET[device.type if device.type in STEP_TARGET else "cpu"]
        met = "met" if libru_ms / lstm_ms <= step_target else "MISSED"
        line = (f"whole training step of TIMIT_liBRU's network (4 x 550 both ways, B=8, T={args.frames}): "
                f"{libru_ms:.0f} ms, with nn.LSTM layers {lstm_ms:.0f} ms: {libru_ms / lstm_ms:.2f} "
                f"(target <= {step_target}: {met})")
        print(line)
        table.append(f"| TIMIT_liBRU step | cfg | 550 | bi | 8 | {libru_ms / lstm_ms:.2f} | <= {step_target} {met} |")
    if args.markdown:
        text = (f"`{' '.join(sys.argv)}` on {time.strftime('%Y-%m-%d')}: {machine}; T={args.frames}, medians of "
                f"{args.repeats}, load average at the end {load_average()}\n\n" + "\n".join(table))
        if args.section:
            with open(args.markdown) as f:
                text = splice(f.read(), args.section, text, tool="bench")
        write_text_atomically(args.markdown, text + ("" if args.section else "\n"))
    print(f"load average {load_average()}")


if __name__ == "__main__":
    main()

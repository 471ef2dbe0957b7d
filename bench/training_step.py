"""Where one training step of a config's network goes, and the floor its parts set for training.

The network a config describes (default ``cfg/MINI_liBRU.cfg``, the README's main job) is built as
``run_exp.py`` builds it, and on one batch of the config's ``batch_size_train`` sequences of ``T`` frames
(all of full length) the bench times, in turn within each repeat so that all see the same load:

* the step as ``run_exp.py`` runs it: forward, loss, backward, gradient clipping, optimiser step;
* its parts alone, each forward + backward on inputs of the step's shapes: every layer's input
  projection (one product for both directions), every direction's recurrence (the cell's fast path with
  its recurrent weight gradient), the output layers; any other layer (torch's own ``cudnn_lstm``, whose
  projection is inside it, an MLP) as one part;
* the rest: the step less its parts. That is norms, dropout, the padding and direction bookkeeping, loss,
  clipping and the optimiser, plus whatever runs slower inside the step than alone (caches, threads).

An epoch of ``--epoch-frames`` frames is about ``frames / (B*T)`` such steps (length-sorted batches add a
little padding: 4 % more recurrence steps on the built-in corpus). The bench prints the config's
``n_epochs_tr`` epochs of training at the step's speed, and at the parts' speed with nothing else, against
``--budget`` seconds. The second is a floor for this machine and these kernels: training takes at least
as long as its products and recurrences, whatever the rest costs. The defaults (280 inputs, 119 pdfs,
364,576 frames an epoch) are the built-in corpus's with the MINI configs' splicing; pass a corpus's own
with ``--input-dim``, ``--pdfs`` and ``--epoch-frames``. A config that names its data through environment
variables needs them set, as for ``run_exp.py``; the bench reads no data. The budget line is printed for
the main job's config (2 minutes) or with ``--budget``.

Usage: python bench/training_step.py [CFG] [--section,option=value ...] [--frames T] [--repeats N]
                                     [--input-dim F] [--pdfs C] [--epoch-frames N] [--budget SECONDS]
                                     [--device cpu|cuda]
  e.g. python bench/training_step.py                       (the main job's network, 2 minutes' budget)
       python bench/training_step.py cfg/MINI_LSTM.cfg --architecture1,unit=cudnn_lstm --architecture1,norm=none
       TIMIT_FMLLR=. TIMIT_EXP=. python bench/training_step.py cfg/TIMIT_liBRU.cfg --input-dim 40 --pdfs 1920
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
MAIN_JOB = os.path.join(os.path.dirname(HERE), "cfg", "MINI_liBRU.cfg")
MAIN_JOB_BUDGET = 120.0  # seconds: the README's main job on 2 idle cores
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)  # bench/ is a folder of scripts: the timing helpers live in recurrences.py
from bru_kaldi.config import parse_config  # noqa: E402
from bru_kaldi.machine import cpu_model, load_average  # noqa: E402
from bru_kaldi.network import build_model, trained_architectures  # noqa: E402
from bru_kaldi.training import autocast, batch_loss, gradient_norm, make_optimizer  # noqa: E402
from models.fast.products import linear  # noqa: E402
from recurrences import blas_name, build_flags_name, timed  # noqa: E402


class Part:
    """One part of the step, run forward + backward alone: ``run()`` does it once."""

    def __init__(self, name: str, run, flops: float):
        self.name, self.run, self.flops = name, run, flops
        self.times: list[float] = []


def forward_backward(forward, inputs: list[torch.Tensor], parameters):
    """A function that runs ``forward()`` and backpropagates a fixed random gradient through it, then
    drops every gradient it made (so that a part never accumulates into the step's or its own).
    The gradient is drawn once: drawing a fresh one each time costs about as much as a product."""
    gradient = forward().detach().normal_()

    def run():
        forward().backward(gradient)
        for tensor in [*inputs, *parameters]:
            tensor.grad = None
    return run


def projection_part(layer, index: int, frames: int, batch: int, needs_input_grad: bool, device) -> Part:
    weight, bias = layer.proj.weight, layer.proj.bias
    x = torch.randn(frames, batch, layer.input_size, device=device, requires_grad=needs_input_grad)
    flops = 2 * frames * batch * weight.numel() * (3 if needs_input_grad else 2)  # forward, weight grad (input grad)
    run = forward_backward(lambda: linear(x, weight, bias), [x], list(layer.proj.parameters()))
    return Part(f"layer {index} projection {layer.input_size} -> {weight.size(0)}", run, flops)


def recurrence_part(layer, index: int, direction: int, frames: int, batch: int, device) -> Part:
    cell = layer.cells[direction]
    width = cell.num_gates * layer.hidden_size
    proj = torch.randn(frames, batch, width, device=device, requires_grad=True)  # time-major, as the layer has it
    lengths = torch.full((batch,), frames, device=device)
    recurrent = getattr(cell, "recurrent", None)
    # the per-step products h_{t-1} U, forward and backward, and the weight gradient: 3 x 2 flops a weight
    flops = 6 * frames * batch * recurrent.weight.numel() if isinstance(recurrent, torch.nn.Linear) else 0.0
    name = f"layer {index} recurrence{' (backward direction)' if direction else ''}, H={layer.hidden_size}"
    return Part(name, forward_backward(lambda: cell(proj.transpose(0, 1), lengths)[0], [proj], list(cell.parameters())),
                flops)


def whole_layer_part(layer, index: int, frames: int, batch: int, needs_input_grad: bool, device) -> Part:
    x = torch.randn(batch, frames, layer.input_size, device=device, requires_grad=needs_input_grad)
    lengths = torch.full((batch,), frames, device=device)
    run = forward_backward(lambda: layer(x, lengths), [x], list(layer.parameters()))
    return Part(f"layer {index} {type(layer).__name__}, whole", run, 0.0)


def output_part(head: torch.nn.Linear, name: str, frames: int, batch: int, device) -> Part:
    x = torch.randn(frames, batch, head.in_features, device=device, requires_grad=True)
    flops = 6 * frames * batch * head.weight.numel()
    run = forward_backward(lambda: linear(x, head.weight, head.bias), [x], list(head.parameters()))
    return Part(f"{name} output {head.in_features} -> {head.out_features}", run, flops)


def parts_of(model, frames: int, batch: int, device) -> list[Part]:
    """Every projection, recurrence and output layer of ``model``, in the order the step runs them."""
    parts, index = [], 0
    for stack in model.stacks:
        for layer in stack.layers:
            index += 1
            if not hasattr(layer, "cells"):  # torch's own layer (cudnn_lstm: its projection is inside), an MLP
                parts.append(whole_layer_part(layer, index, frames, batch, index > 1, device))
                continue
            parts.append(projection_part(layer, index, frames, batch, index > 1, device))
            parts += [recurrence_part(layer, index, d, frames, batch, device) for d in range(layer.num_directions)]
    for name in ("senone", "mono"):
        if getattr(model, name) is not None:
            parts.append(output_part(getattr(model, name), name, frames, batch, device))
    return parts


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("cfg", nargs="?", default=MAIN_JOB)
    parser.add_argument("--frames", type=int, default=400, help="T of the batch")
    parser.add_argument("--repeats", type=int, default=7, help="timed runs of the step and of each part")
    parser.add_argument("--input-dim", type=int, default=280, help="features a frame, context included")
    parser.add_argument("--pdfs", type=int, default=119, help="senone outputs")
    parser.add_argument("--mono-pdfs", type=int, default=48, help="monophone outputs, where the cfg has them")
    parser.add_argument("--epoch-frames", type=int, default=364_576, help="training frames an epoch")
    parser.add_argument("--budget", type=float, help=f"seconds the whole job may take (main job: {MAIN_JOB_BUDGET:.0f})")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args, overrides = parser.parse_known_args()  # the rest: --section,option=value, as for run_exp.py
    for option in ("frames", "repeats", "input_dim", "pdfs", "mono_pdfs", "epoch_frames"):
        if getattr(args, option) < 1:
            parser.error(f"--{option.replace('_', '-')} must be at least 1, got {getattr(args, option)}")
    try:
        config = parse_config(args.cfg, overrides)
        torch.manual_seed(0)
        num_mono = args.mono_pdfs if config.model.mono_lab != "none" else None
        model, groups = build_model(config, args.input_dim, args.pdfs, num_mono)  # checks the units' options
    except ValueError as error:  # ConfigError, and a malformed override
        parser.error(str(error))
    if args.budget is None and os.path.abspath(args.cfg) == MAIN_JOB:
        args.budget = MAIN_JOB_BUDGET
    device = torch.device(args.device)
    batch, frames = config.batches.batch_size_train, args.frames
    model.to(device).train()
    archs = trained_architectures(config)
    optimizers = [make_optimizer(a.arch_opt, params, a.arch_lr, a) for a, params in zip(archs, groups)]
    x = torch.randn(batch, frames, args.input_dim, device=device)
    lengths = torch.full((batch,), frames, device=device)
    labels = {config.model.senone_lab: torch.randint(args.pdfs, (batch, frames), device=device)}
    if num_mono:
        labels[config.model.mono_lab] = torch.randint(num_mono, (batch, frames), device=device)

    def step():  # run_exp.py's training step, without its bookkeeping
        with autocast(config, device):
            out = model(x, lengths)
        loss, _ = batch_loss(out, labels, config.model, batch * frames)
        for optimizer in optimizers:
            optimizer.zero_grad(set_to_none=True)
        loss.backward()
        for arch, params in zip(archs, groups):
            gradient_norm(params, arch.clip_grad_norm)
        for optimizer in optimizers:
            optimizer.step()

    parts = parts_of(model, frames, batch, device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_model()
    print(f"{args.cfg}: {sum(p.numel() for p in model.parameters()) / 1e6:.2f}M parameters, B={batch} T={frames} "
          f"F={args.input_dim}, {args.pdfs} pdfs")
    print(f"torch {torch.__version__}, device {device} ({name}), {torch.get_num_threads()} threads, "
          f"ISA {torch.backends.cpu.get_cpu_capability()}, BLAS {blas_name()}, our kernels {build_flags_name()}; "
          f"load average {load_average()}")
    step()  # warm-ups: the kernels' first calls, the optimiser's state
    for part in parts:
        part.run()
    step_times = []
    for _ in range(args.repeats):
        step_times.append(timed(step, device))
        for part in parts:
            part.times.append(timed(part.run, device))
    step_ms = statistics.median(step_times)
    print(f"\n{'part (forward + backward, alone)':<52} {'ms':>8} {'of step':>8} {'GFLOP/s':>8}")
    parts_ms = 0.0
    for part in parts:
        ms = statistics.median(part.times)
        parts_ms += ms
        rate = f"{part.flops / ms / 1e6:8.1f}" if part.flops else f"{'':>8}"
        print(f"{part.name:<52} {ms:8.1f} {ms / step_ms:8.0%} {rate}")
    print(f"{'the parts together':<52} {parts_ms:8.1f} {parts_ms / step_ms:8.0%}")
    print(f"{'the rest (norms, dropout, loss, optimiser, ...)':<52} {step_ms - parts_ms:8.1f} "
          f"{(step_ms - parts_ms) / step_ms:8.0%}")
    print(f"{'the step as run_exp.py runs it':<52} {step_ms:8.1f} {1:8.0%}   (medians of {args.repeats}; "
          f"step fastest {min(step_times):.1f} ms)")

    steps, epochs = args.epoch_frames / (batch * frames), config.exp.n_epochs_tr
    at_step, at_parts = epochs * steps * step_ms / 1e3, epochs * steps * parts_ms / 1e3
    print(f"\n{epochs} epochs of {args.epoch_frames} frames, about {steps:.0f} steps each: training {at_step:.0f} s "
          f"at the step's speed, {at_parts:.0f} s at the parts' speed with nothing else (a floor here)")
    if args.budget is not None:
        print(f"budget {args.budget:.0f} s for the whole job: {args.budget - at_parts:.0f} s left beside the floor, "
              f"{args.budget - at_step:.0f} s beside training as it runs, for start-up, the dev passes, forward and "
              "decoding" + ("; the floor alone is over it" if at_parts > args.budget else ""))
    print(f"load average {load_average()}")


if __name__ == "__main__":
    main()

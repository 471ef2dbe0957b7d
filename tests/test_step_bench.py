"""bench/training_step.py: the parts it splits a training step into, and its command line."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import models
from models.acoustic import AcousticModel

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "bench" / "training_step.py"


def _bench():
    """bench/training_step.py as a module (bench/ is a folder of scripts, not a package)."""
    spec = importlib.util.spec_from_file_location("training_step_bench", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_parts_cover_every_product_and_recurrence_once():
    """Two bidirectional layers and two output layers: one projection per layer, one recurrence per
    direction, each output layer; the flop counts as counted by hand; and running a part leaves no
    gradient behind on the model, after having made one (the backward pass ran)."""
    bench = _bench()
    T, B, F, H, C, M = 6, 3, 5, 4, 7, 2
    stack = models.build_stack("ligru", F, [H, H], bidirectional=True, norm="batch")
    net = AcousticModel([stack], C, M).train()
    parts = bench.parts_of(net, T, B, torch.device("cpu"))
    assert [p.name for p in parts] == [
        f"layer 1 projection {F} -> {2 * 2 * H}", f"layer 1 recurrence, H={H}",
        f"layer 1 recurrence (backward direction), H={H}", f"layer 2 projection {2 * H} -> {2 * 2 * H}",
        f"layer 2 recurrence, H={H}", f"layer 2 recurrence (backward direction), H={H}",
        f"senone output {2 * H} -> {C}", f"mono output {2 * H} -> {M}"]
    # forward and weight gradient only for the first layer (its input is data), the input gradient too after
    assert parts[0].flops == 2 * 2 * T * B * F * 4 * H
    assert parts[3].flops == 3 * 2 * T * B * 2 * H * 4 * H
    assert parts[1].flops == 3 * 2 * T * B * H * 2 * H  # Li-GRU's recurrent matrix is (2H, H)
    assert parts[6].flops == 3 * 2 * T * B * 2 * H * C
    reached = []
    for layer_part, parameter in ((parts[1], stack.layers[0].cells[0].recurrent.weight),
                                  (parts[3], stack.layers[1].proj.weight), (parts[7], net.mono.weight)):
        handle = parameter.register_hook(lambda grad: reached.append(grad.shape))
        layer_part.run()
        handle.remove()
    assert reached == [(2 * H, H), (4 * H, 2 * H), (M, 2 * H)]
    for part in parts:
        part.run()
    assert all(p.grad is None for p in net.parameters())


def test_a_torch_layer_is_one_part():
    bench = _bench()
    stack = models.build_stack("cudnn_lstm", 5, [4], dropout=0.1)
    parts = bench.parts_of(AcousticModel([stack], 3).train(), 4, 2, torch.device("cpu"))
    assert [p.name for p in parts] == ["layer 1 VendorRNN, whole", "senone output 4 -> 3"]
    parts[0].run()
    assert all(p.grad is None for p in stack.parameters())


def _run(*args):
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, cwd=ROOT, timeout=300)


def test_the_bench_prints_the_main_jobs_step_and_floor():
    result = _run("--frames", "12", "--repeats", "1", "--architecture1,sizes=16,16")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith(f"{ROOT / 'cfg' / 'MINI_liBRU.cfg'}: ") and "B=8 T=12 F=280, 119 pdfs" in lines[0]
    named = [line.split("  ")[0] for line in lines if line.startswith(("layer ", "senone "))]
    assert named == ["layer 1 projection 280 -> 32", "layer 1 recurrence, H=16", "layer 2 projection 16 -> 32",
                     "layer 2 recurrence, H=16", "senone output 16 -> 119"]
    floor = next(line for line in lines if line.startswith("8 epochs of 364576 frames"))
    assert "steps each" in floor and "a floor here" in floor
    assert any(line.startswith("budget 120 s for the whole job") for line in lines)


@pytest.mark.parametrize("args, message", [
    (["--frames", "0"], "--frames must be at least 1, got 0"),
    (["--architecture1"], "override '--architecture1': expected --section,option=value"),
    (["cfg/MINI_liBRU.cfg", "--architecture1,unit=nosuchunit"], "nosuchunit"),
    (["cfg/no_such.cfg"], "config file cfg/no_such.cfg does not exist"),
])
def test_bad_arguments_are_named(args, message):
    result = _run(*args)
    assert result.returncode == 2 and message in result.stderr, (result.returncode, result.stderr)

"""The Triton kernels' budgets on a Hopper GPU (sm_90), read on a machine without one: every kernel the
launcher picks is compiled (Triton's own ``ptxas`` included) and not run, and its registers, spills,
shared memory and resident programs are reported.

:func:`compile_only` replaces each launch of a compiled kernel by Triton's ``warmup`` (compilation to a
CUDA binary) for an sm_90 target, a driver that answers with that target standing in for the CUDA one
this machine cannot load; the launcher (:mod:`models.fast.triton_loops`) then sizes its grids as it would
on an H100 or H200 (``triton_loops.HOPPER``), from the registers and spills of ``ptxas -v``'s log.
:func:`production_passes` runs every layer with a fast path at the launcher's production block sizes:
a batch of 32 sequences (row blocks of 32, the largest tiles) at H = 550 (TIMIT's layers: 69 programs of
8 units), forward and backward, and forward under ``torch.no_grad()`` (the inference variants). What is
computed is garbage: nothing runs. tests/test_triton_compile.py holds the kernels to their budgets this way.

``python -m models.fast.budgets [--dtypes float32 float64]`` prints one line per compiled kernel variant.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import re
import sys
import tempfile
from typing import NamedTuple

import torch

from models.fast import triton_loops


class _HopperDriver:
    """What ``JITFunction.run`` asks of the active driver before it compiles: the device, its stream, its target."""

    def get_current_device(self):
        return 0

    def get_current_stream(self, device=None):
        return 0

    def get_current_target(self):
        from triton.backends.compiler import GPUTarget

        return GPUTarget("cuda", 90, 32)


def ptxas_resources(log: str) -> tuple[int, int]:
    """``(registers a thread, bytes it spills)`` of the one kernel in a ``ptxas -v`` log."""
    registers = re.findall(r"Used (\d+) registers", log)
    spilled = re.findall(r"(\d+) bytes spill stores", log)
    if len(registers) != 1 or len(spilled) != 1:
        raise ValueError(f"not the log of one kernel:\n{log}")
    return int(registers[0]), int(spilled[0])


@contextlib.contextmanager
def compile_only():
    """Within it, every launch of a compiled Triton kernel is compiled for sm_90 and not run, into a fresh
    cache (so that each kernel is compiled, and its log read), and the launcher's grids are sized with an
    H200's limits; CPU tensors of float32 and float64 go to the compiled kernels (``BRU_KALDI_TRITON=1``:
    one that does not compile raises). Yields ``{kernel name: [Compiled, ...]}`` of the variants compiled.
    Everything it changes is put back on leaving."""
    from triton.runtime import driver
    from triton.runtime.jit import JITFunction

    compiled: dict = {}
    run = JITFunction.run

    def warmup(self, *args, grid, warmup, **kwargs):
        log = io.StringIO()
        with contextlib.redirect_stdout(log):  # (Triton prints ptxas's log where it compiles)
            kernel = run(self, *args, grid=grid, warmup=True, **kwargs)
        if kernel is None or not kernel.asm.get("cubin"):
            raise RuntimeError(f"{self.fn.__name__} was not compiled to a binary")
        if not hasattr(kernel, "resources_from_ptxas"):  # compiled now, not found in the cache
            kernel.resources_from_ptxas = ptxas_resources(log.getvalue())
            constants = {k: v for k, v in kwargs.items() if k.isupper()}
            compiled.setdefault(self.fn.__name__, []).append(
                Compiled(*kernel.resources_from_ptxas, int(kernel.metadata.shared), kernel.metadata.num_warps,
                         bool(kernel.metadata.launch_cooperative_grid), constants))
        return kernel

    variables = {"TRITON_DUMP_PTXAS_LOG": "1", "BRU_KALDI_TRITON": "1", "BRU_KALDI_NATIVE": "0"}
    saved_variables = {name: os.environ.get(name) for name in [*variables, "TRITON_CACHE_DIR"]}
    replaced = [(JITFunction, "run", warmup), (driver, "_active", _HopperDriver()),
                (triton_loops, "_wanted", lambda example: False if example.is_floating_point() else None),
                (triton_loops, "_limits", lambda device: triton_loops.HOPPER),
                (triton_loops, "_resources", lambda kernel: kernel.resources_from_ptxas),
                (triton_loops, "GRIDS", {}), (triton_loops, "_occupancies", {}),
                (triton_loops, "VARIANTS", triton_loops.VARIANTS.__class__())]
    # (driver._active is set directly: set_active's undo, reset_active, would load the CUDA driver)
    saved = [(owner, name, owner.__dict__[name] if name in owner.__dict__ else getattr(owner, name))
             for owner, name, _ in replaced]
    with tempfile.TemporaryDirectory() as cache:
        try:
            os.environ.update(variables, TRITON_CACHE_DIR=cache)
            for owner, name, value in replaced:
                setattr(owner, name, value)
            yield compiled
        finally:
            for owner, name, value in saved:
                setattr(owner, name, value)
            for name, value in saved_variables.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value


class Compiled(NamedTuple):
    """One compiled kernel variant."""

    registers: int  # a thread's
    spilled: int  # bytes a thread spills to local memory
    shared: int  # bytes of shared memory a program
    warps: int
    cooperative: bool  # launched with launch_cooperative_grid
    constants: dict

    @property
    def per_multiprocessor(self) -> int:
        """Programs an H100's or H200's multiprocessor holds at once."""
        return triton_loops.resident_programs(self.registers, self.shared, 32 * self.warps, triton_loops.HOPPER)


def fast_variants() -> list:
    """Every ``(unit, options)`` of :func:`models.variants` whose layer runs a fast path."""
    import models

    found = []
    for unit, options in models.variants():
        if unit.startswith("cudnn_"):
            continue
        layer = models.build(unit, 3, 4, **options)
        if layer.cells[0].fast_forward(torch.zeros(1, 2, layer.proj.out_features), torch.tensor([2])) is not None:
            found.append((unit, options))
    return found


def production_passes(variants: list, dtype: torch.dtype, batch: int = 32, hidden: int = 550) -> None:
    """The layers of ``variants`` (:func:`fast_variants`, found before :func:`compile_only`, whose kernels
    they would launch), bidirectional, ``batch`` sequences of 2 frames of 3 inputs, ``hidden`` units: forward
    and backward in training, forward under ``torch.no_grad()`` in evaluation."""
    import models
    from models.recurrent import set_implementation

    for unit, options in variants:
        torch.manual_seed(0)
        layer = set_implementation(models.build(unit, 3, hidden, bidirectional=True, **options).to(dtype), "fast")
        x = torch.randn(batch, 2, 3, dtype=dtype, requires_grad=True)
        layer.train()
        layer(x, [2] * batch).sum().backward()
        layer.eval()
        with torch.no_grad():
            layer(x, [2] * batch)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dtypes", nargs="+", default=["float32", "float64"], choices=["float32", "float64"])
    args = parser.parse_args(argv)
    import triton

    print(f"Triton {triton.__version__}, sm_90, an H100's or H200's limits (triton_loops.HOPPER), B=32 H=550")
    print(f"{'kernel':<24} {'dtype':<8} {'constants':<44} {'regs':>4} {'spill':>5} {'smem KB':>7} {'per SM':>6} "
          f"{'coop':>4}")
    variants, summaries = fast_variants(), []
    units = {number: unit for unit, number in triton_loops.KINDS.items()}
    for name in args.dtypes:
        dtype = getattr(torch, name)
        with compile_only() as compiled:
            production_passes(variants, dtype)
        for kernel, found in sorted(compiled.items()):
            for v in sorted(found, key=lambda v: sorted(v.constants.items())):
                shown = " ".join(f"{k}={int(c) if isinstance(c, bool) else c}" for k, c in sorted(v.constants.items())
                                 if k not in ("BLOCK_B", "BLOCK_H", "BLOCK_K", "BLOCK", "SYNC"))
                print(f"{kernel:<24} {name:<8} {shown:<44} {v.registers:>4} {v.spilled:>5} {v.shared / 1024:>7.0f} "
                      f"{v.per_multiprocessor:>6} {'yes' if v.cooperative else 'no':>4}", flush=True)
        every = [v for found in compiled.values() for v in found]
        barrier = [v for v in every if v.cooperative]
        worst = max(every, key=lambda v: v.spilled)
        where = f"{next(k for k, f in compiled.items() if worst in f)} {units.get(worst.constants.get('KIND'), '')}"
        summaries.append(f"{name}: {len(every)} variants, {min(v.registers for v in every)}-"
                         f"{max(v.registers for v in every)} registers a thread, at most {worst.spilled} bytes spilled "
                         f"({where.strip()}), "
                         f"shared memory up to {max(v.shared for v in every) // 1024} KB; the {len(barrier)} with a "
                         f"barrier: {min(v.per_multiprocessor for v in barrier)}-"
                         f"{max(v.per_multiprocessor for v in barrier)} programs per multiprocessor, all cooperative")
    print("\n".join(summaries))
    return 0


if __name__ == "__main__":
    sys.exit(main())

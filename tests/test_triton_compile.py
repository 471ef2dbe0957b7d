"""The Triton kernels compile for a Hopper GPU (sm_90), on a machine without one.

Triton's interpreter (tests/test_triton_kernels.py) checks what the kernels compute, but it accepts
code that the compiler refuses: a global that is not ``tl.constexpr``, a ``tl.dot`` of a shape the
target has no instruction for, a conditional expression. Here every layer with a fast path runs its
forward and backward passes (training and inference, both dtypes) with the compiled kernels, each
launch replaced by Triton's ``warmup``, which compiles to a CUDA binary (``ptxas`` included) without
running it. A driver that answers with an sm_90 target stands in for the CUDA one that this machine
cannot load. What is computed is garbage (nothing runs); only the compilation is checked.
"""

import pytest
import torch

pytest.importorskip("triton")  # in requirements.txt; a machine without it has no kernels to check

from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.runtime import driver  # noqa: E402
from triton.runtime.jit import JITFunction  # noqa: E402

from models.fast import triton_loops  # noqa: E402
from models.recurrent import set_implementation  # noqa: E402
from tests.test_fast_recurrences import FAST_VARIANTS  # noqa: E402
from tests.unit_variants import make_layer  # noqa: E402

pytestmark = pytest.mark.slow  # compiling about a hundred kernels takes 20-30 s on 2 cores

HOPPER = GPUTarget("cuda", 90, 32)


class _HopperDriver:
    """What ``JITFunction.run`` asks of the active driver before it compiles: the device, its stream, its target."""

    def get_current_device(self):
        return 0

    def get_current_stream(self, device=None):
        return 0

    def get_current_target(self):
        return HOPPER


@pytest.fixture
def compile_only(monkeypatch, tmp_path):
    """The compiled kernels for CPU tensors, every launch compiled for sm_90 and not run; yields the names of
    the kernels compiled. A fresh cache, so that every kernel is really compiled."""
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("BRU_KALDI_TRITON", "1")  # a kernel that does not compile raises
    monkeypatch.setenv("BRU_KALDI_NATIVE", "0")
    monkeypatch.setattr(triton_loops, "_wanted", lambda example: False if example.is_floating_point() else None)
    monkeypatch.setattr(triton_loops, "_sm_count", lambda device: 132)  # an H100's or H200's multiprocessors
    monkeypatch.setattr(triton_loops, "_probed", set())
    compiled = set()
    run = JITFunction.run

    def warmup(self, *args, grid, warmup, **kwargs):
        kernel = run(self, *args, grid=grid, warmup=True, **kwargs)
        assert kernel is not None and kernel.asm.get("cubin"), f"{self.fn.__name__} was not compiled to a binary"
        compiled.add(self.fn.__name__)
        return kernel

    monkeypatch.setattr(JITFunction, "run", warmup)
    # (set_active's undo, reset_active, would load the CUDA driver: put back the field it sets instead)
    monkeypatch.setattr(driver, "_active", _HopperDriver())
    return compiled


def test_every_kernel_compiles_for_hopper(compile_only):
    for unit, options in FAST_VARIANTS:
        for dtype in (torch.float32, torch.float64):
            layer = set_implementation(make_layer(unit, options, input_size=3, hidden_size=40, bidirectional=True,
                                                  dtype=dtype), "fast")
            x = torch.randn(3, 5, 3, dtype=dtype, requires_grad=True)
            layer.train()
            layer(x, [5, 4, 2]).sum().backward()
            layer.eval()
            with torch.no_grad():
                layer(x, [5, 4, 2])
    kernels = {name for name, value in vars(triton_loops._load(False)).items()
               if isinstance(value, JITFunction) and not name.startswith("_")}
    assert kernels and compile_only == kernels, sorted(kernels - compile_only)

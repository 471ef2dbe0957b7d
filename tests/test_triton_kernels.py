"""The Triton kernels of the GPU (models/fast/triton_kernels.py) on the CPU, through Triton's interpreter.

The same comparison as tests/test_fast_recurrences.py (outputs, posteriors, and the gradients of the
input and of every parameter against the reference loop, ragged lengths with garbage in the padding,
float64 to 1e-8 and float32 to 1e-5), for every unit with a fast path, both directions in one layer.
The interpreter runs a kernel's programs one after another, so a launch whose programs wait for each
other at the per-step barrier cannot run there; with several blocks of units the launcher runs one
launch per step instead (the kernel boundary is the barrier), and :func:`test_several_programs_split_the_units`
checks the index arithmetic of that split. The barrier itself, and the speed, need a GPU: there the
``cuda`` backend of tests/test_fast_recurrences.py runs all of its tests through these kernels.
"""

import pytest
import torch

import models
from models.fast import triton_loops
from models.recurrent import set_implementation
from tests.test_fast_recurrences import FAST_VARIANTS, _compare, use_backend
from tests.unit_variants import make_layer, variant_id

pytestmark = pytest.mark.slow  # the Triton kernels through Triton's interpreter, which is slow

CASES = [(u, o, dt) for u, o in FAST_VARIANTS for dt in (torch.float64, torch.float32)]
# The units whose kernels have a recurrent matrix, and so programs that split the hidden units.
MATRIX_VARIANTS = [(u, o) for u, o in FAST_VARIANTS if u != "ubru"]


@pytest.fixture
def interpreted(monkeypatch):
    """The fast paths through the Triton kernels, interpreted on CPU tensors (errors raise)."""
    return use_backend("triton", monkeypatch)


@pytest.mark.parametrize("unit, options, dtype", CASES,
                         ids=[variant_id((u, o)) + ("-f64" if dt == torch.float64 else "-f32") for u, o, dt in CASES])
def test_kernels_equal_the_reference(unit, options, dtype, interpreted):
    _compare(unit, options, True, dtype)


@pytest.mark.parametrize("unit, options", FAST_VARIANTS, ids=[variant_id(v) for v in FAST_VARIANTS])
def test_one_direction(unit, options, interpreted):
    """A layer of one direction hands the recurrences gradients laid out batch-major, transposed to
    ``(T, B, H)`` without a copy: the kernels' outputs must still be row-major (an ``empty_like`` of such a
    gradient was not, and the LBRU's smoothing got its gradient back permuted)."""
    _compare(unit, options, False, torch.float64)


@pytest.mark.parametrize("unit, options", MATRIX_VARIANTS, ids=[variant_id(v) for v in MATRIX_VARIANTS])
def test_several_programs_split_the_units(unit, options, interpreted, monkeypatch):
    """H = 45 in blocks of 16 (three programs, the last one partial): each reads the whole previous state
    and writes its own units, forward and backward. (The MGU's step has two products and a barrier
    between them, and the LSTM without gradients carries its cell in registers: the interpreter runs
    those as one block of units.)"""
    monkeypatch.setattr(triton_loops, "BLOCK_H", 16)
    _compare(unit, options, True, torch.float64, hidden_size=45, T=4, lengths=(4, 2, 4))


def test_batches_of_several_row_blocks(interpreted):
    """More sequences than one program's rows (32): the row blocks run side by side, each with its own barrier."""
    _compare("libru", {}, True, torch.float32, hidden_size=3, T=3, lengths=tuple(range(1, 4)) * 12 + (2,))


def _launches(unit, options, train):
    layer = set_implementation(make_layer(unit, options, bidirectional=True), "fast").train(train)
    x = torch.randn(2, 4, 3, requires_grad=train)
    triton_loops.LAUNCHES.clear()
    out = layer(x, [4, 2])
    if train:
        out.sum().backward()
    return dict(triton_loops.LAUNCHES)


@pytest.mark.parametrize("unit, options", FAST_VARIANTS, ids=[variant_id(v) for v in FAST_VARIANTS])
def test_every_fast_path_runs_the_kernels(unit, options, interpreted):
    """One forward and one backward launch per direction: a path that stopped reaching the kernels (and ran
    its TorchScript loop, with the same results) would pass every comparison above."""
    kernels = {"lbru": ("lbru_forward", "lbru_backward"), "ubru": ("softplus_scan", "softplus_scan_backward")}
    forward, backward = kernels.get(unit, ("gated_forward", "gated_backward"))
    launches = _launches(unit, options, train=True)
    assert launches.get(forward, 0) >= 2 and launches.get(backward, 0) >= 2, launches
    extra = {"kalman": "kalman_smoother", "layer": "matrix_forward"}.get(options.get("backward"))
    if extra:  # the backward recursion (UBRU eq. 21; LBRU eq. 78), one kernel each way and direction
        backward_extra = extra.replace("forward", "backward") if extra.endswith("forward") else extra + "_backward"
        assert launches.get(extra, 0) >= 2 and launches.get(backward_extra, 0) >= 2, launches
    assert set(_launches(unit, options, train=False)) == {forward} | ({extra} if extra else set())


def test_auto_mode_falls_back_once_with_a_warning(monkeypatch):
    """Where a kernel cannot be built, ``auto`` warns once and runs the TorchScript loops from then on for that
    device and dtype (the same results); ``interpret`` and ``1`` raise instead."""
    layer = make_layer("libru", {}, bidirectional=True)
    x = torch.randn(2, 5, 3)
    expected = set_implementation(layer, "reference")(x, [5, 3])
    set_implementation(layer, "fast")

    class Broken:
        INTERPRET = True
        gated_backward = lbru_backward = object()

        class gated_forward:  # a kernel that fails as an unbuildable one does, at its first launch
            fn = staticmethod(lambda: None)

            def __class_getitem__(cls, grid):
                raise RuntimeError("no such instruction")

    monkeypatch.setattr(triton_loops, "_broken", {})
    monkeypatch.setattr(triton_loops, "_load", lambda interpret: Broken)
    monkeypatch.setattr(triton_loops, "_wanted", lambda example: True)  # as a GPU tensor would be
    monkeypatch.setenv("BRU_KALDI_NATIVE", "0")
    monkeypatch.setenv("BRU_KALDI_TRITON", "interpret")
    with pytest.raises(RuntimeError, match="could not run on cpu torch.float32.*no such instruction"):
        layer(x, [5, 3])
    monkeypatch.setenv("BRU_KALDI_TRITON", "auto")
    with pytest.warns(UserWarning, match="run as TorchScript loops"):
        torch.testing.assert_close(layer(x, [5, 3]), expected)
    assert (x.device.type, x.dtype) in triton_loops._broken
    assert triton_loops.route(x) is None
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no second warning
        torch.testing.assert_close(layer(x, [5, 3]), expected)


def test_modes(monkeypatch):
    monkeypatch.setenv("BRU_KALDI_TRITON", "auto")
    assert triton_loops.route(torch.zeros(1)) is None  # CPU tensors only through the interpreter
    monkeypatch.setenv("BRU_KALDI_TRITON", "interpret")
    assert triton_loops.route(torch.zeros(1)) is not None
    assert triton_loops.route(torch.zeros(1, dtype=torch.float16)) is None
    monkeypatch.setenv("BRU_KALDI_TRITON", "on")
    with pytest.raises(ValueError, match="BRU_KALDI_TRITON must be one of"):
        triton_loops.route(torch.zeros(1))


def test_the_fast_paths_need_no_kernel_module_without_the_interpreter(monkeypatch):
    """On a CPU in ``auto`` mode the Triton kernels are never loaded: the C++ kernels or TorchScript run."""
    monkeypatch.setenv("BRU_KALDI_TRITON", "auto")
    monkeypatch.setenv("BRU_KALDI_NATIVE", "0")
    triton_loops.LAUNCHES.clear()
    layer = models.build("ligru", 3, 4)
    layer(torch.randn(2, 3, 3), [3, 2]).sum().backward()
    assert not triton_loops.LAUNCHES

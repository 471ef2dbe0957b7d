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

import contextlib
import logging
import threading
import warnings

import pytest
import torch
import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction

import models
from models.fast import self_test, triton_loops
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
    extra = {"kalman": "kalman_smoother", "hmm": "hmm_smoother", "layer": "matrix_forward"}.get(options.get("backward"))
    if extra:  # the backward recursion (UBRU eq. 21 or 17-18; LBRU eq. 78), one kernel each way and direction
        backward_extra = extra.replace("forward", "backward") if extra.endswith("forward") else extra + "_backward"
        assert launches.get(extra, 0) >= 2 and launches.get(backward_extra, 0) >= 2, launches
    assert set(_launches(unit, options, train=False)) == {forward} | ({extra} if extra else set())


def test_auto_mode_falls_back_once_with_a_warning(monkeypatch):
    """Where a kernel fails after its self-test, ``auto`` warns once and runs the TorchScript loops from then on
    for that device and dtype (the same results); ``interpret`` and ``1`` raise instead. (A kernel that fails
    its self-test: test_a_kernel_that_fails_its_self_test_is_not_used.)"""
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
    monkeypatch.setattr(triton_loops, "_trusted", lambda family, example: True)  # (its self-test passed)
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


# --- inference, the barrier that gives up, the self-test, the device guard, the offsets ------------------

@pytest.mark.parametrize("unit, options", FAST_VARIANTS, ids=[variant_id(v) for v in FAST_VARIANTS])
def test_inference_runs_the_no_grad_variants(unit, options, interpreted):
    """Under ``torch.no_grad()`` nothing is kept for backward: the kernels run their inference variants
    (``TRAIN`` off), no backward kernel runs, and the outputs are the reference loop's. (``needs_input_grad``
    stays true there, and the training kernels once ran instead.)"""
    layer = make_layer(unit, options, input_size=3, hidden_size=5, bidirectional=True, dtype=torch.float64, seed=3)
    x = torch.randn(3, 6, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        expected = set_implementation(layer, "reference")(x, [6, 4, 1])
        triton_loops.LAUNCHES.clear()
        triton_loops.VARIANTS.clear()
        got = set_implementation(layer, "fast")(x, [6, 4, 1])
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-10)
    assert triton_loops.LAUNCHES and not any("backward" in name for name in triton_loops.LAUNCHES)
    trains = [dict(constants)["TRAIN"] for _, constants in triton_loops.VARIANTS if "TRAIN" in dict(constants)]
    assert trains == [] if unit == "ubru" else trains and not any(trains), triton_loops.VARIANTS


@pytest.fixture
def auto_on_the_cpu(monkeypatch):
    """``auto`` mode with the interpreted kernels serving CPU tensors (as compiled ones serve a GPU's), a
    fresh record of broken devices and verdicts; yields the interpreted kernels module."""
    monkeypatch.setenv("BRU_KALDI_NATIVE", "0")
    monkeypatch.setenv("BRU_KALDI_TRITON", "auto")
    monkeypatch.setattr(triton_loops, "_wanted", lambda example: True)
    monkeypatch.setattr(triton_loops, "_broken", {})
    monkeypatch.setattr(triton_loops, "_verdicts", {})
    monkeypatch.setattr(triton_loops, "_warned", set())
    monkeypatch.setattr(self_test, "SHAPE", (3, 2, 5))
    # (the verdicts are logged: not into a handler that a test of run_exp left on the root logger, whose
    # log.txt may be gone)
    monkeypatch.setattr(logging.getLogger(), "handlers", [])
    return triton_loops._load(True)


def _loops_result(layer, x, lengths, monkeypatch, train=True):
    """Output and input gradient of ``layer`` on the TorchScript loops (no kernel serves anything)."""
    with monkeypatch.context() as m:
        m.setattr(triton_loops, "_wanted", lambda example: None)
        return _forward_backward(layer, x, lengths, train)


def _forward_backward(layer, x, lengths, train=True):
    x = x.clone().requires_grad_(train)
    with torch.set_grad_enabled(train):
        out = layer(x, lengths)
    if not train:
        return out, None
    out.sum().backward()
    return out.detach(), x.grad


def test_a_barrier_that_gives_up_falls_back_once_to_the_loops_result(auto_on_the_cpu, monkeypatch):
    """Three programs at the barrier, as on a GPU, where the interpreter runs them one after another: the
    first waits for the others, which never arrive while it waits. Its barrier gives up after SPINS polls
    (and lets everyone through), the host sees the flag, warns once and reruns the pass on the TorchScript
    loop: the results are exactly the loop's. With BRU_KALDI_TRITON=interpret the same raises."""
    monkeypatch.setattr(auto_on_the_cpu, "SPINS", tl.constexpr(20))
    monkeypatch.setattr(triton_loops, "_stepwise", lambda interpret, unit_blocks: False)
    monkeypatch.setattr(triton_loops, "BLOCK_H", 16)
    monkeypatch.setattr(triton_loops, "_trusted", lambda family, example: True)
    layer = set_implementation(make_layer("libru", {}, hidden_size=45, bidirectional=True, dtype=torch.float64), "fast")
    x, lengths = torch.randn(3, 4, 3, dtype=torch.float64), [4, 2, 4]
    expected = _loops_result(layer, x, lengths, monkeypatch)
    triton_loops.LAUNCHES.clear()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = _forward_backward(layer, x, lengths)
    assert [str(w.message) for w in caught if "gave up" in str(w.message)] == [str(caught[0].message)], caught
    assert len(caught) == 1 and triton_loops.LAUNCHES["gated_forward"] == 1  # the kernel ran once, then never
    torch.testing.assert_close(got, expected, rtol=0, atol=0)
    monkeypatch.setenv("BRU_KALDI_TRITON", "interpret")
    monkeypatch.setattr(triton_loops, "_broken", {})
    with pytest.raises(RuntimeError, match="gave up waiting"):
        _forward_backward(layer, x, lengths)


def _zero(a):  # a wrong nonlinearity for a kernel that fails its self-test
    return a * 0.0


def test_a_kernel_passes_its_self_test_before_auto_mode_uses_it(auto_on_the_cpu, monkeypatch, caplog):
    layer = set_implementation(make_layer("libru", {}, hidden_size=5, bidirectional=True, dtype=torch.float64), "fast")
    x, lengths = torch.randn(3, 4, 3, dtype=torch.float64), [4, 2, 4]
    expected = _loops_result(layer, x, lengths, monkeypatch)
    with caplog.at_level(logging.INFO, logger="models.fast.self_test"):
        got = _forward_backward(layer, x, lengths)
    assert triton_loops._verdicts == {("cpu", torch.float64, "gated_forward:libru"): True,
                                      ("cpu", torch.float64, "gated_backward:gated"): True}
    assert caplog.text.count("passed their self-test") == 2, caplog.text
    triton_loops.LAUNCHES.clear()
    torch.testing.assert_close(_forward_backward(layer, x, lengths), expected, rtol=0, atol=1e-12)
    assert triton_loops.LAUNCHES["gated_forward"] == 2 and triton_loops.LAUNCHES["gated_backward"] == 2
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-12)


def test_a_kernel_that_fails_its_self_test_is_not_used(auto_on_the_cpu, monkeypatch, caplog):
    """A forward kernel that computes garbage (its log-sigmoid made 0): its self-test fails, one warning
    says so, and the layer's forward pass is the TorchScript loop's, exactly (the kernel's would differ)."""
    monkeypatch.setattr(auto_on_the_cpu, "_log_sigmoid", InterpretedFunction(_zero))
    layer = set_implementation(make_layer("libru", {}, hidden_size=5, bidirectional=True, dtype=torch.float64), "fast")
    x, lengths = torch.randn(3, 4, 3, dtype=torch.float64), [4, 2, 4]
    expected = _loops_result(layer, x, lengths, monkeypatch, train=False)
    with pytest.warns(UserWarning, match="gated_forward:libru on cpu float64 failed their self-test.*differ"):
        got = _forward_backward(layer, x, lengths, train=False)
    assert triton_loops._verdicts == {("cpu", torch.float64, "gated_forward:libru"): False}
    torch.testing.assert_close(got, expected, rtol=0, atol=0)


def test_a_self_test_past_its_deadline_is_not_used(auto_on_the_cpu, monkeypatch):
    """The host waits DEADLINE seconds for the self-test's thread: one still running then (here: any, with a
    deadline of 0) leaves its kernels unused."""
    monkeypatch.setattr(self_test, "DEADLINE", 0.0)
    layer = set_implementation(make_layer("lstm", {}, hidden_size=5, dtype=torch.float64), "fast")
    x, lengths = torch.randn(3, 4, 3, dtype=torch.float64), [4, 2, 4]
    expected = _loops_result(layer, x, lengths, monkeypatch, train=False)
    try:
        with pytest.warns(UserWarning, match="gated_forward:lstm .* failed their self-test.*not finished after 0 s"):
            got = _forward_backward(layer, x, lengths, train=False)
    finally:  # the abandoned self-test runs on in its thread: let it end before anything else interprets
        for thread in threading.enumerate():
            if thread.name.startswith("bru-kaldi self-test"):
                thread.join()
    assert triton_loops._verdicts == {("cpu", torch.float64, "gated_forward:lstm"): False}
    torch.testing.assert_close(got, expected, rtol=0, atol=0)


def test_the_self_test_command_runs_in_its_smoke_mode(capsys, monkeypatch):
    monkeypatch.setattr(self_test, "SHAPE", self_test.SHAPE)  # (main sets it)
    monkeypatch.setattr(logging.getLogger(), "handlers", [])  # (as in auto_on_the_cpu)
    monkeypatch.setenv("BRU_KALDI_TRITON", "interpret")
    assert self_test.main(["--smoke", "--families", "lbru_forward", "scans"]) == 0
    assert "self-test: 2 passed, 0 failed" in capsys.readouterr().out


def test_every_launch_runs_under_the_tensors_device(interpreted, monkeypatch):
    """Triton launches on the current device: each launch (a pass's and a scan's) is made inside the
    launcher's device context, entered with the tensors' device."""
    current, seen = [], []

    @contextlib.contextmanager
    def guard(device):
        current.append(device)
        yield
        current.pop()

    run = InterpretedFunction.run

    def launch(self, *args, **kwargs):
        seen.append(current[-1] if current else None)
        return run(self, *args, **kwargs)

    monkeypatch.setattr(triton_loops, "_on_device", guard)
    monkeypatch.setattr(InterpretedFunction, "run", launch)
    triton_loops.LAUNCHES.clear()
    for unit, options in [("libru", {}), ("ubru", {"backward": "hmm"}), ("lbru", {"backward": "layer"})]:
        layer = set_implementation(make_layer(unit, options, bidirectional=True), "fast")
        _forward_backward(layer, torch.randn(2, 3, 3), [3, 2])
    assert len(seen) == sum(triton_loops.LAUNCHES.values()) > 0
    assert set(seen) == {torch.device("cpu")}


def test_a_pass_past_the_int32_offsets_is_refused_with_one_warning(auto_on_the_cpu, monkeypatch):
    """Offsets are int32: a pass with a tensor (plus the reach of a masked block) of 2^31 elements or more
    runs as its TorchScript loop, warned once. Here the limit is lowered to a few hundred elements; the
    arithmetic itself at the real limit: 4000 frames of 256 sequences of an LSTM's 4 x 550 gates overflow."""
    assert not triton_loops.offsets_fit([4000 * 256 * 4 * 550], 0)
    assert triton_loops.offsets_fit([1000 * 32 * 4 * 550], 32 * 4 * 550 + 64)
    monkeypatch.setattr(triton_loops, "_trusted", lambda family, example: True)
    monkeypatch.setattr(triton_loops, "INDEX_LIMIT", 300)
    layer = set_implementation(make_layer("libru", {}, hidden_size=4, bidirectional=True, dtype=torch.float64), "fast")
    x, lengths = torch.randn(3, 6, 3, dtype=torch.float64), [6, 2, 4]
    expected = _loops_result(layer, x, lengths, monkeypatch)
    triton_loops.LAUNCHES.clear()
    with pytest.warns(UserWarning, match="too large for the kernels' int32 offsets") as caught:
        got = _forward_backward(layer, x, lengths)
    assert len(caught) == 1 and not triton_loops.LAUNCHES and not triton_loops._broken
    torch.testing.assert_close(got, expected, rtol=0, atol=0)


def test_grids_are_sized_from_the_compiled_kernels_occupancy(monkeypatch):
    """On a GPU of 132 multiprocessors, at most one program on each and at most half of what the GPU holds
    of the kernel: where a multiprocessor holds 4 programs, H = 256 takes 32 programs of 8 units, 4 row
    blocks a launch, and H = 550 69 programs, one row block a launch; where it holds 1 (66 programs a
    launch), H = 256 takes 2 row blocks a launch, H = 550 blocks of 16 units (35 programs); where it holds
    none the pass is refused."""

    class Kernel:
        fn = staticmethod(lambda: None)

    held = {}
    monkeypatch.setattr(triton_loops, "_limits", lambda device: triton_loops.HOPPER)
    monkeypatch.setattr(triton_loops, "_occupancy", lambda kernel, args, meta, device: triton_loops.Occupancy(
        64, 0, 0, 128, held["per_multiprocessor"]))
    for per_multiprocessor, H, expected in [(4, 256, (8, 4)), (4, 550, (8, 1)), (1, 256, (8, 2)), (1, 550, (16, 1))]:
        held["per_multiprocessor"] = per_multiprocessor
        block_h, per_launch, _ = triton_loops._grid(Kernel, lambda block_h: ((), {}), H, 4, torch.device("cuda"))
        assert (block_h, per_launch) == expected, (per_multiprocessor, H)
    held["per_multiprocessor"] = 0
    with pytest.raises(triton_loops.Refused, match="do not fit"):
        triton_loops._grid(Kernel, lambda block_h: ((), {}), 550, 4, torch.device("cuda"))

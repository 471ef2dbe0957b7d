"""The C++ LF-MMI forward-backward (bru_kaldi/chain/csrc/forward_backward.cpp) against the loop of torch ops it
replaces on the CPU, and both against every path of tiny graphs enumerated one by one.

Each comparison forces each path: ``BRU_KALDI_NATIVE=1`` with the torch loop made to fail if it is reached
(so a build that fails fails the test, and a silent fallback cannot pass for the C++ op), and
``BRU_KALDI_NATIVE=0``. The brute force is tests/test_chain.py's, which never forms a vector: the C++ op
is held to the definition, not only to the other implementation. The cases are the ones where a recursion
goes wrong: the leak (at boundary 0 too), time windows and frames past them, padding that holds NaN, an
utterance with no path, a denominator shared by the batch as stride-0 views, float32 and float64, one
utterance and several, one thread and two.
"""

import dataclasses
import math
import random

import pytest
import torch

from bru_kaldi.chain import native, objective
from bru_kaldi.chain.graph import ChainGraph
from tests.test_chain import numerator_graph
from bru_kaldi.chain.objective import forward_backward, lfmmi_loss
from bru_kaldi.torch_state import run_settings
from models.fast import native as fast_native
from models.fast.native import Extension
from tests.test_chain import brute_force, loss_case, paths, random_graph

PATHS = ["native", "torch"]


def _no_torch_loop(*args):
    raise AssertionError("the C++ op was asked for, and the torch loop ran")


def on_path(path, monkeypatch, function, *args, **kwargs):
    """``function(*args, **kwargs)`` with the forward-backward forced onto ``path`` ("native" or "torch")."""
    with monkeypatch.context() as patch:
        patch.setenv("BRU_KALDI_NATIVE", "1" if path == "native" else "0")
        if path == "native":
            patch.setattr(objective, "_torch_forward_backward", _no_torch_loop)
        return function(*args, **kwargs)


def both_paths(monkeypatch, *args):
    """:func:`forward_backward` on ``args`` by the C++ op and by the torch loop."""
    return [on_path(path, monkeypatch, forward_backward, *args) for path in PATHS]


def assert_same(native_result, torch_result, dtype):
    """Equal to rounding: the C++ op works in double, the torch loop in ``dtype``."""
    (logprob, posteriors), (expected_logprob, expected_posteriors) = native_result, torch_result
    assert logprob.dtype == posteriors.dtype == dtype and logprob.shape == expected_logprob.shape
    assert posteriors.shape == expected_posteriors.shape
    assert not posteriors.isnan().any() and not logprob.isnan().any()
    tight = dtype == torch.float64
    torch.testing.assert_close(logprob, expected_logprob, rtol=1e-12 if tight else 1e-5, atol=1e-10 if tight else 1e-4)
    torch.testing.assert_close(posteriors, expected_posteriors, rtol=0, atol=1e-11 if tight else 2e-5)


def outputs(batch, frames, pdfs, lengths, dtype, seed):
    """Random outputs ``(B, T, P)`` with NaN in every padding frame (which must change nothing)."""
    x = 3 * torch.randn(batch, frames, pdfs, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    for b, length in enumerate(lengths):
        x[b, length:] = math.nan
    return x.to(dtype)


# --- against the torch loop -----------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("lengths", [[23], [23, 17, 0, 23, 1]], ids=["B=1", "B=5"])
@pytest.mark.parametrize("leaky", [0.0, 0.1])
def test_the_denominator_equals_the_torch_loop(leaky, lengths, dtype, monkeypatch):
    """A graph of 9 states for the whole batch (ChainGraph.expand: stride-0 views), padding of NaN, an empty
    utterance; and the same graph copied per utterance (no stride 0) gives the same numbers."""
    graph = random_graph(21, 9, 6, final_ones=True)
    x = outputs(len(lengths), 23, 6, lengths, dtype, seed=1)
    fast, reference = both_paths(monkeypatch, x, lengths, graph.expand(len(lengths)), leaky)
    assert_same(fast, reference, dtype)
    copied = on_path("native", monkeypatch, forward_backward, x, lengths, ChainGraph.batch([graph] * len(lengths)),
                     leaky)
    torch.testing.assert_close(copied, fast, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
def test_numerators_with_windows_equal_the_torch_loop(dtype, monkeypatch):
    """Numerator graphs of different sizes padded into one batch (padded arcs of weight 0), with windows
    that end before the batch's last frame. Two utterances have no path: the first is longer than every
    graph's windows (its last frames are past the batch's windows: every state closed), the third longer
    than its own graph's (the batch pads its windows with closed frames); the last is shorter than its
    graph's windows (their last frames unused)."""
    rng = random.Random(3)
    lengths = [32, 12, 25, 7]
    windows_frames = [30, 12, 20, 10]
    alignments = [[p for _ in range(40) for p in [rng.randrange(5)] * rng.randint(1, 4)][:n] for n in windows_frames]
    graphs = ChainGraph.batch([numerator_graph(a, tolerance=t, dtype=dtype) for a, t in zip(alignments, [2, 0, 1, 3])])
    assert graphs.windows.shape[1] == 30
    x = outputs(4, 32, 5, lengths, dtype, seed=2)
    fast, reference = both_paths(monkeypatch, x, lengths, graphs, 0.0)
    for logprob, posteriors in (fast, reference):
        assert [math.isfinite(v) for v in logprob.tolist()] == [False, True, False, True]
        assert logprob[0] == logprob[2] == -math.inf and (posteriors[[0, 2]] == 0).all()
    assert_same(fast, reference, dtype)  # (-inf is close to -inf only)


@pytest.mark.parametrize("leaky", [0.0, 0.25])
def test_one_graph_with_windows_shared_by_the_batch(leaky, monkeypatch):
    """A graph with windows expanded to the batch: windows and arcs all stride-0 views."""
    graph = numerator_graph([0, 0, 1, 2, 2, 2, 1, 1, 0, 3], tolerance=2)
    lengths = [10, 8, 6, 11]
    x = outputs(4, 11, 4, lengths, torch.float64, seed=4)
    fast, reference = both_paths(monkeypatch, x, lengths, graph.expand(4), leaky)
    # 8 frames: the last segment (frame 9) may start 2 frames early; 6 frames: no path (a leak restarts at
    # the first state, which is no nearer the final one); 11 frames: past the windows, no state is open
    assert [math.isfinite(v) for v in fast[0].tolist()] == [True, True, False, False]
    assert_same(fast, reference, torch.float64)


def test_frames_past_the_windows_close_every_state(monkeypatch):
    """Windows of 5 frames, every state open in them, for utterances of 5, 6 and 8 frames: the last two have
    no path, the leak notwithstanding (it restarts a share of the mass, and there is none)."""
    graph = dataclasses.replace(random_graph(12, 5, 3), windows=torch.ones(5, 5, dtype=torch.float64))
    lengths = [5, 6, 8]
    x = outputs(3, 8, 3, lengths, torch.float64, seed=12)
    for graphs in (ChainGraph.batch([graph] * 3), graph.expand(3)):
        fast, reference = both_paths(monkeypatch, x, lengths, graphs, 0.1)
        assert [math.isfinite(v) for v in fast[0].tolist()] == [True, False, False]
        assert_same(fast, reference, torch.float64)


def test_a_dead_utterance_gives_minus_infinity_and_zero_posteriors_without_nan(monkeypatch):
    """Weights of 0 on every arc out of the start state: no path at all, with the leak too."""
    graph = ChainGraph.from_arcs(2, [(0, 1, 0, 0.0), (1, 1, 1, 1.0)], final=[0.0, 1.0])
    x = torch.randn(2, 4, 2, dtype=torch.float64)
    for leaky in (0.0, 0.1):
        fast, reference = both_paths(monkeypatch, x, [4, 3], graph.expand(2), leaky)
        for logprob, posteriors in (fast, reference):
            assert logprob.tolist() == [-math.inf, -math.inf] and (posteriors == 0).all()


def test_a_state_no_path_reaches_gives_no_nan_when_its_beta_overflows(monkeypatch):
    """State 1 is never reached (no initial weight, no arc into it) and its arcs emit the likeliest pdf:
    its beta grows by 1 / z_t ~ e^700 a frame and overflows even in float64 (in float32 this happens with
    ordinary outputs: a numerator's states ahead of its window). Its arcs' posteriors (alpha = 0 times beta
    = inf) must be 0, not NaN: the one path stays in state 0 and emits pdf 0 throughout."""
    graph = ChainGraph.from_arcs(2, [(0, 0, 0, 1.0), (1, 0, 1, 1.0), (1, 1, 1, 1.0)], initial=[1.0, 0.0])
    x = torch.zeros(1, 6, 2, dtype=torch.float64)
    x[..., 0] = -700.0
    for logprob, posteriors in both_paths(monkeypatch, x, [6], graph.expand(1), 0.0):
        assert float(logprob) == -4200.0 and posteriors[0].tolist() == [[1.0, 0.0]] * 6


def test_long_utterances_in_float32_and_two_threads_give_what_one_gives(monkeypatch):
    """600 frames of large outputs (the per-frame normalisation keeps float32 in range), a batch of 5 on
    two threads: each utterance is one thread's from start to end, so the numbers are bit for bit those of
    one thread."""
    graph = random_graph(8, 12, 7, final_ones=True)
    lengths = [600, 450, 599, 20, 600]
    x = 4 * outputs(5, 600, 7, lengths, torch.float32, seed=5)
    fast, reference = both_paths(monkeypatch, x, lengths, graph.expand(5), 0.1)
    torch.testing.assert_close(fast[0], reference[0], rtol=2e-5, atol=0)
    torch.testing.assert_close(fast[1], reference[1], rtol=0, atol=2e-4)
    with run_settings(threads=2):
        two = on_path("native", monkeypatch, forward_backward, x, lengths, graph.expand(5), 0.1)
    with run_settings(threads=1):
        one = on_path("native", monkeypatch, forward_backward, x, lengths, graph.expand(5), 0.1)
    torch.testing.assert_close(two, one, rtol=0, atol=0)


def test_non_contiguous_outputs_and_graphs_in_another_dtype(monkeypatch):
    """Outputs that are a slice of a wider tensor, and a float64 graph for float32 outputs (its weights cast
    to float32, as the torch loop casts them)."""
    graph = random_graph(9, 6, 4)
    wide = outputs(2, 8, 9, [8, 5], torch.float32, seed=6)
    x = wide[..., 2:6]
    assert not x.is_contiguous() and graph.weight.dtype == torch.float64
    fast, reference = both_paths(monkeypatch, x, [8, 5], graph.expand(2), 0.1)
    assert_same(fast, reference, torch.float32)


# --- against every path ---------------------------------------------------------------------------------

def with_windows(graph, frames, seed):
    """``graph`` with random time windows (each state open after a frame with probability 3/4)."""
    generator = torch.Generator().manual_seed(seed)
    windows = (torch.rand(frames, graph.num_states, generator=generator, dtype=torch.float64) < 0.75).double()
    return dataclasses.replace(graph, windows=windows)


@pytest.mark.parametrize("windows", [False, True], ids=["no windows", "windows"])
@pytest.mark.parametrize("leaky", [0.0, 0.3])
@pytest.mark.parametrize("seed", range(4))
def test_the_cpp_op_is_the_sum_over_all_paths(seed, leaky, windows, monkeypatch):
    """Tiny graphs (3-4 states, 2-3 pdfs), 1 to 4 frames, in float64: log P and the posteriors are what
    enumerating every path gives (with the leak's choices at all T + 1 boundaries, and the windows)."""
    num_pdfs = 2 + seed % 2
    graph = random_graph(40 + seed, 3 + seed % 2, num_pdfs, final_ones=seed % 2 == 0)
    generator = torch.Generator().manual_seed(seed)
    for frames in range(1, 5):
        tiny = with_windows(graph, frames + seed % 2, seed + frames) if windows else graph
        x = 2 * torch.randn(frames, num_pdfs, generator=generator, dtype=torch.float64)
        logprob, posteriors = on_path("native", monkeypatch, forward_backward, x[None], [frames], tiny.expand(1), leaky)
        if not any(weight > 0 for weight, _ in paths(tiny, frames, leaky)):  # the windows closed every path
            assert float(logprob) == -math.inf and (posteriors == 0).all()
            continue
        expected_logprob, expected_posteriors = brute_force(tiny, x, leaky)
        assert float(logprob[0]) == pytest.approx(expected_logprob, abs=1e-10), frames
        torch.testing.assert_close(posteriors[0], expected_posteriors, rtol=0, atol=1e-10)


# --- the loss and the dispatch --------------------------------------------------------------------------

def test_lfmmi_loss_and_its_gradients_are_the_same_on_both_paths(monkeypatch):
    den, nums, lengths, x, xent = loss_case(11)
    results = {}
    for path in PATHS:
        xs, xents = x.clone().requires_grad_(True), xent.clone().requires_grad_(True)
        result = on_path(path, monkeypatch, lfmmi_loss, xs, lengths, nums, den, leaky_coefficient=0.1, xent_output=xents,
                         xent_regularize=0.25, output_l2=0.01)
        result.loss.backward()
        results[path] = {"loss": result.loss.detach(), "objf": result.objf, "xent_objf": result.xent_objf,
                         "grad": xs.grad, "xent_grad": xents.grad}
    fast, reference = results["native"], results["torch"]
    assert (fast["objf"], fast["xent_objf"]) == pytest.approx((reference["objf"], reference["xent_objf"]), abs=1e-12)
    for name in ("loss", "grad", "xent_grad"):
        torch.testing.assert_close(fast[name], reference[name], rtol=0, atol=1e-12, msg=name)
    assert fast["grad"].abs().max() > 1e-3  # (a gradient, not zeros on both)


def test_only_cpu_float32_and_float64_go_to_the_cpp_op(monkeypatch):
    monkeypatch.setenv("BRU_KALDI_NATIVE", "1")
    assert native.native_ops(torch.zeros(1)) is not None and native.native_ops(torch.zeros(1).double()) is not None
    assert native.native_ops(torch.zeros(1, dtype=torch.bfloat16)) is None
    assert native.native_ops(torch.zeros(1, device="meta")) is None
    monkeypatch.setenv("BRU_KALDI_NATIVE", "0")
    assert native.native_ops(torch.zeros(1)) is None
    # bfloat16 runs the torch loop, under BRU_KALDI_NATIVE=1 too
    monkeypatch.setenv("BRU_KALDI_NATIVE", "1")
    graph = ChainGraph.from_arcs(1, [(0, 0, 0, 0.5), (0, 0, 1, 0.5)])
    logprob, posteriors = forward_backward(torch.zeros(1, 2, 2, dtype=torch.bfloat16), [2], graph.expand(1))
    assert logprob.dtype == torch.bfloat16 and float(logprob) == 0.0


def test_a_failed_build_falls_back_to_the_torch_loop_under_auto_and_raises_under_1(monkeypatch, tmp_path):
    """The chain's extension has its own state: a source that cannot be built warns once and leaves the
    torch loop running, and the recurrences' kernels are not touched."""
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    broken = Extension(str(tmp_path / "missing.cpp"), "bru_kaldi_chain_missing", "bru_kaldi_chain_missing",
                       native.EXTENSION.fallback)
    monkeypatch.setattr(native, "EXTENSION", broken)
    graph = ChainGraph.from_arcs(1, [(0, 0, 0, 0.5), (0, 0, 1, 0.5)])
    monkeypatch.setenv("BRU_KALDI_NATIVE", "1")
    with pytest.raises(RuntimeError, match="BRU_KALDI_NATIVE=1 but the C\\+\\+ kernels .*missing.cpp"):
        forward_backward(torch.zeros(1, 2, 2), [2], graph.expand(1))
    monkeypatch.setenv("BRU_KALDI_NATIVE", "auto")
    with pytest.warns(UserWarning, match="the LF-MMI forward-backward runs as its loop of torch ops"):
        logprob, _ = forward_backward(torch.zeros(1, 2, 2), [2], graph.expand(1))
    assert float(logprob) == pytest.approx(0.0, abs=1e-6)
    assert native.native_ops(torch.zeros(1)) is None and "error" in broken.loaded  # no second attempt
    assert "error" not in fast_native._loaded

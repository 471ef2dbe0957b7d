"""The LF-MMI forward-backward's Triton kernel (bru_kaldi/chain/triton_fb.py) on the CPU, through Triton's
interpreter: against the sums over every path of tests/test_chain.py (which never form a vector: an
independent reference) and against the C++ op, with the leaky HMM, numerator windows, padded batches
holding NaN and inf, and a sequence without a path. On a GPU tests/test_chain.py -k cuda runs the compiled
kernel against the same references (its ``cuda_path`` "Triton kernel")."""

import math

import pytest
import torch

from bru_kaldi.chain import native, objective, triton_fb
from bru_kaldi.chain.graph import ChainGraph, denominator_graph
from tests.test_chain import CASES, arcs_of, brute_force, numerator_graph, random_graph

pytestmark = pytest.mark.slow  # the kernel through Triton's interpreter


@pytest.fixture(autouse=True)
def interpreted(monkeypatch):
    monkeypatch.setenv("BRU_KALDI_TRITON", "interpret")  # CPU tensors through the interpreter; errors raise
    monkeypatch.setattr(triton_fb, "_broken", {})


def kernel(x, lengths, graphs, leaky=0.0):
    result = triton_fb.forward_backward(x, torch.as_tensor(lengths), graphs, leaky)
    assert result is not None, "the kernel should serve CPU tensors under BRU_KALDI_TRITON=interpret"
    return result


@pytest.mark.parametrize("leaky", [0.0, 0.1, 0.7])
@pytest.mark.parametrize("seed,num_states,num_pdfs", CASES)
def test_the_kernel_is_the_sum_over_all_paths(seed, num_states, num_pdfs, leaky):
    """Frame counts 0-3 in one padded batch, the shorter sequences' padding NaN."""
    graph = random_graph(seed, num_states, num_pdfs, final_ones=seed % 2 == 0)
    x = 2 * torch.randn(4, 3, num_pdfs, generator=torch.Generator().manual_seed(300 + seed), dtype=torch.float64)
    lengths = [3, 1, 0, 2]
    for b, n in enumerate(lengths):
        x[b, n:] = float("nan")
    logprob, posteriors = kernel(x, lengths, graph.expand(4), leaky)
    for b, n in enumerate(lengths):
        expected_logprob, expected_posteriors = brute_force(graph, x[b, :n], leaky)
        assert float(logprob[b]) == pytest.approx(expected_logprob, abs=1e-10), (b, n)
        torch.testing.assert_close(posteriors[b, :n], expected_posteriors.reshape(n, num_pdfs), rtol=0, atol=1e-10)
        assert (posteriors[b, n:] == 0).all()


def test_numerator_windows_and_padding_give_the_brute_force():
    """The last alignment has a state that closes while the next one stays open: the backward pass must
    apply the windows too (frame 2 may not stay in segment 1, though segment 2 continues from there)."""
    alignments = [[0, 0, 1, 2, 2], [1], [2, 2, 0], [0, 1, 1, 1, 1, 2]]
    nums = [numerator_graph(a, tolerance=1) for a in alignments]
    lengths = [len(a) for a in alignments]
    x = torch.randn(4, 6, 3, generator=torch.Generator().manual_seed(8), dtype=torch.float64)
    x[1, 1:] = float("nan")
    x[2, 3:] = float("inf")
    logprob, posteriors = kernel(x, lengths, ChainGraph.batch(nums))
    for b, n in enumerate(lengths):
        expected_logprob, expected_posteriors = brute_force(nums[b], x[b, :n])
        assert float(logprob[b]) == pytest.approx(expected_logprob, abs=1e-10)
        torch.testing.assert_close(posteriors[b, :n], expected_posteriors, rtol=0, atol=1e-10)
        assert (posteriors[b, n:] == 0).all()


@pytest.mark.filterwarnings("ignore:divide by zero encountered in log")  # (numpy, in the interpreter: log 0)
def test_a_sequence_without_a_path_gives_minus_infinity_not_nan():
    logprob, posteriors = kernel(torch.zeros(1, 4, 2), [3], ChainGraph.batch([numerator_graph([0, 1])]))
    assert float(logprob) == -math.inf and (posteriors == 0).all()


@pytest.fixture
def cpp(monkeypatch):
    """The C++ op (built, or the test fails), called as objective.forward_backward calls it."""
    monkeypatch.setenv("BRU_KALDI_NATIVE", "1")
    ops = native.native_ops(torch.zeros(0))

    def run(x, lengths, g, leaky):
        return ops.forward_backward(x, torch.as_tensor(lengths), g.src, g.dst, g.pdf, g.weight, g.initial, g.final,
                                    g.windows, float(leaky))
    return run


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["f64", "f32"])
def test_the_kernel_gives_what_the_cpp_op_gives(cpp, dtype):
    """A denominator of 24 states (several arcs of one pdf out of a state, parallel arcs, self-loops: the
    posteriors' runs of one pdf) on a ragged batch of 4, and the batch's numerators with windows; float64
    to rounding, float32 to its own (both compute in double)."""
    den = denominator_graph(24, arcs_of(random_graph(21, 24, 7)))
    alignments = [[0, 0, 1, 3, 3, 3, 6, 2, 2, 5, 5, 4], [4, 4, 1, 1, 0, 6, 6], [2] * 9, [5, 6]]
    lengths = [len(a) for a in alignments]
    x = 3 * torch.randn(4, 12, 7, generator=torch.Generator().manual_seed(21), dtype=torch.float64)
    x = x.to(dtype)
    nums = ChainGraph.batch([numerator_graph(a, tolerance=2) for a in alignments])
    tolerance = 1e-10 if dtype == torch.float64 else 1e-5
    for graphs, leaky in [(den.expand(4), 0.1), (den.expand(4), 0.0), (nums, 0.0)]:
        logprob, posteriors = kernel(x, lengths, graphs, leaky)
        expected_logprob, expected_posteriors = cpp(x, lengths, graphs, leaky)
        assert logprob.dtype == posteriors.dtype == dtype
        torch.testing.assert_close(logprob, expected_logprob, rtol=tolerance, atol=tolerance)
        torch.testing.assert_close(posteriors, expected_posteriors, rtol=0, atol=tolerance)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["f64", "f32"])
def test_cuda_the_compiled_kernel_gives_what_the_cpp_op_gives_at_a_training_size(cpp, dtype):
    """On a GPU: 16 ragged sequences of up to 300 frames, 200 pdfs, a denominator of 300 states with 10
    arcs out of each (several programs' worth of states a thread, long runs of arcs) and the numerators."""
    generator = torch.Generator().manual_seed(5)
    S, P, B, T = 300, 200, 16, 300
    src = torch.arange(S).repeat_interleave(10)
    dst, pdf = torch.randint(0, S, (10 * S,), generator=generator), torch.randint(0, P, (10 * S,), generator=generator)
    weight = torch.rand(10 * S, generator=generator, dtype=torch.float64) * 0.2
    den = denominator_graph(S, zip(src.tolist(), dst.tolist(), pdf.tolist(), weight.tolist()))
    lengths = torch.randint(T // 2, T + 1, (B,), generator=generator)
    lengths[0] = T
    x = (3 * torch.randn(B, T, P, generator=generator, dtype=torch.float64)).to(dtype)
    alignments = [torch.randint(0, P, (int(n) // 4,), generator=generator).repeat_interleave(4) for n in lengths]
    nums = ChainGraph.batch([numerator_graph(a, tolerance=1) for a in alignments])
    tolerance = 1e-9 if dtype == torch.float64 else 1e-4
    for graphs, leaky in [(den.expand(B), 0.1), (nums, 0.0)]:
        lengths_used = lengths if graphs is not nums else torch.tensor([len(a) for a in alignments])
        logprob, posteriors = kernel(x.cuda(), lengths_used.cuda(), graphs.to("cuda"), leaky)
        expected_logprob, expected_posteriors = cpp(x, lengths_used, graphs, leaky)
        torch.testing.assert_close(logprob.cpu(), expected_logprob, rtol=tolerance, atol=tolerance)
        torch.testing.assert_close(posteriors.cpu(), expected_posteriors, rtol=0, atol=tolerance)


def test_auto_mode_falls_back_to_the_host_once_with_a_warning(monkeypatch):
    """In ``auto`` mode a batch too large for the int32 offsets goes to the host (warned once, the kernel
    kept for other batches), and a kernel that fails warns once and is not asked again for that device and
    dtype; ``1`` raises instead."""
    import warnings

    monkeypatch.setenv("BRU_KALDI_TRITON", "auto")
    monkeypatch.setattr(triton_fb.triton_loops, "wanted", lambda example: True)  # as for a GPU's outputs
    monkeypatch.setattr(triton_fb.triton_loops, "_warned", set())
    graph, x = random_graph(1, 3, 2), torch.zeros(2, 3, 2, dtype=torch.float64)
    with monkeypatch.context() as m:
        m.setattr(triton_fb.triton_loops, "INDEX_LIMIT", 50)
        with pytest.warns(UserWarning, match="too large for the LF-MMI kernel's int32 offsets"):
            assert triton_fb.forward_backward(x, torch.tensor([3, 2]), graph.expand(2), 0.1) is None
    assert not triton_fb._broken and triton_fb.forward_backward(x, torch.tensor([3, 2]), graph.expand(2), 0.1)

    class Broken:
        def __getitem__(self, grid):
            raise RuntimeError("no such instruction")

    monkeypatch.setattr(triton_fb, "_kernel", lambda interpret: Broken())
    with pytest.warns(UserWarning, match="LF-MMI Triton kernel could not run on cpu.*no such instruction"):
        assert triton_fb.forward_backward(x, torch.tensor([3, 2]), graph.expand(2), 0.1) is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no second warning
        assert triton_fb.forward_backward(x, torch.tensor([3, 2]), graph.expand(2), 0.1) is None
    monkeypatch.setenv("BRU_KALDI_TRITON", "1")
    monkeypatch.setattr(triton_fb, "_broken", {})
    with pytest.raises(RuntimeError, match="BRU_KALDI_TRITON=1 but the LF-MMI Triton kernel could not run"):
        triton_fb.forward_backward(x, torch.tensor([3, 2]), graph.expand(2), 0.1)


def test_objective_sends_only_cuda_outputs_to_the_kernel(monkeypatch):
    """The C++ op stays the CPU's path: objective.forward_backward asks the kernel for CUDA outputs only."""
    monkeypatch.setattr(triton_fb, "forward_backward", lambda *args: pytest.fail("the kernel was asked"))
    graph = random_graph(1, 3, 2)
    objective.forward_backward(torch.zeros(1, 2, 2, dtype=torch.float64), [2], graph.expand(1), 0.1)

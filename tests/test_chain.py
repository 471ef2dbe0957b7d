"""LF-MMI's core (bru_kaldi.chain) against references computed from the definitions: every path of small
graphs enumerated one by one, the numerator's rule written as boundary positions, gradcheck.

Why the references are independent of the code: the recursion multiplies normalised vectors frame by
frame and adds the leak as a vector update; the brute force below never forms a vector. It tells the
generative story of the leaky HMM path by path (start in a state drawn from the initial weights; at each of
the T + 1 frame boundaries either stay, weight 1, or leak to any state j, weight c * pi[j]; between
boundaries take an arc, which emits its pdf; end with the final weight) and sums the explicit products.
A mistake in the recursion (a leak missing in beta, a normaliser of the wrong frame, an arc's pdf read at
the wrong frame) changes numbers this sum does not depend on; test_a_broken_recursion_is_caught checks
that two such mistakes are caught.
"""

import itertools
import math
import random
from collections import Counter

import pytest
import torch

from bru_kaldi.chain import objective
from bru_kaldi.chain.graph import ChainGraph, denominator_graph, denominator_initial_probs
from bru_kaldi.chain.objective import (ChainObjective, denominator_forward_backward, forward_backward,
                                       lfmmi_loss, numerator_forward_backward)


# --- references ---------------------------------------------------------------------------------------

def alignment_segments(pdf_alignment) -> list[tuple[int, int, int]]:
    """The maximal runs of one pdf in a frame-level alignment, as ``(pdf, first_frame, end_frame)`` with
    ``end_frame`` exclusive.

    >>> alignment_segments([4, 4, 7, 4])
    [(4, 0, 2), (7, 2, 3), (4, 3, 4)]
    """
    frames = [int(p) for p in (pdf_alignment.tolist() if hasattr(pdf_alignment, "tolist") else pdf_alignment)]
    segments = []
    for t, p in enumerate(frames):
        if segments and segments[-1][0] == p:
            segments[-1][2] = t + 1
        else:
            segments.append([p, t, t + 1])
    return [tuple(s) for s in segments]


def numerator_graph(pdf_alignment, tolerance: int = 0, dtype: torch.dtype = torch.float64) -> ChainGraph:
    """A numerator-like FSA with time windows, for the objective's tests: the pdf sequences of a pdf
    alignment's length ``T`` within ``tolerance`` frames of its segment boundaries, each with weight 1.
    (Training makes its numerators from phones and the HMMs, as Kaldi: ``bru_kaldi.chain.numerator``; this
    simpler rule gives windows whose every accepted sequence is easy to list, :func:`by_the_rule`.)

    The rule. Cut the alignment into its ``K`` segments (:func:`alignment_segments`), segment ``k`` with
    pdf ``p_k`` on frames ``[s_k, e_k)``. A sequence ``y_0 .. y_{T-1}`` is accepted if and only if it is
    ``p_1`` repeated ``n_1 >= 1`` times, then ``p_2`` ``n_2 >= 1`` times, ..., then ``p_K`` ``n_K >= 1``
    times (segments in order, none skipped, none vanishing), and every frame ``t`` that emits segment ``k``
    lies in that segment's frames widened by ``tolerance`` on both sides: ``s_k - tolerance <= t <= e_k - 1 +
    tolerance``. Equivalently: segment ``k`` starts at a frame ``b_k`` with ``b_1 = 0``, ``b_1 < b_2 < ...
    < b_K < T`` and ``|b_k - s_k| <= tolerance`` (each boundary moves by at most ``tolerance`` frames).
    ``tolerance = 0`` accepts the alignment alone. This is Kaldi's ``--left-tolerance`` /
    ``--right-tolerance`` (each phone kept within its aligned frames widened by the tolerance), applied to
    segments of a pdf alignment instead of to phones. Adjacent segments have different pdfs, so an accepted
    sequence has one path: its weight is exactly 1.

    The FSA is the alignment's segments in a row, with the rule's time limits as windows: state 0 is the
    start (initial weight 1), state ``k`` (1-based) "frame just emitted segment ``k``", with arcs ``k -> k``
    and ``k - 1 -> k`` emitting ``p_k``; ``windows[t]`` opens state ``k`` after frame ``t`` only where the rule
    lets frame ``t`` emit segment ``k``; state ``K`` is the one final state (weight 1). ``K + 1`` states and
    ``2 K`` arcs serve all ``T`` frames; it accepts sequences of length ``T`` only.

    >>> g = numerator_graph([5, 5, 6])
    >>> g.num_states, g.pdf.tolist(), g.final.tolist(), g.windows.tolist()
    (3, [5, 5, 6, 6], [0.0, 0.0, 1.0], [[0.0, 1.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]])
    >>> numerator_graph([5, 5, 6], tolerance=1).windows[1].tolist()  # frame 1 may emit either: 5 5 6 or 5 6 6
    [0.0, 1.0, 1.0]
    """
    if tolerance < 0:
        raise ValueError(f"tolerance must be >= 0, not {tolerance}")
    # :func:`alignment_segments` in tensor ops: a training batch makes one of these per utterance per
    # step, and a Python loop over frames and segments took as long as the C++ forward-backward
    frames = torch.as_tensor(pdf_alignment, dtype=torch.int64).reshape(-1)
    num_frames = frames.shape[0]
    if not num_frames:
        raise ValueError("an empty alignment has no numerator graph")
    starts = torch.ones(num_frames, dtype=torch.bool)
    starts[1:] = frames[1:] != frames[:-1]
    first = starts.nonzero().reshape(-1)  # (K,) s_k
    end = torch.cat([first[1:], first.new_tensor([num_frames])])  # (K,) e_k
    count = first.shape[0]
    k = torch.arange(1, count + 1)
    src = torch.stack([k - 1, k], dim=1).reshape(-1)  # per segment: k - 1 -> k, then k -> k
    dst = k.repeat_interleave(2)
    pdf = frames[first].repeat_interleave(2)
    time = torch.arange(num_frames)[:, None]
    windows = torch.zeros(num_frames, count + 1, dtype=dtype)
    windows[:, 1:] = ((time >= first - tolerance) & (time < end + tolerance)).to(dtype)
    windows[0, 2:] = 0.0  # (the first frame can only be segment 1's; the arcs say so too)
    initial, final = torch.zeros(count + 1, dtype=dtype), torch.zeros(count + 1, dtype=dtype)
    initial[0], final[count] = 1.0, 1.0
    return ChainGraph(count + 1, src, dst, pdf, torch.ones(2 * count, dtype=dtype), initial, final, windows)



def random_graph(seed, num_states, num_pdfs, final_ones=False):
    """1 to 3 arcs out of every state (self-loops and parallel arcs allowed), weights in [0.2, 1], initial
    weights random (some 0), final weights random or all 1."""
    rng = random.Random(seed)
    arcs = [(s, rng.randrange(num_states), rng.randrange(num_pdfs), rng.uniform(0.2, 1.0))
            for s in range(num_states) for _ in range(rng.randint(1, 3))]
    initial = [rng.choice([0.0, rng.uniform(0.1, 1.0)]) for _ in range(num_states)]
    initial[rng.randrange(num_states)] = 1.0
    total = sum(initial)
    final = [1.0] * num_states if final_ones else [rng.uniform(0.3, 1.5) for _ in range(num_states)]
    return ChainGraph.from_arcs(num_states, arcs, initial=[p / total for p in initial], final=final)


def arcs_of(graph):
    """The graph's arcs as ``(src, dst, pdf, weight)`` tuples."""
    return list(zip(*(getattr(graph, name).tolist() for name in ("src", "dst", "pdf", "weight"))))


def paths(graph, num_frames, leaky=0.0):
    """Every path of ``num_frames`` arcs through ``graph`` with the leaky HMM's choices, as (weight without
    the outputs, the pdf of each frame). A graph with time windows: an arc that emits frame ``t`` may end
    only in a state open after ``t``."""
    initial, final = graph.initial.tolist(), graph.final.tolist()
    windows = graph.windows.tolist() if graph.windows is not None else None

    def open_after(frame, state):
        return windows is None or frame >= len(windows) or windows[frame][state] > 0
    leaving = {s: [] for s in range(graph.num_states)}
    for src, dst, pdf, weight in arcs_of(graph):
        leaving[src].append((dst, pdf, weight))

    def choices_at_boundary(state):
        yield state, 1.0  # stay
        if leaky:
            for j, p in enumerate(initial):  # leak, to any state, its own included
                if p > 0:
                    yield j, leaky * p

    def walk(state, frame, weight, pdfs):
        for after, leak_weight in choices_at_boundary(state):
            if frame == num_frames:
                yield weight * leak_weight * final[after], pdfs
            else:
                for dst, pdf, arc_weight in leaving[after]:
                    if open_after(frame, dst):
                        yield from walk(dst, frame + 1, weight * leak_weight * arc_weight, pdfs + (pdf,))

    for state, p in enumerate(initial):
        if p > 0:
            yield from walk(state, 0, p, ())


def brute_force(graph, x, leaky=0.0):
    """log P and the pdf posteriors (each path's share of P, added to its pdf at each frame) of outputs
    ``x`` (T, P) by enumerating :func:`paths`, in float64."""
    x = x.double().tolist()
    num_frames, num_pdfs = len(x), len(x[0]) if x else 0
    weighted = [(w * math.exp(sum(x[t][p] for t, p in enumerate(pdfs))), pdfs)
                for w, pdfs in paths(graph, num_frames, leaky)]
    total = sum(w for w, _ in weighted)
    posteriors = [[0.0] * num_pdfs for _ in range(num_frames)]
    for w, pdfs in weighted:
        for t, p in enumerate(pdfs):
            posteriors[t][p] += w / total
    return math.log(total), torch.tensor(posteriors, dtype=torch.float64).reshape(num_frames, num_pdfs)


def run_one(graph, x, leaky=0.0):
    """The code under test on one utterance ``x`` (T, P): (log P, posteriors (T, P))."""
    logprob, posteriors = forward_backward(x[None], [x.shape[0]], graph.expand(1), leaky)
    return float(logprob[0]), posteriors[0]


CASES = [(seed, 3 + seed % 3, 2 + seed % 3) for seed in range(6)]  # (seed, states 3..5, pdfs 2..4)


# --- the denominator against the brute force ----------------------------------------------------------

@pytest.mark.parametrize("seed,num_states,num_pdfs", CASES)
def test_without_leak_logprob_and_posteriors_are_the_sums_over_all_paths(seed, num_states, num_pdfs):
    graph = random_graph(seed, num_states, num_pdfs)
    generator = torch.Generator().manual_seed(seed)
    for num_frames in range(1, 6):
        x = 2 * torch.randn(num_frames, num_pdfs, generator=generator, dtype=torch.float64)
        expected_logprob, expected_posteriors = brute_force(graph, x)
        logprob, posteriors = run_one(graph, x)
        assert logprob == pytest.approx(expected_logprob, abs=1e-10), num_frames
        torch.testing.assert_close(posteriors, expected_posteriors, rtol=0, atol=1e-10)


@pytest.mark.parametrize("leaky", [0.1, 0.7])
@pytest.mark.parametrize("seed,num_states,num_pdfs", CASES)
def test_the_leaky_hmm_is_the_sum_over_paths_that_may_leak_at_every_boundary(seed, num_states, num_pdfs, leaky):
    graph = random_graph(seed, num_states, num_pdfs, final_ones=seed % 2 == 0)
    generator = torch.Generator().manual_seed(100 + seed)
    for num_frames in range(1, 5 if num_states == 3 else 4):
        x = 2 * torch.randn(num_frames, num_pdfs, generator=generator, dtype=torch.float64)
        expected_logprob, expected_posteriors = brute_force(graph, x, leaky)
        logprob, posteriors = run_one(graph, x, leaky)
        assert logprob == pytest.approx(expected_logprob, abs=1e-10), num_frames
        torch.testing.assert_close(posteriors, expected_posteriors, rtol=0, atol=1e-10)


def test_zero_frames_is_the_empty_path_with_its_two_leaks():
    graph = random_graph(3, 3, 2)
    x = torch.zeros(0, 2, dtype=torch.float64)
    for leaky in (0.0, 0.3):
        assert run_one(graph, x, leaky)[0] == pytest.approx(brute_force(graph, x, leaky)[0], abs=1e-12)


def test_denominator_forward_backward_is_the_graph_for_every_utterance_and_float32_agrees():
    graph = random_graph(4, 4, 3)
    x = torch.randn(2, 3, 3, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    logprob, posteriors = denominator_forward_backward(x, [3, 3], graph, leaky_coefficient=0.2)
    for b in range(2):
        expected_logprob, expected_posteriors = brute_force(graph, x[b], 0.2)
        assert float(logprob[b]) == pytest.approx(expected_logprob, abs=1e-10)
        torch.testing.assert_close(posteriors[b], expected_posteriors, rtol=0, atol=1e-10)
    logprob32, posteriors32 = denominator_forward_backward(x.float(), [3, 3], graph, leaky_coefficient=0.2)
    assert logprob32.dtype == posteriors32.dtype == torch.float32
    torch.testing.assert_close(logprob32.double(), logprob, rtol=0, atol=1e-5)
    torch.testing.assert_close(posteriors32.double(), posteriors, rtol=0, atol=1e-5)


def test_long_utterances_stay_in_range_in_float32_and_each_frame_posteriors_sum_to_one():
    """2000 frames: without the per-frame renormalisation the probabilities would underflow long before."""
    graph = denominator_graph(5, arcs_of(random_graph(7, 5, 4)))
    x = 5 * torch.randn(2, 2000, 4, generator=torch.Generator().manual_seed(7), dtype=torch.float64)
    lengths = [2000, 1500]
    logprob64, posteriors64 = denominator_forward_backward(x, lengths, graph, leaky_coefficient=0.1)
    logprob32, posteriors32 = denominator_forward_backward(x.float(), lengths, graph, leaky_coefficient=0.1)
    assert torch.isfinite(logprob32).all()
    torch.testing.assert_close(logprob32.double(), logprob64, rtol=1e-5, atol=0)
    torch.testing.assert_close(posteriors32.double(), posteriors64, rtol=0, atol=1e-3)
    sums = posteriors64.sum(2)
    torch.testing.assert_close(sums[0], torch.ones(2000, dtype=torch.float64))
    torch.testing.assert_close(sums[1], torch.cat([torch.ones(1500), torch.zeros(500)]).double())


def test_a_broken_recursion_is_caught(monkeypatch):
    """The brute force notices a leak dropped from the backward pass, and a leak added with the wrong
    weights: mutations of the code that the comparison above must fail on. (Of the torch loop: the C++ op,
    which the comparisons above run on a CPU, is mutated by hand, see tests/test_chain_native.py.)"""
    monkeypatch.setenv("BRU_KALDI_NATIVE", "0")
    graph = random_graph(5, 4, 3)
    x = torch.randn(3, 3, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    expected_logprob, expected_posteriors = brute_force(graph, x, 0.5)

    monkeypatch.setattr(objective, "_leak_backward", lambda beta, initial, leaky: beta)
    _, posteriors = run_one(graph, x, 0.5)
    assert (posteriors - expected_posteriors).abs().max() > 1e-3

    monkeypatch.setattr(objective, "_leak_forward",
                        lambda alpha, initial, leaky: alpha + leaky * alpha.sum(1, keepdim=True) / alpha.shape[1])
    logprob, _ = run_one(graph, x, 0.5)
    assert abs(logprob - expected_logprob) > 1e-3


# --- the denominator's initial probabilities ------------------------------------------------------------

def test_initial_probs_are_kaldis_set_initial_probs_by_hand():
    """Kaldi's DenominatorGraph::SetInitialProbs: each state's arcs and final weight scaled to sum 1, then the
    occupancy from the start state averaged over the first steps, renormalised after each step."""
    # 0 -> 0 (0.75), 0 -> 1 (0.25); 1 -> 0 (2.0), and state 1's final weight 2.0: normalised, 1 -> 0 is 1/2
    graph = ChainGraph.from_arcs(2, [(0, 0, 0, 0.75), (0, 1, 1, 0.25), (1, 0, 0, 2.0)])
    final = torch.tensor([0.0, 2.0], dtype=torch.float64)
    # p_0 = [1, 0]; p_1 = [3/4, 1/4]; p_2 = [3/4 * 3/4 + 1/4 * 1/2, 3/4 * 1/4] / (11/16 + 3/16) = [11/14, 3/14]
    torch.testing.assert_close(denominator_initial_probs(graph, num_iters=3, final=final),
                               torch.tensor([(1 + 3 / 4 + 11 / 14) / 3, (0 + 1 / 4 + 3 / 14) / 3], dtype=torch.float64))
    # without final weights 1 -> 0 is 1: p_2 = [3/4 * 3/4 + 1/4, 3/16] = [13/16, 3/16]
    torch.testing.assert_close(denominator_initial_probs(graph, num_iters=3),
                               torch.tensor([(1 + 3 / 4 + 13 / 16) / 3, (0 + 1 / 4 + 3 / 16) / 3], dtype=torch.float64))
    # this toolkit's first version, kept for the ablation: no normalisation, 1 -> 0 keeps its 2:
    # p_2 = [3/4 * 3/4 + 1/4 * 2, 3/4 * 1/4] / sum = [17/20, 3/20]
    torch.testing.assert_close(denominator_initial_probs(graph, num_iters=3, final=final, normalise=False),
                               torch.tensor([(1 + 3 / 4 + 17 / 20) / 3, (0 + 1 / 4 + 3 / 20) / 3], dtype=torch.float64))


def test_normalised_initial_probs_do_not_favour_a_state_with_many_arcs():
    """Silence's four-way branching, in small: state 1 has four arcs of weight 1 (three self-loops with their
    own pdfs, one back to 0), state 0 two (itself, 1); weights that are not a distribution. Normalised, 1 -> 0
    is 1/4 and 0 -> 1 is 1/2: the stationary law is [1/3, 2/3]. Unnormalised, the occupancy follows the
    Perron vector of [[1, 1], [1, 3]], (1 + sqrt 2) / (2 + sqrt 2) = 1 / sqrt 2 on state 1."""
    graph = ChainGraph.from_arcs(2, [(0, 0, 0, 1.0), (0, 1, 0, 1.0)] + [(1, 1, p, 1.0) for p in range(3)]
                                 + [(1, 0, 3, 1.0)])
    kaldi, unnormalised = (denominator_initial_probs(graph, num_iters=2000, normalise=n) for n in (True, False))
    assert kaldi.tolist() == pytest.approx([1 / 3, 2 / 3], abs=2e-3)  # the average keeps 1/2000 of the start
    assert float(unnormalised[1]) == pytest.approx(2 ** -0.5, abs=2e-3)


def test_initial_probs_tend_to_the_stationary_distribution_of_a_stochastic_graph():
    graph = random_graph(11, 5, 3)
    # make the arcs out of each state sum to 1, then find the stationary vector as an eigenvector
    out = torch.zeros(5, dtype=torch.float64).index_add_(0, graph.src, graph.weight)
    stochastic = ChainGraph(5, graph.src, graph.dst, graph.pdf, graph.weight / out[graph.src], graph.initial,
                            graph.final)
    matrix = torch.zeros(5, 5, dtype=torch.float64).index_put_((graph.src, graph.dst), stochastic.weight,
                                                               accumulate=True)
    values, vectors = torch.linalg.eig(matrix.T)
    stationary = vectors[:, values.real.argmax()].real
    stationary = stationary / stationary.sum()
    averaged = denominator_initial_probs(stochastic, start_state=int(graph.src[0]), num_iters=20000)
    reachable = averaged > 1e-3  # a state the start cannot reach keeps 0; the rest is the stationary law
    torch.testing.assert_close(averaged, stationary * reachable / (stationary * reachable).sum(), rtol=0,
                               atol=2e-3)


def test_denominator_graph_makes_every_state_final_and_rejects_dead_graphs():
    graph = denominator_graph(3, [(0, 1, 0, 1.0), (1, 2, 1, 1.0), (2, 0, 0, 0.5), (2, 2, 1, 0.5)])
    assert graph.final.tolist() == [1.0, 1.0, 1.0]
    assert float(graph.initial.sum()) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="state 1 has neither arcs nor a final weight"):  # Kaldi asserts it
        denominator_initial_probs(ChainGraph.from_arcs(2, [(0, 1, 0, 1.0)]))
    with pytest.raises(ValueError, match="dies out"):
        denominator_initial_probs(ChainGraph.from_arcs(2, [(0, 1, 0, 1.0)]), normalise=False)


# --- the numerator graph ------------------------------------------------------------------------------

def accepted(graph, num_frames):
    """The pdf sequences of every path of the graph, counted (a path of weight 0 is not one)."""
    found = Counter()
    for weight, pdfs in paths(graph, num_frames):
        if weight > 0:
            assert weight == 1.0, (weight, pdfs)
            found[pdfs] += 1
    return found


def by_the_rule(alignment, tolerance):
    """The sequences of the documented rule, written as boundaries: segment k starts at b_k, b_1 = 0 <
    b_2 < ... < b_K < T, and |b_k - s_k| <= tolerance."""
    segments = alignment_segments(alignment)
    num_frames = len(alignment)
    found = set()
    for starts in itertools.combinations(range(1, num_frames), len(segments) - 1):
        if all(abs(b - s[1]) <= tolerance for b, s in zip(starts, segments[1:])):
            ends = list(starts) + [num_frames]
            found.add(tuple(s[0] for s, begin, end in zip(segments, [0] + list(starts), ends)
                            for _ in range(begin, end)))
    return found


ALIGNMENTS = [[0], [1, 1, 1], [0, 0, 1, 1, 2], [2, 1, 2, 2, 0], [0, 1, 0, 1, 0, 1], [1, 1, 0, 0, 0, 2, 2]]


@pytest.mark.parametrize("alignment", ALIGNMENTS)
def test_tolerance_zero_accepts_the_alignment_alone(alignment):
    graph = numerator_graph(alignment)
    assert accepted(graph, len(alignment)) == Counter({tuple(alignment): 1})
    segments = len(alignment_segments(alignment))  # K + 1 states and 2 K arcs serve every frame
    assert graph.num_states == segments + 1 and graph.num_arcs == 2 * segments
    x = torch.randn(len(alignment), 3, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    logprob, posteriors = numerator_forward_backward(x[None], [len(alignment)], [graph])
    assert float(logprob) == pytest.approx(sum(float(x[t, p]) for t, p in enumerate(alignment)), abs=1e-12)
    assert posteriors[0].tolist() == torch.nn.functional.one_hot(torch.tensor(alignment), 3).double().tolist()


@pytest.mark.parametrize("tolerance", [1, 2, 3])
@pytest.mark.parametrize("alignment", ALIGNMENTS)
def test_a_tolerance_accepts_exactly_the_sequences_of_the_rule_once_each(alignment, tolerance):
    graph = numerator_graph(alignment, tolerance)
    num_pdfs = 3
    found = accepted(graph, len(alignment))
    assert set(found.values()) == {1}  # unambiguous: weight 1 per sequence
    # every sequence over the pdfs, checked one by one against the rule
    for sequence in itertools.product(range(num_pdfs), repeat=len(alignment)):
        assert (sequence in found) == (sequence in by_the_rule(alignment, tolerance)), sequence
    # and the recursion on it sums exactly those sequences
    x = torch.randn(len(alignment), num_pdfs, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    logprob, posteriors = numerator_forward_backward(x[None], [len(alignment)], [graph])
    expected = math.log(sum(math.exp(sum(float(x[t, p]) for t, p in enumerate(s))) for s in found))
    assert float(logprob) == pytest.approx(expected, abs=1e-12)
    torch.testing.assert_close(posteriors[0], brute_force(graph, x)[1], rtol=0, atol=1e-12)
    assert graph.num_states == len(alignment_segments(alignment)) + 1


def test_the_rule_on_a_worked_example():
    """Segments 0: frames 0-1, 1: frames 2-3, 2: frame 4; with tolerance 1 the second segment may start at
    frame 1, 2 or 3 and the third at 3 or 4, the second never vanishing."""
    expected = {(0, 1, 1, 2, 2), (0, 1, 1, 1, 2), (0, 0, 1, 2, 2), (0, 0, 1, 1, 2), (0, 0, 0, 1, 2)}
    assert set(accepted(numerator_graph([0, 0, 1, 1, 2], tolerance=1), 5)) == expected
    assert by_the_rule([0, 0, 1, 1, 2], 1) == expected


def test_numerator_graph_rejects_bad_arguments():
    with pytest.raises(ValueError):
        numerator_graph([])
    with pytest.raises(ValueError):
        numerator_graph([0, 1], tolerance=-1)


# --- batches and padding ------------------------------------------------------------------------------

def test_padded_batches_give_what_each_utterance_gives_alone():
    den = random_graph(8, 4, 3, final_ones=True)
    alignments = [[0, 0, 1, 2, 2], [1], [2, 2, 0]]
    nums = [numerator_graph(a, tolerance=1) for a in alignments]
    lengths = [len(a) for a in alignments]
    x = torch.randn(3, 5, 3, generator=torch.Generator().manual_seed(8), dtype=torch.float64)
    x[1, 1:] = float("nan")  # padding, whatever it holds, must not count
    x[2, 3:] = float("inf")
    den_logprob, den_posteriors = denominator_forward_backward(x, lengths, den, leaky_coefficient=0.1)
    num_logprob, num_posteriors = numerator_forward_backward(x, lengths, nums)
    for b, length in enumerate(lengths):
        alone = x[b:b + 1, :length]
        for (logprob, posteriors), (logprob_alone, posteriors_alone) in [
                ((den_logprob, den_posteriors), denominator_forward_backward(alone, [length], den, 0.1)),
                ((num_logprob, num_posteriors), numerator_forward_backward(alone, [length], [nums[b]]))]:
            assert float(logprob[b]) == pytest.approx(float(logprob_alone[0]), abs=1e-12)
            torch.testing.assert_close(posteriors[b, :length], posteriors_alone[0], rtol=0, atol=1e-12)
            assert (posteriors[b, length:] == 0).all()


def test_a_graph_without_a_path_of_the_length_gives_minus_infinity_not_nan():
    logprob, posteriors = numerator_forward_backward(torch.zeros(1, 4, 2), [3], [numerator_graph([0, 1])])
    assert float(logprob) == -math.inf and (posteriors == 0).all()


def test_inputs_are_checked():
    graph = random_graph(0, 3, 2)
    with pytest.raises(ValueError, match="lengths"):
        denominator_forward_backward(torch.zeros(1, 2, 2), [3], graph)
    with pytest.raises(ValueError, match="pdf"):
        denominator_forward_backward(torch.zeros(1, 2, 1), [2], graph)
    with pytest.raises(ValueError, match="ids outside"):
        ChainGraph.from_arcs(2, [(0, 2, 0, 1.0)])
    with pytest.raises(ValueError, match="costs"):
        ChainGraph.from_arcs(1, [(0, 0, 0, -1.0)])


# --- the objective and its gradient -------------------------------------------------------------------

def loss_case(seed=9):
    den = denominator_graph(4, [(0, 0, 0, 0.5), (0, 1, 1, 0.5), (1, 1, 1, 0.6), (1, 2, 2, 0.4),
                                (2, 3, 0, 0.7), (2, 0, 2, 0.3), (3, 0, 1, 1.0)])
    alignments = [[0, 1, 1, 2], [2, 0, 0]]
    nums = [numerator_graph(a, tolerance=1) for a in alignments]
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(2, 4, 3, generator=generator, dtype=torch.float64)
    xent = torch.randn(2, 4, 3, generator=generator, dtype=torch.float64)
    return den, nums, [4, 3], x, xent


def test_the_loss_is_kaldis_objective_per_frame_with_its_regularisers():
    den, nums, lengths, x, xent = loss_case()
    result = lfmmi_loss(x, lengths, nums, den, leaky_coefficient=0.1, xent_output=xent, xent_regularize=0.25,
                        output_l2=0.01)
    num_logprob, num_posteriors = numerator_forward_backward(x, lengths, nums)
    den_logprob, _ = denominator_forward_backward(x, lengths, den, 0.1)
    valid = torch.tensor([[1.0] * 4, [1.0] * 3 + [0.0]], dtype=torch.float64)[..., None]
    objf = float((num_logprob - den_logprob).sum()) / 7
    l2_term = -0.5 * 0.01 * float((x * valid).pow(2).sum()) / 7
    xent_objf = float((num_posteriors * torch.log_softmax(xent, 2) * valid).sum()) / 7
    assert result.num_frames == 7
    assert (result.objf, result.l2_term, result.xent_objf) == pytest.approx((objf, l2_term, xent_objf), abs=1e-12)
    assert float(result.loss) == pytest.approx(-(objf + l2_term + 0.25 * xent_objf), abs=1e-12)


def test_the_chain_gradient_is_the_numerator_minus_the_denominator_posteriors():
    den, nums, lengths, x, xent = loss_case()
    x.requires_grad_(True)
    xent.requires_grad_(True)
    lfmmi_loss(x, lengths, nums, den, leaky_coefficient=0.1, xent_output=xent, xent_regularize=0.25).loss.backward()
    _, num_posteriors = numerator_forward_backward(x, lengths, nums)
    _, den_posteriors = denominator_forward_backward(x, lengths, den, 0.1)
    torch.testing.assert_close(x.grad, -(num_posteriors - den_posteriors) / 7, rtol=0, atol=1e-12)
    # the xent head is pulled towards the numerator posteriors, on real frames only
    valid = torch.tensor([[1.0] * 4, [1.0] * 3 + [0.0]], dtype=torch.float64)[..., None]
    expected = -0.25 / 7 * (num_posteriors - torch.softmax(xent.detach(), 2) * valid)
    torch.testing.assert_close(xent.grad, expected, rtol=0, atol=1e-12)


def test_gradcheck_on_the_loss():
    """In two parts: the xent term's target, the numerator posteriors, depends on the chain output but is a
    constant there (as in Kaldi), so d loss / d x is the gradient of the loss without that term."""
    den, nums, lengths, x, xent = loss_case(10)
    x.requires_grad_(True)
    xent.requires_grad_(True)

    def chain_and_l2(x):
        return lfmmi_loss(x, lengths, nums, den, leaky_coefficient=0.3, output_l2=0.05).loss

    def with_xent(xent):
        return lfmmi_loss(x.detach(), lengths, nums, den, leaky_coefficient=0.3, xent_output=xent,
                          xent_regularize=0.2, output_l2=0.05).loss

    assert torch.autograd.gradcheck(chain_and_l2, (x,), eps=1e-6, atol=1e-7)
    assert torch.autograd.gradcheck(with_xent, (xent,), eps=1e-6, atol=1e-7)
    # with both: the gradient for x is the same as without the xent head
    x_grad, = torch.autograd.grad(chain_and_l2(x), x)
    x_grad_with_xent, _ = torch.autograd.grad(lfmmi_loss(x, lengths, nums, den, leaky_coefficient=0.3,
                                                         xent_output=xent, output_l2=0.05).loss, (x, xent))
    torch.testing.assert_close(x_grad_with_xent, x_grad, rtol=0, atol=1e-15)


def test_chain_objective_per_utterance_and_float32():
    den, nums, lengths, x, _ = loss_case()
    objf, num_posteriors = ChainObjective.apply(x.float(), lengths, ChainGraph.batch(nums), den, 0.1)
    objf64, _ = ChainObjective.apply(x, lengths, ChainGraph.batch(nums), den, 0.1)
    assert objf.dtype == num_posteriors.dtype == torch.float32 and not num_posteriors.requires_grad
    torch.testing.assert_close(objf.double(), objf64, rtol=0, atol=1e-5)


# --- on a GPU: every path (the Triton kernel, the C++ op on the host, the torch loop on the GPU) against the
# same references

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
# path -> (BRU_KALDI_TRITON, BRU_KALDI_NATIVE)
CUDA_PATHS = {"Triton kernel": ("1", "1"), "host C++": ("0", "1"), "torch loop on the GPU": ("0", "0")}


@pytest.fixture(params=list(CUDA_PATHS))
def cuda_path(request, monkeypatch):
    """GPU outputs through the Triton kernel (``BRU_KALDI_TRITON=1``, bru_kaldi/chain/triton_fb.py), the C++ op
    on the host (``BRU_KALDI_NATIVE=1``) or the loop of torch ops on the GPU; each must run or the test fails."""
    triton_mode, native_mode = CUDA_PATHS[request.param]
    monkeypatch.setenv("BRU_KALDI_TRITON", triton_mode)
    monkeypatch.setenv("BRU_KALDI_NATIVE", native_mode)
    return request.param


@needs_cuda
@pytest.mark.parametrize("leaky", [0.0, 0.1, 0.7])
@pytest.mark.parametrize("seed,num_states,num_pdfs", CASES)
def test_cuda_float64_is_the_sum_over_all_paths(seed, num_states, num_pdfs, leaky, cuda_path):
    graph = random_graph(seed, num_states, num_pdfs, final_ones=seed % 2 == 0)
    generator = torch.Generator().manual_seed(200 + seed)
    for num_frames in range(1, 4):
        x = 2 * torch.randn(num_frames, num_pdfs, generator=generator, dtype=torch.float64)
        expected_logprob, expected_posteriors = brute_force(graph, x, leaky)
        logprob, posteriors = forward_backward(x[None].cuda(), [num_frames], graph.expand(1), leaky)
        assert logprob.is_cuda and posteriors.is_cuda
        assert float(logprob[0]) == pytest.approx(expected_logprob, abs=1e-10), num_frames
        torch.testing.assert_close(posteriors[0].cpu(), expected_posteriors, rtol=0, atol=1e-10)


@needs_cuda
def test_cuda_padded_batches_and_numerator_windows_give_the_brute_force(cuda_path):
    """Padding holding NaN and inf, numerator graphs with tolerance windows, on the GPU in float64."""
    den = random_graph(8, 4, 3, final_ones=True)
    alignments = [[0, 0, 1, 2, 2], [1], [2, 2, 0]]
    nums = [numerator_graph(a, tolerance=1) for a in alignments]
    lengths = [len(a) for a in alignments]
    x = torch.randn(3, 5, 3, generator=torch.Generator().manual_seed(8), dtype=torch.float64)
    x[1, 1:] = float("nan")
    x[2, 3:] = float("inf")
    den_logprob, den_posteriors = denominator_forward_backward(x.cuda(), lengths, den, leaky_coefficient=0.1)
    num_logprob, num_posteriors = numerator_forward_backward(x.cuda(), lengths, nums)
    for b, length in enumerate(lengths):
        for (logprob, posteriors), (expected_logprob, expected_posteriors) in [
                ((den_logprob, den_posteriors), brute_force(den, x[b, :length], 0.1)),
                ((num_logprob, num_posteriors), brute_force(nums[b], x[b, :length]))]:
            assert float(logprob[b]) == pytest.approx(expected_logprob, abs=1e-10)
            torch.testing.assert_close(posteriors[b, :length].cpu(), expected_posteriors, rtol=0, atol=1e-10)
            assert (posteriors[b, length:] == 0).all()


@needs_cuda
def test_cuda_gradcheck_on_the_loss(cuda_path):
    den, nums, lengths, x, _ = loss_case(10)
    x = x.cuda().requires_grad_(True)
    lengths = torch.tensor(lengths, device="cuda")
    den = den.to("cuda")
    assert torch.autograd.gradcheck(
        lambda x: lfmmi_loss(x, lengths, nums, den, leaky_coefficient=0.3, output_l2=0.05).loss, (x,),
        eps=1e-6, atol=1e-7)


@needs_cuda
def test_cuda_gives_what_the_cpu_gives(cuda_path, monkeypatch):
    """The CPU side is the C++ op on CPU outputs, the GPU side the fixture's path."""
    den, nums, lengths, x, xent = loss_case()
    results = {}
    for device in ("cpu", "cuda"):
        monkeypatch.setenv("BRU_KALDI_NATIVE", "1" if device == "cpu" else CUDA_PATHS[cuda_path][1])
        xs = x.detach().to(device).requires_grad_(True)  # a leaf on each device
        result = lfmmi_loss(xs, torch.tensor(lengths, device=device), nums, den.to(device), leaky_coefficient=0.1,
                            xent_output=xent.to(device), output_l2=0.01)
        result.loss.backward()
        results[device] = (result.loss.detach().cpu(), xs.grad.cpu())
    torch.testing.assert_close(results["cuda"], results["cpu"])

"""The LF-MMI numerator (bru_kaldi/chain/numerator.py) against a brute force over Kaldi's rule.

The reference enumerates, for an utterance's phones in order, every way to share the output frames among
them and every path through each phone's HMM (reordered arc order), keeps the pdf sequences whose every
frame's phone is allowed there by Kaldi's formula (AlignmentToProtoSupervision: the phone's full-rate frames
widened by the tolerance, mapped to output frames with ceil), and weighs each by the product of its
transitions' probabilities. The graph's own paths are summed the same way, by pdf sequence.
"""

import itertools
from collections import defaultdict

import numpy as np
import pytest
import torch

from bru_kaldi.chain.numerator import NumeratorCompiler
from bru_kaldi.kaldi.transition_model import HmmState, HmmTopology, TransitionModel, TransitionState


def model(kind):
    """``chain``: Kaldi's 1-state chain topology (forward pdf 2 (p - 1), self-loop pdf one more); ``two``: a
    2-state left-to-right HMM with self-loops whose second state may also be skipped (0 -> 2), forward pdf 2
    (p - 1) + s, self-loop pdf 10 more. Transition probabilities as the topology's, phones 1-3."""
    phones = (1, 2, 3)
    if kind == "chain":
        entry = [HmmState(0, 1, ((0, 0.5), (1, 0.5))), HmmState(-1, -1, ())]
        tuples = [TransitionState(p, 0, 2 * (p - 1), 2 * (p - 1) + 1) for p in phones]
    else:
        entry = [HmmState(0, 0, ((0, 0.5), (1, 0.3), (2, 0.2))), HmmState(1, 1, ((1, 0.6), (2, 0.4))),
                 HmmState(-1, -1, ())]
        tuples = [TransitionState(p, s, 2 * (p - 1) + s, 10 + 2 * (p - 1) + s) for p in phones for s in (0, 1)]
    log_probs = [0.0] + [np.log(q) for t in tuples for _, q in entry[t.hmm_state].transitions]
    return TransitionModel(HmmTopology(list(phones), [-1, 0, 0, 0], [entry]), tuples, log_probs), entry


def hmm_paths(tm, entry, phone, frames_left):
    """(pdfs, tids, weight) of every path through ``phone``'s HMM of at most ``frames_left`` frames, in the
    reordered arc order: for each state passed, the transition that leaves it, then its self-loops."""
    number = {t.hmm_state: n for n, t in enumerate(tm.tuples, 1) if t.phone == phone}
    out, todo = [], [(0, (), (), 1.0)]
    while todo:
        state, pdfs, tids, w = todo.pop()
        t = tm.tuples[number[state] - 1]
        first = int(tm.state2id[number[state]])
        transitions = entry[state].transitions
        loop_tid = next((first + i for i, (d, _) in enumerate(transitions) if d == state), None)
        loop = next((q for d, q in transitions if d == state), 0.0)
        for i, (destination, probability) in enumerate(transitions):
            if destination == state:
                continue
            for loops in range(frames_left - len(pdfs)):
                step = (pdfs + (t.forward_pdf,) + (t.self_loop_pdf,) * loops, tids + (first + i,) + (loop_tid,) * loops,
                        w * probability * loop ** loops)
                (todo if entry[destination].transitions else out).append((destination,) + step)
    return [p[1:] for p in out]


def reference(tm, entry, phones, durations, tolerance, factor, shift):
    """Kaldi's rule by enumeration: {pdf sequence: summed weight} over the output frames."""
    total = sum(durations)
    frames = -(-(total - shift) // factor)
    allowed = defaultdict(set)
    begin = 0
    for phone, n in zip(phones, durations):  # output frame t is at full-rate frame f t + shift
        first = -(-(max(0, begin - tolerance) - shift) // factor)
        end = -(-(min(total, begin + n + tolerance) - shift) // factor)
        for t in range(max(first, 0), end):
            allowed[t].add(phone)
        begin += n
    kept = list(zip(phones, durations))
    sums = defaultdict(float)
    paths_of = {p: hmm_paths(tm, entry, p, frames) for p, _ in kept}

    def joined(k, t):  # the phones from k on, from output frame t to the end, each frame's phone allowed
        if k == len(kept):
            if t == frames:
                yield (), 1.0
            return
        phone = kept[k][0]
        for pdfs, _, w in paths_of[phone]:
            if t + len(pdfs) <= frames and all(phone in allowed[u] for u in range(t, t + len(pdfs))):
                for rest, v in joined(k + 1, t + len(pdfs)):
                    yield pdfs + rest, w * v

    for pdfs, w in joined(0, 0):
        sums[pdfs] += w
    return dict(sums)


def graph_sums(graph, frames):
    """Every path of ``frames`` arcs of a numerator graph, within its windows, summed by pdf sequence."""
    paths = [(s, (), float(graph.initial[s])) for s in range(graph.num_states) if graph.initial[s] > 0]
    for t in range(frames):
        paths = [(int(graph.dst[a]), pdfs + (int(graph.pdf[a]),), w * float(graph.weight[a]))
                 for s, pdfs, w in paths for a in range(graph.num_arcs)
                 if int(graph.src[a]) == s and graph.windows[t, graph.dst[a]] > 0]
    sums = defaultdict(float)
    for s, pdfs, w in paths:
        if graph.final[s] > 0:
            sums[pdfs] += w * float(graph.final[s])
    return dict(sums)


def an_alignment(tm, entry, phones, durations, rng):
    """Transition-ids of one path per phone of its duration (full rate, reordered arc order)."""
    ali = []
    for phone, n in zip(phones, durations):
        options = [tids for pdfs, tids, _ in hmm_paths(tm, entry, phone, n) if len(tids) == n]
        ali += options[rng.integers(len(options))]
    return np.array(ali)


CASES = [  # phones, durations (full-rate frames)
    ((1, 2, 3), (4, 5, 3)),
    ((2, 1, 2), (3, 4, 6)),  # a phone twice: its windows shared by identity
    ((3, 3, 1, 2), (4, 3, 4, 3)),  # a phone twice in a row: kept apart
]


@pytest.mark.parametrize("kind", ["chain", "two"])
@pytest.mark.parametrize("phones, durations", CASES)
@pytest.mark.parametrize("tolerance, factor, shift", [(0, 1, 0), (1, 1, 0), (1, 3, 0), (2, 3, 1), (1, 2, 1), (3, 3, 2)])
def test_the_numerator_accepts_exactly_kaldis_sequences_with_their_weights(kind, phones, durations, tolerance,
                                                                        factor, shift):
    tm, entry = model(kind)
    ali = an_alignment(tm, entry, phones, durations, np.random.default_rng(len(phones) + tolerance))
    compiler = NumeratorCompiler(tm, tolerance=tolerance, frame_subsampling_factor=factor)
    graph = compiler.graph(ali, frame_shift=shift)
    frames = compiler.output_frames(len(ali), shift)
    assert graph.windows.shape[0] == frames
    ours, expected = graph_sums(graph, frames), reference(tm, entry, phones, durations, tolerance, factor, shift)
    assert expected and ours.keys() == expected.keys()
    for pdfs, w in expected.items():
        assert ours[pdfs] == pytest.approx(w, rel=1e-6), pdfs


def test_the_weights_are_the_denominators_at_its_scale():
    """At transition scale 0 every path weighs 1, as the first version's numerator (and denominator) did."""
    tm, entry = model("two")
    ali = an_alignment(tm, entry, (1, 2), (4, 3), np.random.default_rng(0))
    graph = NumeratorCompiler(tm, tolerance=1, frame_subsampling_factor=1, transition_scale=0.0).graph(ali)
    sums = graph_sums(graph, 7)
    assert len(sums) > 1 and set(sums.values()) == {1.0}


def test_a_piece_cut_inside_phones_may_begin_and_end_in_any_of_their_states():
    """A piece of an utterance (max_seq_length cuts long ones) that begins inside a phone may begin in any state
    of it; one that ends before its last phone's final transition may end in any state of that phone."""
    tm, entry = model("chain")
    ali = an_alignment(tm, entry, (1, 2, 3), (3, 4, 3), np.random.default_rng(0))
    piece = ali[4:9]  # phone 2's self-loops (frames 4-6), phone 3's first two frames
    graph = NumeratorCompiler(tm, tolerance=0, frame_subsampling_factor=1).graph(piece)
    sums = graph_sums(graph, 5)
    assert set(sums) == {(3, 3, 3, 4, 5)}  # self-loop pdf of phone 2, then phone 3's forward and self-loop pdfs
    # three self-loops, the entry into phone 3 (1, times phone 2's 1 - 0.5), a self-loop; phone 3's final
    # transition came first (reordered), so it looks whole: its final weight 1 - 0.5
    assert sums[(3, 3, 3, 4, 5)] == pytest.approx(0.5 ** 6)

    tm, entry = model("two")
    ali = an_alignment(tm, entry, (1, 2), (3, 3), np.random.default_rng(1))
    cut = ali[:4]  # phone 1, then phone 2's first frame: before its final transition
    assert not tm.tid_is_final[cut[3]]
    sums = graph_sums(NumeratorCompiler(tm, tolerance=0, frame_subsampling_factor=1).graph(cut), 4)
    whole_phones = reference(tm, entry, (1,), (3,), 0, 1, 0)
    # phone 1 as it could be whole, then the first frame of phone 2 in its first state: forward pdf 2
    assert set(sums) == {pdfs + (2,) for pdfs in whole_phones}


def test_a_tolerance_too_small_for_the_factor_is_refused():
    tm, _ = model("chain")
    with pytest.raises(ValueError, match="2 tolerance \\+ 1 >= the factor"):
        NumeratorCompiler(tm, tolerance=0, frame_subsampling_factor=3)
    NumeratorCompiler(tm, tolerance=1, frame_subsampling_factor=3)


def test_the_graph_is_what_the_objective_runs_on():
    """Posteriors of the numerator on random scores equal the brute force's: windows, weights and all."""
    from bru_kaldi.chain.objective import numerator_forward_backward

    tm, entry = model("two")
    ali = an_alignment(tm, entry, (1, 2, 3), (3, 4, 3), np.random.default_rng(3))
    compiler = NumeratorCompiler(tm, tolerance=2, frame_subsampling_factor=3)
    graph = compiler.graph(ali)
    frames = compiler.output_frames(len(ali))
    x = torch.randn(1, frames, tm.num_pdfs, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    logprob, posteriors = numerator_forward_backward(x, [frames], [graph])
    sums = graph_sums(graph, frames)
    scores = {pdfs: w * float(torch.exp(sum(x[0, t, p] for t, p in enumerate(pdfs)))) for pdfs, w in sums.items()}
    total = sum(scores.values())
    assert float(logprob) == pytest.approx(np.log(total), rel=1e-9)
    expected = torch.zeros(frames, tm.num_pdfs, dtype=torch.float64)
    for pdfs, v in scores.items():
        for t, p in enumerate(pdfs):
            expected[t, p] += v / total
    torch.testing.assert_close(posteriors[0], expected)

"""The LF-MMI graphs (bru_kaldi/chain/phone_lm.py, den_graph.py) against independent references.

The phone n-gram against n-gram counts taken directly and against the definition of a distribution
(every state's outgoing probabilities sum to one; the probabilities of all finite phone sequences sum
to one); the denominator graph against a brute-force enumeration of every phone sequence the LM
allows and every HMM path through it, frame by frame; and the graph written as den.fst and read back
against the same enumeration.
"""

import itertools
import random
from collections import Counter, defaultdict

import numpy as np
import pytest
import torch

from bru_kaldi.chain.den_graph import DenominatorGraph, denominator_graph, read_den_fst, write_den_fst
from bru_kaldi.kaldi.rspecifiers import KaldiIOError
from bru_kaldi.chain.phone_lm import estimate_phone_lm
from bru_kaldi.kaldi.transition_model import HmmState, HmmTopology, TransitionModel, TransitionState


def random_sequences(seed, count=30, phones=4, longest=7):
    rng = random.Random(seed)
    return [[rng.randint(1, phones) for _ in range(rng.randint(1, longest))] for _ in range(count)]


@pytest.mark.parametrize("order, extra", [(1, 0), (2, 0), (3, 0), (4, 1000), (4, 3), (5, 2)])
def test_the_phone_lm_is_a_distribution(order, extra):
    lm = estimate_phone_lm(random_sequences(order), order=order, extra_histories=extra)
    out = np.array(lm.final)
    transitions = np.zeros((lm.num_states, lm.num_states))
    for source, _, following, probability in lm.arcs:
        out[source] += probability
        transitions[source, following] += probability
    np.testing.assert_allclose(out, 1.0, rtol=1e-12)
    # the probabilities of all finite sequences: start^T (sum_n A^n) final = start^T (I - A)^-1 final
    start = np.eye(lm.num_states)[0]
    total = start @ np.linalg.solve(np.eye(lm.num_states) - transitions, np.array(lm.final))
    assert total == pytest.approx(1.0, rel=1e-9)


def test_an_unpruned_phone_lm_gives_the_counted_ngram_probabilities():
    sequences = random_sequences(7)
    order = 3
    lm = estimate_phone_lm(sequences, order=order, extra_histories=10**6)
    counts, totals = Counter(), Counter()
    for sequence in sequences:  # the reference: n-grams counted with their whole (n-1)-phone histories
        padded = [0] + sequence + [-1]
        for i in range(1, len(padded)):
            history = tuple(padded[max(0, i - order + 1):i])
            counts[history, padded[i]] += 1
            totals[history] += 1
    index = {h: s for s, h in enumerate(lm.histories)}
    for sequence in sequences:
        state, ours, reference = 0, 1.0, 1.0
        padded = [0] + sequence
        for i, phone in enumerate(sequence, start=1):
            arc = next(a for a in lm.arcs if a[0] == state and a[1] == phone)
            ours *= arc[3]
            history = tuple(padded[max(0, i - order + 1):i])
            reference *= counts[history, phone] / totals[history]
            state = arc[2]
        history = tuple(padded[max(0, len(padded) - order + 1):])
        ours *= lm.final[state]
        reference *= counts[history, -1] / totals[history]
        assert ours == pytest.approx(reference, rel=1e-12)
        assert lm.histories[state] == history[-(order - 1):] and index[history[-(order - 1):]] == state


def test_pruning_keeps_short_histories_and_the_most_frequent_long_ones():
    sequences = random_sequences(3, count=200, phones=5)
    lm = estimate_phone_lm(sequences, order=4, no_prune_order=3, extra_histories=7)
    long = [h for h in lm.histories if len(h) == 3]
    assert 0 < len(long) <= 7
    # a history is what precedes a token (a phone or the end), the start written 0
    occurrences = Counter(tuple(([0] + s)[i - 3:i]) for s in sequences for i in range(3, len(s) + 2))
    assert occurrences.most_common(1)[0][0] in long
    for h in long:  # both shorter parts kept: the model stays consistent
        assert h[1:] in lm.histories and h[:-1] in lm.histories
    assert len(estimate_phone_lm(sequences, order=4, extra_histories=10**6).histories) > len(lm.histories)


# --------------------------------------------------------------------------- the denominator graph
def toy_model(phones=(1, 2), loop=0.6):
    """A 2-state left-to-right HMM for every phone, each state with a self-loop; forward pdf 2 (phone - 1) +
    state, self-loop pdf 10 more (a chain topology's distinct pdfs, so that a mix-up shows); the transition
    model's probabilities are the topology's."""
    entry = [HmmState(0, 0, ((0, loop), (1, 1 - loop))), HmmState(1, 1, ((1, loop), (2, 1 - loop))),
             HmmState(-1, -1, ())]
    tuples = [TransitionState(p, s, 2 * (p - 1) + s, 12 + 2 * (p - 1) + s) for p in phones for s in (0, 1)]
    phone2idx = [-1] * (max(phones) + 1)
    for p in phones:
        phone2idx[p] = 0
    log_probs = [0.0] + [np.log(q) for _ in tuples for q in (loop, 1 - loop)]
    return TransitionModel(HmmTopology(list(phones), phone2idx, [entry]), tuples, log_probs), entry


def graph_sums(graph, T):
    """Brute force over the graph: the total weight of every path of T arcs from the start state to a final
    one, by pdf sequence."""
    out = defaultdict(float)
    by_source = defaultdict(list)
    for a in range(len(graph.src)):
        by_source[graph.src[a]].append(a)
    paths = [(graph.start, (), 1.0)]
    for _ in range(T):
        paths = [(graph.dst[a], pdfs + (int(graph.pdf[a]),), w * graph.weight[a])
                 for s, pdfs, w in paths for a in by_source[s]]
    for s, pdfs, w in paths:
        out[pdfs] += w * graph.final[s]
    return {k: v for k, v in out.items() if v > 0}


def reference_sums(lm, entry, T, scale):
    """Brute force over the definition: every phone sequence (its LM probability, the end included) and, for
    each phone, every path through its HMM, the frames of all phones adding up to T. A path's frames are in
    Kaldi's reordered arc order: for each state it passes through, the transition that leaves it (its forward
    pdf), then its self-loops (its self-loop pdf); its weight is the product of its transitions'
    probabilities to the power ``scale``."""
    def phone_paths(p):  # (pdfs, weight) of each way through phone p's HMM, at most T frames
        out, todo = [], [(0, (), 1.0)]
        while todo:
            state, pdfs, w = todo.pop()
            (_, loop), = [t for t in entry[state].transitions if t[0] == state]
            for destination, probability in entry[state].transitions:
                if destination == state:
                    continue
                for loops in range(T - len(pdfs)):  # the transition out of state, then its self-loops
                    step = (pdfs + (2 * (p - 1) + state,) + (12 + 2 * (p - 1) + state,) * loops,
                            w * (probability * loop ** loops) ** scale)
                    if entry[destination].transitions:
                        todo.append((destination,) + step)
                    else:
                        out.append(step)
        return out

    paths_of = {p: phone_paths(p) for p in sorted({p for _, p, _, _ in lm.arcs})}

    def joined(sequence, frames):  # (pdfs, weight) of the phones of sequence in exactly `frames` frames
        if not sequence:
            if frames == 0:
                yield (), 1.0
            return
        for pdfs, w in paths_of[sequence[0]]:
            if len(pdfs) <= frames:
                for rest, v in joined(sequence[1:], frames - len(pdfs)):
                    yield pdfs + rest, w * v

    out = defaultdict(float)
    for n in range(1, T + 1):
        for sequence in itertools.product(sorted(paths_of), repeat=n):
            state, probability = 0, 1.0
            for p in sequence:
                arc = [a for a in lm.arcs if a[0] == state and a[1] == p]
                if not arc:
                    probability = 0.0
                    break
                probability *= arc[0][3]
                state = arc[0][2]
            probability *= lm.final[state] if probability else 0.0
            if probability == 0:
                continue
            for pdfs, w in joined(sequence, T):
                out[pdfs] += probability * w
    return {k: v for k, v in out.items() if v > 0}


@pytest.mark.parametrize("scale", [0.0, 0.5, 1.0])
@pytest.mark.parametrize("order", [1, 2, 3])
def test_the_denominator_graph_sums_every_phone_sequence_and_hmm_path(order, scale):
    tm, entry = toy_model()
    lm = estimate_phone_lm([[1, 2, 1], [2, 2], [1], [2, 1, 1, 2]], order=order)
    graph = denominator_graph(lm, tm, transition_scale=scale)
    for T in range(1, 7):
        ours, reference = graph_sums(graph, T), reference_sums(lm, entry, T, scale)
        assert ours.keys() == reference.keys(), T
        for pdfs in reference:
            # rel 1e-6: the transition model keeps its log-probabilities in float32, as Kaldi's
            assert ours[pdfs] == pytest.approx(reference[pdfs], rel=1e-6), (T, pdfs)


def test_the_arcs_carry_kaldis_reordered_weights():
    """Arc by arc, Kaldi's H (GetTransitionLogProbIgnoringSelfLoops) with AddSelfLoopsReorder's factor, by hand:
    the weights of a path alone cannot tell where along it a factor sits, and the decoding graph's arcs
    carry them where Kaldi puts them."""
    tm, _ = toy_model(phones=(1,), loop=0.6)
    graph = denominator_graph(estimate_phone_lm([[1, 1]], order=1), tm)
    named = {(graph.states[a], graph.states[b]): (int(p), float(w), int(t))
             for a, b, p, w, t in zip(graph.src, graph.dst, graph.pdf, graph.weight, graph.tid)}
    entered, middle, done = (0, 1, 0, 1), (0, 1, 1, 2), None
    # in: phone 1's state 0 -> 1 (0.4 / (1 - 0.6) = 1), times the LM's P(1) = 2/3 (tokens 1, 1, end)
    assert named[("start",), entered] == pytest.approx((0, 2 / 3, 2))
    assert named[entered, entered] == pytest.approx((12, 0.6, 1))  # state 0's self-loop after its exit
    assert named[entered, middle] == pytest.approx((1, 0.4, 4))  # 1 -> 2: 0.4 / 0.4, times 1 - 0.6 of state 0
    assert named[middle, middle] == pytest.approx((13, 0.6, 3))
    assert named[middle, entered] == pytest.approx((0, 0.4 * 2 / 3, 2))  # the next phone, times 1 - 0.6 of state 1
    assert graph.final.tolist() == pytest.approx([0.0, 0.0, 0.4 / 3])  # the LM's end 1/3, times 1 - 0.6
    assert done is None and len(named) == 5


@pytest.mark.parametrize("order", [1, 3])
def test_den_fst_keeps_every_path_and_its_weight(order, tmp_path):
    """Written as den.fst (pdf-id + 1 labels, -log weights) and read back: every pdf sequence of 1-6 frames
    has the weight the brute force over the LM and the HMMs gives it."""
    import kaldifst

    tm, entry = toy_model()
    lm = estimate_phone_lm([[1, 2, 1], [2, 2], [1], [2, 1, 1, 2]], order=order)
    graph = denominator_graph(lm, tm, transition_scale=1.0)
    write_den_fst(graph, tmp_path / "den.fst")
    fst = kaldifst.StdVectorFst.read(str(tmp_path / "den.fst"))  # OpenFst's own reader, not ours
    labels = {(a.ilabel, a.olabel) for state in range(fst.num_states) for a in kaldifst.ArcIterator(fst, state)}
    assert fst.num_states == graph.num_states and fst.start == graph.start
    assert {i for i, o in labels} == {int(p) + 1 for p in graph.pdf} and all(i == o for i, o in labels)
    back = read_den_fst(tmp_path / "den.fst")
    for T in range(1, 7):
        ours, reference = graph_sums(back, T), reference_sums(lm, entry, T, 1.0)
        assert ours.keys() == reference.keys(), T
        for pdfs in reference:
            # rel 1e-6: OpenFst's StdArc keeps its -log weights in float32, as Kaldi's den.fst does
            assert ours[pdfs] == pytest.approx(reference[pdfs], rel=1e-6), (T, pdfs)
    # and as the objective's denominator: every state final, initial probabilities from its start, the same
    # whether the graph was read back or not
    chain, direct = back.chain_graph(), graph.chain_graph()
    assert chain.num_states == back.num_states and float(chain.initial.sum()) == pytest.approx(1.0)
    assert chain.final.tolist() == [1.0] * chain.num_states
    torch.testing.assert_close(chain.initial, direct.initial, rtol=1e-5, atol=1e-7)


def test_a_file_that_is_not_a_denominator_fst_is_refused_naming_it(tmp_path):
    import kaldifst

    (tmp_path / "text.fst").write_text("0 1 3 3 0.5\n1\n")
    with pytest.raises(KaldiIOError, match="text.fst: not an OpenFst"):
        read_den_fst(tmp_path / "text.fst")
    fst = kaldifst.StdVectorFst()
    fst.add_state(), fst.add_state()
    fst.start = 0
    fst.add_arc(0, kaldifst.StdArc(0, 0, 0.0, 1))  # an epsilon: each frame must emit a pdf
    fst.set_final(1, 0.0)
    fst.write(str(tmp_path / "eps.fst"))
    with pytest.raises(KaldiIOError, match="eps.fst: state 0 has an arc labelled 0:0"):
        read_den_fst(tmp_path / "eps.fst")
    with pytest.raises(FileNotFoundError, match="missing.fst"):
        read_den_fst(tmp_path / "missing.fst")


def test_a_context_dependent_model_is_refused():
    tm, _ = toy_model()
    tm.tuples.insert(1, TransitionState(1, 0, 5, 5))  # phone 1's first state with a second pdf: a tree's doing
    with pytest.raises(ValueError, match="decision tree"):
        denominator_graph(estimate_phone_lm([[1, 2]], order=2), tm)


@pytest.mark.parametrize("order, extra", [(3, 0), (4, 5), (5, 12), (5, 40), (6, 30)])
def test_the_phone_lm_is_the_maximum_likelihood_model_of_its_own_walks(order, extra):
    """Walking each training sequence along the LM's arcs, the tokens read in each state have exactly the
    LM's probabilities: the states the estimator counted tokens under are the states the automaton is in.
    (A history kept while the part of it before the newest phone was pruned breaks this.)"""
    sequences = random_sequences(11, count=300, phones=3, longest=9)
    lm = estimate_phone_lm(sequences, order=order, extra_histories=extra)
    arcs = {(source, phone): (following, probability) for source, phone, following, probability in lm.arcs}
    read = Counter()
    for sequence in sequences:
        state = 0
        for phone in sequence:
            read[state, phone] += 1
            state = arcs[state, phone][0]
        read[state, -1] += 1
    totals = Counter()
    for (state, _), count in read.items():
        totals[state] += count
    for (state, token), count in read.items():
        probability = lm.final[state] if token == -1 else arcs[state, token][1]
        assert probability == pytest.approx(count / totals[state], rel=1e-12), (lm.histories[state], token)

"""The phone n-gram of the LF-MMI denominator graph, estimated from the training alignments' phone sequences.

The denominator of LF-MMI sums over every frame sequence the model could produce, weighted by a phone
language model: a model of which phone sequences are plausible at all, not of words. Kaldi estimates it
with ``chain-est-phone-lm`` (order 4, trigrams never pruned, at most 1000 histories beyond them); this
is our estimator of the same kind, written from that description:

* Histories are the last ``order - 1`` phones (fewer at the start of an utterance, where ``0`` stands
  for the beginning). Every history of up to ``no_prune_order - 1`` phones that occurs is kept; of the
  longer ones, the ``extra_histories`` most frequent (ties: the earlier in sorted order), and only where
  both histories one phone shorter (without its oldest phone, and without its newest) are kept.
* Each token (a phone, or the end of an utterance) is counted under the longest kept suffix of its
  history. ``P(p | h) = c(h, p) / c(h)``: maximum likelihood, no smoothing. The graph only has to give
  the training utterances' phone sequences their share; a sequence it has never seen costs nothing in
  the objective, and an unsmoothed model keeps the graph small (Kaldi's is unsmoothed too).
* After phone ``p`` from history ``h`` the model is in the longest kept suffix of ``h + p`` (its last
  ``order - 1`` phones). That is the state a token of the training data is counted under: the longest
  kept suffix of the true history cannot be longer, since the part of it before ``p`` would then be a
  kept suffix of the old history longer than ``h``. So the model is consistent, and the probabilities
  out of each state (phones and the end) sum to one.

>>> lm = estimate_phone_lm([[1, 2, 1], [1, 2]], order=2)
>>> [lm.histories[s] for s in range(lm.num_states)]
[(0,), (1,), (2,)]
>>> sorted((lm.histories[src], phone, round(p, 3)) for src, phone, dst, p in lm.arcs)
[((0,), 1, 1.0), ((1,), 2, 0.667), ((2,), 1, 0.5)]
>>> [round(f, 3) for f in lm.final]  # the end of an utterance, from each state
[0.0, 0.333, 0.5]
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Iterable, Sequence

BEGIN = 0  # the history symbol of the start of an utterance (Kaldi's phones are numbered from 1)
END = -1  # the token of the end of an utterance, counted like a phone


@dataclass
class PhoneLM:
    """A phone n-gram as an automaton: state ``s`` is history ``histories[s]`` (state 0 the start, history
    ``(0,)``); ``arcs`` are ``(source, phone, destination, probability)``; ``final[s]`` the probability of
    ending there. Out of every state, the arcs' probabilities and ``final`` sum to one."""

    order: int
    histories: list[tuple[int, ...]]
    arcs: list[tuple[int, int, int, float]]
    final: list[float]

    @property
    def num_states(self) -> int:
        return len(self.histories)


def estimate_phone_lm(sequences: Iterable[Sequence[int]], order: int = 4, no_prune_order: int = 3,
                      extra_histories: int = 1000) -> PhoneLM:
    """The phone n-gram of ``sequences`` (one list of phone ids >= 1 per utterance), as the module says.

    ``order``: the n of the n-gram (Kaldi's default 4); ``no_prune_order``: histories of up to
    ``no_prune_order - 1`` phones are all kept (Kaldi 3); ``extra_histories``: how many longer histories are
    kept, the most frequent first (Kaldi's ``num_extra_lm_states``, 1000)."""
    if order < 1 or no_prune_order < 1:
        raise ValueError(f"order and no_prune_order must be >= 1, got {order} and {no_prune_order}")
    sequences = [list(s) for s in sequences]
    if not any(sequences):
        raise ValueError("no phones to estimate a phone language model from")
    if any(p < 1 for s in sequences for p in s):
        raise ValueError("phone ids start at 1 (0 stands for the start of an utterance)")
    width = max(order - 1, 1)  # a unigram still has one state: the start (its history never changes)

    def histories_of(sequence):  # (full history, token) for each token of one utterance
        history = (BEGIN,)
        for token in [*sequence, END]:
            yield history, token
            if token != END:
                history = (history + (token,))[-width:] if order > 1 else (BEGIN,)

    # Which histories to keep: every suffix of up to no_prune_order - 1 phones, then the most frequent longer.
    seen = Counter(h[-length:] for s in sequences for h, _ in histories_of(s) for length in range(1, len(h) + 1))
    kept = {h for h in seen if len(h) <= max(no_prune_order - 1, 1)}
    extra_left = extra_histories
    for length in range(max(no_prune_order, 2), width + 1):  # both shorter parts kept: see the module's last point
        candidates = sorted((h for h in seen if len(h) == length and h[1:] in kept and h[:-1] in kept),
                            key=lambda h: (-seen[h], h))[:extra_left]
        kept.update(candidates)
        extra_left -= len(candidates)

    def state_of(history):  # the longest kept suffix
        for start in range(len(history)):
            if history[start:] in kept:
                return history[start:]
        raise AssertionError(f"no kept suffix of {history}")  # every single symbol is kept

    counts: Counter = Counter()
    for sequence in sequences:
        for history, token in histories_of(sequence):
            counts[state_of(history), token] += 1
    totals: Counter = Counter()
    for (history, _), count in counts.items():
        totals[history] += count
    histories = sorted({h for h, _ in counts}, key=lambda h: (h != (BEGIN,), len(h), h))
    index = {h: i for i, h in enumerate(histories)}
    arcs, final = [], [0.0] * len(histories)
    for (history, token), count in sorted(counts.items(), key=lambda item: (index[item[0][0]], item[0][1])):
        probability = count / totals[history]
        if token == END:
            final[index[history]] = probability
        else:
            following = state_of((history + (token,))[-width:]) if order > 1 else (BEGIN,)
            arcs.append((index[history], token, index[following], probability))
    return PhoneLM(order, histories, arcs, final)

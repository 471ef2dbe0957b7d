"""The LF-MMI numerator of one utterance, as Kaldi's ``chain-get-supervision`` makes it from an alignment.

Kaldi's rule (``AlignmentToProtoSupervision`` and the ``TimeEnforcerFst`` of chain-supervision.cc), from the
transition-ids of an alignment at the full frame rate:

1. The alignment is cut into its phones (``ali-to-phones --write-lengths``): phone ``k`` on frames ``[b_k,
   e_k)``.
2. With ``f`` the frame subsampling factor and ``T' = ceil(T / f)`` output frames, phone ``k`` is *allowed*
   at output frame ``t`` when ``ceil(max(0, b_k - tolerance) / f) <= t < ceil(min(T, e_k + tolerance) / f)``:
   its frames widened by ``tolerance`` full-rate frames on each side (Kaldi's ``--left-tolerance`` and
   ``--right-tolerance``, 5), then mapped to output frames. Allowed phones are sets of phone *identities*:
   two instances of one phone share their frames.
3. The numerator accepts the pdf sequences of ``T'`` frames that go through the utterance's phones in order,
   each along a path of its HMM (in the reordered arc order of chain graphs: :mod:`.den_graph`), with every
   frame's phone allowed at that frame. Its arcs weigh what the same arcs weigh in the denominator graph
   (the HMM's transition probabilities at ``transition_scale``); the phone LM's weight of the utterance, a
   constant of its phone sequence, is left out (Kaldi adds it by composing with the denominator; it moves
   the objective by a constant per utterance and no gradient).

Kaldi requires ``2 tolerance + 1 >= f``, so that every output frame allows some phone; so do we.

As a :class:`~bru_kaldi.chain.graph.ChainGraph`: state 0 is the start; phone ``k``'s HMM has the states
``(k, s, d)`` of the denominator's ``(h', p, s, d)`` (after the transition ``s -> d``); the windows open the
states of phone ``k`` at the output frames that allow its phone. An alignment that begins inside a phone (a
piece of a long utterance cut by ``max_seq_length``) may begin in any state of its first phone, one that
ends inside a phone may end in any state of its last.

>>> import numpy as np
>>> from bru_kaldi.kaldi.transition_model import TransitionModel, HmmTopology, HmmState, TransitionState
>>> one_state = [HmmState(0, 0, ((0, 0.5), (1, 0.5))), HmmState(-1, -1, ())]  # the chain topology
>>> tm = TransitionModel(HmmTopology([1, 2], [-1, 0, 0], [one_state]),
...                      [TransitionState(1, 0, 0, 1), TransitionState(2, 0, 2, 3)], [0.0] + [np.log(0.5)] * 4)
>>> numerators = NumeratorCompiler(tm, tolerance=0, frame_subsampling_factor=1)
>>> g = numerators.graph(np.array([2, 1, 1, 4, 3]))  # phone 1 for 3 frames (forward, self-loops), phone 2 for 2
>>> g.num_states, g.windows.tolist()  # the start, phone 1's state, phone 2's state
(3, [[0.0, 1.0, 0.0], [0.0, 1.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0], [0.0, 0.0, 1.0]])
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np
import torch

from bru_kaldi.chain.graph import ChainGraph
from bru_kaldi.kaldi.transition_model import TransitionModel


class NumeratorCompiler:
    """Numerator graphs (module docstring) of the alignments of one TransitionModel ``tm``, with Kaldi's
    ``tolerance`` (full-rate frames on each side of a phone), ``frame_subsampling_factor`` and the
    denominator's ``transition_scale``."""

    def __init__(self, tm: TransitionModel, tolerance: int = 5, frame_subsampling_factor: int = 1,
                 transition_scale: float = 1.0):
        if tolerance < 0 or frame_subsampling_factor < 1:
            raise ValueError(f"tolerance must be >= 0 and frame_subsampling_factor >= 1, got {tolerance} and "
                             f"{frame_subsampling_factor}")
        if 2 * tolerance + 1 < frame_subsampling_factor:
            raise ValueError(f"a tolerance of {tolerance} frames leaves output frames without a phone at a frame "
                             f"subsampling factor of {frame_subsampling_factor}: Kaldi requires 2 tolerance + 1 >= "
                             "the factor")
        self.tm, self.tolerance, self.factor, self.scale = tm, tolerance, frame_subsampling_factor, transition_scale
        self.by_phone_state = {}  # (phone, hmm state) -> transition-state, where it is unique
        for number, t in enumerate(tm.tuples, 1):
            key = (t.phone, t.hmm_state)
            self.by_phone_state[key] = None if key in self.by_phone_state else number
        self._template = lru_cache(maxsize=None)(self._make_template)

    def output_frames(self, num_frames: int, frame_shift: int = 0) -> int:
        """``ceil((T - shift) / f)``: the network's output frames for ``T`` input frames (Kaldi's rule)."""
        return -(-(num_frames - frame_shift) // self.factor)

    def graph(self, ali: np.ndarray, frame_shift: int = 0, dtype: torch.dtype = torch.float64) -> ChainGraph:
        """The numerator of the transition-ids ``ali`` ``(T,)`` whose output frame ``t`` is at full-rate frame
        ``f t + frame_shift`` (``0 <= frame_shift < f``: Kaldi shifts the subsampling from one pass over the data
        to the next, ``nnet3-chain-copy-egs --frame-shift``): a phone's widened frames ``[b, e)`` allow output
        frames ``ceil((b - shift) / f)`` to ``ceil((e - shift) / f)``."""
        if not 0 <= frame_shift < self.factor:
            raise ValueError(f"frame_shift must lie in [0, {self.factor}), got {frame_shift}")
        ali = np.asarray(ali)
        parts = self.tm.split_to_phones(ali)
        if not parts:
            raise ValueError("an empty alignment has no numerator graph")
        starts_inside = not self._begins_a_phone(parts[0], ali)
        ends_inside = not self.tm.tid_is_final[parts[-1]].any()
        templates = [self._template(self._instance_states(part)) for part in parts]

        # the states: the start, then each phone's; their arcs, by phone, shifted by the phone's first state
        offsets = np.cumsum([1] + [t.num_states for t in templates])
        src, dst, pdf, weight = [], [], [], []
        for k, template in enumerate(templates):
            o = offsets[k]
            src.append(template.src + o), dst.append(template.dst + o), pdf.append(template.pdf)
            weight.append(template.weight)
            entry_from = ([0] if k == 0 else offsets[k - 1] + templates[k - 1].exits)
            leave = [1.0] if k == 0 else templates[k - 1].leaving
            for source, factor in zip(entry_from, leave):  # into phone k: its entry arcs, times the leaving factor
                src.append(np.full(len(template.entry_dst), source)), dst.append(template.entry_dst + o)
                pdf.append(template.entry_pdf), weight.append(template.entry_weight * factor)
        num_states = int(offsets[-1])
        initial = np.zeros(num_states)
        initial[0] = 1.0
        final = np.zeros(num_states)
        last = templates[-1]
        final[offsets[-2] + (np.arange(last.num_states) if ends_inside else last.exits)] = \
            1.0 if ends_inside else last.leaving
        src, dst, pdf, weight = (np.concatenate(column) for column in (src, dst, pdf, weight))
        if starts_inside:  # a piece cut from an utterance: it may begin in any state of its first phone
            first = templates[0]
            internal = src >= 1
            src, dst, pdf, weight = src[internal], dst[internal], pdf[internal], weight[internal]
            initial[0], initial[1:1 + first.num_states] = 0.0, 1.0

        # which output frames allow each phone (by identity), then each state's window
        frames = self.output_frames(len(ali), frame_shift)
        allowed = {}
        begin = 0
        for part in parts:
            phone = int(self.tm.tid2phone[part[0]])
            first = -(-(max(0, begin - self.tolerance) - frame_shift) // self.factor)
            end = -(-(min(len(ali), begin + len(part) + self.tolerance) - frame_shift) // self.factor)
            allowed.setdefault(phone, np.zeros(frames, dtype=bool))[max(first, 0):max(end, 0)] = True
            begin += len(part)
        windows = np.zeros((frames, num_states))
        for k, (part, template) in enumerate(zip(parts, templates)):
            windows[:, offsets[k]:offsets[k + 1]] = allowed[int(self.tm.tid2phone[part[0]])][:, None]
        return ChainGraph(num_states, *(torch.from_numpy(np.asarray(c, dtype=np.int64)) for c in (src, dst, pdf)),
                          torch.as_tensor(weight, dtype=dtype), torch.as_tensor(initial, dtype=dtype),
                          torch.as_tensor(final, dtype=dtype), torch.as_tensor(windows, dtype=dtype))

    def _begins_a_phone(self, part: np.ndarray, ali: np.ndarray) -> bool:
        """Whether the alignment's first phone begins on its first frame: in its HMM's first state, and (in the
        reordered arc order, where a state's self-loops follow the arc that leaves it) not on a self-loop."""
        first = int(part[0])
        hmm_state = self.tm.tuples[int(self.tm.tid2state[first]) - 1].hmm_state
        return hmm_state == 0 and not (self.tm.tid_is_self_loop[first] and self.tm._is_reordered(ali))

    def _instance_states(self, part: np.ndarray) -> tuple:
        """The transition-state of each HMM state of one phone instance: those its alignment visits, the
        others the phone's own where the model has one per (phone, state) (a context-dependent model's
        unvisited states cannot be known without its tree)."""
        phone = int(self.tm.tid2phone[part[0]])
        visited = {self.tm.tuples[n - 1].hmm_state: n for n in (int(x) for x in np.unique(self.tm.tid2state[part]))}
        states = []
        for s in range(len(self.tm.topology.entry(phone)) - 1):
            number = visited.get(s, self.by_phone_state.get((phone, s)))
            if number is None:
                raise ValueError(f"phone {phone}'s HMM state {s} is not in the alignment and has several "
                                 "transition-states in the model: its numerator needs the decision tree")
            states.append(number)
        return (phone, tuple(states))

    def _make_template(self, key: tuple) -> "_PhoneHmm":
        phone, numbers = key
        tm, a = self.tm, self.scale
        entry = tm.topology.entry(phone)

        def out(s):  # (destination, transition-id, probability) of state s
            first = int(tm.state2id[numbers[s]])
            return [(d, first + i, math.exp(float(tm.log_probs[first + i])))
                    for i, (d, _) in enumerate(entry[s].transitions)]

        def loop(s):
            return next((p for d, _, p in out(s) if d == s), 0.0)

        names, index = [], {}
        for s in range(len(entry) - 1):
            for d, _, _ in out(s):
                if d != s:
                    index[s, d] = len(names)
                    names.append((s, d))
        src, dst, pdf, weight = [], [], [], []
        for i, (s, d) in enumerate(names):
            if loop(s) > 0:
                src.append(i), dst.append(i), pdf.append(tm.tuples[numbers[s] - 1].self_loop_pdf)
                weight.append(loop(s) ** a)
            if entry[d].transitions:
                for e, _, p in out(d):
                    if e != d:
                        src.append(i), dst.append(index[d, e]), pdf.append(tm.tuples[numbers[d] - 1].forward_pdf)
                        weight.append((p / (1.0 - loop(d))) ** a * (1.0 - loop(s)) ** a)
        entries = [(index[0, d], tm.tuples[numbers[0] - 1].forward_pdf, (p / (1.0 - loop(0))) ** a)
                   for d, _, p in out(0) if d != 0]
        exits = [i for i, (s, d) in enumerate(names) if not entry[d].transitions]
        return _PhoneHmm(len(names), np.array(src, dtype=np.int64), np.array(dst, dtype=np.int64),
                         np.array(pdf, dtype=np.int64), np.array(weight), np.array([e[0] for e in entries]),
                         np.array([e[1] for e in entries]), np.array([e[2] for e in entries]), np.array(exits),
                         np.array([(1.0 - loop(names[i][0])) ** a for i in exits]))


class _PhoneHmm:
    """One phone's HMM in the reordered arc order: its states' arcs (``src``, ``dst``, ``pdf``, ``weight``,
    numbered from 0), the arcs that enter it (``entry_dst``, ``entry_pdf``, ``entry_weight``), the states where
    it is done (``exits``) and the factor on whatever leaves each (``leaving``)."""

    def __init__(self, num_states, src, dst, pdf, weight, entry_dst, entry_pdf, entry_weight, exits, leaving):
        self.num_states, self.src, self.dst, self.pdf, self.weight = num_states, src, dst, pdf, weight
        self.entry_dst, self.entry_pdf, self.entry_weight = entry_dst, entry_pdf, entry_weight
        self.exits, self.leaving = exits, leaving

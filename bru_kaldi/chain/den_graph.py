"""The LF-MMI denominator graph: the phone n-gram composed with the HMMs, one arc per frame, weighted as
Kaldi's ``chain-make-den-fst`` weights it and as the chain decoding graph does.

Every arc emits exactly one frame (a pdf-id), so that forward-backward over ``T`` frames takes ``T`` steps
along arcs. What the graph is, in Kaldi's terms: the phone LM as an FST, composed with the H transducer of
the transition model at ``transition_scale``, self-loops added at the same scale with ``reorder = true``,
projected on pdf-ids (``CreateDenominatorFst`` in Kaldi's chain-den-graph.cc, which uses 1.0 and 1.0 and
warns that test time must use the same values: the chain decoding graph, ``mkgraph.sh --self-loop-scale 1.0``,
carries exactly these weights, and ``tests/test_chain_graphs.py`` holds the two to each other arc for arc).

Two details of Kaldi's H decide the arcs, and are reproduced here exactly:

* **reorder.** A phone's frames are, per HMM state ``s`` it passes through, the transition leaving ``s``
  first and then ``s``'s self-loops: ``F_0 L_0* F_1 L_1* ...``, so its first frame emits the forward pdf
  of its first state (the chain topology's "forward pdf class happens on the incoming arc"). A state of
  the graph is therefore ``(h', p, s, d)``: inside phone ``p`` after the transition ``s -> d``, where ``s``'s
  self-loop may come next and then a transition out of ``d`` (``d`` the final, non-emitting state when the
  phone is done: the next phone follows); ``h'`` is the phone-LM state that ``p`` led to. Phones entered from
  different LM states that lead to the same one share their states, so the graph is as small as the LM
  and the HMMs allow. State 0, ``("start",)``, is before the first phone.
* **the weights.** With ``a`` the scale and ``p(t)`` the transition model's probability of transition-id
  ``t`` (``final.mdl``'s ``<LogProbs>``): an arc of a non-self-loop transition ``t`` out of HMM state ``d``
  weighs ``(p(t) / (1 - loop(d))) ^ a`` (Kaldi's ``GetTransitionLogProbIgnoringSelfLoops``) times
  ``(1 - loop(s)) ^ a`` of the state it leaves (``AddSelfLoopsReorder`` moves the "not the self-loop"
  factor of ``s`` onto the arcs out of the state where ``s``'s self-loop is added), times the LM's
  ``P(q | h')`` when it enters phone ``q``; a self-loop weighs ``loop(s) ^ a``; a state where the phone
  is done has the final weight ``P(end | h') (1 - loop(s)) ^ a``. A whole path weighs the product of its
  transitions' probabilities to the power ``a`` times its phone sequence's LM probability. ``a = 0`` gives
  every HMM arc weight 1, as this toolkit's first version did (the ablation of RESULTS.md).

The pdf of each ``(phone, HMM state)`` comes from the TransitionModel, so this covers models whose pdfs
depend on the phone and state alone: monophone systems such as the built-in corpus's. A context-dependent
(triphone) system needs its decision tree as well, which is not read; such a system's own ``den.fst``, made
by Kaldi's ``chain-make-den-fst``, is read instead (:func:`read_den_fst`).

On disk the graph is ``den.fst`` as Kaldi's chain recipes keep it (:func:`write_den_fst`): an OpenFst
``StdVectorFst`` acceptor whose labels are pdf-id + 1 (0 is epsilon in OpenFst) and whose weights are
``-log`` of ours, readable by kaldifst, OpenFst's ``fstinfo`` and Kaldi's chain tools.

>>> from bru_kaldi.chain.phone_lm import estimate_phone_lm
>>> from bru_kaldi.kaldi.transition_model import TransitionModel, HmmTopology, HmmState, TransitionState
>>> one_state = [HmmState(0, 0, ((0, 0.5), (1, 0.5))), HmmState(-1, -1, ())]  # Kaldi's chain topology
>>> tm = TransitionModel(HmmTopology([1, 2], [-1, 0, 0], [one_state]),
...                      [TransitionState(1, 0, 0, 1), TransitionState(2, 0, 2, 3)], [0.0] + [np.log(0.5)] * 4)
>>> graph = denominator_graph(estimate_phone_lm([[1, 2], [2]], order=2), tm)
>>> graph.states  # the start; phone 1, then phone 2 (from the start or after 1): LM state, phone, s -> d
[('start',), (1, 1, 0, 1), (2, 2, 0, 1)]
>>> [(graph.states[a], int(p), round(float(w), 4)) for a, b, p, w in
...  zip(graph.src, graph.dst, graph.pdf, graph.weight) if graph.states[b] == (2, 2, 0, 1)]
[(('start',), 2, 0.5), ((1, 1, 0, 1), 2, 0.5), ((2, 2, 0, 1), 3, 0.5)]
>>> [round(f, 4) for f in graph.final.tolist()]  # after phone 2: the LM's end, times 1 - the self-loop's 0.5
[0.0, 0.0, 0.5]
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from bru_kaldi.chain.graph import ChainGraph, denominator_initial_probs
from bru_kaldi.chain.phone_lm import PhoneLM
from bru_kaldi.kaldi.rspecifiers import KaldiIOError
from bru_kaldi.kaldi.transition_model import TransitionModel

INITIAL_PROBS = ("kaldi", "unnormalised")  # see graph.denominator_initial_probs


@dataclass
class DenominatorGraph:
    """An acceptor over pdf-ids, as ``den.fst`` holds it: arcs ``src``, ``dst``, ``pdf``, ``weight`` ``(A,)``
    (probabilities), ``tid`` ``(A,)`` the transition-id each arc stands for (0 where unknown: a graph read
    from a file), ``final`` ``(S,)`` final weights, one ``start`` state, and ``states`` naming each state
    (see the module docstring; a graph read from a file names them by number)."""

    src: np.ndarray
    dst: np.ndarray
    pdf: np.ndarray
    weight: np.ndarray
    tid: np.ndarray
    final: np.ndarray
    start: int
    states: list

    @property
    def num_states(self) -> int:
        return len(self.states)

    def chain_graph(self, initial_probs: str = "kaldi", num_iters: int = 100,
                    dtype: torch.dtype = torch.float64) -> ChainGraph:
        """This graph as the LF-MMI objective's denominator, as Kaldi's ``DenominatorGraph`` sets it up: every
        state final with weight 1 (a chunk may end anywhere), initial probabilities from
        :func:`~bru_kaldi.chain.graph.denominator_initial_probs` over the first ``num_iters`` frames from the
        start, with this graph's final weights in the normalisation (``initial_probs = "kaldi"``), or without
        the normalisation (``"unnormalised"``, this toolkit's first version: the ablation of RESULTS.md)."""
        if initial_probs not in INITIAL_PROBS:
            raise ValueError(f"initial_probs must be one of {INITIAL_PROBS}, not {initial_probs!r}")
        graph = ChainGraph.from_arcs(self.num_states, zip(self.src.tolist(), self.dst.tolist(), self.pdf.tolist(),
                                                          self.weight.tolist()), dtype=dtype)
        initial = denominator_initial_probs(graph, self.start, num_iters, torch.as_tensor(self.final, dtype=dtype),
                                            normalise=initial_probs == "kaldi")
        return ChainGraph(graph.num_states, graph.src, graph.dst, graph.pdf, graph.weight, initial, graph.final)


class _HmmWeights:
    """Per (phone, HMM state) of a TransitionModel: its pdfs, its transitions' ids and probabilities, and its
    self-loop probability (module docstring; Kaldi's ``TransitionModel`` accessors by another name)."""

    def __init__(self, tm: TransitionModel):
        self.tm = tm
        self.number = {}  # (phone, hmm state) -> transition-state (1-based)
        for number, t in enumerate(tm.tuples, 1):
            known = self.number.get((t.phone, t.hmm_state))
            if known is not None and tm.tuples[known - 1] != t:
                raise ValueError(f"phone {t.phone} state {t.hmm_state} has several pdfs: the model is context-"
                                 "dependent, and its denominator graph needs the decision tree, which is not read")
            self.number[t.phone, t.hmm_state] = number

    def state(self, phone: int, hmm_state: int) -> int:
        if (phone, hmm_state) not in self.number:
            raise ValueError(f"phone {phone} state {hmm_state} has no pdf in the TransitionModel")
        return self.number[phone, hmm_state]

    def transitions(self, phone: int, hmm_state: int):
        """``(destination, transition-id, probability)`` of each transition out of the state, in topology order."""
        first = int(self.tm.state2id[self.state(phone, hmm_state)])
        entry = self.tm.topology.entry(phone)
        return [(d, first + k, math.exp(float(self.tm.log_probs[first + k])))
                for k, (d, _) in enumerate(entry[hmm_state].transitions)]

    def loop(self, phone: int, hmm_state: int) -> tuple[float, int]:
        """The self-loop's probability and transition-id (0 and 0 without one)."""
        return next(((p, t) for d, t, p in self.transitions(phone, hmm_state) if d == hmm_state), (0.0, 0))

    def pdfs(self, phone: int, hmm_state: int) -> tuple[int, int]:
        t = self.tm.tuples[self.state(phone, hmm_state) - 1]
        return t.forward_pdf, t.self_loop_pdf


def denominator_graph(lm: PhoneLM, tm: TransitionModel, transition_scale: float = 1.0) -> DenominatorGraph:
    """The graph of the module docstring, from phone LM ``lm`` and the HMMs, pdfs and transition
    probabilities of ``tm``, at ``transition_scale`` (Kaldi's 1.0; 0 gives every HMM arc weight 1)."""
    hmm = _HmmWeights(tm)
    a = float(transition_scale)
    phones_out = {}  # LM state -> [(phone, next LM state, probability)]
    for source, phone, following, probability in lm.arcs:
        phones_out.setdefault(source, []).append((phone, following, probability))

    states, index = [("start",)], {("start",): 0}
    todo = deque([("start",)])  # breadth first: states numbered in the order a path meets them

    def state(name) -> int:
        if name not in index:
            index[name] = len(states)
            states.append(name)
            todo.append(name)
        return index[name]

    def forward_arcs(phone, d, after, factor):  # the transitions out of HMM state d of phone (not its self-loop)
        loop_d = hmm.loop(phone, d)[0]
        forward_pdf = hmm.pdfs(phone, d)[0]
        for e, tid, p in hmm.transitions(phone, d):
            if e != d:
                yield state((after, phone, d, e)), forward_pdf, factor * (p / (1.0 - loop_d)) ** a, tid

    arcs, final = [], {}  # (src, dst, pdf, weight, tid); state -> final weight
    while todo:
        name = todo.popleft()
        source = index[name]
        if name == ("start",):
            after, leaving = 0, 1.0  # the LM's start; nothing to leave
            done = True
        else:
            after, phone, s, d = name
            loop_s, loop_tid = hmm.loop(phone, s)
            leaving = (1.0 - loop_s) ** a  # AddSelfLoopsReorder: the arcs out of s's self-loop state
            if loop_tid:
                arcs.append((source, source, hmm.pdfs(phone, s)[1], loop_s ** a, loop_tid))
            done = not tm.topology.entry(phone)[d].transitions  # d is the phone's final state
            if not done:
                arcs += [(source, *arc) for arc in forward_arcs(phone, d, after, leaving)]
        if not done:
            continue
        if lm.final[after] > 0 and name != ("start",):
            final[source] = lm.final[after] * leaving
        for q, following, probability in phones_out.get(after, []):
            if tm.topology.entry(q)[0].forward_pdf_class < 0:
                raise ValueError(f"phone {q}'s first HMM state emits nothing; the denominator graph needs an "
                                 "emitting first state")
            arcs += [(source, *arc) for arc in forward_arcs(q, 0, following, leaving * probability)]
    src, dst, pdf, weight, tid = (np.array(column) for column in zip(*arcs))
    final_weights = np.zeros(len(states))
    for s, w in final.items():
        final_weights[s] = w
    return DenominatorGraph(src.astype(np.int64), dst.astype(np.int64), pdf.astype(np.int64), weight.astype(np.float64),
                            tid.astype(np.int64), final_weights, 0, states)


def write_den_fst(graph: DenominatorGraph, path) -> None:
    """Write ``graph`` as ``den.fst`` (module docstring), atomically: state for state and arc for arc, its
    weights to float32 precision (OpenFst's ``StdArc``, as Kaldi's den.fst).

    >>> import tempfile, kaldifst
    >>> g = DenominatorGraph(np.array([0]), np.array([1]), np.array([3]), np.array([0.5]), np.array([7]),
    ...                      np.array([0.0, 1.0]), 0, [0, 1])
    >>> with tempfile.TemporaryDirectory() as d:
    ...     write_den_fst(g, f"{d}/den.fst"); fst = kaldifst.StdVectorFst.read(f"{d}/den.fst")
    >>> fst.num_states, fst.start, [(a.ilabel, round(a.weight.value, 4), a.nextstate) for a in kaldifst.ArcIterator(fst, 0)]
    (2, 0, [(4, 0.6931, 1)])
    """
    import kaldifst  # only here: reading a config or training needs no OpenFst

    from bru_kaldi.atomic import atomic_path

    fst = kaldifst.StdVectorFst()
    for _ in range(graph.num_states):
        fst.add_state()
    fst.start = graph.start
    for a, b, p, w in zip(graph.src.tolist(), graph.dst.tolist(), graph.pdf.tolist(), graph.weight.tolist()):
        fst.add_arc(a, kaldifst.StdArc(p + 1, p + 1, -math.log(w), b))
    for state, probability in enumerate(graph.final.tolist()):
        if probability > 0:
            fst.set_final(state, -math.log(probability))
    with atomic_path(Path(path)) as temporary:
        fst.write(str(temporary))


def read_den_fst(path) -> DenominatorGraph:
    """A ``den.fst`` (ours, or Kaldi's ``chain-make-den-fst``'s, e.g. from a triphone chain system's
    ``exp/chain/tdnn*/den.fst``) as a :class:`DenominatorGraph`: its start state, its final weights, its arcs
    with pdf ``label - 1`` and weight ``exp(-w)``; states are named by their FST ids, transition-ids unknown
    (0). Raises ``KaldiIOError`` naming the file for a file OpenFst cannot read, an empty FST, or an epsilon
    arc or one whose input and output labels differ (not a denominator acceptor).

    >>> import tempfile
    >>> g = DenominatorGraph(np.array([0, 0]), np.array([0, 1]), np.array([2, 0]), np.array([0.25, 0.75]),
    ...                      np.array([5, 6]), np.array([0.0, 1.0]), 0, [0, 1])
    >>> with tempfile.TemporaryDirectory() as d:
    ...     write_den_fst(g, f"{d}/den.fst"); back = read_den_fst(f"{d}/den.fst")
    >>> back.num_states, sorted(zip(back.src.tolist(), back.pdf.tolist(), back.weight.round(4).tolist()))
    (2, [(0, 0, 0.75), (0, 2, 0.25)])
    """
    import kaldifst

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such denominator FST")
    try:
        fst = kaldifst.StdVectorFst.read(str(path))
    except Exception as error:
        fst, why = None, str(error)
    else:
        why = "OpenFst's reader failed; its message is above"  # it prints it, and returns None
    if fst is None:
        raise KaldiIOError(f"{path}: not an OpenFst StdVectorFst ({why})")
    src, dst, pdf, weight = [], [], [], []
    final = np.zeros(fst.num_states)
    for state in range(fst.num_states):
        for arc in kaldifst.ArcIterator(fst, state):
            if arc.ilabel == 0 or arc.ilabel != arc.olabel:
                raise KaldiIOError(f"{path}: state {state} has an arc labelled {arc.ilabel}:{arc.olabel}; a denominator "
                                 "FST is an acceptor of pdf-id + 1, without epsilons (chain-make-den-fst's den.fst)")
            src.append(state), dst.append(arc.nextstate), pdf.append(arc.ilabel - 1)
            weight.append(math.exp(-arc.weight.value))
        final[state] = math.exp(-fst.final(state).value)  # OpenFst's non-final is +inf: exp(-inf) = 0
    if fst.start < 0 or not src:
        raise KaldiIOError(f"{path}: an empty FST (no start state or no arcs)")
    return DenominatorGraph(np.array(src, dtype=np.int64), np.array(dst, dtype=np.int64), np.array(pdf, dtype=np.int64),
                            np.array(weight), np.zeros(len(src), dtype=np.int64), final, int(fst.start),
                            list(range(fst.num_states)))

"""The LF-MMI denominator graph: the phone n-gram composed with the HMM topology, one arc per frame.

Every arc of the graph emits exactly one frame (a pdf-id), so that forward-backward over ``T`` frames
takes ``T`` steps along arcs. Its states are ``(h', p, s)``: inside phone ``p``, in emitting state ``s`` of
``p``'s HMM, with ``h'`` the phone-LM state that ``p`` led to (what follows depends on nothing else, so
phones entered from different LM states that lead to the same one share their states: the graph is
as small as the LM and the HMMs allow); plus one state ``after(h')`` per LM state, where an utterance may
end. A frame in state ``s`` takes one of ``s``'s transitions and emits that transition's
pdf (the transition-state's ``self_loop_pdf`` on a self-loop, else its ``forward_pdf``: Kaldi's
convention, ``TransitionModel``). A transition into ``p``'s final (non-emitting) state ends the phone,
and in the same frame the graph moves on, to the first state of each next phone ``q`` with the LM's
``P(q | h')``, or to ``after(h')``, whose final weight is the LM's probability of ending there. The start
is each phone ``q``'s first state with ``P(q | start)``.

The HMM's own transition probabilities enter raised to ``transition_scale``: 0 (the default) gives every
HMM transition weight 1, as Kaldi builds its chain denominator (the network's outputs absorb them), 1
the topology's probabilities. The pdf of each ``(phone, HMM state)`` comes from the TransitionModel, so
this covers models whose pdfs depend on the phone and state alone: monophone systems such as the
built-in corpus's. A context-dependent (triphone) system needs its decision tree as well, which is not
read yet; such a system's own ``den.fst``, made by Kaldi's ``chain-make-den-fst``, is read instead
(:func:`read_den_fst`).

On disk the graph is ``den.fst`` as Kaldi's chain recipes keep it (:func:`write_den_fst`): an OpenFst
``StdVectorFst`` acceptor whose labels are pdf-id + 1 (0 is epsilon in OpenFst) and whose weights are
``-log`` of ours, readable by kaldifst, OpenFst's ``fstinfo`` and Kaldi's chain tools.

>>> from bru_kaldi.chain.phone_lm import estimate_phone_lm
>>> from bru_kaldi.kaldi.transition_model import TransitionModel, HmmTopology, HmmState, TransitionState
>>> one_state = [HmmState(0, 0, ((0, 0.5), (1, 0.5))), HmmState(-1, -1, ())]
>>> tm = TransitionModel(HmmTopology([1, 2], [-1, 0, 0], [one_state]),
...                      [TransitionState(1, 0, 0, 0), TransitionState(2, 0, 1, 1)], [0.0] * 5)
>>> graph = denominator_graph(estimate_phone_lm([[1, 2], [2]], order=2), tm)
>>> graph.states  # (LM state led to, phone, HMM state): phone 1, phone 2 (from the start or after 1), the end
[(1, 1, 0), (2, 2, 0), ('after', 2)]
>>> [(graph.states[a], graph.states[b], int(p), float(w)) for a, b, p, w in
...  zip(graph.src, graph.dst, graph.pdf, graph.weight) if graph.states[a] == (1, 1, 0)]
[((1, 1, 0), (1, 1, 0), 0, 1.0), ((1, 1, 0), (2, 2, 0), 0, 1.0)]
>>> graph.initial.tolist(), graph.final.tolist()
([0.5, 0.5, 0.0], [0.0, 0.0, 1.0])
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from bru_kaldi.chain.graph import ChainGraph, denominator_initial_probs
from bru_kaldi.chain.phone_lm import PhoneLM
from bru_kaldi.kaldi.rspecifiers import KaldiIOError
from bru_kaldi.kaldi.transition_model import TransitionModel


@dataclass
class DenominatorGraph:
    """Arcs ``src``, ``dst``, ``pdf``, ``weight`` ``(A,)``; ``initial``, ``final`` ``(S,)`` weights; ``states``
    names each state (``(h', p, s)``, or ``("after", h')``), for reading and for tests."""

    src: np.ndarray
    dst: np.ndarray
    pdf: np.ndarray
    weight: np.ndarray
    initial: np.ndarray
    final: np.ndarray
    states: list

    @property
    def num_states(self) -> int:
        return len(self.states)

    def chain_graph(self, num_iters: int = 100, dtype: torch.dtype = torch.float64) -> ChainGraph:
        """This graph as the LF-MMI objective's denominator, set up as Kaldi's ``DenominatorGraph``: every
        state final with weight 1, and initial probabilities the state occupancy averaged over the first
        ``num_iters`` frames from this graph's start (``graph.denominator_initial_probs``), which is also
        where the leaky HMM's leaks land. With every state final the end states ``("after", h)`` have no
        use, and are left out. The exact start and end of the phone LM stay in ``initial`` and ``final``
        here, for other uses."""
        keep = np.array([not (isinstance(name, tuple) and name[0] == "after") for name in self.states])
        number = np.cumsum(keep) - 1  # old state -> new
        arcs = [(int(number[a]), int(number[b]), int(p), float(w))
                for a, b, p, w in zip(self.src, self.dst, self.pdf, self.weight) if keep[a] and keep[b]]
        size = int(keep.sum())
        graph = ChainGraph.from_arcs(size, arcs, dtype=dtype)
        start = torch.as_tensor(self.initial[keep], dtype=dtype)
        return dataclasses.replace(graph, initial=denominator_initial_probs(graph, start, num_iters))


def denominator_graph(lm: PhoneLM, tm: TransitionModel, transition_scale: float = 0.0) -> DenominatorGraph:
    """The graph of the module docstring, from phone LM ``lm`` and the HMMs and pdfs of ``tm``."""
    pdf_of = {}  # (phone, hmm state) -> (forward pdf, self-loop pdf)
    for t in tm.tuples:
        if (t.phone, t.hmm_state) in pdf_of and pdf_of[t.phone, t.hmm_state] != (t.forward_pdf, t.self_loop_pdf):
            raise ValueError(f"phone {t.phone} state {t.hmm_state} has several pdfs: the model is context-dependent, "
                             "and its denominator graph needs the decision tree, which is not read yet")
        pdf_of[t.phone, t.hmm_state] = (t.forward_pdf, t.self_loop_pdf)
    phones_out = {}  # LM state -> [(phone, next LM state, probability)]
    for source, phone, following, probability in lm.arcs:
        phones_out.setdefault(source, []).append((phone, following, probability))

    states, index = [], {}

    def state(name) -> int:
        if name not in index:
            index[name] = len(states)
            states.append(name)
        return index[name]

    arcs = []  # (src, dst, pdf, weight)
    initial, final = {}, {}
    for phone, following, probability in phones_out.get(0, []):
        initial[state((following, phone, 0))] = probability
    todo = list(states)
    while todo:
        after, p, s = todo.pop()  # after: the LM state that phone p led to
        entry = tm.topology.entry(p)
        source = index[after, p, s]
        for destination, hmm_probability in entry[s].transitions:
            if (p, s) not in pdf_of:
                raise ValueError(f"phone {p} state {s} has no pdf in the TransitionModel")
            forward_pdf, self_loop_pdf = pdf_of[p, s]
            pdf = self_loop_pdf if destination == s else forward_pdf
            weight = hmm_probability ** transition_scale
            if entry[destination].transitions:  # an emitting state of the same phone
                before = len(states)
                arcs.append((source, state((after, p, destination)), pdf, weight))
                todo += states[before:]
                continue
            if lm.final[after] > 0:  # (an LM state where no utterance ended gets no end state)
                final_state = state(("after", after))
                final[final_state] = lm.final[after]
                arcs.append((source, final_state, pdf, weight))
            for q, following, probability in phones_out.get(after, []):
                before = len(states)
                arcs.append((source, state((following, q, 0)), pdf, weight * probability))
                todo += states[before:]
    src, dst, pdf, weight = (np.array(column) for column in zip(*arcs))
    return DenominatorGraph(src.astype(np.int64), dst.astype(np.int64), pdf.astype(np.int64), weight.astype(np.float64),
                            _dense(initial, len(states)), _dense(final, len(states)), states)


def _dense(values: dict, size: int) -> np.ndarray:
    out = np.zeros(size)
    for i, v in values.items():
        out[i] = v
    return out


def write_den_fst(graph: DenominatorGraph, path) -> None:
    """Write ``graph`` as ``den.fst`` (module docstring), atomically: its language exactly, its weights to
    float32 precision (OpenFst's ``StdArc``, as Kaldi's den.fst).

    An FST has one start state where ours has initial weights, and an FST's arcs must each emit a pdf
    (Kaldi's denominator has no epsilons), so state 0 is a new start whose arcs are the first frame's:
    one per arc ``i -> j`` of ours with weight ``initial[i] * weight``. Our state ``i`` is ``i + 1``, with
    its final weight. A path of ``T`` arcs then weighs what the same pdfs weigh in ``graph``.

    >>> import tempfile, kaldifst
    >>> g = DenominatorGraph(np.array([0]), np.array([1]), np.array([3]), np.array([0.5]), np.array([1.0, 0.0]),
    ...                      np.array([0.0, 1.0]), [0, 1])
    >>> with tempfile.TemporaryDirectory() as d:
    ...     write_den_fst(g, f"{d}/den.fst"); fst = kaldifst.StdVectorFst.read(f"{d}/den.fst")
    >>> fst.num_states, fst.start, [(a.ilabel, round(a.weight.value, 4), a.nextstate) for a in kaldifst.ArcIterator(fst, 0)]
    (3, 0, [(4, 0.6931, 2)])
    """
    import kaldifst  # only here: reading a config or training needs no OpenFst

    from bru_kaldi.atomic import atomic_path

    fst = kaldifst.StdVectorFst()
    for _ in range(graph.num_states + 1):
        fst.add_state()
    fst.start = 0
    out_of = [[] for _ in range(graph.num_states)]
    for a, b, p, w in zip(graph.src.tolist(), graph.dst.tolist(), graph.pdf.tolist(), graph.weight.tolist()):
        out_of[a].append((b, p, w))
        fst.add_arc(a + 1, kaldifst.StdArc(p + 1, p + 1, -math.log(w), b + 1))
    for state, probability in enumerate(graph.initial.tolist()):
        for b, p, w in out_of[state] if probability > 0 else ():
            fst.add_arc(0, kaldifst.StdArc(p + 1, p + 1, -math.log(probability * w), b + 1))
    for state, probability in enumerate(graph.final.tolist()):
        if probability > 0:
            fst.set_final(state + 1, -math.log(probability))
    with atomic_path(Path(path)) as temporary:
        fst.write(str(temporary))


def read_den_fst(path) -> DenominatorGraph:
    """A ``den.fst`` (ours, or Kaldi's ``chain-make-den-fst``'s, e.g. from a triphone chain system's
    ``exp/chain/tdnn*/den.fst``) as a :class:`DenominatorGraph`: initial weight 1 on the FST's start
    state, its final weights, its arcs with pdf ``label - 1`` and weight ``exp(-w)``; states are named
    by their FST ids. Raises ``KaldiIOError`` naming the file for a file OpenFst cannot read, an empty
    FST, or an epsilon arc or one whose input and output labels differ (not a denominator acceptor).

    >>> import tempfile
    >>> g = DenominatorGraph(np.array([0, 0]), np.array([0, 1]), np.array([2, 0]), np.array([0.25, 0.75]),
    ...                      np.array([1.0, 0.0]), np.array([0.0, 1.0]), [0, 1])
    >>> with tempfile.TemporaryDirectory() as d:
    ...     write_den_fst(g, f"{d}/den.fst"); back = read_den_fst(f"{d}/den.fst")
    >>> back.num_states, sorted(zip(back.src.tolist(), back.pdf.tolist(), back.weight.round(4).tolist()))[:2]
    (3, [(0, 0, 0.75), (0, 2, 0.25)])
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
    initial = np.zeros(fst.num_states)
    initial[fst.start] = 1.0
    return DenominatorGraph(np.array(src, dtype=np.int64), np.array(dst, dtype=np.int64), np.array(pdf, dtype=np.int64),
                            np.array(weight), initial, final, list(range(fst.num_states)))

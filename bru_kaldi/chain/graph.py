"""The graphs of chain training: one FSA whose every arc emits one frame's pdf, batches of them, and the
denominator's initial probabilities (the numerator of an alignment: ``numerator``).

A :class:`ChainGraph` is a weighted automaton over pdf-ids without epsilons: ``S`` states, ``A`` arcs
``src[a] -> dst[a]`` each emitting pdf ``pdf[a]`` with weight ``weight[a]`` (a probability, not a cost),
initial weights ``initial[s]`` and final weights ``final[s]``. The weight of a path of ``T`` arcs
``a_1 .. a_T`` given per-frame scores ``e[t, p]`` is

    initial[src[a_1]] * prod_t weight[a_t] * e[t - 1, pdf[a_t]] * final[dst[a_T]]

and :mod:`bru_kaldi.chain.objective` sums it over all paths (with the leaky HMM for the denominator).

>>> g = ChainGraph.from_arcs(2, [(0, 0, 0, 0.5), (0, 1, 1, 0.5), (1, 1, 1, 1.0)], initial=[1.0, 0.0])
>>> g.num_states, g.num_arcs, g.num_pdfs, g.final.tolist()
(2, 3, 2, [1.0, 1.0])
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Iterable, Optional, Sequence

import torch


def _check_ids(name: str, ids: torch.Tensor, upper: Optional[int]) -> None:
    if ids.dtype != torch.int64:
        raise TypeError(f"{name} must be int64, not {ids.dtype}")
    if ids.device.type == "cpu" and ids.numel():  # value checks only where they cost no device sync
        if int(ids.min()) < 0 or (upper is not None and int(ids.max()) >= upper):
            raise ValueError(f"{name} has ids outside [0, {upper})")


def _check_weights(name: str, weights: torch.Tensor) -> None:
    if not weights.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor, not {weights.dtype}")
    if weights.device.type == "cpu" and weights.numel():
        if not bool(torch.isfinite(weights).all()) or bool((weights < 0).any()):
            raise ValueError(f"{name} must be finite and >= 0 (probabilities, not costs)")


@dataclass(frozen=True)
class _Arcs:
    """The fields of one graph (:class:`ChainGraph`) and of a padded batch of them (:class:`GraphBatch`, one
    more leading dimension on every tensor), and how both move to a device."""

    num_states: int
    src: torch.Tensor
    dst: torch.Tensor
    pdf: torch.Tensor
    weight: torch.Tensor
    initial: torch.Tensor
    final: torch.Tensor
    windows: Optional[torch.Tensor] = None

    def to(self, device=None, dtype: Optional[torch.dtype] = None):
        """The same on ``device`` with its weights (and windows) in ``dtype`` (ids stay int64); itself where
        that changes nothing (no copy, and no second check of its fields: a batch's graphs are moved every step)."""
        moved = {name: getattr(self, name).to(device) for name in ("src", "dst", "pdf")}
        moved.update({name: getattr(self, name).to(device, dtype) for name in ("weight", "initial", "final")})
        moved["windows"] = None if self.windows is None else self.windows.to(device, dtype)
        if all(tensor is getattr(self, name) for name, tensor in moved.items()):
            return self
        return dataclasses.replace(self, **moved)


@dataclass(frozen=True)
class ChainGraph(_Arcs):
    """One epsilon-free FSA over pdf-ids, as tensors (every arc emits exactly one frame).

    ``num_states``: ``S``; ``src``, ``dst``, ``pdf``: ``(A,)`` int64 (states in ``[0, S)``, pdf-ids
    ``>= 0``); ``weight``: ``(A,)`` float, the arc probabilities; ``initial``, ``final``: ``(S,)`` float,
    the initial and final weights (the denominator of :func:`denominator_graph` has every state final with
    weight 1, as Kaldi's denominator treats all states); ``windows``: ``None``, or ``(T, S)`` 0/1, the states
    that may hold a path after each frame (a numerator's time windows, ``numerator.NumeratorCompiler``: a graph
    of ``K`` states then serves ``T`` frames, where unrolling it in time would take ``T`` times as many).
    Construct it from a list with :meth:`from_arcs`.

    >>> g = ChainGraph.from_arcs(1, [(0, 0, 3, 1.0)])
    >>> g.pdf.tolist(), g.initial.tolist(), g.weight.dtype
    ([3], [1.0], torch.float64)
    """

    def __post_init__(self):
        arcs = self.src.shape
        if len(arcs) != 1 or self.dst.shape != arcs or self.pdf.shape != arcs or self.weight.shape != arcs:
            raise ValueError(f"src, dst, pdf and weight must all have shape (A,): {self.src.shape}, "
                             f"{self.dst.shape}, {self.pdf.shape}, {self.weight.shape}")
        if self.initial.shape != (self.num_states,) or self.final.shape != (self.num_states,):
            raise ValueError(f"initial and final must have shape ({self.num_states},): "
                             f"{tuple(self.initial.shape)}, {tuple(self.final.shape)}")
        for name in ("src", "dst"):
            _check_ids(name, getattr(self, name), self.num_states)
        _check_ids("pdf", self.pdf, None)
        for name in ("weight", "initial", "final"):
            _check_weights(name, getattr(self, name))
        if self.windows is not None and (self.windows.dim() != 2 or self.windows.shape[1] != self.num_states):
            raise ValueError(f"windows must have shape (T, {self.num_states}), got {tuple(self.windows.shape)}")

    @classmethod
    def from_arcs(cls, num_states: int, arcs: Iterable[tuple[int, int, int, float]],
                  initial: Optional[Sequence[float]] = None, final: Optional[Sequence[float]] = None,
                  dtype: torch.dtype = torch.float64, windows=None) -> "ChainGraph":
        """A graph from ``(src, dst, pdf, weight)`` tuples. ``initial`` defaults to all weight on state 0,
        ``final`` to 1 for every state.

        >>> ChainGraph.from_arcs(2, [(0, 1, 0, 0.25)], final=[0, 1]).final.tolist()
        [0.0, 1.0]
        """
        arcs = list(arcs)
        columns = list(zip(*arcs)) if arcs else [(), (), (), ()]
        ids = [torch.tensor(column, dtype=torch.int64) for column in columns[:3]]
        if initial is None:
            initial = [1.0] + [0.0] * (num_states - 1)
        if final is None:
            final = [1.0] * num_states
        return cls(num_states, *ids, torch.tensor(columns[3], dtype=dtype), torch.tensor(initial, dtype=dtype),
                   torch.tensor(final, dtype=dtype), None if windows is None else torch.as_tensor(windows, dtype=dtype))

    @property
    def num_arcs(self) -> int:
        """``A``, the number of arcs."""
        return self.src.shape[0]

    @property
    def num_pdfs(self) -> int:
        """One more than the largest pdf-id on an arc (0 without arcs): the least output width it needs."""
        return int(self.pdf.max()) + 1 if self.num_arcs else 0

    def expand(self, batch_size: int) -> "GraphBatch":
        """This graph ``batch_size`` times as a :class:`GraphBatch`, without copying (expanded views): how the
        one denominator graph serves a whole batch.

        >>> ChainGraph.from_arcs(1, [(0, 0, 0, 1.0)]).expand(3).src.shape
        torch.Size([3, 1])
        """
        def rows(t):
            return t.unsqueeze(0).expand(batch_size, -1)
        windows = None if self.windows is None else self.windows.unsqueeze(0).expand(batch_size, -1, -1)
        return GraphBatch(self.num_states, rows(self.src), rows(self.dst), rows(self.pdf), rows(self.weight),
                          rows(self.initial), rows(self.final), windows)

    @staticmethod
    def batch(graphs: Sequence["ChainGraph"]) -> "GraphBatch":
        """Graphs of different sizes padded into one :class:`GraphBatch` (``S``, ``A``: the largest).

        A padded arc goes from state 0 to state 0 with pdf 0 and weight 0; a padded state has initial and
        final weight 0: neither carries any probability, so each graph keeps its own path weights.

        >>> b = ChainGraph.batch([ChainGraph.from_arcs(1, [(0, 0, 0, 1.0)]),
        ...                       ChainGraph.from_arcs(2, [(0, 1, 1, 1.0), (1, 1, 1, 1.0)])])
        >>> b.num_states, b.weight.tolist(), b.final.tolist()
        (2, [[1.0, 0.0], [1.0, 1.0]], [[1.0, 0.0], [1.0, 1.0]])
        """
        if not graphs:
            raise ValueError("no graphs to batch")
        states = max(g.num_states for g in graphs)
        arcs = max(g.num_arcs for g in graphs)
        dtype = graphs[0].weight.dtype

        def pad(tensors, width, dtype):
            out = torch.zeros(len(tensors), width, dtype=dtype, device=tensors[0].device)
            for row, tensor in zip(out, tensors):
                row[:tensor.shape[0]] = tensor
            return out

        windows = None
        if any(g.windows is not None for g in graphs):  # past a graph's own frames every state is closed
            frames = max(g.windows.shape[0] for g in graphs if g.windows is not None)
            windows = torch.zeros(len(graphs), frames, states, dtype=dtype, device=graphs[0].src.device)
            for row, g in zip(windows, graphs):
                if g.windows is None:  # (a graph without windows in such a batch: open for these frames)
                    row[:, :g.num_states] = 1.0
                else:
                    row[:g.windows.shape[0], :g.num_states] = g.windows
        return GraphBatch(states, *(pad([getattr(g, name) for g in graphs], arcs, torch.int64)
                                    for name in ("src", "dst", "pdf")),
                          pad([g.weight for g in graphs], arcs, dtype),
                          *(pad([getattr(g, name) for g in graphs], states, dtype) for name in ("initial", "final")),
                          windows)


@dataclass(frozen=True)
class GraphBatch(_Arcs):
    """``B`` graphs with the same ``S`` and ``A`` (padded), one per utterance of a batch: what the
    forward-backward of :mod:`bru_kaldi.chain.objective` runs on.

    ``num_states``: ``S``; ``src``, ``dst``, ``pdf``: ``(B, A)`` int64; ``weight``: ``(B, A)`` float;
    ``initial``, ``final``: ``(B, S)`` float; ``windows``: ``None`` or ``(B, T', S)`` (see :class:`ChainGraph`;
    frames past a graph's own close every state: a numerator accepts its utterance's length only). Made by
    :meth:`ChainGraph.batch` or :meth:`ChainGraph.expand`.

    >>> ChainGraph.from_arcs(2, [(0, 1, 0, 1.0)]).expand(4).initial.shape
    torch.Size([4, 2])
    """

    @property
    def batch_size(self) -> int:
        """``B``."""
        return self.src.shape[0]



def denominator_initial_probs(graph: ChainGraph, start_state: int = 0, num_iters: int = 100,
                              final: Optional[torch.Tensor] = None, normalise: bool = True) -> torch.Tensor:
    """The denominator's initial probabilities, Kaldi's ``DenominatorGraph::SetInitialProbs``: where the HMM
    tends to be, for chunks cut from the middle of utterances, whose first state is unknown (also where the
    leaky HMM's leaks land). Returns ``(S,)`` in the graph's dtype, summing to 1.

    The steps, as Kaldi's (in float64 there, in the graph's dtype here):

    1. Every state's outgoing weights, its final weight included (``final``: the FST's own, e.g. the phone
       LM's end probabilities; 0 for every state when ``None``), are scaled to sum to 1, because the
       graph's weights are not a distribution (a phone LM's probabilities times HMM transitions).
       ``normalise = False`` leaves this step out: this toolkit's first version did, and the ablation of
       RESULTS.md runs it again; a state with many arcs (silence's four-way branching) then draws the mass.
    2. ``p_0`` is all mass on ``start_state``; ``p_{k+1}[j] = sum over arcs i -> j of p_k[i] * weight``,
       renormalised to sum 1 (the mass that ends at final weights is lost).
    3. The result is ``(p_0 + ... + p_{num_iters - 1}) / num_iters``: the average, stable for periodic
       graphs where the power iteration itself oscillates, and with some mass kept near the start.

    >>> g = ChainGraph.from_arcs(2, [(0, 1, 0, 1.0), (1, 0, 1, 1.0)])  # period 2
    >>> denominator_initial_probs(g, num_iters=4).tolist()
    [0.5, 0.5]
    >>> g = ChainGraph.from_arcs(2, [(0, 0, 0, 1.0), (0, 1, 0, 1.0), (0, 1, 1, 1.0), (1, 0, 0, 1.0)])
    >>> [round(v, 4) for v in denominator_initial_probs(g, num_iters=2).tolist()]  # p_1: 1/3 and 2/3
    [0.6667, 0.3333]
    """
    if num_iters < 1:
        raise ValueError(f"num_iters must be >= 1, not {num_iters}")
    if not 0 <= start_state < graph.num_states:
        raise ValueError(f"start_state {start_state} is not a state of a graph with {graph.num_states}")
    weight = graph.weight
    if normalise:
        out = torch.zeros(graph.num_states, dtype=weight.dtype, device=weight.device).index_add_(0, graph.src, weight)
        if final is not None:
            out = out + final.to(out)
        if not bool((out > 0).all()):
            raise ValueError(f"state {int((out > 0).logical_not().nonzero()[0])} has neither arcs nor a final weight")
        weight = weight / out[graph.src]
    occupancy = torch.zeros(graph.num_states, dtype=weight.dtype, device=weight.device)
    occupancy[start_state] = 1.0
    average = torch.zeros_like(occupancy)
    for _ in range(num_iters):
        average += occupancy / num_iters
        following = torch.zeros_like(occupancy).index_add_(0, graph.dst, occupancy[graph.src] * weight)
        total = following.sum()
        if not total > 0:
            raise ValueError("the graph's probability mass dies out: no arcs leave the states reached")
        occupancy = following / total
    return average


def denominator_graph(num_states: int, arcs: Iterable[tuple[int, int, int, float]], start_state: int = 0,
                      num_iters: int = 100, dtype: torch.dtype = torch.float64) -> ChainGraph:
    """The denominator graph from ``(src, dst, pdf, weight)`` arcs, as Kaldi's ``DenominatorGraph`` sets it
    up: initial probabilities from :func:`denominator_initial_probs`, and every state final with weight 1
    (a chunk may end anywhere in the HMM).

    >>> g = denominator_graph(2, [(0, 0, 0, 0.5), (0, 1, 1, 0.5), (1, 0, 0, 1.0)], num_iters=2)
    >>> g.initial.tolist(), g.final.tolist()
    ([0.75, 0.25], [1.0, 1.0])
    """
    graph = ChainGraph.from_arcs(num_states, arcs, dtype=dtype)
    return dataclasses.replace(graph, initial=denominator_initial_probs(graph, start_state, num_iters))

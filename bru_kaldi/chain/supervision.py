"""LF-MMI training's supervision: the denominator graph of a training set, and a batch's numerator graphs.

:func:`estimate_denominator` estimates the phone n-gram from the phone sequences of a training
set's alignments (``ali-to-phones`` through its ``final.mdl``) and composes it with the HMMs of that
``final.mdl`` (or reads a ``den.fst`` instead); :func:`denominator_from_alignments` sets the result up as
Kaldi's denominator. :class:`ChainSupervision` holds it with the
objective's options and computes a batch's loss: each utterance's numerator graph is made from its
pdf alignment (the batch's senone labels) with ``tolerance`` frames of freedom at each boundary
(``graph.numerator_graph``), and :func:`~bru_kaldi.chain.objective.lfmmi_loss` does the rest.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch

from bru_kaldi.batching import IGNORE
from bru_kaldi.chain.den_graph import DenominatorGraph, denominator_graph, read_den_fst
from bru_kaldi.chain.graph import ChainGraph, numerator_graph
from bru_kaldi.chain.objective import LFMMIResult, lfmmi_loss
from bru_kaldi.chain.phone_lm import estimate_phone_lm
from bru_kaldi.kaldi.alignments import read_alignments
from bru_kaldi.kaldi.transition_model import read_transition_model

log = logging.getLogger(__name__)


def estimate_denominator(lab_folder, order: int = 4, transition_scale: float = 0.0,
                         den_fst: str = "") -> DenominatorGraph:
    """The denominator graph of the alignments in ``lab_folder`` (``ali.*.gz`` and ``final.mdl``): a phone
    n-gram of order ``order`` over their phone sequences, composed with ``final.mdl``'s HMMs. With
    ``den_fst`` (a path), that FST instead (``den_graph.read_den_fst``: Kaldi's, for a context-dependent
    system, whose decision tree we do not read)."""
    if den_fst:
        graph = read_den_fst(den_fst)
        log.info("LF-MMI denominator: %s, %d states, %d arcs", den_fst, graph.num_states, len(graph.src))
        return graph
    model = read_transition_model(Path(lab_folder) / "final.mdl")
    sequences = [model.ali_to_phones(ali) for _, ali in read_alignments(str(lab_folder))]
    lm = estimate_phone_lm(sequences, order=order)
    graph = denominator_graph(lm, model, transition_scale)
    log.info("LF-MMI denominator: a %d-gram of %d phone sequences (%d states), composed with the HMMs: %d states, "
             "%d arcs", order, len(sequences), lm.num_states, graph.num_states, len(graph.src))
    return graph


def denominator_from_alignments(lab_folder, order: int = 4, transition_scale: float = 0.0) -> ChainGraph:
    """:func:`estimate_denominator`'s graph set up as Kaldi's denominator (``DenominatorGraph.chain_graph``)."""
    return estimate_denominator(lab_folder, order, transition_scale).chain_graph()


@dataclass
class ChainSupervision:
    """The denominator graph and the options of ``[model] objective = lfmmi`` (see ``bru_kaldi.config.Model``)."""

    den_graph: ChainGraph
    leaky_hmm: float = 0.1
    xent_regularize: float = 0.1
    output_l2: float = 0.0
    tolerance: int = 5

    def to(self, device, dtype: torch.dtype = torch.float32) -> "ChainSupervision":
        """The same, its denominator on ``device`` in ``dtype`` (the network's outputs' dtype; Kaldi's is float32)."""
        return dataclasses.replace(self, den_graph=self.den_graph.to(device, dtype))

    def loss(self, output: torch.Tensor, pdfs: torch.Tensor, xent_output: Optional[torch.Tensor] = None) -> LFMMIResult:
        """The LF-MMI loss of ``output`` ``(B, T, P)`` against the pdf alignments ``pdfs`` ``(B, T)`` (``IGNORE``
        past each utterance's end); ``xent_output`` the cross-entropy head's logits."""
        real = pdfs != IGNORE
        lengths = real.sum(1)
        alignments = [row[:n].tolist() for row, n in zip(pdfs.cpu(), lengths.tolist())]
        # on the CPU, where they are made: the forward-backward moves them (batched) to where it runs
        numerators = [numerator_graph(a, self.tolerance, dtype=output.dtype) for a in alignments]
        graph = self.den_graph
        if graph.weight.device != output.device or graph.weight.dtype != output.dtype:
            graph = graph.to(output.device, output.dtype)
        return lfmmi_loss(output, lengths, numerators, graph, self.leaky_hmm, xent_output, self.xent_regularize,
                          self.output_l2)

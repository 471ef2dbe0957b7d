"""LF-MMI training's supervision: a training set's denominator graph, a batch's numerator graphs, the loss, and
the setup of ``[model] objective = lfmmi`` from a config.

:func:`estimate_denominator` estimates the phone n-gram from the phone sequences of a training set's
alignments (``ali-to-phones`` through its ``final.mdl``) and composes it with the HMMs of that
``final.mdl`` (or reads a ``den.fst`` instead). :class:`ChainSupervision` holds it, set up as Kaldi's
denominator, with the numerator compiler and the objective's options, and computes a batch's loss: each
utterance's numerator is made from its transition-ids (``numerator.NumeratorCompiler``: Kaldi's
``chain-get-supervision``), and :func:`~bru_kaldi.chain.objective.lfmmi_loss` does the rest.
:func:`chain_supervision` makes it from a config; ``run_exp.py`` calls it once before training.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch

from bru_kaldi.batching import IGNORE
from bru_kaldi.chain.den_graph import DenominatorGraph, denominator_graph, read_den_fst, write_den_fst
from bru_kaldi.chain.graph import ChainGraph
from bru_kaldi.chain.numerator import NumeratorCompiler
from bru_kaldi.chain.objective import LFMMIResult, lfmmi_loss
from bru_kaldi.chain.phone_lm import estimate_phone_lm
from bru_kaldi.kaldi.alignments import read_alignments
from bru_kaldi.kaldi.rspecifiers import KaldiIOError
from bru_kaldi.kaldi.transition_model import read_transition_model

log = logging.getLogger(__name__)


def estimate_denominator(lab_folder, order: int = 4, transition_scale: float = 1.0,
                         den_fst: str = "") -> DenominatorGraph:
    """The denominator graph of the alignments in ``lab_folder`` (``ali.*.gz`` and ``final.mdl``): a phone
    n-gram of order ``order`` over their phone sequences, composed with ``final.mdl``'s HMMs at
    ``transition_scale`` (``den_graph.denominator_graph``). With ``den_fst`` (a path), that FST instead
    (``den_graph.read_den_fst``: Kaldi's, for a context-dependent system, whose decision tree we do not read)."""
    if den_fst:
        graph = read_den_fst(den_fst)
        log.info("LF-MMI denominator: %s, %d states, %d arcs", den_fst, graph.num_states, len(graph.src))
        return graph
    model = read_transition_model(Path(lab_folder) / "final.mdl")
    sequences = [model.ali_to_phones(ali) for _, ali in read_alignments(str(lab_folder))]
    lm = estimate_phone_lm(sequences, order=order)
    graph = denominator_graph(lm, model, transition_scale)
    log.info("LF-MMI denominator: a %d-gram of %d phone sequences (%d states), composed with the HMMs at transition "
             "scale %g: %d states, %d arcs", order, len(sequences), lm.num_states, transition_scale, graph.num_states,
             len(graph.src))
    return graph


def denominator_from_alignments(lab_folder, order: int = 4, transition_scale: float = 1.0) -> ChainGraph:
    """:func:`estimate_denominator`'s graph set up as Kaldi's denominator (``DenominatorGraph.chain_graph``)."""
    return estimate_denominator(lab_folder, order, transition_scale).chain_graph()


@dataclass
class ChainSupervision:
    """The denominator graph, the numerator compiler and the options of ``[model] objective = lfmmi`` (see
    ``bru_kaldi.config.Model``)."""

    den_graph: ChainGraph
    numerators: NumeratorCompiler
    leaky_hmm: float = 0.1
    xent_regularize: float = 0.1
    output_l2: float = 5e-5

    @property
    def frame_subsampling_factor(self) -> int:
        return self.numerators.factor

    def to(self, device, dtype: torch.dtype = torch.float32) -> "ChainSupervision":
        """The same, its denominator on ``device`` in ``dtype`` (the network's outputs' dtype; Kaldi's is float32)."""
        return dataclasses.replace(self, den_graph=self.den_graph.to(device, dtype))

    def loss(self, output: torch.Tensor, transition_ids: torch.Tensor, xent_output: Optional[torch.Tensor] = None,
             frame_shift: int = 0) -> LFMMIResult:
        """The LF-MMI loss of ``output`` ``(B, T', P)`` (the network's output frames: the input's ``f t +
        frame_shift``) against the alignments' transition-ids ``(B, T)`` at the full rate (``IGNORE`` past each
        utterance's end); ``xent_output`` the cross-entropy head's logits ``(B, T', P)``. Utterances whose
        numerator has no path of their length are left out of it, with a warning (Kaldi's chain-get-supervision
        refuses them)."""
        real = transition_ids != IGNORE
        lengths = real.sum(1).tolist()
        rows = transition_ids.cpu().numpy()
        frames = [self.numerators.output_frames(n, frame_shift) for n in lengths]
        if output.shape[1] != max(frames):
            raise ValueError(f"the network gives {output.shape[1]} output frames for utterances of at most "
                             f"{max(lengths)} frames at frame_subsampling_factor {self.frame_subsampling_factor} "
                             f"and shift {frame_shift}: expected {max(frames)}")
        # on the CPU, where they are made: the forward-backward moves them (batched) to where it runs
        numerators = [self.numerators.graph(row[:n], frame_shift, dtype=output.dtype) for row, n in zip(rows, lengths)]
        graph = self.den_graph
        if graph.weight.device != output.device or graph.weight.dtype != output.dtype:
            graph = graph.to(output.device, output.dtype)
        result = lfmmi_loss(output, frames, numerators, graph, self.leaky_hmm, xent_output, self.xent_regularize,
                            self.output_l2)
        if result.dropped:
            log.warning("LF-MMI: %d of %d utterances have no numerator path of their %s output frames (more phones "
                        "than frames, or windows that exclude each other) and were left out of this batch",
                        len(result.dropped), len(lengths), ", ".join(str(frames[i]) for i in result.dropped))
        return result


def chain_supervision(model, lab_folder, num_pdfs: int, den_fst_out: Optional[Path] = None) -> ChainSupervision:
    """The supervision of ``[model] objective = lfmmi`` (``model``: the config's ``[model]``) for the training
    alignments of ``lab_folder``, whose labels have ``num_pdfs`` pdfs: the denominator (estimated, or
    ``lfmmi_den_fst``), written as ``den_fst_out`` for fstinfo, fstprint and Kaldi's chain tools where given,
    and the numerator compiler of ``lab_folder/final.mdl``. Raises ``KaldiIOError`` for a denominator that
    uses pdfs the labels do not have."""
    den = estimate_denominator(lab_folder, model.lfmmi_phone_lm_order, model.lfmmi_transition_scale,
                               den_fst=model.lfmmi_den_fst)
    if int(den.pdf.max()) >= num_pdfs:
        raise KaldiIOError(f"{model.lfmmi_den_fst or lab_folder}: the denominator uses pdf {int(den.pdf.max())}, the "
                           f"senone labels have {num_pdfs} pdfs")
    if den_fst_out is not None:
        write_den_fst(den, den_fst_out)
    numerators = NumeratorCompiler(read_transition_model(Path(lab_folder) / "final.mdl"), model.lfmmi_tolerance,
                                   model.frame_subsampling_factor, model.lfmmi_transition_scale)
    return ChainSupervision(den.chain_graph(model.lfmmi_initial_probs), numerators, model.lfmmi_leaky_hmm,
                            model.lfmmi_xent_regularize, model.lfmmi_output_l2)

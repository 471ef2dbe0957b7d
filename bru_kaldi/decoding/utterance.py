"""One utterance decoded without Kaldi: per-pdf log-likelihoods to the best path through HCLG.fst.

The search is what ``latgen-faster-mapped`` does for a hybrid system, with kaldi-hmm-gmm's
``FasterDecoder`` (Kaldi's faster-decoder.cc, a beam-pruned Viterbi search): the acoustic model gives
one score per frame and *pdf*; the graph's input labels are *transition-ids*; the transition model
maps each transition-id to its pdf (``tid2pdf``, index 0 unused, from ``read_transition_model``).

kaldi-hmm-gmm's ``DecodableCtc`` serves ``loglike(frame, i) = M[frame, i - 1]`` for index ``i``
(it was written for CTC, whose index 0 is the blank). With transition-ids as indices that is
exactly the layout we need: column ``tid - 1`` of ``M`` holds ``acoustic_scale * loglikes[:, tid2pdf[tid]]``.

Import order: kaldi_hmm_gmm before kaldifst. Some import orders of the kaldi-* packages hang for ever
(``import kaldilm, kaldifst`` does); kaldi_hmm_gmm first and kaldilm last is safe.

>>> import numpy as np
>>> graph = linear_loop_graph(num_transition_ids=2)   # any word, any number of times
>>> tid2pdf = np.array([0, 0, 1])                       # tid 1 -> pdf 0, tid 2 -> pdf 1
>>> loglikes = np.log(np.array([[.9, .1]] * 3 + [[.2, .8]] * 2, dtype=np.float32))  # (T=5, num_pdfs=2)
>>> result = decode(loglikes, graph, tid2pdf, DecoderOptions(acoustic_scale=1.0))
>>> result.words, result.alignment, result.reached_final
([1, 1, 1, 2, 2], [1, 1, 1, 2, 2], True)
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

import kaldi_hmm_gmm as khg  # before kaldifst: see the module docstring
import kaldifst
import numpy as np


class NoPathError(RuntimeError):
    """No path survived the beam search (:func:`decode`); a set-level decode counts it as failed."""




@dataclass(frozen=True)
class DecoderOptions:
    """Search settings, with the defaults of Kaldi's ``latgen-faster-mapped`` for hybrid models."""

    beam: float = 13.0  # prune paths scoring more than this below the best one
    max_active: int = 7000  # at most this many active states per frame
    min_active: int = 200
    acoustic_scale: float = 0.1  # scale on the log-likelihoods against the graph's LM/transition costs


@dataclass(frozen=True)
class DecodeResult:
    """The best path: ``words`` (output labels: word-ids, phone-ids for a phone recogniser),
    ``alignment`` (one transition-id per frame), ``cost`` (graph + scaled acoustic cost, lower is
    better) and whether it ended in a final state of the graph (else it is the best partial path)."""

    words: list[int]
    alignment: list[int]
    cost: float
    reached_final: bool


class GraphReadError(ValueError):
    """A decoding graph that cannot be read; the message names the file and why."""


FST_MAGIC = 2125659606  # OpenFst's FstHeader
_HAS_ISYMBOLS, _HAS_OSYMBOLS, _IS_ALIGNED = 0x1, 0x2, 0x4  # FstHeader flags


def load_graph(path: str | Path) -> kaldifst.StdVectorFst:
    """Read a decoding graph (HCLG.fst) written by Kaldi, kaldifst or kaldi-hmm-gmm, as a vector FST.

    Kaldi's ``utils/mkgraph.sh`` writes HCLG as a *const* FST (``fstconvert --fst_type=const``), which
    kaldifst cannot read (its ``read`` returns None for it): such a graph goes through
    :func:`read_const_fst`. Anything else that is not a graph is a :class:`GraphReadError`.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no such decoding graph {path}")
    kind = _fst_type(path)
    if kind == "const":
        return read_const_fst(path)
    graph = kaldifst.StdVectorFst.read(str(path)) if kind == "vector" else None
    if graph is None:
        raise GraphReadError(f"{path}: not a decoding graph this toolkit can read (an OpenFst {kind or 'file'} of "
                             "the standard arc type, vector or const, is expected)")
    return graph


def _fst_type(path: Path):
    """The FST type in an OpenFst file's header (``"vector"``, ``"const"``...), or None for another file."""
    with open(path, "rb") as f:
        head = f.read(64)
    if len(head) < 8 or struct.unpack_from("<i", head)[0] != FST_MAGIC:
        return None
    (length,) = struct.unpack_from("<i", head, 4)
    return head[8:8 + length].decode(errors="replace") if 0 < length < 32 else None


def read_const_fst(path: str | Path) -> kaldifst.StdVectorFst:
    """An OpenFst ``const`` FST of standard (tropical) arcs, read from its bytes into a vector FST.

    The format (OpenFst's ``ConstFst::Write``): the FST header (magic, type and arc type strings,
    version, flags, properties, start, number of states and of arcs), symbol tables when the flags say
    so, then every state as ``(final weight float32, first arc uint32, arcs, input-epsilon arcs,
    output-epsilon arcs: uint32)`` and every arc as ``(ilabel, olabel int32, weight float32, next
    state int32)``, each array aligned to 16 bytes in the aligned variant. Hand-written because no
    package here reads it.
    """
    data = Path(path).read_bytes()
    position = 0

    def take(fmt: str):
        nonlocal position
        values = struct.unpack_from(fmt, data, position)
        position += struct.calcsize(fmt)
        return values

    def string() -> str:
        nonlocal position
        (length,) = take("<i")
        text = data[position:position + length].decode(errors="replace")
        position += length
        return text

    def align() -> None:
        nonlocal position
        position += -position % 16

    def skip_symbols() -> None:  # SymbolTable: magic, name, available key, size, then (symbol, key) pairs
        take("<i")
        string()
        _, size = take("<qq")
        for _ in range(size):
            string()
            take("<q")

    try:
        (magic,) = take("<i")
        kind, arc_type = string(), string()
        if magic != FST_MAGIC or kind != "const" or arc_type != "standard":
            raise GraphReadError(f"{path}: expected an OpenFst const FST of standard arcs, got type {kind!r}, "
                                 f"arcs {arc_type!r}")
        _, flags = take("<ii")
        _, start, num_states, num_arcs = take("<Qqqq")
        if flags & _HAS_ISYMBOLS:
            skip_symbols()
        if flags & _HAS_OSYMBOLS:
            skip_symbols()
        if flags & _IS_ALIGNED:
            align()
        states = np.frombuffer(data, dtype=[("final", "<f4"), ("pos", "<u4"), ("narcs", "<u4"), ("nie", "<u4"),
                                            ("noe", "<u4")], count=num_states, offset=position)
        position += states.nbytes
        if flags & _IS_ALIGNED:
            align()
        arcs = np.frombuffer(data, dtype=[("ilabel", "<i4"), ("olabel", "<i4"), ("weight", "<f4"), ("next", "<i4")],
                             count=num_arcs, offset=position)
    except (struct.error, ValueError) as error:
        if isinstance(error, GraphReadError):
            raise
        raise GraphReadError(f"{path}: a truncated or damaged const FST ({error})") from None
    graph = kaldifst.StdVectorFst()
    graph.reserve_states(num_states)
    for _ in range(num_states):
        graph.add_state()
    if num_states:
        graph.start = int(start)
    for state, (final, first, count) in enumerate(zip(states["final"].tolist(), states["pos"].tolist(),
                                                      states["narcs"].tolist())):
        if final != float("inf"):
            graph.set_final(state=state, weight=final)
        for ilabel, olabel, weight, target in arcs[first:first + count].tolist():
            graph.add_arc(state=state, arc=kaldifst.StdArc(ilabel, olabel, weight, target))
    return graph


def transition_loglikes(loglikes: np.ndarray, tid2pdf: np.ndarray, acoustic_scale: float) -> np.ndarray:
    """Per-pdf log-likelihoods (T, num_pdfs) -> scaled per-transition-id scores (T, num_tids) float32.

    Column ``tid - 1`` holds the score of transition-id ``tid`` (see the module docstring).
    """
    loglikes = np.asarray(loglikes)
    tid2pdf = np.asarray(tid2pdf)
    if loglikes.ndim != 2:
        raise ValueError(f"log-likelihoods must be (frames, pdfs), got shape {loglikes.shape}")
    if tid2pdf.ndim != 1 or len(tid2pdf) < 2:
        raise ValueError(f"tid2pdf must be (num_transition_ids + 1,) with index 0 unused, got shape {tid2pdf.shape}")
    if tid2pdf[1:].max() >= loglikes.shape[1]:
        raise ValueError(f"the transition model has {tid2pdf[1:].max() + 1} pdfs, the log-likelihoods {loglikes.shape[1]}")
    return np.ascontiguousarray(acoustic_scale * loglikes[:, tid2pdf[1:]], dtype=np.float32)


def decode(loglikes: np.ndarray, graph: kaldifst.StdVectorFst, tid2pdf: np.ndarray,
           options: DecoderOptions = DecoderOptions()) -> DecodeResult:
    """Best path through ``graph`` for one utterance's log-likelihoods (T, num_pdfs).

    Raises ``ValueError`` on mismatched shapes and ``RuntimeError`` when no path survives the
    beam (widen ``beam`` or ``max_active``).
    """
    scores = transition_loglikes(loglikes, tid2pdf, options.acoustic_scale)
    if len(scores) == 0:
        raise ValueError("cannot decode an utterance with no frames")
    decoder = khg.FasterDecoder(graph, khg.FasterDecoderOptions(beam=options.beam, max_active=options.max_active,
                                                                min_active=options.min_active))
    decoder.decode(khg.DecodableCtc(scores))
    reached_final = decoder.reached_final()
    ok, path = decoder.get_best_path(use_final_probs=reached_final)
    if not ok:
        raise NoPathError(f"no path survived the search over {len(scores)} frames (beam {options.beam})")
    ok, alignment, words, weight = kaldifst.get_linear_symbol_sequence(path)
    if not ok:
        raise RuntimeError("the decoder's best path is not linear")
    return DecodeResult(words=list(words), alignment=list(alignment), cost=weight.value1 + weight.value2,
                        reached_final=reached_final)


def linear_loop_graph(num_transition_ids: int) -> kaldifst.StdVectorFst:
    """A one-state graph accepting any sequence of transition-ids, each emitting word = its id.

    Not a real HCLG: a stand-in for examples and tests of the decoder itself.
    """
    fst = kaldifst.StdVectorFst()
    state = fst.add_state()
    fst.start = state
    fst.set_final(state=state, weight=0.0)
    for tid in range(1, num_transition_ids + 1):
        fst.add_arc(state=state, arc=kaldifst.StdArc(tid, tid, 0.0, state))
    return fst


def with_word_penalty(graph: kaldifst.StdVectorFst, penalty: float) -> kaldifst.StdVectorFst:
    """A copy of ``graph`` whose word-emitting arcs (output label not epsilon) cost ``penalty`` more.

    This is Kaldi's word insertion penalty (``lattice-add-penalty``), applied to the graph instead of a
    lattice: every word of a path costs ``penalty`` more, so a larger one means fewer, longer words.
    The copy is built arc by arc (kaldifst has no mutable arc iterator): about 5 s for 2.6 M arcs.
    """
    out = kaldifst.StdVectorFst()
    out.reserve_states(graph.num_states)
    for _ in range(graph.num_states):
        out.add_state()
    out.start = graph.start
    zero = float("inf")  # the tropical semiring's zero: not final
    for state in range(graph.num_states):
        final = graph.final(state)
        if final.value != zero:
            out.set_final(state=state, weight=final)
        for arc in kaldifst.ArcIterator(graph, state):
            if arc.olabel:
                arc = kaldifst.StdArc(arc.ilabel, arc.olabel, arc.weight.value + penalty, arc.nextstate)
            out.add_arc(state=state, arc=arc)
    return out

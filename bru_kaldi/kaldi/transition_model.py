"""Kaldi's TransitionModel (the first object of every ``final.mdl``), read and written without Kaldi.

An alignment (``ali.*.gz``) holds one *transition-id* per frame. Kaldi numbers them from 1: the
model lists *transition-states* (tuples ``phone, hmm_state, forward_pdf, self_loop_pdf``, sorted),
and each transition-state owns one transition-id per outgoing arc of its HMM state in the topology.
A self-loop's pdf is the tuple's ``self_loop_pdf``, any other arc's is its ``forward_pdf``
(``TransitionModel::ComputeDerived`` in Kaldi's transition-model.cc). This module derives
``tid2pdf`` and ``tid2phone`` (index 0 unused, as in Kaldi) and so replaces ``ali-to-pdf``,
``ali-to-phones`` and ``hmm-info``. Long because the topology, the transition-states and both of their
formats (text and binary, read and written) are one object in Kaldi and one here.

Formats (Kaldi's hmm-topology.cc, transition-model.cc, io-funcs): a binary file starts with
``"\\0B"``; tokens are written as the text plus a space; an int32 as the size byte 4 and 4
little-endian bytes; a float as the size byte 4 and its bytes; an integer vector as the element size
byte, a raw int32 count and the elements; the log-probabilities as a Kaldi vector (``FV``). A binary
topology whose states carry separate self-loop pdf classes (chain models) is flagged by an int32 -1
before its entry count, and the model then lists ``<Tuples>`` of 4 instead of ``<Triples>``.

The reader and the writer of both formats stay in this one module (it runs past 450 lines for that
reason): each is the other's inverse, and the tests hold them to that with every model they write.

Usage: write ``exp/mono/final.mdl`` from kaldi-hmm-gmm's model (whose ``str()`` is Kaldi text), then
read it back as the data pipeline does:

>>> import os, tempfile, kaldi_hmm_gmm as khg
>>> topo = khg.HmmTopology()
>>> topo.read(standard_topology_text(nonsilence_phones=[2, 3, 4], silence_phones=[1]))
>>> ctx = khg.monophone_context_dependency(topo.phones, topo.get_phone_to_num_pdf_classes())
>>> path = os.path.join(tempfile.mkdtemp(), "final.mdl")
>>> write_transition_model(khg.TransitionModel(ctx, topo), path, binary=True)
>>> tm = read_transition_model(path)
>>> tm.num_pdfs, tm.num_phones, tm.num_transition_ids, tm.tid2pdf[1:6].tolist()
(14, 4, 36, [0, 0, 0, 0, 1])
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from bru_kaldi.atomic import write_atomically
from bru_kaldi.kaldi.tables import KaldiIOError

NO_PDF = -1  # Kaldi's kNoPdf: the pdf class of a non-emitting state


# --------------------------------------------------------------------------- the objects
@dataclass(frozen=True)
class HmmState:
    """One state of a topology entry; ``transitions`` are ``(destination state, probability)``."""

    forward_pdf_class: int
    self_loop_pdf_class: int
    transitions: tuple[tuple[int, float], ...]


@dataclass
class HmmTopology:
    """Kaldi's HmmTopology: ``entries[phone2idx[phone]]`` is the list of states of ``phone``'s HMM."""

    phones: list[int]
    phone2idx: list[int]
    entries: list[list[HmmState]]

    @property
    def is_hmm(self) -> bool:
        """True unless some state has different forward and self-loop pdf classes (chain topologies)."""
        return all(s.forward_pdf_class == s.self_loop_pdf_class for e in self.entries for s in e)

    def entry(self, phone: int) -> list[HmmState]:
        if not 0 <= phone < len(self.phone2idx) or self.phone2idx[phone] < 0:
            raise KaldiIOError(f"phone {phone} has no topology entry")
        return self.entries[self.phone2idx[phone]]


@dataclass(frozen=True)
class TransitionState:
    """A Kaldi transition-state tuple (``Tuple`` in transition-model.h)."""

    phone: int
    hmm_state: int
    forward_pdf: int
    self_loop_pdf: int


class TransitionModel:
    """Kaldi's TransitionModel with the maps an acoustic-model trainer needs.

    Attributes (integer numpy arrays indexed by transition-id, index 0 unused and set to -1):
        tid2pdf: pdf-id of each transition-id (what ``ali-to-pdf`` outputs).
        tid2phone: phone of each transition-id (``ali-to-phones --per-frame``).
        tid2state: transition-state (1-based); ``tid_is_self_loop``, ``tid_is_final`` booleans.
        num_pdfs, num_phones (phones in the topology, as ``hmm-info``), num_transition_ids,
        max_phone (the largest phone id: a monophone output needs ``max_phone + 1`` classes).
    """

    def __init__(self, topology: HmmTopology, tuples: Sequence[TransitionState], log_probs: np.ndarray):
        self.topology = topology
        self.tuples = list(tuples)
        self.log_probs = np.asarray(log_probs, dtype=np.float32)
        if not self.tuples:
            raise KaldiIOError("a TransitionModel without transition-states")
        # ComputeDerived: transition-ids are numbered from 1, tuple by tuple, arc by arc.
        state2id = [0, 1]
        tid2state, self_loop, final, pdf, phone = [-1], [False], [False], [-1], [-1]
        for number, t in enumerate(self.tuples, 1):
            states = topology.entry(t.phone)
            if not 0 <= t.hmm_state < len(states):
                raise KaldiIOError(f"transition-state {number}: phone {t.phone} has no HMM state {t.hmm_state}")
            for destination, _ in states[t.hmm_state].transitions:
                loop = destination == t.hmm_state
                tid2state.append(number)
                self_loop.append(loop)
                final.append(destination == len(states) - 1)
                # TransitionIdToPdf: a self-loop emits the self-loop pdf, every other arc the forward pdf
                pdf.append(t.self_loop_pdf if loop else t.forward_pdf)
                phone.append(t.phone)
            state2id.append(len(tid2state))
        self.state2id = np.array(state2id, dtype=np.int64)
        self.tid2state = np.array(tid2state, dtype=np.int64)
        self.tid_is_self_loop = np.array(self_loop, dtype=bool)
        self.tid_is_final = np.array(final, dtype=bool)
        self.tid2pdf = np.array(pdf, dtype=np.int64)
        self.tid2phone = np.array(phone, dtype=np.int64)
        self.num_transition_ids = len(tid2state) - 1
        self.num_pdfs = 1 + max(max(t.forward_pdf, t.self_loop_pdf) for t in self.tuples)
        self.num_phones = len(topology.phones)
        self.max_phone = max(topology.phones)
        if len(self.log_probs) != self.num_transition_ids + 1:
            raise KaldiIOError(f"<LogProbs> has {len(self.log_probs)} values; expected {self.num_transition_ids + 1} "
                               "(one per transition-id, plus the unused 0)")

    # ------------------------------------------------------------------ constructors and writers
    @classmethod
    def from_kaldi_text(cls, text: str, source: str = "<text>") -> "TransitionModel":
        """Parse Kaldi's text format (what kaldi-hmm-gmm's ``str(tm)`` and ``--binary=false`` write)."""
        return _read_model(_Reader(text.encode(), binary=False, source=source))

    @classmethod
    def from_bytes(cls, data: bytes, source: str = "<bytes>") -> "TransitionModel":
        """Parse a model in either format; binary is recognised by Kaldi's ``"\\0B"`` header."""
        return _read_model(_Reader(data, binary=data.startswith(b"\0B"), source=source))

    def to_kaldi_text(self) -> str:
        """Kaldi's text format, byte for byte what Kaldi (and kaldi-hmm-gmm's ``str``) writes."""
        return _kaldi_text(self)

    def to_kaldi_binary(self) -> bytes:
        """Kaldi's binary format, ``"\\0B"`` header included."""
        return b"\0B" + _kaldi_binary(self)

    # ------------------------------------------------------------------ alignments
    def _check(self, ali: np.ndarray) -> np.ndarray:
        ali = np.asarray(ali)
        if ali.size and (ali.min() < 1 or ali.max() > self.num_transition_ids):
            bad = int(ali[(ali < 1) | (ali > self.num_transition_ids)][0])
            raise KaldiIOError(f"transition-id {bad} is outside [1, {self.num_transition_ids}]: "
                               "the alignment does not belong to this model")
        return ali

    def ali_to_pdf(self, ali: np.ndarray) -> np.ndarray:
        """``(T,)`` transition-ids -> ``(T,)`` pdf-ids (``ali-to-pdf``)."""
        return self.tid2pdf[self._check(ali)]

    def ali_to_phones_per_frame(self, ali: np.ndarray) -> np.ndarray:
        """``(T,)`` transition-ids -> ``(T,)`` phones (``ali-to-phones --per-frame=true``)."""
        return self.tid2phone[self._check(ali)]

    def split_to_phones(self, ali: np.ndarray) -> list[np.ndarray]:
        """Split an alignment into phone instances (Kaldi's ``SplitToPhones``), in either arc order.

        A phone ends at a transition into its final state. Graphs built with ``reorder=true`` put a
        state's self-loops after its exit arc, so the exit is then followed by the self-loops.
        """
        ali = self._check(ali)
        if ali.size == 0:
            return []
        reordered = self._is_reordered(ali)
        ends, i = [], 0
        while i < len(ali):
            if self.tid_is_final[ali[i]]:
                while reordered and i + 1 < len(ali) and self.tid_is_self_loop[ali[i + 1]]:
                    i += 1
                ends.append(i + 1)
            elif i + 1 == len(ali) or self.tid2phone[ali[i]] != self.tid2phone[ali[i + 1]]:
                ends.append(i + 1)  # an incomplete phone (Kaldi flags this alignment as not ok)
            i += 1
        return np.split(ali, ends[:-1])

    def _is_reordered(self, ali: np.ndarray) -> bool:
        # Kaldi's IsReordered: at the first change of transition-state next to a self-loop, a
        # self-loop before it means "reordered" (self-loops last), one after it "not reordered".
        states, loops = self.tid2state[ali], self.tid_is_self_loop[ali]
        for c in np.flatnonzero(states[1:] != states[:-1]):
            if loops[c] or loops[c + 1]:
                return bool(loops[c])
        return bool(loops[-1] and not loops[0])

    def ali_to_phones(self, ali: np.ndarray) -> list[int]:
        """The phone sequence of an alignment (``ali-to-phones``), repeated phones kept apart."""
        return [int(self.tid2phone[part[0]]) for part in self.split_to_phones(ali)]

    def info(self) -> dict[str, int]:
        """What ``hmm-info`` prints: numbers of phones, pdfs, transition-ids and transition-states."""
        return {"phones": self.num_phones, "pdfs": self.num_pdfs,
                "transition-ids": self.num_transition_ids, "transition-states": len(self.tuples)}


# --------------------------------------------------------------------------- reading
class _Reader:
    """Kaldi's ReadToken / ReadBasicType / ReadIntegerVector over bytes, binary or text."""

    def __init__(self, data: bytes, binary: bool, source: str):
        self.data, self.binary, self.source = data, binary, source
        self.pos = 2 if binary else 0
        self._tokens = None if binary else re.finditer(rb"\S+", data)

    def fail(self, expected: str, got) -> KaldiIOError:
        mode = "binary" if self.binary else "text"
        return KaldiIOError(f"{self.source}: reading a Kaldi TransitionModel ({mode}): "
                            f"expected {expected}, got {got!r}")

    def _take(self, n: int) -> bytes:
        if self.pos + n > len(self.data):
            raise self.fail(f"{n} more bytes", "end of file")
        chunk = self.data[self.pos:self.pos + n]
        self.pos += n
        return chunk

    def token(self) -> str:
        if not self.binary:
            match = next(self._tokens, None)
            if match is None:
                raise self.fail("a token", "end of file")
            return match.group().decode(errors="replace")
        end = self.data.find(b" ", self.pos)  # binary WriteToken: the token, then one space
        if end < 0:
            raise self.fail("a token", "end of file")
        token = self.data[self.pos:end].decode(errors="replace")
        self.pos = end + 1
        return token

    def expect(self, expected: str) -> None:
        token = self.token()
        if token != expected:
            raise self.fail(expected, token)

    def int32(self) -> int:
        if not self.binary:
            token = self.token()
            try:
                return int(token)
            except ValueError:
                raise self.fail("an integer", token) from None
        size = self._take(1)
        if size != b"\x04":  # signed types carry +sizeof, unsigned -sizeof
            raise self.fail("an int32 (size byte 4)", size)
        return struct.unpack("<i", self._take(4))[0]

    def float32(self) -> float:
        if not self.binary:
            token = self.token()
            try:
                return float(token)
            except ValueError:
                raise self.fail("a number", token) from None
        size = self._take(1)[0]
        if size not in (4, 8):  # a double written where a float is read is accepted, as in Kaldi
            raise self.fail("a float (size byte 4 or 8)", size)
        return struct.unpack("<f" if size == 4 else "<d", self._take(size))[0]

    def int_vector(self) -> list[int]:  # only the binary topology has integer vectors
        if self._take(1) != b"\x04":
            raise self.fail("an int32 vector", "another element size")
        (count,) = struct.unpack("<i", self._take(4))  # the count has no size byte
        if count < 0:
            raise self.fail("a vector length", count)
        return np.frombuffer(self._take(4 * count), dtype="<i4").tolist()

    def float_vector(self) -> np.ndarray:
        if not self.binary:
            self.expect("[")
            values = []
            while (token := self.token()) != "]":
                try:
                    values.append(float(token))
                except ValueError:
                    raise self.fail("a number or ]", token) from None
            return np.array(values, dtype=np.float32)
        kind = self.token()
        if kind not in ("FV", "DV"):
            raise self.fail("FV or DV", kind)
        count = self.int32()
        if count < 0:
            raise self.fail("a vector length", count)
        dtype = "<f4" if kind == "FV" else "<f8"
        return np.frombuffer(self._take(count * np.dtype(dtype).itemsize), dtype=dtype).astype(np.float32)


def _read_topology(r: _Reader) -> HmmTopology:
    r.expect("<Topology>")
    if r.binary:
        phones, phone2idx = r.int_vector(), r.int_vector()
        count = r.int32()
        is_hmm = count != -1  # -1 flags the format with separate self-loop pdf classes
        if not is_hmm:
            count = r.int32()
        entries = []
        for _ in range(count):
            states = []
            for _ in range(r.int32()):
                forward = r.int32()
                loop = forward if is_hmm else r.int32()
                transitions = tuple((r.int32(), r.float32()) for _ in range(r.int32()))
                states.append(HmmState(forward, loop, transitions))
            entries.append(states)
        r.expect("</Topology>")
        return HmmTopology(phones, phone2idx, entries)
    entries, phone2idx = [], []
    while (token := r.token()) != "</Topology>":
        if token != "<TopologyEntry>":
            raise r.fail("<TopologyEntry> or </Topology>", token)
        r.expect("<ForPhones>")
        entry_phones = []
        while (token := r.token()) != "</ForPhones>":
            if not token.isdigit():
                raise r.fail("a phone id or </ForPhones>", token)
            entry_phones.append(int(token))
        states, token = [], r.token()
        while token != "</TopologyEntry>":
            if token != "<State>":
                raise r.fail("<State> or </TopologyEntry>", token)
            if r.int32() != len(states):
                raise r.fail(f"state {len(states)} (states are numbered in order)", "another number")
            forward = loop = NO_PDF
            token = r.token()
            if token == "<PdfClass>":
                forward = loop = r.int32()
                token = r.token()
            elif token == "<ForwardPdfClass>":
                forward = r.int32()
                r.expect("<SelfLoopPdfClass>")
                loop = r.int32()
                token = r.token()
            transitions = []
            while token == "<Transition>":
                transitions.append((r.int32(), r.float32()))
                token = r.token()
            if token != "</State>":
                raise r.fail("</State>", token)
            states.append(HmmState(forward, loop, tuple(transitions)))
            token = r.token()
        for phone in entry_phones:
            if phone >= len(phone2idx):
                phone2idx.extend([-1] * (phone + 1 - len(phone2idx)))
            if phone <= 0 or phone2idx[phone] != -1:
                raise r.fail("each phone (> 0) in one topology entry", phone)
            phone2idx[phone] = len(entries)
        entries.append(states)
    phones = [p for p, index in enumerate(phone2idx) if index >= 0]
    return HmmTopology(phones, phone2idx, entries)


def _read_model(r: _Reader) -> TransitionModel:
    r.expect("<TransitionModel>")
    topology = _read_topology(r)
    kind = r.token()
    if kind not in ("<Triples>", "<Tuples>"):  # older Kaldi writes triples (self-loop pdf = forward pdf)
        raise r.fail("<Triples> or <Tuples>", kind)
    tuples = []
    for _ in range(r.int32()):
        phone, hmm_state, forward = r.int32(), r.int32(), r.int32()
        tuples.append(TransitionState(phone, hmm_state, forward, r.int32() if kind == "<Tuples>" else forward))
    r.expect("</" + kind[1:])
    r.expect("<LogProbs>")
    log_probs = r.float_vector()
    r.expect("</LogProbs>")
    r.expect("</TransitionModel>")  # final.mdl goes on with the acoustic model, which we do not need
    try:
        return TransitionModel(topology, tuples, log_probs)
    except KaldiIOError as error:
        raise KaldiIOError(f"{r.source}: {error}") from None


def read_transition_model(path) -> TransitionModel:
    """Read the TransitionModel at the start of a Kaldi model file (``final.mdl``), binary or text.

    Binary is recognised by Kaldi's ``"\\0B"`` header. Returns a :class:`TransitionModel` with
    ``num_pdfs``, ``num_phones``, ``num_transition_ids`` and the ``(num_transition_ids + 1,)``
    arrays ``tid2pdf`` and ``tid2phone``.
    """
    try:
        data = Path(path).read_bytes()
    except OSError as error:
        raise KaldiIOError(f"cannot read the model {path}: {error.strerror}") from None
    try:
        return TransitionModel.from_bytes(data, source=str(path))
    except KaldiIOError:
        raise
    except (ValueError, IndexError, KeyError, struct.error, OverflowError) as error:  # a file that parses but cannot be
        raise KaldiIOError(f"{path}: not a usable Kaldi TransitionModel ({type(error).__name__}: {error})") from None


# --------------------------------------------------------------------------- writing
def _kaldi_text(tm: TransitionModel) -> str:
    """Kaldi's text format: every token and number followed by one space, as WriteToken/WriteBasicType."""
    topology, is_hmm = tm.topology, tm.topology.is_hmm
    out = ["<TransitionModel> \n<Topology> \n"]
    for index, states in enumerate(topology.entries):
        phones = "".join(f"{p} " for p, i in enumerate(topology.phone2idx) if i == index)
        out.append(f"<TopologyEntry> \n<ForPhones> \n{phones}\n</ForPhones> \n")
        for number, s in enumerate(states):
            pdf = ("" if s.forward_pdf_class == NO_PDF else f"<PdfClass> {s.forward_pdf_class} " if is_hmm
                   else f"<ForwardPdfClass> {s.forward_pdf_class} <SelfLoopPdfClass> {s.self_loop_pdf_class} ")
            arcs = "".join(f"<Transition> {d} {p:g} " for d, p in s.transitions)  # %g: C++ ostream's 6 digits
            out.append(f"<State> {number} {pdf}{arcs}</State> \n")
        out.append("</TopologyEntry> \n")
    kind = "Triples" if is_hmm else "Tuples"
    out.append(f"</Topology> \n<{kind}> {len(tm.tuples)} \n")
    for t in tm.tuples:
        out.append(f"{t.phone} {t.hmm_state} {t.forward_pdf} " + ("" if is_hmm else f"{t.self_loop_pdf} ") + "\n")
    out.append(f"</{kind}> \n<LogProbs> \n [ " + "".join(f"{float(v):g} " for v in tm.log_probs) + "]\n")
    out.append("</LogProbs> \n</TransitionModel> \n")
    return "".join(out)


def _int32(*values: int) -> bytes:
    return b"".join(struct.pack("<bi", 4, v) for v in values)  # WriteBasicType: size byte, then the value


def _kaldi_binary(tm: TransitionModel) -> bytes:
    """Kaldi's binary format (without the "\\0B" header)."""
    topology, is_hmm = tm.topology, tm.topology.is_hmm

    def int_vector(values):  # WriteIntegerVector: element size, a raw int32 count, the elements
        return struct.pack("<bi", 4, len(values)) + np.asarray(values, dtype="<i4").tobytes()

    out = [b"<TransitionModel> <Topology> ", int_vector(topology.phones), int_vector(topology.phone2idx)]
    if not is_hmm:
        out.append(_int32(-1))  # flags states with separate self-loop pdf classes
    out.append(_int32(len(topology.entries)))
    for states in topology.entries:
        out.append(_int32(len(states)))
        for s in states:
            out.append(_int32(s.forward_pdf_class) + (b"" if is_hmm else _int32(s.self_loop_pdf_class)))
            out.append(_int32(len(s.transitions)))
            out += [_int32(d) + struct.pack("<bf", 4, p) for d, p in s.transitions]
    kind = "Triples" if is_hmm else "Tuples"
    out.append(f"</Topology> <{kind}> ".encode() + _int32(len(tm.tuples)))
    for t in tm.tuples:
        out.append(_int32(t.phone, t.hmm_state, t.forward_pdf) + (b"" if is_hmm else _int32(t.self_loop_pdf)))
    out.append(f"</{kind}> <LogProbs> FV ".encode() + _int32(len(tm.log_probs)) + tm.log_probs.astype("<f4").tobytes())
    out.append(b"</LogProbs> </TransitionModel> ")
    return b"".join(out)


def write_transition_model(tm, path, binary: bool = True) -> None:
    """Write ``tm`` to ``path`` in Kaldi's binary (default) or text format, atomically.

    ``tm`` is a :class:`TransitionModel` or any object whose ``str()`` is Kaldi's text format, such
    as ``kaldi_hmm_gmm.TransitionModel``. The file is a valid ``final.mdl`` for the programs that
    read only its TransitionModel (``ali-to-pdf``, ``hmm-info``, ``latgen-faster-mapped``).
    """
    if not isinstance(tm, TransitionModel):
        tm = TransitionModel.from_kaldi_text(str(tm), source=type(tm).__name__)
    data = tm.to_kaldi_binary() if binary else tm.to_kaldi_text().encode()
    write_atomically(path, lambda tmp: tmp.write_bytes(data))


def standard_topology_text(nonsilence_phones: Sequence[int], silence_phones: Sequence[int],
                           nonsilence_states: int = 3, silence_states: int = 5) -> str:
    """The topology Kaldi's ``utils/gen_topo.pl`` writes: left-to-right phones, an ergodic-ish silence.

    Non-silence states loop with 0.75 and move on with 0.25. Silence state 0 reaches states
    0 to n-2; the middle states reach 1 to n-1; the last emitting state loops (0.75) or exits (0.25).
    """
    lines = ["<Topology>", "<TopologyEntry>", "<ForPhones>", " ".join(map(str, nonsilence_phones)), "</ForPhones>"]
    for s in range(nonsilence_states):
        lines.append(f"<State> {s} <PdfClass> {s} <Transition> {s} 0.75 <Transition> {s + 1} 0.25 </State>")
    lines += [f"<State> {nonsilence_states} </State>", "</TopologyEntry>"]
    if silence_phones:
        n, p = silence_states, 1.0 / (silence_states - 1)
        lines += ["<TopologyEntry>", "<ForPhones>", " ".join(map(str, silence_phones)), "</ForPhones>"]
        def arcs(destinations):
            return " ".join(f"<Transition> {d} {p:g}" for d in destinations)

        lines.append(f"<State> 0 <PdfClass> 0 {arcs(range(n - 1))} </State>")
        for s in range(1, n - 1):
            lines.append(f"<State> {s} <PdfClass> {s} {arcs(range(1, n))} </State>")
        lines.append(f"<State> {n - 1} <PdfClass> {n - 1} <Transition> {n - 1} 0.75 <Transition> {n} 0.25 </State>")
        lines += [f"<State> {n} </State>", "</TopologyEntry>"]
    return "\n".join(lines + ["</Topology>"]) + "\n"


def chain_topology_text(phones: Sequence[int]) -> str:
    """The topology of Kaldi's chain models (``steps/nnet3/chain/gen_topo.py``), the same for every phone:
    one emitting state with a forward pdf class (0) and a separate self-loop pdf class (1), left with
    probability 0.5 or looped with 0.5. With ``reorder = true`` graphs, as chain models are always built, a
    phone's first frame emits its forward pdf and every later frame its self-loop pdf; it lasts at least
    one frame, which at a frame subsampling factor of 3 is 30 ms.

    >>> print(chain_topology_text([1, 2]).splitlines()[5])
    <State> 0 <ForwardPdfClass> 0 <SelfLoopPdfClass> 1 <Transition> 0 0.5 <Transition> 1 0.5 </State>
    """
    return "\n".join(["<Topology>", "<TopologyEntry>", "<ForPhones>", " ".join(map(str, phones)), "</ForPhones>",
                      "<State> 0 <ForwardPdfClass> 0 <SelfLoopPdfClass> 1 <Transition> 0 0.5 <Transition> 1 0.5 </State>",
                      "<State> 1 </State>", "</TopologyEntry>", "</Topology>"]) + "\n"

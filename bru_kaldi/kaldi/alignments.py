"""Kaldi alignment directories (``ali.*.gz`` + ``final.mdl``) as frame labels, without Kaldi.

Transition-ids become pdf-ids (``ali-to-pdf``) or per-frame phones (``ali-to-phones --per-frame=true``)
through the TransitionModel of ``final.mdl`` (``transition_model``). :class:`AlignmentStore` keeps a
directory's transition-ids in an anonymous memory-mapped temporary file, so a corpus larger than
memory costs only its index, and counts pdfs and phones on the way (``analyze-counts``).

>>> import gzip, os, tempfile, kaldi_hmm_gmm as khg
>>> from bru_kaldi.kaldi.transition_model import standard_topology_text, write_transition_model
>>> d = tempfile.mkdtemp()
>>> topo = khg.HmmTopology()
>>> topo.read(standard_topology_text([2, 3], [1]))
>>> ctx = khg.monophone_context_dependency(topo.phones, topo.get_phone_to_num_pdf_classes())
>>> write_transition_model(khg.TransitionModel(ctx, topo), os.path.join(d, "final.mdl"))
>>> with gzip.open(os.path.join(d, "ali.1.gz"), "wt") as f:
...     _ = f.write("utt1 1 5 19 20\\n")
>>> store = AlignmentStore(d)
>>> store.labels("utt1", "pdf").tolist(), store.labels("utt1", "phone").tolist()
([0, 1, 5, 5], [1, 1, 2, 2])
"""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path
from typing import Iterator

import numpy as np

from bru_kaldi.kaldi.tables import KaldiIOError, read_int_vectors
from bru_kaldi.kaldi.transition_model import read_transition_model


def alignment_files(lab_folder: str) -> list[Path]:
    """``ali.1.gz, ali.2.gz, ... ali.10.gz`` of an alignment directory, in job order."""
    files = list(Path(lab_folder).glob("ali.*.gz"))
    if not files:
        raise KaldiIOError(f"{lab_folder}: no ali.*.gz alignment archives")
    return sorted(files, key=lambda p: [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", p.name)])


def read_alignments(source: str) -> Iterator[tuple[str, np.ndarray]]:
    """``(key, (T,) int32 transition-ids)`` from an alignment directory or an rspecifier / archive."""
    paths = alignment_files(source) if Path(source).is_dir() else [source]
    for path in paths:
        yield from read_int_vectors(str(path))


def label_kind(lab_opts: str) -> str:
    """``"pdf"`` for ``ali-to-pdf``, ``"phone"`` for ``ali-to-phones --per-frame=true``."""
    words = lab_opts.split()
    if words == ["ali-to-pdf"]:
        return "pdf"
    if words and words[0] == "ali-to-phones" and set(words[1:]) in ({"--per-frame=true"}, {"--per-frame"}):
        return "phone"
    raise ValueError(f"lab_opts {lab_opts!r}: expected 'ali-to-pdf' or 'ali-to-phones --per-frame=true' "
                     "(frame labels need per-frame phones)")


def hmm_info(model_path: str) -> dict[str, int]:
    """What Kaldi's ``hmm-info final.mdl`` prints: numbers of phones, pdfs, transition-ids, transition-states."""
    return read_transition_model(model_path).info()


class AlignmentStore:
    """The transition-ids of one alignment directory in an anonymous memory-mapped temporary file.

    Built in one pass over ``ali.*.gz`` that checks every transition-id against ``final.mdl``.

    Attributes:
        model: the :class:`~transition_model.TransitionModel` of ``final.mdl``.
        spans: key -> (first position, frames, index of its file in ``files``).
        pdf_counts: ``(num_pdfs,)`` frames per pdf over the whole directory (``analyze-counts``).
        phone_counts: ``(max_phone + 1,)`` frames per phone.
    """

    def __init__(self, lab_folder: str):
        self.folder = lab_folder
        self.model = read_transition_model(os.path.join(lab_folder, "final.mdl"))
        self.files = alignment_files(lab_folder)
        self.spans: dict[str, tuple[int, int, int]] = {}  # key -> (start, frames, file index)
        self.pdf_counts = np.zeros(self.model.num_pdfs, dtype=np.int64)
        self.phone_counts = np.zeros(self.model.max_phone + 1, dtype=np.int64)
        self._file = tempfile.TemporaryFile()  # unlinked at once: nothing to clean up, even after a crash
        start = 0
        for index, path in enumerate(self.files):
            for key, ali in read_int_vectors(str(path)):
                if key in self.spans:
                    raise KaldiIOError(f"{path}: utterance {key!r} is also in {self.files[self.spans[key][2]]}")
                try:
                    pdfs = self.model.ali_to_pdf(ali)
                except KaldiIOError as error:
                    raise KaldiIOError(f"{path}: utterance {key!r}: {error} ({lab_folder}/final.mdl)") from None
                self.pdf_counts += np.bincount(pdfs, minlength=self.model.num_pdfs)
                self.phone_counts += np.bincount(self.model.tid2phone[ali], minlength=len(self.phone_counts))
                self.spans[key] = (start, len(ali), index)
                self._file.write(ali.astype("<i4").tobytes())
                start += len(ali)
        self._file.flush()
        self._ids = np.memmap(self._file, dtype="<i4", mode="r", shape=(start,)) if start else np.zeros(0, np.int32)

    def labels(self, key: str, kind: str) -> np.ndarray:
        """``(T,)`` int64 pdf-ids (``kind`` "pdf"), phones ("phone") or the transition-ids themselves
        ("transition-id": what LF-MMI's numerator is made from) of ``key``."""
        start, frames, _ = self.spans[key]
        ids = self._ids[start:start + frames]
        if kind == "transition-id":
            return ids.astype(np.int64)
        return (self.model.tid2pdf if kind == "pdf" else self.model.tid2phone)[ids]

    def source(self, key: str) -> str:
        """The ``ali.N.gz`` that holds ``key`` (for error messages)."""
        return str(self.files[self.spans[key][2]])

"""Kaldi data and alignment directories in, training batches out; network outputs back as Kaldi archives.

Works with or without a Kaldi installation. The pieces, in the order data flows:

1. Parameters: :class:`FeatureStream`, :class:`LabelStream`, :class:`DatasetSpec` use pytorch-kaldi's
   names (``fea_name``, ``fea_lst``, ``fea_opts``, ``cw_left``, ``cw_right``; ``lab_name``,
   ``lab_folder``, ``lab_opts``, ``lab_count_file``; ``n_chunks``), so a config maps onto them
   directly (:meth:`DatasetSpec.from_config`); :class:`LoaderOptions` holds batching and checks.
2. Labels (``alignments``): ``ali.*.gz`` transition-ids become pdf-ids (``ali-to-pdf``) or per-frame
   phones (``ali-to-phones --per-frame=true``) through the TransitionModel of ``final.mdl``
   (:func:`read_transition_model`, from ``transition_model``), kept in a memory-mapped temporary file
   so that a corpus larger than memory costs only its index.
3. Features: each stream is an scp (random access, header-only indexing) or any rspecifier or Kaldi
   pipeline (``ark:copy-feats ... |``, exit status checked), post-processed by its ``fea_opts``
   (CMVN per speaker or utterance, deltas; see ``feature_transforms``) and spliced with
   ``cw_left``/``cw_right``; streams are concatenated per frame.
4. :class:`Corpus` joins streams and labels (missing utterances skipped and counted, an error above
   ``max_missing_fraction``; lengths checked up front), cuts the corpus into ``n_chunks`` chunks
   (re-drawn every epoch from the seed), loads one chunk while the next is prepared in a background
   thread, and yields padded batches of length-sorted utterances (:class:`Batch`, ``batching``).
5. Outputs: :func:`log_priors` from pdf counts (``analyze-counts``) and :class:`LoglikeWriter`,
   which writes log posteriors minus log priors as a float32 ``ark`` + ``scp``, atomically.

Errors are :class:`KaldiIOError`, naming the file, the utterance and what was expected.

>>> import tempfile, numpy as np
>>> d = tempfile.mkdtemp()
>>> with ArkWriter(f"{d}/feats.ark", f"{d}/feats.scp") as w:
...     for i in range(5):
...         w.write(f"utt{i}", np.random.rand(10 + i, 13))
>>> corpus = Corpus(DatasetSpec("test", [FeatureStream("mfcc", f"{d}/feats.scp", "cmvn=utterance", 1, 1)]),
...                 LoaderOptions(batch_size=2, shuffle=False))
>>> [(tuple(b.x.shape), b.keys) for b in corpus.batches()]
[((2, 11, 39), ['utt0', 'utt1']), ((2, 13, 39), ['utt2', 'utt3']), ((1, 14, 39), ['utt4'])]
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Iterable, Iterator, Optional

import numpy as np
import torch

from alignments import AlignmentStore, alignment_files, hmm_info, label_kind, read_alignments
from batching import IGNORE, Batch, Prefetcher, Utterance, collate, make_batches
from feature_transforms import (GlobalNorm, add_deltas, apply_cmvn, cmvn_stats_sum, compute_cmvn_stats, parse_fea_opts,
                                splice)
from kaldi_tables import (ArkWriter, KaldiIOError, ScpTable, parse_rspecifier, read_int_vectors, read_kaldi_vector,
                          read_matrices, read_text_table, write_kaldi_vector)
from transition_model import TransitionModel, read_transition_model, write_transition_model

log = logging.getLogger(__name__)

__all__ = ["KaldiIOError", "FeatureStream", "LabelStream", "DatasetSpec", "LoaderOptions", "Corpus", "Batch",
           "IGNORE", "GlobalNorm", "TransitionModel", "read_transition_model", "write_transition_model",
           "read_matrices", "read_int_vectors", "read_alignments", "alignment_files", "AlignmentStore", "ScpTable",
           "ArkWriter", "LoglikeWriter", "read_counts", "write_counts", "log_priors", "hmm_info", "label_kind"]


# --------------------------------------------------------------------------- parameters
def _copy_fields(cls, source):
    """An instance of ``cls`` from any object with attributes of the same names (a parsed config)."""
    return cls(**{f.name: getattr(source, f.name) for f in fields(cls) if hasattr(source, f.name)})


@dataclass
class FeatureStream:
    """One feature stream; several are concatenated per frame (e.g. fMLLR + MFCC + fbank)."""

    fea_name: str
    fea_lst: str  # feats.scp, or any rspecifier / Kaldi pipeline ("ark:copy-feats scp:a.scp ark:- |")
    fea_opts: str = ""  # CMVN and deltas: see feature_transforms.parse_fea_opts
    cw_left: int = 0  # frames of left context spliced in
    cw_right: int = 0


@dataclass
class LabelStream:
    """One label stream from an alignment directory (``ali.*.gz`` and ``final.mdl``)."""

    lab_name: str
    lab_folder: str
    lab_opts: str = "ali-to-pdf"  # or "ali-to-phones --per-frame=true" (an auxiliary monophone output)
    lab_count_file: str = "auto"  # "auto": counts from these alignments; "none"; or an analyze-counts file
    lab_data_folder: str = ""  # not read here (decoding uses it)
    lab_graph: str = ""  # not read here (decoding uses it)


@dataclass
class DatasetSpec:
    """A data set: its feature streams, its label streams (none for unlabelled test data), its chunks."""

    data_name: str
    fea: list[FeatureStream]
    lab: list[LabelStream] = field(default_factory=list)
    n_chunks: int = 1

    @classmethod
    def from_config(cls, dataset) -> "DatasetSpec":
        """From a config section with the same field names (``config.Dataset``)."""
        return cls(dataset.data_name, [_copy_fields(FeatureStream, s) for s in dataset.fea],
                   [_copy_fields(LabelStream, s) for s in dataset.lab], dataset.n_chunks)


@dataclass
class LoaderOptions:
    """How a :class:`Corpus` is cut into batches, and how strict it is."""

    batch_size: int = 8  # utterances per batch
    max_seq_length: int = 0  # 0: no limit; longer utterances are split or dropped (counted in the log)
    long_utterances: str = "split"  # "split" into near-equal pieces, or "drop"
    seed: int = 1234
    shuffle: bool = True  # training: chunks re-drawn per epoch, batch order shuffled; False: scp order
    max_missing_fraction: float = 0.05  # utterances missing from a stream: skipped up to this fraction
    length_tolerance: int = 0  # frames by which streams and labels may differ (trimmed to the shortest)
    prefetch: bool = True  # prepare the next chunk in a background thread

    def __post_init__(self):
        if self.long_utterances not in ("split", "drop"):
            raise ValueError(f"long_utterances must be 'split' or 'drop', got {self.long_utterances!r}")
        if self.batch_size < 1 or self.max_seq_length < 0 or self.length_tolerance < 0:
            raise ValueError(f"batch_size >= 1, max_seq_length >= 0 and length_tolerance >= 0 expected, got {self}")


# --------------------------------------------------------------------------- feature streams
class _FeatureSource:
    """One feature stream: where its matrices are, their shapes, and their post-processing."""

    def __init__(self, stream: FeatureStream):
        self.stream = stream
        self.options = parse_fea_opts(stream.fea_opts)
        spec = parse_rspecifier(stream.fea_lst)
        self.table = ScpTable(spec.target) if spec.kind == "scp" else None
        if self.table is not None:
            self.shapes = self.table.shapes()
            self.data_dir = Path(spec.target).parent
        else:  # an archive or pipeline has no index: one pass over it for the keys and lengths
            self.shapes = {key: m.shape for key, m in read_matrices(stream.fea_lst)}
            self.data_dir = None
            if not self.shapes:
                raise KaldiIOError(f"{stream.fea_lst}: no utterances")
        dims = {shape[1] for shape in self.shapes.values()}
        if len(dims) != 1:
            raise KaldiIOError(f"{stream.fea_lst}: utterances of different dimensions {sorted(dims)}")
        self.raw_dim = dims.pop()
        width = (1 + self.options.delta_order) * (1 + stream.cw_left + stream.cw_right)
        self.dim = self.raw_dim * width
        self.utt2spk: dict[str, str] = {}
        self.cmvn: dict[str, np.ndarray] = {}  # speaker (or utterance) -> (2, D + 1) float64 stats
        if self.options.cmvn != "none":
            self._load_cmvn()

    def _default(self, option: str, name: str) -> str:
        if option:
            return option
        if self.data_dir is None:
            raise KaldiIOError(f"fea_opts of {self.stream.fea_name}: give {name} explicitly "
                               f"(fea_lst {self.stream.fea_lst} is not an scp beside a data directory)")
        return str(self.data_dir / name)

    def _load_cmvn(self) -> None:
        o = self.options
        if o.cmvn == "speaker":
            self.utt2spk = read_text_table(self._default(o.utt2spk, "utt2spk"))
            for key in self.shapes:
                if key not in self.utt2spk:
                    raise KaldiIOError(f"{self.stream.fea_lst}: utterance {key!r} has no speaker in the utt2spk file")
        stats_spec = o.cmvn_stats
        beside = self.data_dir / "cmvn.scp" if self.data_dir is not None else None
        if not stats_spec and o.cmvn == "speaker" and beside is not None and beside.is_file():
            stats_spec = str(beside)
        if stats_spec:
            self.cmvn = dict(read_matrices(stats_spec, dtype=np.float64))
        elif o.cmvn == "speaker":  # no cmvn.scp: compute-cmvn-stats --spk2utt, one pass over the features
            log.info("%s: no CMVN stats given, computing per-speaker stats from the features", self.stream.fea_lst)
            for key, feats in self._read(list(self.shapes), raw=True):
                speaker = self.utt2spk[key]
                self.cmvn[speaker] = cmvn_stats_sum(self.cmvn.get(speaker), feats)
        if o.cmvn == "speaker":
            wanted = {self.utt2spk[k] for k in self.shapes}
        else:
            wanted = set(self.shapes) if stats_spec else set()
        missing = sorted(wanted - set(self.cmvn))
        if missing:
            raise KaldiIOError(f"{stats_spec}: no CMVN stats for {o.cmvn} {missing[0]!r} "
                               f"({len(missing)} missing; needed by {self.stream.fea_lst})")
        for name, stats in self.cmvn.items():  # fail now, not in the middle of an epoch
            if stats.shape[1] != self.raw_dim + 1 or stats.shape[0] != 2 or stats[0, -1] < 1:
                raise KaldiIOError(f"{stats_spec or self.stream.fea_lst}: CMVN stats of {name!r} have shape "
                                   f"{stats.shape} and count {stats[0, -1]:g}; expected (2, {self.raw_dim + 1}) and a count >= 1")

    def _read(self, keys: list[str], raw: bool = False) -> Iterator[tuple[str, np.ndarray]]:
        if self.table is not None:
            pairs = self.table.load(keys)
        else:  # no random access: stream the whole archive or pipeline, keep this chunk's utterances
            wanted = set(keys)
            pairs = ((k, m) for k, m in read_matrices(self.stream.fea_lst) if k in wanted)
        for key, feats in pairs:
            if feats.shape != tuple(self.shapes[key]):
                raise KaldiIOError(f"{self.stream.fea_lst}: utterance {key!r} has shape {feats.shape}, "
                                   f"its header said {tuple(self.shapes[key])} (was the archive rewritten?)")
            yield key, feats if raw else self._process(key, feats)

    def _process(self, key: str, feats: np.ndarray) -> np.ndarray:
        o = self.options
        if o.cmvn == "speaker":
            feats = apply_cmvn(feats, self.cmvn[self.utt2spk[key]], o.norm_means, o.norm_vars)
        elif o.cmvn == "utterance":
            stats = self.cmvn[key] if self.cmvn else compute_cmvn_stats(feats)
            feats = apply_cmvn(feats, stats, o.norm_means, o.norm_vars)
        feats = add_deltas(feats, o.delta_order, o.delta_window)
        return splice(feats, self.stream.cw_left, self.stream.cw_right)

    def load(self, keys: list[str]) -> dict[str, np.ndarray]:
        """``{key: (T, dim) float32}`` for ``keys``, post-processed."""
        return dict(self._read(keys))


# --------------------------------------------------------------------------- the corpus
class Corpus:
    """A Kaldi data set read chunk by chunk: its feature streams joined with its label streams.

    Args:
        spec: streams and ``n_chunks``.
        options: batching and strictness (:class:`LoaderOptions`).
        norm: a :class:`GlobalNorm` from the *training* corpus (:meth:`global_norm`), applied to the
            concatenated features; dev and test sets get the training set's, never their own.

    Attributes:
        keys: the usable utterances, in the order of the first feature stream.
        lengths: ``(N,)`` frames of each usable utterance (trimmed within ``length_tolerance``).
        feature_dim: ``F`` of the batches; ``label_dims``: ``lab_name`` -> number of classes
            (``num_pdfs``, or the largest phone + 1: phone ids are kept as Kaldi numbers them).
        report: utterances skipped per stream, split or dropped for ``max_seq_length`` (also logged).

    Only the index (keys, lengths, speakers) is held for the whole corpus; frames are read one chunk
    at a time, and at most two chunks are alive (the one consumed and the one being prepared).
    """

    def __init__(self, spec: DatasetSpec, options: Optional[LoaderOptions] = None, norm: Optional[GlobalNorm] = None):
        self.spec, self.options, self.norm = spec, options or LoaderOptions(), norm
        if not spec.fea or spec.n_chunks < 1:
            raise ValueError(f"dataset {spec.data_name}: needs at least one feature stream and n_chunks >= 1")
        self.report: dict = {}
        self._kinds = {lab.lab_name: label_kind(lab.lab_opts) for lab in spec.lab}
        self.sources = [_FeatureSource(s) for s in spec.fea]
        self.stores: dict[str, AlignmentStore] = {}
        for lab in spec.lab:
            if lab.lab_folder not in self.stores:
                self.stores[lab.lab_folder] = AlignmentStore(lab.lab_folder)
        self.keys = self._join()
        self._index = {key: i for i, key in enumerate(self.keys)}
        self.lengths = self._check_lengths()
        self.feature_dim = sum(s.dim for s in self.sources)
        self.label_dims = {}
        for lab in spec.lab:
            model = self.stores[lab.lab_folder].model
            is_pdf = self._kinds[lab.lab_name] == "pdf"
            self.label_dims[lab.lab_name] = model.num_pdfs if is_pdf else model.max_phone + 1
        if norm is not None and len(norm.mean) != self.feature_dim:
            raise ValueError(f"dataset {spec.data_name}: global normalisation of dimension {len(norm.mean)} "
                             f"for features of dimension {self.feature_dim}")
        self._count_long()

    def __len__(self) -> int:
        return len(self.keys)

    def _join(self) -> list[str]:
        sources = [(s.stream.fea_lst, s.shapes) for s in self.sources]
        sources += [(f"{folder}/ali.*.gz", store.spans) for folder, store in self.stores.items()]
        everything = set().union(*(keys for _, keys in sources))
        usable = set.intersection(*(set(keys) for _, keys in sources))
        missing = {name: sorted(everything.difference(keys)) for name, keys in sources}
        missing = {name: keys for name, keys in missing.items() if keys}
        self.report["skipped"] = {name: len(keys) for name, keys in missing.items()}
        if not usable:
            raise KaldiIOError(f"dataset {self.spec.data_name}: no utterance is in every stream "
                               f"({', '.join(name for name, _ in sources)})")
        skipped = len(everything) - len(usable)
        if skipped:
            fraction = skipped / len(everything)
            examples = "; ".join(f"{len(keys)} missing from {name} (e.g. {', '.join(map(repr, keys[:3]))})"
                                 for name, keys in missing.items())
            message = (f"dataset {self.spec.data_name}: {skipped} of {len(everything)} utterances ({fraction:.1%}) "
                       f"are not in every stream: {examples}")
            if fraction > self.options.max_missing_fraction:
                raise KaldiIOError(f"{message}; that is above max_missing_fraction={self.options.max_missing_fraction}")
            log.warning("%s; they are skipped", message)
        return [key for key in self.sources[0].shapes if key in usable]

    def _check_lengths(self) -> np.ndarray:
        tolerance = self.options.length_tolerance
        lengths = np.empty(len(self.keys), dtype=np.int64)
        for i, key in enumerate(self.keys):
            found = [(s.stream.fea_lst, s.shapes[key][0]) for s in self.sources]
            found += [(store.source(key), store.spans[key][1]) for store in self.stores.values()]
            frames = [n for _, n in found]
            if max(frames) - min(frames) > tolerance:
                raise KaldiIOError(f"dataset {self.spec.data_name}: utterance {key!r} has "
                                   + ", ".join(f"{n} frames in {name}" for name, n in found)
                                   + f"; expected equal lengths (length_tolerance={tolerance} frames)")
            lengths[i] = min(frames)
        return lengths

    def _count_long(self) -> None:
        limit = self.options.max_seq_length
        long = self.lengths > limit if limit else np.zeros(len(self.lengths), dtype=bool)
        self.report["long"] = int(long.sum())
        self.report["long_action"] = self.options.long_utterances
        if long.any():
            pieces = int(np.ceil(self.lengths[long] / limit).sum())
            action = (f"split into {pieces} pieces" if self.options.long_utterances == "split"
                      else f"dropped ({int(self.lengths[long].sum())} frames)")
            log.info("dataset %s: %d of %d utterances are longer than max_seq_length=%d frames: %s",
                     self.spec.data_name, long.sum(), len(self.keys), limit, action)

    # ------------------------------------------------------------------ chunks
    def chunk_keys(self, epoch: int = 0) -> list[list[str]]:
        """The keys of each chunk of ``epoch``: with ``shuffle``, a permutation drawn from
        ``(seed, epoch)``; cut into ``n_chunks`` chunks of about equal frames."""
        n = len(self.keys)
        rng = np.random.default_rng([self.options.seed, epoch])
        order = rng.permutation(n) if self.options.shuffle else np.arange(n)
        frames = self.lengths[order]
        starts = np.cumsum(frames) - frames
        chunk_of = starts * self.spec.n_chunks // int(frames.sum())  # (N,) chunk of each utterance
        chunks = [[self.keys[i] for i in order[chunk_of == c]] for c in range(self.spec.n_chunks)]
        return [chunk for chunk in chunks if chunk]

    def load_chunk(self, keys: list[str]) -> list[Utterance]:
        """Read, post-process, normalise and label the utterances ``keys``; long ones split or dropped."""
        streams = [source.load(keys) for source in self.sources]
        utterances = []
        for key in keys:
            frames = int(self.lengths[self._index[key]])
            parts = [stream.pop(key)[:frames] for stream in streams]  # pop: the chunk is held once
            feats = parts[0] if len(parts) == 1 else np.concatenate(parts, axis=1)
            if self.norm is not None:
                feats = self.norm.apply(feats)
            labels = {lab.lab_name: self.stores[lab.lab_folder].labels(key, self._kinds[lab.lab_name])[:frames]
                      for lab in self.spec.lab}
            utterances.extend(self._limit(key, feats, labels))
        return utterances

    def _limit(self, key: str, feats: np.ndarray, labels: dict) -> list[Utterance]:
        limit = self.options.max_seq_length
        if not limit or len(feats) <= limit:
            return [Utterance(key, feats, labels)]
        if self.options.long_utterances == "drop":
            return []
        bounds = np.linspace(0, len(feats), -(-len(feats) // limit) + 1).astype(int)  # near-equal pieces
        return [Utterance(f"{key}#{i}", feats[a:b], {name: v[a:b] for name, v in labels.items()})
                for i, (a, b) in enumerate(zip(bounds[:-1], bounds[1:]))]

    def _chunks(self, plan: list[list[str]]) -> tuple[Iterator[list[Utterance]], Optional[Prefetcher]]:
        if not self.options.prefetch:
            return (self.load_chunk(keys) for keys in plan), None
        prefetcher = Prefetcher(lambda i: self.load_chunk(plan[i]), len(plan), name=f"{self.spec.data_name} chunk")
        return iter(prefetcher), prefetcher

    def batches(self, epoch: int = 0, first_chunk: int = 0) -> Iterator[Batch]:
        """The padded batches of one epoch, chunk by chunk (see :class:`Batch` for the shapes).

        Within a chunk, utterances are sorted by length and cut into batches of ``batch_size``; with
        ``shuffle`` the batch order is drawn from ``(seed, epoch, chunk)``. ``first_chunk`` skips the
        chunks before it without reading them (a resumed run). A failure while preparing the next
        chunk is raised here, at the next batch.
        """
        chunks, prefetcher = self._chunks(self.chunk_keys(epoch)[first_chunk:])
        try:
            for index, utterances in enumerate(chunks, first_chunk):
                rng = np.random.default_rng([self.options.seed, epoch, index]) if self.options.shuffle else None
                for group in make_batches([u.num_frames for u in utterances], self.options.batch_size, rng):
                    if prefetcher is not None:
                        prefetcher.check()
                    batch = collate([utterances[i] for i in group])
                    batch.chunk = index
                    yield batch
        finally:
            if prefetcher is not None:
                prefetcher.close()

    # ------------------------------------------------------------------ statistics
    def global_norm(self) -> GlobalNorm:
        """Mean and deviation of the features over real frames; compute it on the training corpus."""
        if self.norm is not None:
            raise ValueError(f"dataset {self.spec.data_name} is already normalised")
        total, squares, count = np.zeros(self.feature_dim), np.zeros(self.feature_dim), 0
        chunks, _ = self._chunks(self.chunk_keys(0))
        for utterances in chunks:
            for u in utterances:
                feats = u.feats.astype(np.float64)
                total += feats.sum(axis=0)
                squares += np.square(feats).sum(axis=0)
                count += len(feats)
        return GlobalNorm.from_sums(total, squares, count)

    def counts(self, lab_name: str) -> Optional[np.ndarray]:
        """Frame counts per class of ``lab_name`` for the priors, as its ``lab_count_file`` says:
        ``"auto"`` counts over the alignments of ``lab_folder`` (``analyze-counts``), ``"none"``
        gives None, anything else is read as an ``analyze-counts`` file."""
        lab = self._label_stream(lab_name)
        if lab.lab_count_file == "none":
            return None
        if lab.lab_count_file != "auto":
            counts = read_counts(lab.lab_count_file)
            if len(counts) != self.label_dims[lab_name]:
                raise KaldiIOError(f"{lab.lab_count_file}: {len(counts)} counts, expected {self.label_dims[lab_name]}")
            return counts
        store = self.stores[lab.lab_folder]
        return (store.pdf_counts if self._kinds[lab_name] == "pdf" else store.phone_counts).astype(np.float64)

    def model(self, lab_name: str) -> TransitionModel:
        """The TransitionModel behind ``lab_name`` (from its ``final.mdl``)."""
        return self.stores[self._label_stream(lab_name).lab_folder].model

    def _label_stream(self, lab_name: str) -> LabelStream:
        for lab in self.spec.lab:
            if lab.lab_name == lab_name:
                return lab
        raise KeyError(f"dataset {self.spec.data_name} has no label stream {lab_name!r}")


# --------------------------------------------------------------------------- outputs
def read_counts(path: str) -> np.ndarray:
    """Class counts written by ``analyze-counts`` (text or binary Kaldi vector), float64 ``(C,)``."""
    return read_kaldi_vector(path)


def write_counts(path: str, counts: np.ndarray) -> None:
    """Write counts as ``analyze-counts --binary=false`` does (``[ c0 c1 ... ]``), atomically."""
    write_kaldi_vector(path, counts)


FLT_MAX = float(np.finfo(np.float32).max)


def log_priors(counts: np.ndarray, cutoff: float = 1e-10) -> np.ndarray:
    """``(C,)`` float32 log prior of each class from its frame count.

    As Kaldi nnet1's ``PdfPrior``, a class counted fewer than ``cutoff`` times gets a log prior raised
    by FLT_MAX/2, so its log-likelihood is hugely negative and the decoder never picks it.

    >>> [round(float(p), 4) for p in log_priors(np.array([1.0, 3.0, 0.0]))[:2]]
    [-1.3863, -0.2877]
    """
    counts = np.asarray(counts, dtype=np.float64)
    low = counts < cutoff
    counts = np.where(low, cutoff, counts)
    priors = np.log(counts / counts.sum())
    return (priors + np.where(low, FLT_MAX / 2, 0.0)).astype(np.float32)


class LoglikeWriter(ArkWriter):
    """Network outputs written as Kaldi archives: log-likelihoods = log posteriors - log priors.

    float32 ``ark`` + ``scp`` as ``latgen-faster-mapped`` reads them (rows are frames, columns
    pdf-ids), written atomically (see :class:`ArkWriter`).

    Args:
        ark_path, scp_path: the outputs.
        log_priors: ``(C,)`` from :func:`log_priors`, or None to write the log posteriors unchanged.

    >>> import tempfile, torch, kaldiio
    >>> d = tempfile.mkdtemp()
    >>> with LoglikeWriter(f"{d}/ll.ark", f"{d}/ll.scp", log_priors(np.array([1.0, 1.0]))) as w:
    ...     w.write_batch(["a", "b"], torch.zeros(2, 3, 2), torch.tensor([3, 1]))
    >>> table = kaldiio.load_scp(f"{d}/ll.scp")
    >>> {k: m.shape for k, m in table.items()}, round(float(table["b"][0, 0]), 4)  # 0 - log(1/2)
    ({'a': (3, 2), 'b': (1, 2)}, 0.6931)
    """

    def __init__(self, ark_path: str, scp_path: Optional[str] = None, log_priors: Optional[np.ndarray] = None):
        super().__init__(ark_path, scp_path)
        self.log_priors = None if log_priors is None else np.asarray(log_priors, dtype=np.float32)

    def write(self, key: str, log_posteriors) -> None:
        """Write one utterance: ``(T, C)`` log posteriors (array or tensor)."""
        if torch.is_tensor(log_posteriors):
            log_posteriors = log_posteriors.detach().cpu().float().numpy()
        out = np.asarray(log_posteriors, dtype=np.float32)
        if self.log_priors is not None:
            if out.ndim != 2 or out.shape[1] != len(self.log_priors):
                raise KaldiIOError(f"{self.ark_path}: utterance {key!r} has outputs of shape {out.shape}, "
                                   f"expected (frames, {len(self.log_priors)}) to match the priors")
            out = out - self.log_priors  # hybrid decoding wants p(x|s) ~ p(s|x) / p(s)
        super().write(key, out)

    def write_batch(self, keys: Iterable[str], log_posteriors: torch.Tensor, lengths: torch.Tensor) -> None:
        """Write a batch: ``(B, T, C)`` log posteriors, ``(B,)`` lengths; padded frames are not written."""
        for key, out, n in zip(keys, log_posteriors, lengths.tolist()):
            self.write(key, out[:n])

"""A Kaldi data set read chunk by chunk into training batches: streams, labels, checks, chunks.

:class:`Corpus` joins a data set's feature streams (``bru_kaldi.feature_streams``: scp, ark or Kaldi
pipeline, ``fea_opts``, splicing) with its label streams (``bru_kaldi.kaldi.alignments``: pdf-ids or
per-frame phones through ``final.mdl``), skips and counts utterances missing from one of them (an error
above ``max_missing_fraction``), checks lengths up front, cuts the corpus into ``n_chunks`` chunks
re-drawn every epoch from the seed, reads one chunk while the next is prepared in a background thread,
and yields padded batches of length-sorted utterances (``bru_kaldi.batching``). :class:`LoaderOptions`
holds batching and checks; :func:`loader_options` builds them from a config's ``[batches]``, and
:func:`dataset_for` picks the streams a model uses. Errors are ``KaldiIOError``, naming the file and the
utterance. (Long because the corpus is one object: its checks, chunking and statistics share the index
it builds once.)

>>> import tempfile, numpy as np
>>> from bru_kaldi.config import FeatureStream
>>> from bru_kaldi.kaldi.tables import ArkWriter
>>> d = tempfile.mkdtemp()
>>> with ArkWriter(f"{d}/feats.ark", f"{d}/feats.scp") as w:
...     for i in range(3):
...         w.write(f"utt{i}", np.random.rand(10 + i, 13))
>>> corpus = Corpus(Dataset("test", [FeatureStream("mfcc", f"{d}/feats.scp", "cmvn=utterance", 0, 0)]),
...                 LoaderOptions(batch_size=2, shuffle=False))
>>> [(tuple(b.x.shape), b.keys) for b in corpus.batches()]
[((2, 11, 13), ['utt0', 'utt1']), ((1, 12, 13), ['utt2'])]
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Optional, Sequence

import numpy as np
import torch

from bru_kaldi.batching import Batch, Prefetcher, Utterance, collate, make_batches
from bru_kaldi.config import LONG_UTTERANCES, Config, ConfigError, Dataset, LabelStream
from bru_kaldi.feature_streams import FeatureSource
from bru_kaldi.feature_transforms import GlobalNorm
from bru_kaldi.kaldi.alignments import AlignmentStore, label_kind
from bru_kaldi.kaldi.tables import KaldiIOError
from bru_kaldi.kaldi.transition_model import TransitionModel
from bru_kaldi.posteriors import read_counts
from bru_kaldi.schedules import epoch_values

log = logging.getLogger(__name__)


# --------------------------------------------------------------------------- parameters
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
    # "frames": batches of batch_size single frames (B, 1, F), shuffled over the whole chunk; frame-wise
    # models only (pytorch-kaldi's batches for non-recurrent models)
    batch_unit: str = "utterances"

    def __post_init__(self):
        if self.long_utterances not in LONG_UTTERANCES:
            raise ValueError(f"long_utterances must be one of {LONG_UTTERANCES}, got {self.long_utterances!r}")
        if self.batch_size < 1 or self.max_seq_length < 0 or self.length_tolerance < 0:
            raise ValueError(f"batch_size >= 1, max_seq_length >= 0 and length_tolerance >= 0 expected, got {self}")


def loader_options(config: Config, purpose: str, epoch: int = 0) -> LoaderOptions:
    """``[batches]`` as loader options for ``purpose``: ``"train"`` (shuffled; batch size and length limit
    of training epoch ``epoch``, from 0, see ``bru_kaldi.schedules``), ``"valid"`` (in scp order) or
    ``"forward"`` (whole utterances in scp order: their keys name the output rows)."""
    b = config.batches
    checks = dict(max_missing_fraction=b.max_missing_fraction, length_tolerance=b.length_tolerance)
    if purpose == "train":
        now = epoch_values(config, epoch)
        return LoaderOptions(now["batch_size"], now["max_seq_length"], b.long_utterances, config.exp.seed,
                             shuffle=True, batch_unit=b.batch_unit, **checks)
    if purpose == "valid":
        return LoaderOptions(b.batch_size_valid, b.max_seq_length_valid, b.long_utterances, config.exp.seed,
                             shuffle=False, **checks)
    if purpose == "forward":
        return LoaderOptions(b.batch_size_valid, 0, "split", config.exp.seed, shuffle=False, **checks)
    raise ValueError(f"purpose must be train, valid or forward, got {purpose!r}")


def label_names(config: Config) -> list[str]:
    """The label streams a model trains on: ``[model] senone_lab``, and ``mono_lab`` unless it is none."""
    return [config.model.senone_lab] + ([config.model.mono_lab] if config.model.mono_lab != "none" else [])


def transition_ids_of(lab_name: str) -> str:
    """The name of the label stream that carries the transition-ids of ``lab_name`` (:class:`Corpus`).

    >>> transition_ids_of("lab_cd")
    'lab_cd:transition-ids'
    """
    return f"{lab_name}:transition-ids"


def dataset_for(config: Config, name: str, with_labels: bool) -> Dataset:
    """The streams of data set ``name`` that the model uses: ``[model] inputs`` in that order (all of them when
    empty) and, with the labels, ``mse_target`` after them unless it is one; the labels when ``with_labels``."""
    dataset = config.dataset(name)
    streams = {s.fea_name: s for s in dataset.fea}
    target = [config.model.mse_target] if with_labels and config.model.mse_arch else []  # see training.feature_columns
    names = list(dict.fromkeys((config.model.inputs or list(streams)) + target))
    for wanted in names:
        if wanted not in streams:
            raise ConfigError(f"{config.source} [model] {'inputs' if wanted in config.model.inputs else 'mse_target'}: "
                              f"dataset {name} has no feature stream {wanted!r}; it has {sorted(streams)}")
    fea = [streams[wanted] for wanted in names]
    labels = label_names(config) if with_labels else []
    have = {s.lab_name for s in dataset.lab}
    for wanted in labels:
        if wanted not in have:
            raise ConfigError(f"{config.source}: dataset {name} needs a label stream {wanted!r} "
                              f"([model] senone_lab / mono_lab); it has {sorted(have)}")
    return dataclasses.replace(dataset, fea=fea, lab=[s for s in dataset.lab if s.lab_name in labels])


def fingerprint(dataset: Dataset) -> str:
    """A digest of what a data set's derived files (normalisation, pdf counts) are computed from: its
    streams as configured, and the size and modification time of every file they name (feature lists,
    the CMVN files of ``fea_opts``, each alignment folder's ``final.mdl`` and ``ali.*.gz``)."""
    parts = [repr(dataclasses.asdict(dataset))]
    paths = []
    for stream in dataset.fea:
        words = [stream.fea_lst, *stream.fea_opts.replace("=", " ").split()]
        paths += [Path(w.split(":", 1)[-1]) for w in words if w and not w.startswith("-")]
    for lab in dataset.lab:
        paths.append(Path(lab.lab_folder) / "final.mdl")
        paths += sorted(Path(lab.lab_folder).glob("ali.*.gz"))
    for path in paths:
        if path.is_file():
            stat = path.stat()
            parts.append(f"{path} {stat.st_size} {stat.st_mtime_ns}")
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


# --------------------------------------------------------------------------- the corpus
class Corpus:
    """A Kaldi data set read chunk by chunk: its feature streams joined with its label streams.

    Args:
        spec: streams and ``n_chunks``.
        options: batching and strictness (:class:`LoaderOptions`).
        norm: a :class:`GlobalNorm` from the *training* corpus (:meth:`global_norm`), applied to the
            concatenated features; dev and test sets get the training set's, never their own.
        transition_ids: label streams whose alignments' transition-ids ride along with their labels, as the
            label stream :func:`transition_ids_of` ``(name)`` (LF-MMI's numerator is made from them).

    Attributes:
        keys: the usable utterances, in the order of the first feature stream.
        lengths: ``(N,)`` frames of each usable utterance (trimmed within ``length_tolerance``).
        feature_dim: ``F`` of the batches; ``label_dims``: ``lab_name`` -> number of classes
            (``num_pdfs``, or the largest phone + 1: phone ids are kept as Kaldi numbers them).
        report: utterances skipped per stream, split or dropped for ``max_seq_length`` (also logged).

    Only the index (keys, lengths, speakers) is held for the whole corpus; frames are read one chunk
    at a time, and at most two chunks are alive (the one consumed and the one being prepared).
    """

    def __init__(self, spec: Dataset, options: Optional[LoaderOptions] = None, norm: Optional[GlobalNorm] = None,
                 transition_ids: Sequence[str] = ()):
        self.spec, self.options, self.norm = spec, options or LoaderOptions(), norm
        if not spec.fea or spec.n_chunks < 1:
            raise ValueError(f"dataset {spec.data_name}: needs at least one feature stream and n_chunks >= 1")
        self.report: dict = {}
        self._kinds = {lab.lab_name: label_kind(lab.lab_opts) for lab in spec.lab}
        unknown = set(transition_ids) - set(self._kinds)
        if unknown:
            raise ValueError(f"dataset {spec.data_name}: no label stream {sorted(unknown)} for transition-ids")
        self._transition_ids = [lab for lab in spec.lab if lab.lab_name in transition_ids]
        self.sources = [FeatureSource(s) for s in spec.fea]
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
            action = (f"{self.options.long_utterances} into {pieces} pieces" if self.options.long_utterances != "drop"
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
            for lab in self._transition_ids:
                store = self.stores[lab.lab_folder]
                labels[transition_ids_of(lab.lab_name)] = store.labels(key, "transition-id")[:frames]
            utterances.extend(self._limit(key, feats, labels))
        return utterances

    def _limit(self, key: str, feats: np.ndarray, labels: dict) -> list[Utterance]:
        limit = self.options.max_seq_length
        if not limit or len(feats) <= limit:
            return [Utterance(key, feats, labels)]
        if self.options.long_utterances == "drop":
            return []
        if self.options.long_utterances == "cut":  # pytorch-kaldi: pieces of exactly `limit` frames
            bounds = np.append(np.arange(0, len(feats), limit), len(feats))
            return [Utterance(f"{key}#{i}", feats[a:b], {name: v[a:b] for name, v in labels.items()})
                    for i, (a, b) in enumerate(zip(bounds[:-1], bounds[1:]))]
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
                if self.options.batch_unit == "frames":
                    yield from self._frame_batches(utterances, rng, index)
                    continue
                for group in make_batches([u.num_frames for u in utterances], self.options.batch_size, rng):
                    if prefetcher is not None:
                        prefetcher.check()
                    batch = collate([utterances[i] for i in group])
                    batch.chunk = index
                    yield batch
        finally:
            if prefetcher is not None:
                prefetcher.close()

    def _frame_batches(self, utterances: list[Utterance], rng, chunk: int) -> Iterator[Batch]:
        """Batches of ``batch_size`` single frames of the chunk, in an order drawn from ``rng``: each frame
        is a sequence of length 1, ``(B, 1, F)``, so that batch norm and dropout see frames, as
        pytorch-kaldi's non-recurrent models do."""
        feats = np.concatenate([u.feats for u in utterances])  # (N, F)
        labels = {name: np.concatenate([u.labels[name] for u in utterances]) for name in utterances[0].labels}
        keys = [f"{u.key}@{t}" for u in utterances for t in range(u.num_frames)]
        order = rng.permutation(len(feats)) if rng is not None else np.arange(len(feats))
        size = self.options.batch_size
        for start in range(0, len(order), size):
            rows = order[start:start + size]
            lengths = torch.ones(len(rows), dtype=torch.int64)
            batch = Batch(torch.from_numpy(feats[rows][:, None]), lengths, torch.ones(len(rows), 1, dtype=torch.bool),
                          {name: torch.from_numpy(v[rows][:, None]) for name, v in labels.items()},
                          [keys[i] for i in rows], chunk)
            yield batch

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

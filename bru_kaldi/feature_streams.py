"""One feature stream of a data set as the loader reads it: where its matrices are, their shapes, and
their post-processing (``fea_opts``: CMVN, deltas; ``cw_left``/``cw_right``: splicing).

An scp is indexed from the matrix headers alone; an archive or pipeline (no random access) is read
once for its keys and lengths and streamed again for each chunk. CMVN statistics come from
``cmvn.scp`` beside an scp, from the files ``fea_opts`` names, or are computed from the features
(``compute-cmvn-stats --spk2utt``); every speaker's statistics are checked before training starts.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Iterator

import numpy as np

from bru_kaldi.config import FeatureStream
from bru_kaldi.feature_transforms import add_deltas, apply_cmvn, cmvn_stats_sum, compute_cmvn_stats, parse_fea_opts, splice
from bru_kaldi.kaldi.tables import KaldiIOError, ScpTable, parse_rspecifier, read_matrices, read_text_table

log = logging.getLogger(__name__)


class FeatureSource:
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

"""Kaldi's feature post-processing without Kaldi: ``apply-cmvn``, ``add-deltas``, ``splice-feats``.

Each function takes and returns one utterance's ``(T, D)`` float32 matrix and follows Kaldi's
arithmetic (transform/cmvn.cc, feat/feature-functions.cc); the tests compare them with
kaldi-native-fbank to 1e-5. :func:`parse_fea_opts` turns a pytorch-kaldi ``fea_opts`` string,
written either as the Kaldi commands it used to pipe through or as ``key=value`` pairs, into
:class:`FeatureOptions`.

>>> import numpy as np
>>> x = np.arange(12, dtype=np.float32).reshape(4, 3)
>>> apply_cmvn(x, compute_cmvn_stats(x)).mean(axis=0)
array([0., 0., 0.], dtype=float32)
>>> add_deltas(x, order=2, window=2).shape, splice(x, 2, 1).shape
((4, 9), (4, 12))
"""

from __future__ import annotations

import functools
import shlex
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Optional

import numpy as np

from bru_kaldi.atomic import write_atomically

CMVN_MODES = ("none", "speaker", "utterance")


@dataclass
class FeatureOptions:
    """Per-stream post-processing, applied in this order: CMVN, deltas (splicing is ``cw_left/right``).

    Attributes:
        cmvn: ``"speaker"`` (stats per speaker via ``utt2spk``), ``"utterance"`` or ``"none"``.
        norm_means, norm_vars: what CMVN normalises (Kaldi's ``--norm-means``, ``--norm-vars``).
        cmvn_stats: Kaldi CMVN stats (``scp:cmvn.scp``, ``ark:cmvn.ark``, or a path), keyed by speaker
            for ``"speaker"`` and by utterance for ``"utterance"``. Empty: for ``"speaker"`` the
            ``cmvn.scp`` beside ``feats.scp`` if there is one, else stats computed from the features;
            for ``"utterance"`` the utterance's own stats.
        utt2spk: the utt2spk file; empty means the one beside ``feats.scp``.
        delta_order, delta_window: ``add-deltas --delta-order --delta-window`` (order 0: none).
    """

    cmvn: str = "none"
    norm_means: bool = True
    norm_vars: bool = False
    cmvn_stats: str = ""
    utt2spk: str = ""
    delta_order: int = 0
    delta_window: int = 2

    def __post_init__(self):
        if self.cmvn not in CMVN_MODES:
            raise ValueError(f"fea_opts cmvn: expected one of {', '.join(CMVN_MODES)}, got {self.cmvn!r}")
        if self.norm_vars and not self.norm_means:
            raise ValueError("fea_opts: norm_vars=true needs norm_means=true (as Kaldi's apply-cmvn)")
        if not 0 <= self.delta_order <= 3 or self.delta_window < 1:
            raise ValueError(f"fea_opts: expected delta_order in 0..3 and delta_window >= 1, "
                             f"got {self.delta_order} and {self.delta_window}")


# --------------------------------------------------------------------------- fea_opts strings
def _bool(text: str, where: str) -> bool:
    if text.lower() in ("true", "1", "yes"):
        return True
    if text.lower() in ("false", "0", "no"):
        return False
    raise ValueError(f"fea_opts {where}: expected true or false, got {text!r}")


def _strip_ark(spec: str) -> str:
    return spec.split(":", 1)[1] if spec.split(":", 1)[0] in ("ark", "scp", "ark,s,cs", "ark,t") else spec


def _parse_kaldi_commands(text: str) -> FeatureOptions:
    values: dict = {}
    for command in filter(None, (c.strip() for c in text.split("|"))):
        words = shlex.split(command)
        name, args = words[0], words[1:]
        options = dict(a[2:].split("=", 1) for a in args if a.startswith("--") and "=" in a)
        positional = [a for a in args if not a.startswith("--")]
        if name == "apply-cmvn":
            known = {"utt2spk", "norm-means", "norm-vars"}
            if set(options) - known:
                raise ValueError(f"fea_opts apply-cmvn: unsupported options {sorted(set(options) - known)}")
            if not positional or positional[0] in ("ark:-", "-"):
                raise ValueError("fea_opts apply-cmvn: expected the CMVN stats (e.g. scp:data/train/cmvn.scp) first")
            values["cmvn_stats"] = positional[0]
            values["utt2spk"] = _strip_ark(options.get("utt2spk", ""))
            # Kaldi: stats are per speaker exactly when --utt2spk is given, else keyed by utterance
            values["cmvn"] = "speaker" if values["utt2spk"] else "utterance"
            values["norm_means"] = _bool(options.get("norm-means", "true"), "--norm-means")
            values["norm_vars"] = _bool(options.get("norm-vars", "false"), "--norm-vars")
        elif name == "add-deltas":
            if set(options) - {"delta-order", "delta-window"}:
                raise ValueError(f"fea_opts add-deltas: unsupported options {sorted(set(options))}")
            values["delta_order"] = int(options.get("delta-order", 2))
            values["delta_window"] = int(options.get("delta-window", 2))
        else:
            raise ValueError(f"fea_opts: {name} is not one of apply-cmvn, add-deltas (splicing is cw_left/cw_right; "
                             "run any other Kaldi pipeline by giving it as fea_lst, e.g. 'ark:copy-feats ... |')")
    return FeatureOptions(**values)


def parse_fea_opts(text: str) -> FeatureOptions:
    """Parse a ``fea_opts`` string into :class:`FeatureOptions`.

    Two spellings are accepted: pytorch-kaldi's Kaldi commands, and ``key=value`` pairs named as the
    fields of :class:`FeatureOptions`.

    >>> parse_fea_opts("apply-cmvn --utt2spk=ark:data/train/utt2spk scp:data/train/cmvn.scp ark:- ark:- "
    ...                "| add-deltas --delta-order=2 ark:- ark:- |").cmvn
    'speaker'
    >>> o = parse_fea_opts("cmvn=utterance norm_vars=true delta_order=1")
    >>> o.cmvn, o.norm_means, o.norm_vars, o.delta_order, o.delta_window
    ('utterance', True, True, 1, 2)
    """
    text = (text or "").strip()
    if not text:
        return FeatureOptions()
    first = text.split()[0]
    if "=" not in first or first.startswith("--"):
        return _parse_kaldi_commands(text)
    kinds = {f.name: f.type for f in fields(FeatureOptions)}
    values: dict = {}
    for pair in text.split():
        key, sep, value = pair.partition("=")
        if not sep or key not in kinds:
            raise ValueError(f"fea_opts: unknown option {key!r}; expected key=value with keys {', '.join(kinds)}")
        kind = kinds[key]
        values[key] = _bool(value, key) if kind in (bool, "bool") else int(value) if kind in (int, "int") else value
    return FeatureOptions(**values)


# --------------------------------------------------------------------------- CMVN
def compute_cmvn_stats(feats: np.ndarray) -> np.ndarray:
    """Kaldi CMVN stats of ``(T, D)`` frames: ``(2, D + 1)`` float64, sums, sums of squares, count."""
    feats = np.asarray(feats, dtype=np.float64)
    stats = np.zeros((2, feats.shape[1] + 1))
    stats[0, :-1] = feats.sum(axis=0)
    stats[1, :-1] = np.square(feats).sum(axis=0)
    stats[0, -1] = len(feats)
    return stats


def apply_cmvn(feats: np.ndarray, stats: np.ndarray, norm_means: bool = True, norm_vars: bool = False) -> np.ndarray:
    """Kaldi's ``ApplyCmvn``: ``(T, D)`` float32 -> ``(T, D)`` float32.

    Args:
        feats: ``(T, D)`` frames.
        stats: ``(2, D + 1)`` (or ``(1, D + 1)`` for means only) Kaldi CMVN stats.
    """
    if not norm_means:
        return np.asarray(feats, dtype=np.float32)
    stats = np.asarray(stats, dtype=np.float64)
    dim = stats.shape[1] - 1
    if feats.shape[1] != dim or stats.shape[0] not in (1, 2) or (norm_vars and stats.shape[0] != 2):
        raise ValueError(f"CMVN stats of shape {stats.shape} do not fit features of shape {feats.shape}")
    count = stats[0, dim]
    if count < 1.0:  # Kaldi refuses: "Insufficient stats for cepstral mean and variance normalization"
        raise ValueError(f"CMVN stats with a frame count of {count} (at least 1 needed)")
    mean = stats[0, :dim] / count
    scale = np.ones(dim)
    if norm_vars:
        variance = np.maximum(stats[1, :dim] / count - mean * mean, 1e-20)  # Kaldi floors the variance at 1e-20
        scale = 1.0 / np.sqrt(variance)
    # as Kaldi, offset and scale are computed in double, stored in float, applied in float
    offset, scale = (-mean * scale).astype(np.float32), scale.astype(np.float32)
    return np.asarray(feats, dtype=np.float32) * scale + offset


# --------------------------------------------------------------------------- deltas and splicing
def _edge_padded(feats: np.ndarray, left: int, right: int) -> np.ndarray:
    # Kaldi repeats the first and last frame where a window reaches past the utterance
    return np.pad(np.asarray(feats, dtype=np.float32), ((left, right), (0, 0)), mode="edge")


@functools.lru_cache(maxsize=None)
def delta_scales(order: int, window: int) -> tuple[tuple[float, ...], ...]:
    """Kaldi's ``DeltaFeatures`` filters: ``scales[i]`` has ``2 * i * window + 1`` taps."""
    scales = [np.ones(1)]
    ramp = np.arange(-window, window + 1, dtype=np.float64)
    for _ in range(order):
        scales.append(np.convolve(scales[-1], ramp) / np.square(ramp).sum())
    return tuple(tuple(s.tolist()) for s in scales)  # immutable: the result is cached


def add_deltas(feats: np.ndarray, order: int = 2, window: int = 2) -> np.ndarray:
    """``add-deltas``: ``(T, D)`` -> ``(T, D * (order + 1))``, blocks ``[x, delta, delta-delta, ...]``."""
    feats = np.asarray(feats, dtype=np.float32)
    if order == 0:
        return feats
    T = len(feats)
    reach = order * window
    padded = _edge_padded(feats, reach, reach)
    blocks = [feats]
    for scale in delta_scales(order, window)[1:]:
        half = len(scale) // 2
        block = np.zeros_like(feats)
        for j, s in enumerate(scale):
            if s != 0.0:
                start = reach - half + j
                block += np.float32(s) * padded[start:start + T]
        blocks.append(block)
    return np.concatenate(blocks, axis=1)


def splice(feats: np.ndarray, left: int, right: int) -> np.ndarray:
    """``splice-feats``: ``(T, D)`` -> ``(T, D * (left + 1 + right))``, frames ``t-left .. t+right``."""
    feats = np.asarray(feats, dtype=np.float32)
    if left == 0 and right == 0:
        return feats
    if left < 0 or right < 0:
        raise ValueError(f"context widths must be >= 0, got cw_left={left}, cw_right={right}")
    T = len(feats)
    padded = _edge_padded(feats, left, right)
    return np.concatenate([padded[j:j + T] for j in range(left + 1 + right)], axis=1)


# --------------------------------------------------------------------------- frames as they arrive
class OnlineCmvn:
    """Kaldi's ``OnlineCmvn`` (``apply-cmvn-online``) for a speaker never seen: causal sliding-window CMVN
    from a global prior, frames ``(T, D)`` -> ``(T, D)`` float32, given all at once or chunk by chunk.

    Frame ``t`` is normalised with the statistics of the last ``cmn_window`` frames up to and including
    it; while there are fewer, the window is topped up with ``min(cmn_window - n, global_frames)``
    frames' worth of ``global_stats`` (Kaldi's ``global_cmvn.stats``, scaled to that count), so that the
    first frames lean on the training set's mean. Defaults are Kaldi's ``OnlineCmvnOptions``. Written by
    hand: kaldi-native-fbank has no online CMVN. One object normalises one stream; ``norm_vars`` as
    :func:`apply_cmvn`'s.

    >>> cmvn = OnlineCmvn(compute_cmvn_stats(np.zeros((10, 2))), cmn_window=3, global_frames=1)
    >>> cmvn(np.array([[3.0, 3.0], [6.0, 6.0]], dtype=np.float32))[:, 0]  # 3 - (3 + 0) / 2; 6 - (3 + 6 + 0) / 3
    array([1.5, 3. ], dtype=float32)
    """

    def __init__(self, global_stats: np.ndarray, cmn_window: int = 600, global_frames: int = 200,
                 norm_vars: bool = False):
        self.prior = np.asarray(global_stats, dtype=np.float64)
        if self.prior.ndim != 2 or self.prior.shape[0] != 2 or not self.prior[0, -1] > 0:
            raise ValueError(f"global CMVN stats must be (2, D + 1) with a positive count, got {self.prior.shape}")
        if not 0 < global_frames <= cmn_window:
            raise ValueError(f"expected 0 < global_frames <= cmn_window, got {global_frames} and {cmn_window}")
        self.window, self.global_frames, self.norm_vars = cmn_window, global_frames, norm_vars
        self.history = np.zeros((0, self.prior.shape[1] - 1))  # the last cmn_window - 1 frames, float64

    def __call__(self, feats: np.ndarray) -> np.ndarray:
        feats = np.asarray(feats, dtype=np.float32)
        dim = self.prior.shape[1] - 1
        if feats.ndim != 2 or feats.shape[1] != dim:
            raise ValueError(f"online CMVN of dimension {dim}, features of shape {feats.shape}")
        frames = np.concatenate([self.history, feats.astype(np.float64)])
        ends = np.arange(len(self.history), len(frames)) + 1  # each new frame's window ends after it
        starts = np.maximum(ends - self.window, 0)
        sums = np.concatenate([np.zeros((1, dim)), np.cumsum(frames, axis=0)])
        squares = np.concatenate([np.zeros((1, dim)), np.cumsum(frames * frames, axis=0)])
        count = (ends - starts).astype(np.float64)[:, None]
        topped = np.minimum(self.window - count, self.global_frames) / self.prior[0, -1]  # prior frames per frame
        mean_sum = sums[ends] - sums[starts] + topped * self.prior[0, :dim]
        total = count + topped * self.prior[0, -1]
        mean = mean_sum / total
        scale = np.ones_like(mean)
        if self.norm_vars:  # as apply_cmvn: the variance floored at 1e-20
            square_sum = squares[ends] - squares[starts] + topped * self.prior[1, :dim]
            scale = 1.0 / np.sqrt(np.maximum(square_sum / total - mean * mean, 1e-20))
        self.history = frames[max(0, len(frames) - self.window + 1):]
        return feats * scale.astype(np.float32) + (-mean * scale).astype(np.float32)


class OnlineContext:
    """Deltas then splicing (:func:`add_deltas`, :func:`splice`) of frames that arrive in chunks: a frame
    comes out once the frames its window reaches have arrived (:attr:`lookahead` of them after it), or at
    the end of the stream, where the last frame is repeated as offline. Row for row what the offline
    functions give over the whole stream.

    >>> context = OnlineContext(delta_order=0, delta_window=2, left=1, right=1)
    >>> x = np.arange(4, dtype=np.float32)[:, None]
    >>> context.push(x[:2]).tolist(), context.push(x[2:], final=True).tolist()
    ([[0.0, 0.0, 1.0]], [[0.0, 1.0, 2.0], [1.0, 2.0, 3.0], [2.0, 3.0, 3.0]])
    """

    def __init__(self, delta_order: int, delta_window: int, left: int, right: int):
        self.delta_order, self.delta_window, self.left, self.right = delta_order, delta_window, left, right
        reach = delta_order * delta_window  # frames a delta reaches on each side
        self.lookahead, self.behind = reach + right, reach + left
        self.frames: Optional[np.ndarray] = None  # the frames still needed, from stream frame self.first on
        self.first = 0
        self.emitted = 0  # frames given out so far

    def push(self, feats: np.ndarray, final: bool = False) -> np.ndarray:
        """The frames that are complete now, ``(n, D * (order + 1) * (left + 1 + right))``."""
        feats = np.asarray(feats, dtype=np.float32)
        self.frames = feats if self.frames is None else np.concatenate([self.frames, feats])
        total = self.first + len(self.frames)
        end = total if final else total - self.lookahead
        width = self.frames.shape[1] * (self.delta_order + 1) * (self.left + 1 + self.right)
        if end <= self.emitted:
            return np.zeros((0, width), dtype=np.float32)
        low = max(self.first, self.emitted - self.behind)  # rows before low + behind see a false left edge
        window = self.frames[low - self.first:]
        out = splice(add_deltas(window, self.delta_order, self.delta_window), self.left, self.right)
        out = out[self.emitted - low:end - low]
        keep = max(self.first, end - self.behind)
        self.frames, self.first, self.emitted = self.frames[keep - self.first:], keep, end
        return out


# --------------------------------------------------------------------------- global normalisation
@dataclass
class GlobalNorm:
    """Mean and standard deviation per dimension, ``(F,)`` each, estimated on the training data only.

    pytorch-kaldi normalised each chunk with its own statistics, dev and test chunks included; here
    the statistics are computed once (real frames only, never padding) and handed to every set.
    """

    mean: np.ndarray
    std: np.ndarray

    @classmethod
    def from_sums(cls, total: np.ndarray, squares: np.ndarray, count: int, floor: float = 1e-5) -> "GlobalNorm":
        if count < 2:
            raise ValueError(f"global normalisation needs at least 2 frames, got {count}")
        mean = total / count
        std = np.sqrt(np.maximum(squares / count - mean * mean, floor * floor))
        return cls(mean.astype(np.float32), std.astype(np.float32))

    def apply(self, feats: np.ndarray) -> np.ndarray:
        """``(T, F)`` -> ``(T, F)`` float32."""
        if feats.shape[-1] != len(self.mean):
            raise ValueError(f"global normalisation of dimension {len(self.mean)}, features of shape {feats.shape}")
        return ((feats - self.mean) / self.std).astype(np.float32)

    def save(self, path) -> None:
        """Write ``mean`` and ``std`` as an ``.npz``, atomically (what a forward pass on new data needs)."""
        def write(tmp: Path) -> None:
            with open(tmp, "wb") as f:
                np.savez(f, mean=self.mean, std=self.std)

        write_atomically(path, write)

    @classmethod
    def load(cls, path) -> "GlobalNorm":
        """Read what :meth:`save` wrote (no pickles: ``allow_pickle=False``)."""
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"{path}: feature normalisation of the trained model is missing (train it first)")
        with np.load(path, allow_pickle=False) as stats:
            return cls(stats["mean"], stats["std"])


def cmvn_stats_sum(stats: Optional[np.ndarray], feats: np.ndarray) -> np.ndarray:
    """Add the CMVN stats of ``feats`` to ``stats`` (Kaldi's ``compute-cmvn-stats --spk2utt``)."""
    new = compute_cmvn_stats(feats)
    return new if stats is None else stats + new

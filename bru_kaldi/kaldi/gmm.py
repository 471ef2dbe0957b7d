"""A Kaldi GMM acoustic model (``AmDiagGmm``) estimated from alignments, and written after the
TransitionModel so that ``final.mdl`` is a complete GMM model for Kaldi's ``gmm-*`` programs.

A ``final.mdl`` of a GMM system is the TransitionModel followed by an ``AmDiagGmm``: the feature
dimension, the number of pdfs, and per pdf a diagonal-covariance GMM stored as Kaldi keeps it in
memory, ``gconsts`` (the log-likelihood's constant per Gaussian), ``weights``, ``means * inv_vars`` and
``inv_vars``. kaldi-hmm-gmm (the Python binding we use for topologies, trees and TransitionModels) has
the object but no writer, so the binary layout is written here, as Kaldi's ``AmDiagGmm::Write`` and
``DiagGmm::Write`` do. The estimate is the maximum-likelihood single Gaussian of each pdf's frames
(``gmm-init-mono`` followed by one ``gmm-est`` pass on a fixed alignment), which is what a monophone
system whose alignments are given needs to be read, realigned (``gmm-align-compiled``) and split
further by Kaldi's own training scripts.

>>> import numpy as np
>>> rng = np.random.default_rng(0)
>>> feats, pdfs = rng.normal(size=(500, 3)), rng.integers(0, 4, size=500)
>>> gmm = estimate_single_gaussians(feats, pdfs, num_pdfs=4)
>>> gmm.means.shape, gmm.variances.shape, gmm.weights.shape
((4, 1, 3), (4, 1, 3), (4, 1))
>>> data = am_diag_gmm_binary(gmm)
>>> data[:12]
b'<DIMENSION> '
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass

import numpy as np

from bru_kaldi.atomic import write_atomically

# The variance floor of Kaldi's ML update (MleDiagGmmOptions::min_variance) and the fraction of the
# global variance that gmm-init-mono's flat start never goes below.
MIN_VARIANCE, RELATIVE_FLOOR = 1e-3, 1e-2
# A pdf with fewer frames than this keeps the global Gaussian (Kaldi's min_gaussian_occupancy is 10).
MIN_FRAMES = 10


@dataclass
class DiagGmms:
    """One diagonal GMM per pdf, all with the same number of Gaussians ``G``.

    Shapes: ``means`` and ``variances`` ``(P, G, D)``, ``weights`` ``(P, G)`` (each row sums to 1).
    """

    means: np.ndarray
    variances: np.ndarray
    weights: np.ndarray

    def gconsts(self) -> np.ndarray:
        """``(P, G)``: ``log w - (D log 2 pi + sum log var + sum mean^2 / var) / 2``, Kaldi's
        ``DiagGmm::ComputeGconsts``, in float64 before it is stored as float32."""
        dim = self.means.shape[-1]
        var = self.variances.astype(np.float64)
        return (np.log(self.weights.astype(np.float64)) - 0.5 * dim * math.log(2 * math.pi)
                - 0.5 * np.log(var).sum(-1) - 0.5 * (self.means.astype(np.float64) ** 2 / var).sum(-1))

    def log_likelihood(self, frame: np.ndarray, pdf: int) -> float:
        """``log p(frame | pdf)`` (for checks): log-sum-exp over the pdf's Gaussians."""
        var, mean = self.variances[pdf].astype(np.float64), self.means[pdf].astype(np.float64)
        per_gauss = (np.log(self.weights[pdf]) - 0.5 * (np.log(2 * math.pi * var) + (frame - mean) ** 2 / var).sum(-1))
        top = per_gauss.max()
        return float(top + np.log(np.exp(per_gauss - top).sum()))


class GaussianStats:
    """Zeroth, first and second-order statistics of each pdf's frames, added an utterance at a time
    (a corpus need not fit in memory), and the maximum-likelihood single Gaussian of each pdf from them.

    >>> stats = GaussianStats(num_pdfs=2, dim=1)
    >>> stats.add(np.array([[0.0], [2.0]] * 5 + [[9.0]] * 3), np.array([0, 0] * 5 + [1] * 3))
    >>> gmm = stats.estimate()
    >>> [round(float(m), 3) for m in gmm.means[:, 0, 0]]  # pdf 1: 3 frames, under MIN_FRAMES: the global mean
    [1.0, 2.846]
    """

    def __init__(self, num_pdfs: int, dim: int):
        self.num_pdfs, self.dim = num_pdfs, dim
        self.counts = np.zeros(num_pdfs)
        self.sums, self.squares = np.zeros((num_pdfs, dim)), np.zeros((num_pdfs, dim))

    def add(self, feats: np.ndarray, pdfs: np.ndarray, source: str = "frames") -> None:
        """Add ``feats`` ``(N, D)`` whose frames belong to ``pdfs`` ``(N,)``; ``source`` names them in errors."""
        feats, pdfs = np.asarray(feats, dtype=np.float64), np.asarray(pdfs)
        if feats.ndim != 2 or feats.shape[1] != self.dim or pdfs.shape != (feats.shape[0],):
            raise ValueError(f"{source}: expected feats (N, {self.dim}) and pdfs (N,), got {feats.shape} and {pdfs.shape}")
        if pdfs.size and (pdfs.min() < 0 or pdfs.max() >= self.num_pdfs):
            raise ValueError(f"{source}: pdf-ids must be in [0, {self.num_pdfs}), got {pdfs.min()}..{pdfs.max()}")
        self.counts += np.bincount(pdfs, minlength=self.num_pdfs)
        np.add.at(self.sums, pdfs, feats)
        np.add.at(self.squares, pdfs, feats ** 2)

    def estimate(self) -> DiagGmms:
        """One Gaussian per pdf; a pdf with fewer than ``MIN_FRAMES`` frames keeps the global mean and
        variance; variances floored at ``max(MIN_VARIANCE, RELATIVE_FLOOR * global variance)``."""
        total = self.counts.sum()
        if total == 0:
            raise ValueError("no frames to estimate Gaussians from")
        global_mean = self.sums.sum(0) / total
        global_var = self.squares.sum(0) / total - global_mean ** 2
        enough = self.counts >= MIN_FRAMES
        n = np.maximum(self.counts, 1)[:, None]
        means = np.where(enough[:, None], self.sums / n, global_mean)
        variances = np.where(enough[:, None], self.squares / n - means ** 2, global_var)
        variances = np.maximum(variances, np.maximum(MIN_VARIANCE, RELATIVE_FLOOR * global_var))
        return DiagGmms(means[:, None, :].astype(np.float32), variances[:, None, :].astype(np.float32),
                        np.ones((self.num_pdfs, 1), dtype=np.float32))


def estimate_single_gaussians(feats: np.ndarray, pdfs: np.ndarray, num_pdfs: int) -> DiagGmms:
    """The maximum-likelihood Gaussian of each pdf's frames ``feats`` ``(N, D)``, ``pdfs`` ``(N,)``
    (see :class:`GaussianStats`, which does the same an utterance at a time)."""
    feats = np.asarray(feats)
    if feats.ndim != 2:
        raise ValueError(f"expected feats (N, D), got {feats.shape}")
    stats = GaussianStats(num_pdfs, feats.shape[1])
    stats.add(feats, pdfs)
    return stats.estimate()


def _token(name: str) -> bytes:
    return name.encode() + b" "  # WriteToken in binary mode: the token and one space


def _int32(value: int) -> bytes:
    return struct.pack("<bi", 4, value)  # WriteBasicType: the size byte, then the value


def _vector(values: np.ndarray) -> bytes:
    return _token("FV") + _int32(len(values)) + np.asarray(values, dtype="<f4").tobytes()


def _matrix(values: np.ndarray) -> bytes:
    rows, cols = values.shape
    return _token("FM") + _int32(rows) + _int32(cols) + np.ascontiguousarray(values, dtype="<f4").tobytes()


def am_diag_gmm_binary(gmm: DiagGmms) -> bytes:
    """``gmm`` in Kaldi's binary ``AmDiagGmm`` layout (no ``"\\0B"`` header: it follows a TransitionModel)."""
    num_pdfs, _, dim = gmm.means.shape
    inv_vars = 1.0 / gmm.variances.astype(np.float64)
    gconsts = gmm.gconsts()
    out = [_token("<DIMENSION>"), _int32(dim), _token("<NUMPDFS>"), _int32(num_pdfs)]
    for p in range(num_pdfs):
        out += [_token("<DiagGMM>"), _token("<GCONSTS>"), _vector(gconsts[p]), _token("<WEIGHTS>"),
                _vector(gmm.weights[p]), _token("<MEANS_INVVARS>"), _matrix(gmm.means[p] * inv_vars[p]),
                _token("<INV_VARS>"), _matrix(inv_vars[p]), _token("</DiagGMM>")]
    return b"".join(out)


def write_gmm_model(tm, gmm: DiagGmms, path) -> None:
    """``final.mdl`` of a GMM system: Kaldi's binary header, ``tm`` (a TransitionModel of
    :mod:`bru_kaldi.kaldi.transition_model`), then ``gmm``; written atomically."""
    if gmm.means.shape[0] != tm.num_pdfs:
        raise ValueError(f"the GMM has {gmm.means.shape[0]} pdfs, the TransitionModel {tm.num_pdfs}")
    data = tm.to_kaldi_binary() + am_diag_gmm_binary(gmm)
    write_atomically(path, lambda tmp: tmp.write_bytes(data))

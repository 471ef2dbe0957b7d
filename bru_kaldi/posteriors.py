"""Network outputs back to Kaldi: pdf counts, log priors, and log-likelihood archives.

A hybrid system decodes with ``log p(x | s) ~ log p(s | x) - log p(s)``: :func:`log_priors` turns the pdf
counts of the training alignments (``analyze-counts``'s file, :func:`read_counts`, :func:`write_counts`)
into ``log p(s)``, and :class:`LoglikeWriter` writes the network's log posteriors minus them as a
float32 ``ark`` + ``scp``, atomically: what ``latgen-faster-mapped`` and our decoder read.

>>> import numpy as np
>>> log_priors(np.array([1.0, 3.0]))  # log(1/4), log(3/4), float32
array([-1.3862944, -0.2876821], dtype=float32)
"""

from __future__ import annotations

import logging
from typing import Iterable, Optional

import numpy as np
import torch

from bru_kaldi.kaldi.tables import ArkWriter, KaldiIOError, read_kaldi_vector, write_kaldi_vector

log = logging.getLogger(__name__)


def read_counts(path: str) -> np.ndarray:
    """Class counts written by ``analyze-counts`` (text or binary Kaldi vector), float64 ``(C,)``."""
    return read_kaldi_vector(path)


def write_counts(path: str, counts: np.ndarray) -> None:
    """Write counts as ``analyze-counts --binary=false`` does (``[ c0 c1 ... ]``), atomically."""
    write_kaldi_vector(path, counts)


FLT_MAX = float(np.finfo(np.float32).max)
PRIOR_FLOOR = 1e-10  # Kaldi nnet1's --prior-floor


def log_priors(counts: np.ndarray, floor: float = PRIOR_FLOOR) -> np.ndarray:
    """``(C,)`` float32 log prior of each class from its frame count, as Kaldi nnet1's ``PdfPrior``.

    ``log(count / total + 1e-20)``; a class whose relative frequency is under ``floor`` (one never
    seen in training, say) gets ``sqrt(FLT_MAX)`` instead: its log-likelihood (log posterior minus log
    prior) is then hugely negative, so the decoder never picks it, yet finite, so that no sum of
    scores overflows to infinity or turns into NaN.

    >>> [round(float(p), 4) for p in log_priors(np.array([1.0, 3.0, 0.0]))[:2]], float(log_priors([1.0, 0.0])[1]) > 1e19
    ([-1.3863, -0.2877], True)
    """
    counts = np.asarray(counts, dtype=np.float64)
    if counts.ndim != 1 or not counts.sum() > 0 or (counts < 0).any():
        raise ValueError(f"pdf counts must be non-negative with a positive total, got {counts.shape} summing to "
                         f"{counts.sum() if counts.size else 0}")
    frequency = counts / counts.sum()
    priors = np.log(frequency + 1e-20)
    priors[frequency < floor] = np.sqrt(FLT_MAX)
    return priors.astype(np.float32)


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

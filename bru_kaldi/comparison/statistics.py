"""How sure a comparison of error rates is: bootstrap intervals and matched-pair tests over utterances,
with one or several training seeds per system.

Everything works on per-utterance error counts (``decode_<set>/per_utt``): ``errors`` ``(S, N)``, the
errors of each of ``S`` seeds on each of ``N`` utterances of one test set, and ``lengths`` ``(N,)``, the
reference words (or phones) of each utterance. A system's error rate is the mean over its seeds of
``sum_u errors[s, u] / sum_u lengths[u]``.

**Interval** (:func:`interval`). The bootstrap of Bisani and Ney (2004), the definition Kaldi's
``compute-wer-bootci`` uses: draw ``N`` utterances with replacement, recompute the error rate, repeat;
the interval is the mean of the replicates +- 1.96 of their standard deviation (Kaldi's form), and we
also give the 2.5 and 97.5 percentiles. With several seeds the variation between training runs is a
second source of error, so each replicate also draws ``S`` seeds with replacement (a two-level
bootstrap): replicate ``b`` is ``mean_k sum_j errors[s*_k, u*_j] / sum_j lengths[u*_j]`` for seeds
``s*`` and utterances ``u*`` drawn independently. With one seed it is exactly the utterance bootstrap.
With few seeds (3) resampling them understates the spread between seeds by a factor ``sqrt((S-1)/S)``
and cannot see beyond the seeds that were run: read such intervals as a lower bound on the
uncertainty.

**Probability of improvement** (:func:`probability_of_improvement`): the fraction of replicates in
which system B has strictly fewer errors than system A (Kaldi: "probability of hyp2 being better").
Both systems are scored on the same drawn utterances (the pairing); their seeds are drawn
independently (seed 1 of one system has nothing to do with seed 1 of another).

**Matched pairs** (:func:`matched_pairs`): with ``d_u`` the difference of the two systems' errors on
utterance ``u`` (averaged over each system's seeds), the NIST MAPSSWE test with every utterance as one
segment (Gillick and Cox 1989): ``z = mean(d) / (sd(d) / sqrt(N))``, two-sided normal p-value. And the
**sign test** (:func:`sign_test`): of the utterances where the two differ, how many B wins, against a
fair coin, exact two-sided binomial p-value.

>>> import numpy as np
>>> a = np.array([[1, 0, 2, 1]]); b = np.array([[0, 0, 1, 1]]); n = np.array([5, 5, 5, 5])
>>> round(error_rate(a, n), 3), round(error_rate(b, n), 3)
(0.2, 0.1)
>>> sign_test(a, b).wins, sign_test(a, b).losses, round(sign_test(a, b).p_value, 3)
(2, 0, 0.5)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

REPLICATIONS = 10000  # compute-wer-bootci's default


def _check(errors: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    errors = np.atleast_2d(np.asarray(errors, dtype=np.float64))
    lengths = np.asarray(lengths, dtype=np.float64)
    if errors.ndim != 2 or errors.shape[1] != len(lengths) or len(lengths) == 0:
        raise ValueError(f"errors must be (seeds, utterances) for {len(lengths)} utterance lengths, got {errors.shape}")
    if lengths.sum() <= 0:
        raise ValueError("the utterances have no reference tokens")
    return errors, lengths


def error_rate(errors, lengths) -> float:
    """The mean over seeds of each seed's error rate (a fraction)."""
    errors, lengths = _check(errors, lengths)
    return float((errors.sum(axis=1) / lengths.sum()).mean())


def _utterance_draws(rng: np.random.Generator, count: int, replications: int) -> np.ndarray:
    """``(B, N)``: how often each utterance is drawn in each replicate (``N`` draws with replacement)."""
    return rng.multinomial(count, np.full(count, 1.0 / count), size=replications).astype(np.float64)


def _replicates(errors: np.ndarray, lengths: np.ndarray, draws: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """``(B,)`` error rates of the replicates: the drawn utterances, and seeds drawn with replacement."""
    per_seed = draws @ errors.T / (draws @ lengths)[:, None]  # (B, S): each seed on the drawn utterances
    seeds = rng.integers(0, errors.shape[0], size=per_seed.shape)  # (B, S) drawn seeds
    return np.take_along_axis(per_seed, seeds, axis=1).mean(axis=1)


@dataclass(frozen=True)
class Interval:
    """An error rate (fractions) with its bootstrap distribution: ``mean`` +- ``half_width`` (Kaldi's
    1.96 standard deviations) and the percentile interval ``[low, high]``."""

    rate: float  # the point estimate (mean over seeds)
    mean: float  # the mean of the replicates
    half_width: float
    low: float
    high: float


def interval(errors, lengths, replications: int = REPLICATIONS, seed: int = 0) -> Interval:
    """The 95 % bootstrap interval of one system's error rate (see the module docstring)."""
    errors, lengths = _check(errors, lengths)
    rng = np.random.default_rng(seed)
    reps = _replicates(errors, lengths, _utterance_draws(rng, len(lengths), replications), rng)
    low, high = np.percentile(reps, [2.5, 97.5])
    return Interval(error_rate(errors, lengths), float(reps.mean()), float(1.96 * reps.std()), float(low), float(high))


def probability_of_improvement(errors_a, errors_b, lengths, replications: int = REPLICATIONS, seed: int = 0) -> float:
    """The fraction of paired bootstrap replicates in which system B makes strictly fewer errors than A."""
    errors_a, lengths = _check(errors_a, lengths)
    errors_b, _ = _check(errors_b, lengths)
    rng = np.random.default_rng(seed)
    draws = _utterance_draws(rng, len(lengths), replications)  # the same utterances for both systems
    difference = _replicates(errors_b, lengths, draws, rng) - _replicates(errors_a, lengths, draws, rng)
    return float((difference < -1e-12).mean())


@dataclass(frozen=True)
class PairedTest:
    """A two-sided test of two systems over the same utterances: its statistic and p-value."""

    statistic: float
    p_value: float
    wins: int = 0  # utterances where B made fewer errors (sign test)
    losses: int = 0  # utterances where B made more


def _per_utterance_difference(errors_a, errors_b) -> np.ndarray:
    a = np.atleast_2d(np.asarray(errors_a, dtype=np.float64)).mean(axis=0)
    b = np.atleast_2d(np.asarray(errors_b, dtype=np.float64)).mean(axis=0)
    if a.shape != b.shape:
        raise ValueError(f"the two systems were scored on different utterances: {a.shape} and {b.shape}")
    return b - a


def matched_pairs(errors_a, errors_b) -> PairedTest:
    """MAPSSWE with utterances as segments: ``z`` of the mean per-utterance error difference (B - A),
    two-sided normal p-value. Identical systems give ``z = 0, p = 1``."""
    d = _per_utterance_difference(errors_a, errors_b)
    sd = d.std(ddof=1) if len(d) > 1 else 0.0
    if sd == 0:
        return PairedTest(0.0 if d.mean() == 0 else math.copysign(math.inf, d.mean()), 1.0 if d.mean() == 0 else 0.0)
    z = d.mean() / (sd / math.sqrt(len(d)))
    return PairedTest(float(z), float(math.erfc(abs(z) / math.sqrt(2))))


def sign_test(errors_a, errors_b) -> PairedTest:
    """Exact two-sided sign test over the utterances where the systems' (seed-averaged) errors differ."""
    d = _per_utterance_difference(errors_a, errors_b)
    wins, losses = int((d < 0).sum()), int((d > 0).sum())
    n, k = wins + losses, min(wins, losses)
    p = min(1.0, 2 * sum(math.comb(n, i) for i in range(k + 1)) / 2 ** n) if n else 1.0
    return PairedTest(float(wins - losses), p, wins, losses)

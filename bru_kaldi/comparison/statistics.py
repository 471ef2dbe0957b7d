"""How sure a comparison of error rates is: bootstrap intervals, a run-level test whose unit is the
training run, utterance-level tests, and the power of the design, with one or several seeds per system.

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
independently, as if seed 1 of one system had nothing to do with seed 1 of another (but see
**Seeds shared by configs** below).

**Matched pairs** (:func:`matched_pairs`): with ``d_u`` the difference of the two systems' errors on
utterance ``u`` (averaged over each system's seeds), the NIST MAPSSWE test with every utterance as one
segment (Gillick and Cox 1989): ``z = mean(d) / (sd(d) / sqrt(N))``, two-sided normal p-value. And the
**sign test** (:func:`sign_test`): of the utterances where the two differ, how many B wins, against a
fair coin, exact two-sided binomial p-value. Both see only the variation between utterances: they
answer whether these trained networks differ on utterances like these, not whether training the two
configs again would give the same order. **Utterance-only tests**, labelled so wherever they are shown.

**The run-level test** (:func:`run_level`), the one a verdict rests on. A seed repeats the whole
training run, so the runs, not the utterances, are what a comparison of configs replicates. With
``r_s`` each seed's error rate on the test set and ``D = mean(r_B) - mean(r_A)``, the variance of ``D``
has two parts: the training runs', ``s_A^2 / S_A + s_B^2 / S_B`` (the sample variances of the per-seed
rates), and the test set's, ``N var(d) / L^2`` (``d_u`` the seed-averaged difference of error counts on
utterance ``u``, ``L`` the reference tokens: the variance of the rate difference that drawing another
test set of ``N`` utterances would give, the same quantity as the matched-pairs test's). The test is
``t = D / sqrt(sum of both)`` with Welch-Satterthwaite degrees of freedom (the three variance terms with
``S_A - 1``, ``S_B - 1`` and ``N - 1``), two-sided. The test set's term is taken from seed-averaged
errors, which still carry part of the seeds' variation: counted twice, it makes the test a little
conservative. With one seed in either system the training runs' variance is unknown and there is no
run-level test: a comparison of single runs is not resolved, whatever the utterance-only tests say.

**Seeds shared by configs.** Seed ``k`` of every config draws the same batches in the same order
(the order comes from ``(seed, epoch, chunk)``), so a seed whose order happens to help or hurt does so
for every config: in the built-in corpus's study, at seed 3, the rate of twelve of the thirteen
configs first halves after the same epoch (the fourth, whose dev error does not improve), and seed 3
is one of the two worst of five seeds in twelve of the thirteen configs. Treating the two systems'
seeds as independent, as the tests here do, then overstates the variance of the difference: the run-level test
and the interval are conservative for such pairs. A test paired by seed would resolve more of those
pairs, but fewer of those whose seeds' errors do not move together (it has half the degrees of
freedom), and it needs the same seeds in both systems, which a study under way does not have.

**Power** (:attr:`RunLevelTest.resolvable`, :attr:`RunLevelTest.seeds_needed`): the difference this
design resolves with probability 0.8 at the level, ``(t_{df, 1 - alpha/2} + t_{df, 0.8}) SE``, and the
seeds per system with which the observed difference would be resolved with that probability, if the
variances observed are the true ones (the training runs' part shrinks as ``1 / S``, the test set's
does not: a difference below its floor needs a larger test set, not more seeds: ``None``); given a
``target`` difference, the seeds per system that would resolve it so
(:attr:`RunLevelTest.seeds_for_target`: what a study that means to resolve that difference should
run). The floor (:attr:`RunLevelTest.floor`) is what unlimited seeds would resolve: the same formula
with the test set's variance alone and ``N - 1`` degrees of freedom. Planning figures, from a few
seeds' variances: rough.

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
from typing import Optional

import numpy as np
from scipy import stats as scipy_stats

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


@dataclass(frozen=True)
class RunLevelTest:
    """B against A with the training run as the unit (see the module docstring); rates are fractions."""

    difference: float  # mean over B's seeds minus mean over A's, of the per-seed error rates
    standard_error: float
    seed_variance: float  # the training runs' part of standard_error ** 2
    utterance_variance: float  # the test set's part
    df: float  # Welch-Satterthwaite degrees of freedom
    statistic: float  # t
    p_value: float  # two-sided
    low: float  # the 1 - alpha interval of the difference
    high: float
    resolvable: float  # the difference this design resolves with probability `power` at the level
    seeds_needed: Optional[int]  # seeds per system to resolve `difference` so; None: no number of seeds does
    seeds: tuple[int, int]
    floor: float  # what unlimited seeds would resolve so: the test set's part alone
    target: Optional[float] = None  # a difference a study means to resolve (``run_level``'s ``target``)
    seeds_for_target: Optional[int] = None  # seeds per system to resolve `target` so; None: none does, or no target

    def reading(self, alpha: float = 0.05) -> str:
        """``better``/``worse`` (B than A) where this test says so at ``alpha``, else ``not resolved with
        S_B / S_A seeds`` (B's first, as the pairs table's column "seeds": system / against)."""
        if self.p_value < alpha:
            return f"{'better' if self.difference < 0 else 'worse'} (p < {alpha:g})"
        return f"not resolved with {self.seeds[1]} / {self.seeds[0]} seeds"


MAX_SEEDS = 1000  # the search for the seeds a difference needs stops here


def _welch(parts: list[tuple[float, float]]) -> tuple[float, float]:
    """``(variance, df)`` of a sum of independent variance estimates ``(v_i, df_i)`` (Welch-Satterthwaite)."""
    variance = sum(v for v, _ in parts)
    denominator = sum(v * v / df for v, df in parts if v > 0)
    return variance, (variance * variance / denominator if denominator > 0 else math.inf)


def _detectable(variance: float, df: float, alpha: float, power: float) -> float:
    """The difference a two-sided t test at ``alpha`` finds with probability ``power``."""
    return float((scipy_stats.t.ppf(1 - alpha / 2, df) + scipy_stats.t.ppf(power, df)) * math.sqrt(variance))


def run_level(errors_a, errors_b, lengths, alpha: float = 0.05, power: float = 0.8,
              target: Optional[float] = None) -> Optional[RunLevelTest]:
    """The run-level test of B against A (module docstring); ``None`` where a system has one seed.

    ``errors_a`` ``(S_A, N)``, ``errors_b`` ``(S_B, N)`` errors per seed and utterance, ``lengths`` ``(N,)``;
    ``target`` (a fraction, e.g. 0.015): a difference a study plans to resolve, whose seeds per system
    the test gives as :attr:`RunLevelTest.seeds_for_target`, as it gives the observed difference's.
    """
    errors_a, lengths = _check(errors_a, lengths)
    errors_b, _ = _check(errors_b, lengths)
    sizes = (errors_a.shape[0], errors_b.shape[0])
    if min(sizes) < 2:
        return None
    total, count = lengths.sum(), len(lengths)
    rates_a, rates_b = errors_a.sum(axis=1) / total, errors_b.sum(axis=1) / total
    difference = float(rates_b.mean() - rates_a.mean())
    seed_parts = [(float(r.var(ddof=1)) / len(r), len(r) - 1) for r in (rates_a, rates_b)]
    d = errors_b.mean(axis=0) - errors_a.mean(axis=0)
    utterance_part = (count * float(d.var(ddof=1)) / float(total) ** 2 if count > 1 else 0.0, max(count - 1, 1))
    variance, df = _welch(seed_parts + [utterance_part])
    variance, df = float(variance), float(df)
    if variance == 0:
        statistic = 0.0 if difference == 0 else math.copysign(math.inf, difference)
        p_value = 1.0 if difference == 0 else 0.0
    else:
        statistic = difference / math.sqrt(variance)
        p_value = float(2 * scipy_stats.t.sf(abs(statistic), df))
    half = float(scipy_stats.t.ppf(1 - alpha / 2, df) * math.sqrt(variance))

    def detectable_with(seeds: int) -> float:  # both systems with `seeds` runs, the variances as observed
        parts = [(v * n / seeds, seeds - 1) for (v, _), n in zip(seed_parts, sizes)] + [utterance_part]
        return _detectable(*_welch(parts), alpha, power)

    def seeds_to_resolve(wanted: Optional[float]) -> Optional[int]:
        if not wanted:
            return None
        return next((n for n in range(2, MAX_SEEDS + 1) if detectable_with(n) <= abs(wanted)), None)

    return RunLevelTest(difference, math.sqrt(variance), sum(v for v, _ in seed_parts), utterance_part[0], df,
                        statistic, p_value, difference - half, difference + half, _detectable(variance, df, alpha, power),
                        seeds_to_resolve(difference), sizes, _detectable(*utterance_part, alpha, power),
                        target, seeds_to_resolve(target))


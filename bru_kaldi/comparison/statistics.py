"""How sure a comparison of error rates is: bootstrap intervals, a run-level test whose unit is the
training run, utterance-only tests, and the power of the design, with one or several seeds per system.
Long because each formula is explained here, where it is computed, and the tests share their pieces
(the variance components feed the run-level test, its interval and its power alike).

Everything works on per-utterance error counts (``decode_<set>/per_utt``): ``errors`` ``(S, N)``, the
errors of each of ``S`` seeds on each of ``N`` utterances of one test set, and ``lengths`` ``(N,)``, the
reference words (or phones) of each utterance, ``L`` in all. A system's error rate is the mean over its
seeds of ``sum_u errors[s, u] / L``.

**Interval** (:func:`interval`), one system's. The bootstrap of Bisani and Ney (2004), the definition
Kaldi's ``compute-wer-bootci`` uses: draw ``N`` utterances with replacement, recompute the error rate,
repeat; the interval is the mean of the replicates +- 1.96 of their standard deviation (Kaldi's form),
and we also give the 2.5 and 97.5 percentiles (the tables' column). With several seeds the variation
between training runs is a second source of error, so each replicate also draws ``S`` seeds with
replacement (a two-level bootstrap): replicate ``b`` is ``mean_k sum_j errors[s*_k, u*_j] / sum_j
lengths[u*_j]`` for seeds ``s*`` and utterances ``u*`` drawn independently. With one seed it is exactly
the utterance bootstrap. With few seeds resampling them understates the spread between seeds by a
factor ``sqrt((S-1)/S)`` and cannot see beyond the seeds that were run: read such intervals as a lower
bound on the uncertainty.

**Matched pairs** (:func:`matched_pairs`): with ``d_u`` the difference of the two systems' errors on
utterance ``u`` (averaged over each system's seeds), the NIST MAPSSWE test with every utterance as one
segment (Gillick and Cox 1989): ``z = mean(d) / (sd(d) / sqrt(N))``, two-sided normal p-value. And the
**sign test** (:func:`sign_test`): of the utterances where the two differ, how many B wins, against a
fair coin, exact two-sided binomial p-value. Both see only the variation between utterances: they
answer whether these trained networks differ on utterances like these, not whether training the two
configs again would give the same order. **Utterance-only tests**, labelled so wherever they are shown.

**Variance components** (:func:`variance_components`). A seed repeats the whole training run, so the
runs, not the utterances, are what a comparison of configs replicates. Of system ``X``'s errors,
``e[s, u] = c_u + a_s + g[s, u]``: what the utterance asks of the system (``c_u``), what the seed does
to every utterance (``a_s``), and what it does to one utterance alone (``g``, the seed x utterance
interaction). With ``r_s`` each seed's error rate and ``D = mean(r_B) - mean(r_A)``:

- the runs' part of ``var(D)`` is ``s_A^2 / S_A + s_B^2 / S_B``, ``s_X^2`` the sample variance of
  system X's per-seed rates (``S_X - 1`` degrees of freedom). A seed's ``a_s`` and its ``g[s, u]``
  both move ``r_s``, so this holds the interaction already, divided by ``S_X``;
- the interaction, ``N MS_X / L^2`` a run, ``MS_X`` the residual mean square of the two-way table
  ``e[s, u]`` (seeds x utterances, one count a cell: ``sum (e - row mean - column mean + grand
  mean)^2 / ((S_X - 1)(N - 1))``);
- the test set's part: how much ``D`` would move on another test set of ``N`` utterances. From the
  seed-averaged differences ``d_u``, the spread ``N sum_u (d_u - D n_u)^2 / ((N - 1) L^2)`` (``n_u``
  the utterance's length: ``D`` is a ratio of sums, and ``d_u - D n_u`` its residual) holds it, and
  each system's interaction once more, divided by its seeds. Counted as it is, that interaction
  would be counted twice and would not shrink with more seeds: so the test set's part is the spread
  less ``N MS_A / (S_A L^2) + N MS_B / (S_B L^2)`` (none where that is negative). Its degrees of
  freedom are Satterthwaite's for that difference; with unlimited seeds they would be ``N - 1``.

**The run-level test** (:func:`run_level`), the one a verdict rests on: ``t = D / sqrt(the runs' part
+ the test set's part)``, with the Welch-Satterthwaite degrees of freedom of the whole sum, two-sided.
``P(better)`` is read off the same ``t`` distribution: the probability that B's expected error rate is
below A's, given ``D`` and its standard error (a flat prior); above 0.975 exactly where the test calls
B better at 5 %. With one seed in either system the runs' variance is unknown and there is no run-level
test: a comparison of single runs is not resolved, whatever the utterance-only tests say. With fewer
than three seeds it is approximate (``APPROXIMATE_BELOW``): each system's spread then rests on one
degree of freedom, so the test leans wholly on the seeds' rates being normal, which two seeds cannot
check. ``bench/power_simulation.py`` simulates studies with known components (normal seeds), whose
table RESULTS.md keeps: at 2, 3 and 5 seeds a system the test's false positives and its interval's
coverage are close to their 5 and 95 %, and the test set's part is estimated without the double count.

**Seeds shared by configs.** Seed ``k`` of every config draws the same batches in the same order
(the order comes from ``(seed, epoch, chunk)``), so the two systems' seed x utterance interactions are
correlated (measured on the archived studies: -0.05 to +0.17), and the seed-averaged spread then holds
``(g_A + g_B - 2 cov) / S``, not ``(g_A + g_B) / S``: subtracting each system's interaction alone
takes too much, and the test set's part (the floor) comes out too small, as low as 0. Where the two
systems ran the same seeds (``paired``), the interaction is taken from the seed-paired differences
instead, ``delta[s, u] = e_B[s, u] - e_A[s, u]``: the residual mean square of that table estimates
``g_A + g_B - 2 cov`` whatever the correlation, and the test set's part is the spread less ``N MS_delta
/ (S L^2)``. ``bench/power_simulation.py`` checks it on simulated paired studies with a known correlation.
A seed whose order happens to help or hurt does so for every config: in the built-in corpus's study, at seed 3, the rate of twelve of the thirteen
configs first halves after the same epoch (the fourth, whose dev error does not improve), and seed 3
is one of the two worst of five seeds in twelve of the thirteen configs. Treating the two systems'
seeds as independent, as the tests here do, then overstates the variance of the difference: the run-level test
and the interval are conservative for such pairs. A test paired by seed would resolve more of those
pairs, but fewer of those whose seeds' errors do not move together (it has half the degrees of
freedom), and it needs the same seeds in both systems, which a study under way does not have.

**Power** (:attr:`RunLevelTest.resolvable`, :attr:`RunLevelTest.seeds_needed`): the difference this
design resolves with probability 0.8 at the level, ``(t_{df, 1 - alpha/2} + t_{df, 0.8}) SE``, and the
seeds per system with which the observed difference would be resolved with that probability, if the
components estimated are the true ones. With ``S`` seeds a system the runs' part is ``s_X^2 / S`` each
(the interaction in it shrinking with the seeds) and the test set's part stays, with the degrees of
freedom that design would have. A difference below the test set's floor needs a larger test set, not
more seeds (``None``). Given a ``target`` difference, the seeds per system that would resolve it so
(:attr:`RunLevelTest.seeds_for_target`: what a study that means to resolve that difference should
run). The floor (:attr:`RunLevelTest.floor`) is what unlimited seeds would resolve: the test set's part
alone, with ``N - 1`` degrees of freedom. Planning figures, from a few seeds' variances: rough.

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
from functools import cached_property
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


def bootstrap_probability_of_improvement(errors_a, errors_b, lengths, replications: int = REPLICATIONS,
                                         seed: int = 0) -> float:
    """The fraction of paired bootstrap replicates of the utterances in which B makes strictly fewer errors
    than A (Kaldi's ``compute-wer-bootci``): one run of each system, so it sees only the test set's variation,
    never the seeds' (between systems of several seeds, read the run-level ``P(better)`` instead).

    Shapes: ``errors_a``, ``errors_b``, ``lengths`` ``(utterances,)``.

    >>> bootstrap_probability_of_improvement([1, 1, 1], [0, 0, 0], [2, 2, 2])
    1.0
    """
    errors_a, lengths = _check(errors_a, lengths)
    errors_b, _ = _check(errors_b, lengths)
    rng = np.random.default_rng(seed)
    draws = _utterance_draws(rng, len(lengths), replications)  # the same utterances for both systems
    difference = _replicates(errors_b, lengths, draws, rng) - _replicates(errors_a, lengths, draws, rng)
    return float((difference < -1e-12).mean())


MAX_SEEDS = 1000  # the search for the seeds a difference needs stops here
APPROXIMATE_BELOW = 3  # seeds: with fewer in either system the run-level test is approximate (module docstring)


def _welch(parts: list[tuple[float, float]]) -> tuple[float, float]:
    """``(variance, df)`` of a sum of independent variance estimates ``(v_i, df_i)``, some of them subtracted
    (``v_i < 0``): Welch-Satterthwaite, ``df = (sum v_i)^2 / sum (v_i^2 / df_i)``."""
    variance = sum(v for v, _ in parts)
    denominator = sum(v * v / df for v, df in parts if v != 0)
    return variance, (variance * variance / denominator if denominator > 0 else math.inf)


def detectable(variance: float, df: float, alpha: float, power: float) -> float:
    """The difference a two-sided t test at ``alpha`` finds with probability ``power``, where the difference's
    estimate has ``variance`` with ``df`` degrees of freedom: ``(t_{df, 1 - alpha/2} + t_{df, power}) sqrt(variance)``.

    >>> round(detectable(1.0, math.inf, 0.05, 0.8), 4)  # 1.960 + 0.842, the normal's
    2.8016
    >>> round(detectable(4.0, 10, 0.05, 0.8), 4)  # (2.228 + 0.879) x 2, t's at 10 df
    6.2144
    """
    return float((scipy_stats.t.ppf(1 - alpha / 2, df) + scipy_stats.t.ppf(power, df)) * math.sqrt(variance))


def _interaction(errors: np.ndarray) -> float:
    """The residual mean square of the two-way table ``errors`` ``(S, N)`` (seeds x utterances, one count a
    cell): what a seed does to one utterance beyond what it does to all (squared counts)."""
    seeds, count = errors.shape
    residual = errors - errors.mean(axis=1, keepdims=True) - errors.mean(axis=0, keepdims=True) + errors.mean()
    return float((residual ** 2).sum() / ((seeds - 1) * (count - 1)))


@dataclass(frozen=True)
class Components:
    """The parts of the variance of the run-level difference ``D`` of two systems (module docstring,
    "Variance components"); rates are fractions, so these are fractions squared."""

    seeds: tuple[int, int]  # S_A, S_B
    utterances: int  # N
    runs: tuple[float, float]  # each system's variance of one run's rate: the sample variance of its seeds' rates
    interaction: tuple[float, float]  # the part of each that is seed x utterance interaction, N MS / L^2
    spread: float  # N var(d_u - D n_u) / L^2 of the seed-averaged differences: test set + interaction / seeds
    test_set: float  # the spread less the interaction / the seeds (0 where that is negative)
    # seeds paired (the same seeds in both systems): the interaction of the seed-paired differences,
    # N MS_delta / L^2 (module docstring, "Seeds shared by configs"); None: the seeds are not paired
    paired_interaction: Optional[float] = None

    def variance(self, seeds: Optional[int] = None) -> tuple[float, float]:
        """``(variance, df)`` of ``D`` with the seeds run, or with ``seeds`` per system if the components
        are the true ones: the runs' part and the interaction shrink as ``1 / seeds``, the test set's part
        stays, and the spread it is estimated from has ``N - 1`` degrees of freedom, the interaction
        ``(S - 1)(N - 1)``."""
        sizes = self.seeds if seeds is None else (seeds, seeds)
        parts = [(runs / n, n - 1) for runs, n in zip(self.runs, sizes)]
        if self.test_set > 0:
            if self.paired_interaction is not None:
                shares = [(self.paired_interaction / sizes[0], (sizes[0] - 1) * (self.utterances - 1))]
            else:
                shares = [(g / n, (n - 1) * (self.utterances - 1)) for g, n in zip(self.interaction, sizes)]
            parts += [(self.test_set + sum(v for v, _ in shares), self.utterances - 1)]
            parts += [(-v, df) for v, df in shares]
        return _welch(parts)


def variance_components(errors_a, errors_b, lengths, paired: bool = False) -> Components:
    """The :class:`Components` of B against A: ``errors_a`` ``(S_A, N)``, ``errors_b`` ``(S_B, N)`` errors per
    seed and utterance (at least two seeds each), ``lengths`` ``(N,)``. ``paired``: row ``s`` of both is the
    same seed (module docstring, "Seeds shared by configs"), and the interaction comes from their differences.

    >>> a = [[1, 1, 1, 1], [2, 2, 2, 2]]  # A's second seed: one more error on every utterance
    >>> c = variance_components(a, [[2, 1, 1, 1], [3, 2, 2, 2]], [5, 5, 5, 5])  # B: one more on the first
    >>> [round(v, 6) for v in (*c.runs, *c.interaction, c.spread, c.test_set)]
    [0.02, 0.02, 0.0, 0.0, 0.0025, 0.0025]
    >>> c = variance_components(a, [[3, 1, 1, 1], [2, 2, 2, 2]], [5, 5, 5, 5])  # B's seeds differ on one utterance
    >>> [round(v, 6) for v in (*c.runs, *c.interaction, c.spread, c.test_set)]  # all of it interaction
    [0.02, 0.005, 0.0, 0.005, 0.0025, 0.0]
    >>> a = [[2, 1, 1, 1], [1, 2, 1, 1]]  # seed 1: one error more on the first utterance, seed 2 on the second
    >>> b = [[3, 1, 1, 1], [2, 2, 1, 1]]  # the same seeds doing the same, and B one error worse on the first
    >>> variance_components(a, b, [5, 5, 5, 5]).test_set  # the interaction taken twice: nothing left
    0.0
    >>> c = variance_components(a, b, [5, 5, 5, 5], paired=True)  # it cancels in the seed-paired differences
    >>> round(c.paired_interaction, 6), round(c.test_set, 6), round(c.spread, 6)
    (0.0, 0.0025, 0.0025)
    """
    errors_a, lengths = _check(errors_a, lengths)
    errors_b, _ = _check(errors_b, lengths)
    sizes = (errors_a.shape[0], errors_b.shape[0])
    if min(sizes) < 2:
        raise ValueError(f"variance components need two seeds of each system, got {sizes[0]} and {sizes[1]}")
    total, count = float(lengths.sum()), len(lengths)
    runs = tuple(float((e.sum(axis=1) / total).var(ddof=1)) for e in (errors_a, errors_b))
    if count < 2:  # one utterance: no test set's variance to speak of
        return Components(sizes, count, runs, (0.0, 0.0), 0.0, 0.0)
    interaction = tuple(count * _interaction(e) / total ** 2 for e in (errors_a, errors_b))
    d = errors_b.mean(axis=0) - errors_a.mean(axis=0)
    spread = count * float(((d - d.sum() / total * lengths) ** 2).sum()) / (count - 1) / total ** 2
    paired_interaction = None
    if paired:
        if sizes[0] != sizes[1]:
            raise ValueError(f"paired seeds need as many seeds in both systems, got {sizes[0]} and {sizes[1]}")
        paired_interaction = count * _interaction(errors_b - errors_a) / total ** 2
        test_set = spread - paired_interaction / sizes[0]
    else:
        test_set = spread - sum(g / n for g, n in zip(interaction, sizes))
    return Components(sizes, count, runs, interaction, spread, max(test_set, 0.0), paired_interaction)


@dataclass(frozen=True)
class RunLevelTest:
    """B against A with the training run as the unit (see the module docstring); rates are fractions."""

    difference: float  # D: mean over B's seeds minus mean over A's, of the per-seed error rates
    standard_error: float
    seed_variance: float  # the training runs' part of standard_error ** 2
    utterance_variance: float  # the test set's part
    df: float  # Welch-Satterthwaite degrees of freedom
    statistic: float  # t
    p_value: float  # two-sided
    low: float  # the 1 - alpha interval of the difference
    high: float
    probability_better: float  # P(B's expected error rate below A's), from the same t distribution
    seeds: tuple[int, int]
    components: Components
    alpha: float = 0.05
    power: float = 0.8
    target: Optional[float] = None  # a difference a study means to resolve (``run_level``'s ``target``)

    @property
    def approximate(self) -> bool:
        """Whether a system has fewer than ``APPROXIMATE_BELOW`` seeds (module docstring)."""
        return min(self.seeds) < APPROXIMATE_BELOW

    def reading(self, alpha: float = 0.05) -> str:
        """``better``/``worse`` (B than A) where this test says so at ``alpha``, else ``not resolved with
        S_B / S_A seeds`` (B's first, as the pairs table's column "seeds": system / against); with fewer
        than ``APPROXIMATE_BELOW`` seeds, saying that the test is approximate."""
        caveat = f"an approximate test below {APPROXIMATE_BELOW} seeds" if self.approximate else ""
        if self.p_value < alpha:
            return f"{'better' if self.difference < 0 else 'worse'} (p < {alpha:g}{'; ' + caveat if caveat else ''})"
        return f"not resolved with {self.seeds[1]} / {self.seeds[0]} seeds" + (f" ({caveat})" if caveat else "")

    @property
    def resolvable(self) -> float:
        """The difference this design resolves with probability ``power`` at ``alpha``."""
        return detectable(self.standard_error ** 2, self.df, self.alpha, self.power)

    @property
    def floor(self) -> float:
        """What unlimited seeds would resolve so: the test set's part alone, with ``N - 1`` degrees of freedom."""
        return detectable(self.components.test_set, max(self.components.utterances - 1, 1), self.alpha, self.power)

    def seeds_to_resolve(self, wanted: Optional[float]) -> Optional[int]:
        """The fewest seeds per system (2 to ``MAX_SEEDS``) with which a difference of ``wanted`` would be
        resolved with probability ``power``, the components being the true ones; None where none does."""
        if not wanted:
            return None
        return next((n for n in range(2, MAX_SEEDS + 1)
                     if detectable(*self.components.variance(n), self.alpha, self.power) <= abs(wanted)), None)

    @cached_property
    def seeds_needed(self) -> Optional[int]:
        """Seeds per system to resolve the observed difference; None: no number of seeds does."""
        return self.seeds_to_resolve(self.difference)

    @cached_property
    def seeds_for_target(self) -> Optional[int]:
        """Seeds per system to resolve ``target``; None: none does, or no target."""
        return self.seeds_to_resolve(self.target)


def run_level(errors_a, errors_b, lengths, alpha: float = 0.05, power: float = 0.8,
              target: Optional[float] = None, paired: bool = False) -> Optional[RunLevelTest]:
    """The run-level test of B against A (module docstring); ``None`` where a system has one seed.

    ``errors_a`` ``(S_A, N)``, ``errors_b`` ``(S_B, N)`` errors per seed and utterance, ``lengths`` ``(N,)``;
    ``target`` (a fraction, e.g. 0.015): a difference a study plans to resolve, whose seeds per system
    the test gives as :attr:`RunLevelTest.seeds_for_target`, as it gives the observed difference's;
    ``paired``: row ``s`` of both is the same seed (:func:`variance_components`).
    """
    errors_a, lengths = _check(errors_a, lengths)
    errors_b, _ = _check(errors_b, lengths)
    if min(errors_a.shape[0], errors_b.shape[0]) < 2:
        return None
    components = variance_components(errors_a, errors_b, lengths, paired)
    difference = error_rate(errors_b, lengths) - error_rate(errors_a, lengths)
    variance, df = components.variance()
    if variance == 0:
        statistic = 0.0 if difference == 0 else math.copysign(math.inf, difference)
        p_value = 1.0 if difference == 0 else 0.0
        better = 1.0 if difference < 0 else 0.0
    else:
        statistic = difference / math.sqrt(variance)
        p_value = float(2 * scipy_stats.t.sf(abs(statistic), df))
        better = float(scipy_stats.t.cdf(-statistic, df))
    half = float(scipy_stats.t.ppf(1 - alpha / 2, df) * math.sqrt(variance))
    seed_variance = sum(runs / n for runs, n in zip(components.runs, components.seeds))
    return RunLevelTest(difference, math.sqrt(variance), seed_variance, components.test_set, df, statistic, p_value,
                        difference - half, difference + half, better, components.seeds, components, alpha, power,
                        target)

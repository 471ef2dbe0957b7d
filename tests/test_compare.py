"""compare.py: the statistics against hand-computed cases, the table of experiment folders, and a sweep on
the tiny corpus that is killed and resumed."""

import math
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from scipy import stats as scipy_stats

import compare
from bru_kaldi.comparison import report, statistics
from bru_kaldi.comparison.runs import find_runs, group
from bru_kaldi.config import option_default

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "tests" / "data" / "tiny_liBRU.cfg"


# --------------------------------------------------------------------------- statistics, by hand
def test_one_utterance_one_seed_has_no_spread():
    iv = statistics.interval([[3]], [10], replications=200)
    assert (iv.rate, iv.mean, iv.low, iv.high) == pytest.approx((0.3, 0.3, 0.3, 0.3)) and iv.half_width < 1e-12


def test_the_interval_is_the_2_5_and_97_5_percentiles_of_an_exact_distribution():
    """One seed of ten one-token utterances, three of them wrong: the bootstrap's rate is Binomial(10, 0.3) / 10
    exactly. Its 2.5 % point is 0 (P(X = 0) = 0.7^10 = 0.028 > 0.025) and its 97.5 % point 0.6 (P(X <= 5) = 0.953,
    P(X <= 6) = 0.989); a 90 % interval (5 and 95 %) would be 0.1 to 0.5."""
    assert scipy_stats.binom.cdf([0, 1, 4, 5, 6], 10, 0.3) == pytest.approx([0.0282, 0.1493, 0.8497, 0.9527, 0.9894],
                                                                             abs=1e-4)
    iv = statistics.interval([[1, 1, 1, 0, 0, 0, 0, 0, 0, 0]], [1] * 10, replications=40000)
    assert (iv.low, iv.high) == (pytest.approx(0.0), pytest.approx(0.6))
    assert iv.half_width == pytest.approx(1.96 * math.sqrt(0.3 * 0.7 / 10), rel=0.02)  # Kaldi's 1.96 sd


def test_two_seeds_on_one_utterance_give_the_seed_distribution():
    """Each replicate is the mean of two seeds drawn from {0.1, 0.5}: 0.1 (1/4), 0.3 (1/2), 0.5 (1/4)."""
    iv = statistics.interval([[1], [5]], [10], replications=40000)
    assert iv.rate == pytest.approx(0.3)
    assert (iv.low, iv.high) == pytest.approx((0.1, 0.5))
    assert iv.mean == pytest.approx(0.3, abs=0.005)
    assert iv.half_width == pytest.approx(1.96 * 0.4 / (2 * math.sqrt(2)), rel=0.02)  # sd = |0.5 - 0.1| / (2 sqrt 2)


def test_utterance_bootstrap_agrees_with_kaldis_loop():
    """One seed: mean and 1.96 sd of the replicates, as compute-wer-bootci computes them, from a plain loop."""
    rng = np.random.default_rng(3)
    lengths = rng.integers(5, 30, size=40)
    errors = rng.binomial(lengths, 0.2)
    reps = []
    for _ in range(20000):
        pick = rng.integers(0, 40, size=40)
        reps.append(errors[pick].sum() / lengths[pick].sum())
    iv = statistics.interval([errors], lengths, replications=20000, seed=1)
    assert iv.rate == pytest.approx(errors.sum() / lengths.sum())
    assert iv.mean == pytest.approx(np.mean(reps), abs=0.002)
    assert iv.half_width == pytest.approx(1.96 * np.std(reps), rel=0.05)


def test_matched_pairs_by_hand():
    # d = B - A = [-1, -2, 0, 1]: mean -0.5, sd sqrt(5/3), z = -0.5 / (sd / 2)
    test = statistics.matched_pairs([[2, 3, 1, 0]], [[1, 1, 1, 1]])
    z = -0.5 / (math.sqrt(5 / 3) / 2)
    assert test.statistic == pytest.approx(z) and test.p_value == pytest.approx(math.erfc(abs(z) / math.sqrt(2)))
    assert test.p_value == pytest.approx(0.4386, abs=1e-4)
    assert statistics.matched_pairs([[1, 2]], [[1, 2]]).p_value == 1.0


def test_sign_test_by_hand():
    a = [[1] * 10 + [0] * 5]
    b = [[0] * 8 + [2] * 2 + [0] * 5]  # B wins 8, loses 2, ties 5
    test = statistics.sign_test(a, b)
    assert (test.wins, test.losses) == (8, 2)
    assert test.p_value == pytest.approx(2 * (1 + 10 + 45) / 1024)
    # several seeds: the per-utterance errors are averaged first
    assert statistics.sign_test([[1, 0], [1, 2]], [[0, 1], [0, 1]]).wins == 1


def test_run_level_test_when_the_seeds_disagree():
    """Every utterance says B is better (the utterance-only tests at p ~ 0), but B's seeds range over A's:
    A's seeds have error rates 0.2, 0.4, 0.3 and B's 0.4, 0.1, 0.2 on every utterance alike. With no
    variation between utterances the run-level test is Welch's t on the per-seed rates."""
    lengths = np.full(20, 10)
    a = np.array([[2] * 20, [4] * 20, [3] * 20])
    b = np.array([[4] * 20, [1] * 20, [2] * 20])
    assert statistics.matched_pairs(a, b).p_value < 1e-6 and statistics.sign_test(a, b).p_value < 1e-5
    test = statistics.run_level(a, b, lengths)
    # by hand: D = 0.7/3 - 0.3, the rates' variances over seeds 0.01 and 0.07/3, each over 3 seeds;
    # df = SE^4 / sum((v / S)^2 / (S - 1))
    v_a, v_b = 0.01 / 3, 0.07 / 9
    assert test.difference == pytest.approx(-0.2 / 3)
    assert (test.seed_variance, test.utterance_variance) == (pytest.approx(v_a + v_b), pytest.approx(0, abs=1e-20))
    assert test.components.interaction == (0, 0) and test.components.spread == pytest.approx(0, abs=1e-20)
    assert test.df == pytest.approx((v_a + v_b) ** 2 / (v_a ** 2 / 2 + v_b ** 2 / 2))
    welch = scipy_stats.ttest_ind(b.sum(1) / 200, a.sum(1) / 200, equal_var=False)
    assert (test.statistic, test.p_value) == (pytest.approx(welch.statistic), pytest.approx(welch.pvalue))
    assert test.p_value == pytest.approx(0.567, abs=0.002)
    # P(better): the t distribution's mass below 0 for B - A, here a little over half (B is 6.7 points lower)
    assert test.probability_better == pytest.approx(scipy_stats.t.cdf(-welch.statistic, test.df))
    assert test.probability_better == pytest.approx(1 - test.p_value / 2)
    assert statistics.run_level(b, a, lengths).probability_better == pytest.approx(test.p_value / 2)
    assert test.reading() == "not resolved with 3 / 3 seeds"
    # B's seeds first, as the pairs table's column "seeds" (system / against); two seeds: an approximate test
    assert statistics.run_level(a, b[:2], lengths).reading() == \
        "not resolved with 2 / 3 seeds (an approximate test below 3 seeds)"

    def detectable(n):  # with n seeds each, the variances as observed: (t_.975 + t_.8) SE at the Welch df
        parts = [v_a * 3 / n, v_b * 3 / n]
        df = sum(parts) ** 2 / sum(v * v / (n - 1) for v in parts)
        return (scipy_stats.t.ppf(0.975, df) + scipy_stats.t.ppf(0.8, df)) * math.sqrt(sum(parts))

    assert test.resolvable == pytest.approx(detectable(3))
    assert detectable(60) > 0.2 / 3 >= detectable(61) and test.seeds_needed == 61
    # a study's plan: the seeds that resolve a chosen difference, 0.1 here (the first n reaching it)
    planned = statistics.run_level(a, b, lengths, target=0.1)
    assert detectable(27) > 0.1 >= detectable(28) and (planned.target, planned.seeds_for_target) == (0.1, 28)
    assert planned.seeds_needed == 61 and test.seeds_for_target is None  # no target asked
    assert statistics.run_level(a, b, lengths, target=-0.1).seeds_for_target == 28  # either side
    assert test.floor == pytest.approx(0, abs=1e-12)  # the utterances agree: unlimited seeds resolve anything


# Four utterances of 10 tokens; A's seeds 0.300 / 0.325 / 0.275, B's 0.150 / 0.150 / 0.175 (the rates' variances
# over seeds 0.000625 and 0.000625 / 3). Each seed's extra or missing errors fall on one or two utterances: the
# seed x utterance interaction, by hand below.
SEEDS_A = np.array([[3, 3, 3, 3], [4, 3, 3, 3], [3, 3, 3, 2]])
SEEDS_B = np.array([[2, 1, 2, 1], [2, 2, 1, 1], [1, 2, 2, 2]])


def test_the_interaction_is_taken_out_of_the_test_sets_part():
    """The two-way residuals of A (rows: seeds; by hand, row and column means 3 / 3.25 / 2.75 and 10/3, 3, 3,
    8/3) are -1/3 0 0 1/3; 5/12 -1/4 -1/4 1/12; -1/12 1/4 1/4 -5/12: sum of squares 5/6 over (3 - 1)(4 - 1)
    degrees of freedom, MS 5/36; B's, 5/12 -7/12 5/12 -1/4; 5/12 5/12 -7/12 -1/4; -5/6 1/6 1/6 1/2: MS 5/12.
    A run's interaction is N MS / L^2. The seed-averaged differences d = [-5/3, -4/3, -4/3, -4/3] spread by
    1/36 (N var(d) / L^2 = 1/14400): less than the interaction they hold (5/36 / 3 + 5/12 / 3 counts, squared),
    so the test set's part is none, and the test is Welch's on the per-seed rates alone."""
    lengths = np.full(4, 10)
    test = statistics.run_level(SEEDS_A, SEEDS_B, lengths)
    c = test.components
    assert c.interaction == (pytest.approx(4 * 5 / 36 / 1600), pytest.approx(4 * 5 / 12 / 1600))
    assert c.spread == pytest.approx(1 / 14400) and c.test_set == 0 and test.utterance_variance == 0
    v_a, v_b = 0.000625 / 3, 0.000625 / 3 / 3
    se = math.sqrt(v_a + v_b)
    df = se ** 4 / (v_a ** 2 / 2 + v_b ** 2 / 2)
    assert test.difference == pytest.approx(0.475 / 3 - 0.3)
    assert (test.standard_error, test.df) == (pytest.approx(se), pytest.approx(df))
    assert test.statistic == pytest.approx(-8.5) and test.p_value == pytest.approx(2 * scipy_stats.t.sf(8.5, df))
    assert test.p_value < 0.005 and test.reading() == "better (p < 0.05)"
    assert test.probability_better == pytest.approx(scipy_stats.t.cdf(8.5, df)) and test.probability_better > 0.975
    assert statistics.run_level(SEEDS_B, SEEDS_A, lengths).reading() == "worse (p < 0.05)"
    assert statistics.run_level(SEEDS_B, SEEDS_A, lengths).p_value == pytest.approx(test.p_value)
    half = scipy_stats.t.ppf(0.975, df) * se
    assert (test.low, test.high) == (pytest.approx(test.difference - half), pytest.approx(test.difference + half))
    assert test.resolvable == pytest.approx((scipy_stats.t.ppf(0.975, df) + scipy_stats.t.ppf(0.8, df)) * se)
    assert test.seeds_needed == 2 and test.floor == 0  # no test set's part: unlimited seeds resolve anything
    assert statistics.run_level(SEEDS_A, SEEDS_A, lengths).reading() == "not resolved with 3 / 3 seeds"


def test_paired_seeds_take_the_interaction_from_their_differences():
    """Simulated studies whose two systems ran the same seeds, with interactions that correlate (rho 0.5) and a
    known test set's part: from the seed-paired differences it is estimated without bias; subtracting each
    system's interaction alone takes the shared part twice and leaves next to nothing (the floor of 0.00)."""
    rng = np.random.default_rng(7)
    count, length, seeds, rho = 200, 10, 3, 0.5
    disagreement, interaction = 1.0, 4.0  # variances of b_u and of each g[s, u], in counts squared
    truth = count * disagreement / (count * length) ** 2
    paired, unpaired = [], []
    for _ in range(300):
        base = rng.normal(3.0, 1.0, count)
        shared = rng.normal(0.0, 1.0, (seeds, count))
        own = rho * shared + math.sqrt(1 - rho ** 2) * rng.normal(0.0, 1.0, (seeds, count))
        a = base + rng.normal(0.0, 0.3, (seeds, 1)) + math.sqrt(interaction) * shared
        b = base + rng.normal(0.0, math.sqrt(disagreement), count) + rng.normal(0.0, 0.3, (seeds, 1)) \
            + math.sqrt(interaction) * own
        lengths = np.full(count, length)
        c = statistics.variance_components(a, b, lengths, paired=True)
        paired.append(c.spread - c.paired_interaction / seeds)  # unclipped: its mean is the truth
        unpaired.append(statistics.variance_components(a, b, lengths).test_set)
    assert np.mean(paired) == pytest.approx(truth, rel=0.1)
    assert np.mean(unpaired) < 0.3 * truth
    with pytest.raises(ValueError, match="as many seeds in both"):
        statistics.variance_components(a, b[:2], lengths, paired=True)


def test_a_test_sets_part_that_remains_and_the_seeds_a_target_needs():
    """B as above with two more errors on the first utterance at every seed (the interaction and the seeds'
    rates' spread stay): d = [1/3, -4/3, -4/3, -4/3], D = -11/120, residuals d - D n_u = [15/12, -5/12 x 3],
    spread N (25/12) / 3 / L^2 = 25/14400; less the interaction, 5/14400 / 3 + 15/14400 / 3, leaves 55/43200.
    The run-level variance is 9/43200 + 3/43200 (the seeds') + 55/43200, its df Satterthwaite's over all five
    estimates: the spread with N - 1 = 3 df, each interaction with (3 - 1)(4 - 1) = 6, subtracted."""
    lengths = np.full(4, 10)
    b = SEEDS_B + [2, 0, 0, 0]
    test = statistics.run_level(SEEDS_A, b, lengths)
    c = test.components
    assert (c.spread, c.test_set) == (pytest.approx(25 / 14400), pytest.approx(55 / 43200))
    assert test.difference == pytest.approx(-11 / 120) and test.utterance_variance == pytest.approx(55 / 43200)
    parts = [(9 / 43200, 2), (3 / 43200, 2), (75 / 43200, 3), (-5 / 43200, 6), (-15 / 43200, 6)]
    variance = sum(v for v, _ in parts)
    df = variance ** 2 / sum(v * v / d for v, d in parts)
    assert variance == pytest.approx(67 / 43200) and df == pytest.approx(4489 / 1961.6667, rel=1e-5)
    assert (test.standard_error, test.df) == (pytest.approx(math.sqrt(variance)), pytest.approx(df))
    assert test.p_value == pytest.approx(2 * scipy_stats.t.sf(11 / 120 / math.sqrt(variance), df))
    # unlimited seeds: the test set's part alone, with N - 1 = 3 degrees of freedom
    floor = (scipy_stats.t.ppf(0.975, 3) + scipy_stats.t.ppf(0.8, 3)) * math.sqrt(55 / 43200)
    assert test.floor == pytest.approx(floor)

    def detectable(n):  # n seeds each: the seeds' parts and the interaction shrink as 1 / n, the test set's stays
        parts = [(27 / 43200 / n, n - 1), (9 / 43200 / n, n - 1), (55 / 43200 + 60 / 43200 / n, 3),
                 (-15 / 43200 / n, 6 * (n - 1) / 2), (-45 / 43200 / n, 6 * (n - 1) / 2)]
        v = sum(p for p, _ in parts)
        df = v * v / sum(p * p / d for p, d in parts)
        return (scipy_stats.t.ppf(0.975, df) + scipy_stats.t.ppf(0.8, df)) * math.sqrt(v)

    assert detectable(3) == pytest.approx(test.resolvable)
    target = 0.16  # a little above the floor: many seeds
    needed = next(n for n in range(2, 100) if detectable(n) <= target)
    assert needed > 5 and statistics.run_level(SEEDS_A, b, lengths, target=target).seeds_for_target == needed
    # a target below the floor: no number of seeds resolves it on this test set
    assert statistics.run_level(SEEDS_A, b, lengths, target=0.9 * floor).seeds_for_target is None


def test_the_test_sets_part_is_a_ratios_residual():
    """Utterances of 5, 10 and 15 tokens, each system's second seed one error more on every utterance (no
    interaction), B three more than A on the last: d = [0, 0, 3], D = 3 / 30, and the residuals d - D n_u =
    [-0.5, -1, 1.5] (sum of squares 3.5), not d - mean(d) (6): the test set's part is 3 x 3.5 / 2 / 30^2."""
    lengths = np.array([5, 10, 15])
    a = np.array([[1, 2, 3], [2, 3, 4]])
    test = statistics.run_level(a, a + [0, 0, 3], lengths)
    assert test.components.interaction == (pytest.approx(0, abs=1e-20), pytest.approx(0, abs=1e-20))
    assert test.utterance_variance == pytest.approx(3 * 3.5 / 2 / 900)


def test_one_seed_has_no_run_level_test():
    assert statistics.run_level([[1, 2]], [[0, 0], [0, 1]], [5, 5]) is None
    assert statistics.run_level([[1, 2], [2, 2]], [[0, 0], [0, 1]], [5, 5]) is not None


# --------------------------------------------------------------------------- the table, from folders
RESOLVED = """# resolved from cfg/{name}.cfg
[exp]
out_folder = {folder}
seed = {seed}
device = auto
[architecture1]
arch_name = rec
unit = {unit}
sizes = 8,8
bidirectional = True,True
[model]
stack = rec
"""


def fake_run(folder: Path, name: str, unit: str, seed: int, errors: list[int], dev: float, test: float,
             machine: str = "Some CPU, 2 cores, 1 thread, torch 2.13.0+cpu, device cpu", speeds=(1000, 3000)):
    """An experiment folder as run_exp.py leaves it, with ``errors`` per test utterance (length 10 each),
    trained on ``machine`` at ``speeds`` frames/s in its two epochs."""
    folder.mkdir(parents=True)
    (folder / "config.resolved.cfg").write_text(RESOLVED.format(name=name, folder=folder, seed=seed, unit=unit))
    (folder / "res.res").write_text(
        "epoch=001 train_loss=2.0 train_err=0.5 dev_loss=2.1 dev_err=0.6100 lr_rec=0.002 time=30.0s\n"
        "epoch=002 train_loss=1.5 train_err=0.4 dev_loss=1.9 dev_err=0.5500 lr_rec=0.002 time=31.0s\n"
        f"dev: %WER {dev:.2f} [ 1 / 2, 0 ins, 0 del, 1 sub ] acwt=0.2 decoder=python rtf=0.003\n"
        f"test: %WER {test:.2f} [ 1 / 2, 0 ins, 0 del, 1 sub ] acwt=0.2 decoder=python rtf=0.003\n")
    (folder / "log.txt").write_text(f"12:00:00 machine: 2026-11-26, {machine}\n12:00:00 epoch=001 ... ({speeds[0]} frames/s)\n"
                                    f"12:00:30 epoch=002 ... ({speeds[1]} frames/s)\n")
    (folder / "decode_test").mkdir()
    (folder / "decode_test" / "per_utt").write_text(
        "# utt ref_len errors ins del sub\n" + "".join(f"u{i:02d} 10 {e} 0 0 {e}\n" for i, e in enumerate(errors)))


def test_the_table_groups_seeds_and_tests_against_the_baseline(tmp_path):
    rng = np.random.default_rng(0)
    for seed in (1, 2, 3):
        fake_run(tmp_path / "A" / f"seed{seed}", "MINI_A", "ligru", seed, list(rng.integers(2, 5, 30)), 30 + seed, 29 + seed)
        fake_run(tmp_path / "B" / f"seed{seed}", "MINI_B", "libru", seed, list(rng.integers(0, 3, 30)), 20 + seed, 19 + seed)
    systems = group(find_runs([str(tmp_path / "*")]))
    assert [(s.name, s.seeds) for s in systems] == [("MINI_A", [1, 2, 3]), ("MINI_B", [1, 2, 3])]
    assert systems[0].describe() == "ligru 2x8 bi"
    rows = report.rows(systems, ["dev", "test"], "MINI_A", "test", replications=2000)
    a, b = rows
    assert a.errors["test"] == [30.0, 31.0, 32.0] and a.epochs == 2 and a.seconds == 61.0 and a.frames_per_second == 2000
    assert a.versus == {} and b.versus["run_level"].probability_better > 0.99
    assert b.versus["matched_pairs_p"] < 1e-3 and b.versus["sign_p"] < 1e-3
    rate, low, high = b.intervals["test"]
    assert low < rate < high
    text = compare.table([str(tmp_path)], baseline="MINI_A", markdown=tmp_path / "t.md", csv=tmp_path / "t.csv",
                         plots=tmp_path / "plots", replications=500)
    assert "30.00 / 31.00 / 32.00" in text and "31.00 ± 1.00" in text
    # the header, the rule, A's row, B's, then what the run-level columns are
    assert (tmp_path / "t.md").read_text().count("\n") == 6 and "MINI_B" in (tmp_path / "t.csv").read_text()
    assert "1 - the one-sided p of the run-level t, read as a probability under a flat prior" in (tmp_path / "t.md").read_text()
    # the interval's cell is the bootstrap's percentiles, P(better) and p the run-level test's
    lines = (tmp_path / "t.md").read_text().splitlines()  # the header, the rule, A's row, B's
    cells = dict(zip(*[line.strip("| ").split(" | ") for line in (lines[0], lines[3])]))
    test = b.versus["run_level"]
    assert cells["run-level P(better than baseline), one-sided"] == f"{test.probability_better:.3f}" != ""
    assert cells["run-level p, two-sided"] == f"{test.p_value:.3g}"
    shown = statistics.interval(*group(find_runs([str(tmp_path / "B")]))[0].errors("test")[:2], 500)
    assert cells["test 95 % interval (bootstrap)"] == f"{100 * shown.low:.2f}-{100 * shown.high:.2f}"
    assert sorted(p.name for p in (tmp_path / "plots").iterdir()) == [
        "dev_curves.png", "dev_curves.svg", "error_vs_cost.png", "error_vs_cost.svg", "errors.png", "errors.svg"]
    # figures are committed with a study: remade from the same runs they are the same bytes (no date, fixed ids)
    first = {p.name: p.read_bytes() for p in (tmp_path / "plots").iterdir()}
    compare.table([str(tmp_path)], baseline="MINI_A", plots=tmp_path / "plots", replications=500)
    assert {p.name: p.read_bytes() for p in (tmp_path / "plots").iterdir()} == first
    with pytest.raises(ValueError, match="no such system"):
        report.rows(systems, ["test"], "MINI_C", "test")



def test_named_pairs_and_a_generated_section(tmp_path, capsys):
    """--pairs tests each named pair as the table does with that baseline; --section puts the tables, under
    the date, machine and command, between the markers of a hand-written page and leaves the rest alone."""
    rng = np.random.default_rng(1)
    errors = {}  # (system, seed) -> errors on the 30 test utterances of 10 tokens
    for seed in (1, 2):
        for system, unit, low, dev, test_error in (("A", "ligru", 2, 31, 30 + seed), ("B", "libru", 0, 21, 20 + seed),
                                                   ("C", "lstm", 2, 31, 32)):
            errors[system, seed] = list(rng.integers(low, low + 3, 30))
            fake_run(tmp_path / "runs" / system / f"seed{seed}", f"MINI_{system}", unit, seed, errors[system, seed], dev,
                     test_error)
    systems = group(find_runs([str(tmp_path / "runs" / "*")]))
    (b_vs_a, c_vs_b) = report.pairs(systems, [("MINI_B", "MINI_A"), ("MINI_C", "MINI_B")], "test", replications=400)
    assert (b_vs_a.system_error, b_vs_a.against_error) == (21.5, 31.5)  # the means of res.res's rates
    assert b_vs_a.versus == report.rows(systems, ["test"], "MINI_A", "test", replications=400)[1].versus
    # P(better) beyond 0.975 exactly where the two-sided run-level test calls B better at 5 %
    assert b_vs_a.versus["run_level"].probability_better > 0.975 and c_vs_b.versus["run_level"].probability_better < 0.025
    # the difference is the test's own D, from the per-utterance counts (300 tokens a seed), not 21.50 - 31.50
    d = (sum(errors["B", 1]) + sum(errors["B", 2]) - sum(errors["A", 1]) - sum(errors["A", 2])) / 600
    assert b_vs_a.versus["difference"] == pytest.approx(d) and b_vs_a.versus["run_level"].difference == pytest.approx(d)
    assert f"| MINI_B | MINI_A | 2 / 2 | 21.50 | 31.50 | {100 * d:+.2f} |" in report.pairs_markdown([b_vs_a], "test")
    approximate = "an approximate test below 3 seeds"
    assert (b_vs_a.reading(), c_vs_b.reading()) == (f"better (p < 0.05; {approximate})", f"worse (p < 0.05; {approximate})")
    (a_vs_c,) = report.pairs(systems, [("MINI_A", "MINI_C")], "test", replications=400)  # errors drawn alike
    assert a_vs_c.versus["matched_pairs_p"] > 0.05
    assert a_vs_c.reading() == f"not resolved with 2 / 2 seeds ({approximate})"
    row = report.pairs_markdown([b_vs_a], "test").split("\n\n")[0].splitlines()[-1].split(" | ")
    # relative to A's mean error, the difference and its run-level interval (fractions; the errors in points)
    test = b_vs_a.versus["run_level"]
    assert row[7] == f"{1e4 * d / 31.5:+.1f} % ({1e4 * test.low / 31.5:+.1f} % to {1e4 * test.high / 31.5:+.1f} %)"
    assert row[8:13] == [f"{test.probability_better:.3f}", f"{test.p_value:.3g}", f"{b_vs_a.versus['matched_pairs_p']:.3g}",
                         f"{b_vs_a.versus['sign_p']:.3g}", f"better (p < 0.05; {approximate})"]
    assert row[13:] == [f"{100 * test.resolvable:.2f}", str(test.seeds_needed), f"{100 * test.floor:.2f} |"]
    assert test.floor < test.resolvable  # the two power columns are not one number twice
    # --target: the seeds for that difference, a column before the floor; the other cells stay put
    (planned,) = report.pairs(systems, [("MINI_B", "MINI_A")], "test", replications=400, target=7.5)
    table = report.pairs_markdown([planned], "test", target=7.5).splitlines()
    assert table[0].split(" | ")[-2:] == ["seeds for 7.5 points", "resolved at 80 % power with unlimited seeds |"]
    assert len(table[1].split(" | ")) == len(table[0].split(" | ")) == len(table[2].split(" | ")) == len(row) + 1
    assert table[2].split(" | ")[:-2] == row[:-1]
    assert planned.versus["run_level"].target == pytest.approx(0.075)  # points in, a fraction to the test
    assert table[2].split(" | ")[-2] == str(planned.versus["run_level"].seeds_for_target) != "None"
    one_seed = report.pairs(group(find_runs([str(tmp_path / "runs" / "*" / "seed1")])), [("MINI_B", "MINI_A")], "test",
                            replications=400)[0]
    assert one_seed.versus["matched_pairs_p"] < 0.05  # the utterances alone would call it, the runs cannot
    assert one_seed.reading() == "not resolved: one seed, run-to-run variance unknown"
    assert "| one seed | " in report.pairs_markdown([one_seed], "test")
    d = (sum(errors["B", 1]) - sum(errors["A", 1])) / 3  # points; A's seed 1 has 31.00 in res.res
    cells = report.pairs_markdown([one_seed], "test").split("\n\n")[0].splitlines()[-1].split(" | ")
    assert cells[5:9] == [f"{d:+.2f}", "", f"{100 * d / 31:+.1f} %", ""]  # no interval, no P(better): one seed
    with pytest.raises(ValueError, match="no system MINI_D"):
        report.pairs(systems, [("MINI_D", "MINI_A")], "test")
    (not_started,) = report.pairs(systems, [("MINI_D", "MINI_A")], "test", missing_ok=True)  # a study under way
    assert (not_started.system_error, not_started.against_error, not_started.versus) == (None, 31.5, {})
    unfinished = tmp_path / "more" / "D" / "seed1"  # a study under way: trained, not yet decoded
    fake_run(unfinished, "MINI_D", "lbru", 1, [1] * 30, 20, 20)
    (unfinished / "res.res").write_text("".join((unfinished / "res.res").read_text().splitlines(True)[:2]))
    (pending,) = report.pairs(group(find_runs([str(tmp_path / "runs" / "*"), str(unfinished)])),
                              [("MINI_D", "MINI_A")], "test")
    assert "| MINI_D | MINI_A | 0 / 2 | - | 31.50 | | no finished run of both yet |" + " |" * 9 in \
        report.pairs_markdown([pending], "test")

    page = tmp_path / "RESULTS.md"
    page.write_text("# Results\nabove\n<!-- compare.py study -->\nstale table\n<!-- /compare.py study -->\nbelow\n")
    assert compare.main(["table", str(tmp_path / "runs"), "--markdown", str(page), "--section", "study",
                         "--pairs", "MINI_B:MINI_A", "--replications", "200", "--target", "7.5"]) == 0
    text = page.read_text()
    assert "| seeds for 7.5 points | resolved at 80 % power with unlimited seeds |" in text
    for bad in (["--target", "0", "--pairs", "MINI_B:MINI_A"], ["--target", "1.5"]):  # no pairs table to add it to
        assert compare.main(["table", str(tmp_path / "runs"), *bad]) == 1
    assert text.startswith("# Results\nabove\n<!-- compare.py study -->\nGenerated ") and text.endswith(
        "<!-- /compare.py study -->\nbelow\n")
    assert "stale table" not in text and "3 systems, 6 finished runs, 0.1 h of training in all; trained on " \
        "Some CPU, 2 cores, 1 thread, torch 2.13.0+cpu, device cpu (6 runs, 0.1 h)." in text
    assert f"by `python compare.py table {tmp_path / 'runs'} --markdown" in text
    # the printed command runs as printed: a system named by an override has parentheses, which a shell
    # would read as syntax unless quoted
    argv = ["table", str(tmp_path / "runs"), "--markdown", str(page), "--section", "study", "--pairs",
            "MINI_B:MINI_A(opt_bias_correction=False)", "--pending-ok"]
    assert compare.main(argv) == 0
    printed = re.search(r"by `python compare.py ([^`]*)`", page.read_text()).group(1)
    assert shlex.split(printed) == argv
    assert text.count("\n| MINI_A | ligru") == 1 and "| MINI_B | MINI_A | 2 / 2 | 21.50 | 31.50 |" in text
    capsys.readouterr()
    for page_text in ("no markers here\n", "<!-- compare.py study -->\n", "<!-- compare.py study -->\n" * 2 +
                      "<!-- /compare.py study -->\n"):
        page.write_text(page_text)
        assert compare.main(["table", str(tmp_path / "runs"), "--markdown", str(page), "--section", "study"]) == 1
        assert page.read_text() == page_text
        assert "expected one line '<!-- compare.py study -->' followed by one line" in capsys.readouterr().err
    assert compare.main(["table", str(tmp_path / "runs"), "--pairs", "MINI_B"]) == 1


def test_the_cost_columns_compare_systems_on_one_machine(tmp_path):
    """Runs from two machines: every seed counts for the errors, but the training time and frames/s are
    the means over the machine most runs trained on, and a system with no run there has none."""
    gpu = "A GPU host, 16 cores, 1 thread, torch 2.11.0+cu130, device Some GPU"
    rng = np.random.default_rng(4)
    for seed in (1, 2, 3):
        on_gpu = seed == 3
        fake_run(tmp_path / "A" / f"seed{seed}", "MINI_A", "ligru", seed, list(rng.integers(2, 5, 30)), 30, 29 + seed,
                 **({"machine": gpu, "speeds": (50000, 70000)} if on_gpu else {}))
        fake_run(tmp_path / "B" / f"seed{seed}", "MINI_B", "libru", seed, list(rng.integers(0, 3, 30)), 20, 19 + seed,
                 **({"machine": gpu, "speeds": (50000, 70000)} if on_gpu else {"speeds": (2000, 4000)}))
    fake_run(tmp_path / "C" / "seed1", "MINI_C", "lstm", 1, [3] * 30, 30, 30, machine=gpu, speeds=(9000, 9000))
    for run in ("A/seed3", "B/seed3", "C/seed1"):  # the GPU's runs take 20 min an epoch, the CPU's 30 s
        res = tmp_path / run / "res.res"
        res.write_text(res.read_text().replace("time=30.0s", "time=1200.0s").replace("time=31.0s", "time=1200.0s"))
    systems = group(find_runs([str(tmp_path / "*")]))
    machine = compare.cost_machine(systems)
    assert machine == "Some CPU, 2 cores, 1 thread, torch 2.13.0+cpu, device cpu"  # 4 runs against 3
    a, b, c = report.rows(systems, ["test"], "MINI_A", "test", replications=200, cost_machine=machine)
    assert (a.frames_per_second, b.frames_per_second, c.frames_per_second) == (2000, 3000, None)
    assert c.seconds is None and a.errors["test"] == [30.0, 31.0, 32.0]  # the GPU seed is a seed
    everything = report.rows(systems, ["test"], "MINI_A", "test", replications=200)
    assert everything[0].frames_per_second == pytest.approx((2000 + 2000 + 60000) / 3)
    assert everything[0].versus == {} and everything[1].versus.keys() == b.versus.keys()
    line = compare.provenance(systems, "compare.py table")
    # runs and hours per machine: 4 x 61 s; 3 x 2 x 20 min
    assert f"trained on {machine} (4 runs, 0.1 h); {gpu} (3 runs, 2.0 h)." in line
    assert line.endswith(f"The training time and frames/s are those of the runs on {machine} alone.")
    assert compare.cost_machine(group(find_runs([str(tmp_path / "A" / "seed[12]")]))) is None  # one machine
    assert "alone" not in compare.provenance(group(find_runs([str(tmp_path / "A" / "seed[12]")])), "c")


def test_claims_take_their_verdicts_from_the_run_level_reading(tmp_path):
    rng = np.random.default_rng(1)
    for seed in (1, 2):
        fake_run(tmp_path / "runs" / "A" / f"seed{seed}", "MINI_A", "ligru", seed, list(rng.integers(2, 5, 30)), 31, 30 + seed)
        fake_run(tmp_path / "runs" / "B" / f"seed{seed}", "MINI_B", "libru", seed, list(rng.integers(0, 3, 30)), 21, 20 + seed)
        fake_run(tmp_path / "runs" / "C" / f"seed{seed}", "MINI_C", "lstm", seed, list(rng.integers(2, 5, 30)), 31, 32)
    fake_run(tmp_path / "runs" / "D" / "seed1", "MINI_D", "gru", 1, [0] * 30, 5, 5)
    claims = tmp_path / "claims.tsv"
    claims.write_text("claim\tpaper\texpects\tpair\n# a comment\n"
                      "B beats A\t1 % better\tbetter\tMINI_B:MINI_A\n"
                      "A beats B\t2 % better\tbetter\tMINI_A:MINI_B\n"
                      "A is no worse than C\tequal\tnot worse\tMINI_A:MINI_C\n"
                      "D beats A\tfar better\tbetter\tMINI_D:MINI_A\n"
                      "B is no worse than A\tequal\tnot worse\tMINI_B:MINI_A\n"
                      "A is no better than B\tequal\tnot better\tMINI_A:MINI_B\n"
                      "B is worse than A\tworse\tworse\tMINI_B:MINI_A\n")
    assert compare.main(["table", str(tmp_path / "runs"), "--claims", str(claims), "--replications", "200",
                         "--markdown", str(tmp_path / "out.md")]) == 0
    rows = [line for line in (tmp_path / "out.md").read_text().splitlines() if line.startswith("| ") and
            (" beats " in line or " no worse " in line or " no better " in line or " is worse " in line)]
    verdicts = [row.rstrip(" |").rsplit(" | ", 1)[1] for row in rows]
    approximate = "(an approximate test below 3 seeds)"
    # B is better than A at 5 %: what each expectation makes of it
    assert verdicts == [f"**agrees** {approximate}", f"**disagrees** {approximate}",
                        f"not resolved with 2 / 2 seeds {approximate}",
                        "not resolved: one seed, run-to-run variance unknown", f"**agrees** {approximate}",
                        f"**agrees** {approximate}", f"**disagrees** {approximate}"], rows
    (pair,) = report.pairs(group(find_runs([str(tmp_path / "runs")])), [("MINI_B", "MINI_A")], "test", replications=200)
    test = pair.versus["run_level"]
    assert f"| B beats A | 1 % better | `MINI_B : MINI_A` | {100 * test.difference:+.2f} ({100 * test.low:+.2f} to " \
        f"{100 * test.high:+.2f}) | {test.p_value:.3g} |" in rows[0]
    assert f"{100 * test.difference:+.2f}" != "-10.00"  # not the difference of res.res's means, 21.50 - 31.50
    # --claims-only: the page gets the claims' table alone, the same rows, under the command that makes it
    page = tmp_path / "README.md"
    page.write_text("<!-- compare.py claims -->\n<!-- /compare.py claims -->\n")
    argv = ["table", str(tmp_path / "runs"), "--claims", str(claims), "--replications", "200", "--markdown", str(page),
            "--section", "claims", "--claims-only"]
    assert compare.main(argv) == 0
    section = page.read_text().splitlines()
    assert section[1].startswith("Generated ") and shlex.join(argv) in section[1]
    assert section[3].startswith("| claim | the paper's numbers |") and section[5:-1] == rows
    assert compare.main(argv[:-3] + ["--claims-only"]) == 0 and page.read_text().startswith("| claim |")
    assert compare.main(["table", str(tmp_path / "runs"), "--claims-only", "--markdown", str(page)]) == 1
    claims.write_text("claim\tpaper\texpects\tpair\nB beats A\t1 %\tfaster\tMINI_B:MINI_A\n")
    with pytest.raises(ValueError, match=r"claims.tsv:2: expected 4 tab-separated fields.*got 'B beats A"):
        report.read_claims(claims)
    claims.write_text("claim\tpaper\texpects\tpair\n\nB beats A\t1 %\tbetter\tMINI_B:MINI_A\tMINI_C\n")
    with pytest.raises(ValueError, match=r"claims.tsv:3: expected 4 tab-separated fields"):
        report.read_claims(claims)
    assert compare.main(["table", str(tmp_path / "runs"), "--claims", str(claims)]) == 1


def test_the_archived_study_reads_as_its_runs_allow():
    """The five-seed study: the utterance-only tests call the first pair (p 0.002), the runs cannot; the
    others' differences are larger than the seeds' spread."""
    systems = group(find_runs([str(ROOT / "results" / "study_runs" / "layout2" / "phones")]))
    wanted = [("MINI_liBRU", "MINI_liGRU"), ("MINI_LBRU", "MINI_GRU_bi"), ("MINI_UBRU_kalman", "MINI_UBRU_bi")]
    found = report.pairs(systems, wanted, "test", replications=100)
    assert found[0].versus["matched_pairs_p"] < 0.01
    assert [p.reading() for p in found] == ["not resolved with 5 / 5 seeds", "better (p < 0.05)", "worse (p < 0.05)"]


def test_archived_runs_give_the_same_table_and_count_as_finished(tmp_path):
    """compare.py archive keeps what the table reads, without weights: the archive gives the same table
    (parameters included), a sweep sees its runs as finished, and an unfinished run is left out."""
    import torch

    from bru_kaldi.comparison.sweep import is_finished

    rng = np.random.default_rng(2)
    for seed in (1, 2):
        for letter, unit in (("A", "ligru"), ("B", "libru")):
            folder = tmp_path / "exp" / letter / f"seed{seed}"
            fake_run(folder, f"MINI_{letter}", unit, seed, list(rng.integers(0, 5, 30)), 30, 29 + seed)
            torch.save({"model": {"w": torch.zeros(3, 4), "b": torch.zeros(5 if letter == "A" else 7)}}, folder / "final.pt")
            (folder / ".done").mkdir()
            for stage in ("train", "decode"):
                (folder / ".done" / stage).touch()
    unfinished = tmp_path / "exp" / "B" / "seed3"
    fake_run(unfinished, "MINI_B", "libru", 3, [1] * 30, 20, 20)
    (unfinished / "res.res").write_text("".join((unfinished / "res.res").read_text().splitlines(True)[:2]))

    assert compare.main(["archive", str(tmp_path / "exp"), str(tmp_path / "kept")]) == 0
    kept = tmp_path / "kept"
    assert sorted(str(p.relative_to(kept)) for p in kept.glob("*/*")) == ["A/seed1", "A/seed2", "B/seed1", "B/seed2"]
    assert not list(kept.rglob("*.pt")) and (kept / "B" / "seed2" / "parameters").read_text() == "19\n"
    assert is_finished(kept / "A" / "seed1") and (kept / "A" / "seed1" / "decode_test" / "per_utt").is_file()
    original = compare.table([str(tmp_path / "exp" / "*" / "seed[12]")], baseline="MINI_A", replications=300)
    assert compare.table([str(kept)], baseline="MINI_A", replications=300) == original
    assert [r.parameters for s in group(find_runs([str(kept)])) for r in s.runs] == [17, 17, 19, 19]
    assert compare.main(["archive", str(tmp_path / "nothing"), str(kept)]) == 1  # not a folder of runs


def test_only_the_utterances_every_run_scored_are_compared_each_with_its_length(tmp_path):
    """A's second seed lacks utterance u05 and B lacks u00 (a decode cut short): the tests take the 28
    utterances every run scored, each with its own length (5 + u tokens)."""
    lengths = np.arange(5, 35)
    rng = np.random.default_rng(5)
    kept = {}
    for name, seed, missing in (("A", 1, None), ("A", 2, 5), ("B", 1, 0), ("B", 2, 0)):
        errors = rng.integers(0, 5, 30)
        folder = tmp_path / name / f"seed{seed}"
        fake_run(folder, f"MINI_{name}", "ligru" if name == "A" else "libru", seed, list(errors), 30, 30)
        (folder / "decode_test" / "per_utt").write_text("# utt ref_len errors ins del sub\n" + "".join(
            f"u{u:02d} {lengths[u]} {errors[u]} 0 0 {errors[u]}\n" for u in range(30) if u != missing))
        kept[name, seed] = np.delete(errors, [0, 5])
    a, b = group(find_runs([str(tmp_path / "*")]))
    e, n, utterances = a.errors("test")
    assert len(utterances) == 29 and "u05" not in utterances and list(n) == list(np.delete(lengths, 5))
    (row,) = [r for r in report.rows([a, b], ["test"], "MINI_A", "test", replications=200) if r.versus]
    expected = statistics.run_level(np.array([kept["A", 1], kept["A", 2]]), np.array([kept["B", 1], kept["B", 2]]),
                                    np.delete(lengths, [0, 5]), paired=True)  # seeds 1 and 2 of both: paired
    assert row.versus["run_level"].p_value == pytest.approx(expected.p_value)
    assert row.versus["run_level"].utterance_variance == pytest.approx(expected.utterance_variance)
    assert row.versus["difference"] == pytest.approx(expected.difference)


def test_runs_tuned_on_an_edge_are_marked_and_a_column_tuned_on_part_of_it_is_held_out(tmp_path):
    """Seed 1 recorded its grid and an edge (res.res edge=), seed 2 its grid and no edge, seed 3 was decoded
    before grids grew: its scale is the top of the config's acwt_sweep. dev_core (u00-u09) chose the setting,
    so the dev column is dev's other utterances (u10-u29), each seed's rate over those alone."""
    tuned = {1: "acwt=0.4 wip=0 decoder=python rtf=0.1 grid=acwt:0.1,0.2,0.4;wip:0,0.5 edge=acwt",
             2: "acwt=0.2 wip=0 decoder=python rtf=0.1 grid=acwt:0.1,0.2,0.4;wip:-0.5,0,0.5",
             3: "acwt=0.4 wip=0.5 decoder=python rtf=0.1"}
    held_out = {}
    for seed, setting in tuned.items():
        folder = tmp_path / f"seed{seed}"
        fake_run(folder, "MINI_A", "ligru", seed, [seed] * 30, 30.0, 31.0)
        with open(folder / "config.resolved.cfg", "a") as f:
            f.write("[data_use]\nvalid_with = dev_core\n[decoding]\nacwt_sweep = 0.1,0.2,0.4\nwip_sweep = -0.5,0,0.5\n")
        res = (folder / "res.res").read_text()
        (folder / "res.res").write_text(res.replace("dev: ", f"dev_core: %WER 9.00 [ 9 / 100, 0 ins, 0 del, 9 sub ] {setting}\ndev: "))
        dev = {f"u{u:02d}": (u % 3 + seed) for u in range(30)}  # errors per utterance, 10 tokens each
        for name, utterances in (("dev", range(30)), ("dev_core", range(10))):
            (folder / f"decode_{name}").mkdir(exist_ok=True)
            (folder / f"decode_{name}" / "per_utt").write_text("".join(f"u{u:02d} 10 {dev[f'u{u:02d}']} 0 0 0\n"
                                                                        for u in utterances))
        held_out[seed] = 100 * sum(dev[f"u{u:02d}"] for u in range(10, 30)) / 200
    (system,) = group(find_runs([str(tmp_path)]))
    assert [r.edges for r in system.runs] == [["acwt"], [], ["acwt", "wip"]]
    (row,) = report.rows([system], ["dev", "test"], None, "test", replications=100)
    assert row.on_edge == [True, False, True] and row.labels == {"dev": "dev without dev_core"}
    assert row.errors["dev"] == [pytest.approx(held_out[seed]) for seed in (1, 2, 3)]
    assert system.runs[0].held_out("dev") == (pytest.approx(held_out[1]), 20, 10)
    table = report.markdown([row], "test")
    assert f"{held_out[1]:.2f}‡ / {held_out[2]:.2f} / {held_out[3]:.2f}‡" in table
    assert "| dev without dev_core per seed |" in table and "31.00‡ / 31.00 / 31.00‡" in table
    assert report.EDGE_NOTE in table and "dev less the utterances of dev_core, which chose the decoding setting" in table


def test_a_resumed_run_is_of_the_machine_it_finished_on(tmp_path):
    fake_run(tmp_path / "seed1", "MINI_A", "ligru", 1, [1] * 30, 30, 30)
    log = tmp_path / "seed1" / "log.txt"
    log.write_text(log.read_text() + "13:00:00 machine: 2026-11-27, Another CPU, 4 cores, 1 thread\n")
    assert find_runs([str(tmp_path)])[0].machine == "Another CPU, 4 cores, 1 thread"


def test_runs_on_clones_in_other_folders_are_seeds_of_one_system(tmp_path):
    """The built-in corpus's folder, and the data paths below it, do not split a system; other data does."""
    for seed, where in ((1, "/clone_a/recipes/mini_timit"), (2, "/clone_b/recipes/mini_timit"), (3, "/clone_a/other")):
        folder = tmp_path / f"seed{seed}"
        fake_run(folder, "MINI_A", "ligru", seed, [1] * 30, 30, 30)
        resolved = folder / "config.resolved.cfg"
        data = "/clone_a/recipes/mini_timit" if seed == 3 else where  # seed 3: the same corpus folder, other data
        resolved.write_text(resolved.read_text().replace(
            "device = auto\n", f"device = auto\nbuiltin_corpus_dir = {where}\n[dataset1]\nfea_lst = {data}/data/train/feats.scp\n"))
    systems = group(find_runs([str(tmp_path)]))
    assert sorted(s.seeds for s in systems) == [[1, 2], [3]]


def test_options_at_their_defaults_do_not_split_a_system(tmp_path):
    """A run written before an option existed and one that lists it at its default (also per layer:
    ``default,default``) are seeds of one system; the option at another value is another system."""
    lines = {1: "", 2: "objective = ce\nlfmmi_den_fst = \n", 3: "objective = lfmmi\n"}
    for seed, extra in lines.items():
        folder = tmp_path / f"seed{seed}"
        fake_run(folder, "MINI_A", "ligru", seed, [1] * 30, 30, 30)
        resolved = folder / "config.resolved.cfg"
        resolved.write_text(resolved.read_text().replace("[model]\n", "[model]\n" + extra))
    arch = tmp_path / "seed2" / "config.resolved.cfg"
    arch.write_text(arch.read_text().replace("unit = ligru\n", "unit = ligru\nactivation = default,default\n"))
    systems = group(find_runs([str(tmp_path)]))
    assert sorted(s.seeds for s in systems) == [[1, 2], [3]]


# --------------------------------------------------------------------------- a sweep, killed and resumed
@pytest.mark.slow
def test_a_sweep_on_the_tiny_corpus_is_killed_and_resumes(tiny_corpus, tmp_path):
    ligru = tmp_path / "tiny_liGRU.cfg"
    ligru.write_text(TINY.read_text().replace("unit = libru", "unit = ligru"))
    out = tmp_path / "sweep"
    env = dict(os.environ, MINI_TIMIT=str(tiny_corpus.root), BRU_TEST_EXP=str(tmp_path / "unused"), OMP_NUM_THREADS="1")
    command = [sys.executable, "compare.py", "sweep", str(TINY), str(ligru), "--seeds", "1,2", "--out", str(out),
               "--baseline", "tiny_liBRU", "--exp,n_epochs_tr=1"]
    first = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             start_new_session=True)
    done = out / "tiny_liBRU" / "seed1" / ".done" / "decode"
    deadline = time.time() + 240
    while not done.exists() and first.poll() is None and time.time() < deadline:
        time.sleep(0.2)
    time.sleep(1.0)  # into the second run
    os.killpg(first.pid, signal.SIGKILL)
    first.wait()
    assert done.exists(), first.stdout.read()
    again = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert "tiny_liBRU seed 1: finished before, skipped" in again.stdout
    assert re.search(r"\[4/4\] tiny_liGRU seed 2: done in \d+ s", again.stdout)
    lines = {line.split()[0]: line for line in again.stdout.splitlines() if line.startswith("tiny_")}
    assert set(lines) == {"tiny_liBRU", "tiny_liGRU"}
    # the Li-GRU row has both seeds, an interval and the four tests against the Li-BRU baseline
    assert re.search(r"\d+\.\d\d / \d+\.\d\d .* \d+\.\d\d-\d+\.\d\d +\d\.\d{3} +\S+ +\S+ +\S+$", lines["tiny_liGRU"]), lines


def test_a_sweep_runs_jobs_at_a_time_seed_by_seed_and_reports_a_failure(tmp_path, monkeypatch):
    """With a stand-in for Python that records when each run starts and ends: never more than --jobs runs at
    once, seed 1 of every config before seed 2, cores / jobs threads each, and a failed run listed."""
    from bru_kaldi.comparison.sweep import run_sweep

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    fake = tmp_path / "python"
    fake.write_text(f"""#!{sys.executable}
import os, sys, time
from pathlib import Path
config, seed, folder = sys.argv[2], sys.argv[3].split("=")[1], Path(sys.argv[4].split("=")[1])
with open({str(tmp_path / "events")!r}, "a") as f:
    f.write(f"start {{Path(config).stem}} {{seed}} {{time.time()}} {{os.environ['OMP_NUM_THREADS']}}\\n")
time.sleep(1.5)  # long enough for the two runs of a round to overlap on a loaded machine
with open({str(tmp_path / "events")!r}, "a") as f:
    f.write(f"end {{Path(config).stem}} {{seed}} {{time.time()}}\\n")
if Path(config).stem == "b" and seed == "2":
    print("error: the loss is nan")
    sys.exit(3)
(folder / ".done").mkdir(parents=True, exist_ok=True)
(folder / ".done" / "train").touch(); (folder / ".done" / "decode").touch()
""")
    fake.chmod(0o755)
    configs = [tmp_path / "a.cfg", tmp_path / "b.cfg", tmp_path / "c.cfg"]
    for config in configs:
        config.write_text("[exp]\n")
    logged = []
    outcomes = run_sweep(configs, [1, 2], tmp_path / "out", log=logged.append, python=str(fake), jobs=2)
    assert [(o.config.stem, o.seed, o.status) for o in outcomes] == [
        ("a", 1, "done"), ("b", 1, "done"), ("c", 1, "done"), ("a", 2, "done"), ("b", 2, "failed"), ("c", 2, "done")]
    assert "exit status 3: error: the loss is nan" in outcomes[4].message
    events = [line.split() for line in (tmp_path / "events").read_text().splitlines()]
    launched = [re.match(r"\[\d/6\] (\w) seed (\d): running", line) for line in logged]
    assert [m.groups() for m in launched if m] == [("a", "1"), ("b", "1"), ("c", "1"), ("a", "2"), ("b", "2"), ("c", "2")]
    assert {e[4] for e in events if e[0] == "start"} == {str(max(1, (os.cpu_count() or 1) // 2))}
    at_once, most = 0, 0
    for event in sorted(events, key=lambda e: (float(e[3]), e[0] == "start")):
        at_once += 1 if event[0] == "start" else -1
        most = max(most, at_once)
    assert most == 2
    assert any("[6/6]" in line and "to go" in line for line in logged)
    again = run_sweep(configs, [1, 2], tmp_path / "out", log=logged.append, python=str(fake), jobs=2)
    assert [o.status for o in again] == ["skipped"] * 4 + ["failed", "skipped"]
    (tmp_path / "out" / "a" / "seed1" / ".done" / "decode").unlink()  # trained, not decoded: not finished
    third = run_sweep(configs, [1], tmp_path / "out", log=logged.append, python=str(fake), jobs=2)
    assert [o.status for o in third] == ["done", "skipped", "skipped"]


def test_seeds_and_pairs_on_the_command_line():
    assert compare.parse_seeds("1-3,7") == [1, 2, 3, 7] and compare.parse_seeds("5") == [5]
    assert compare.parse_seeds("2-3,1-2") == [1, 2, 3]
    with pytest.raises(compare.ConfigError, match="--seeds"):
        compare.parse_seeds("1-x")
    assert compare.parse_pairs("A:B, C:D") == [("A", "B"), ("C", "D")]
    with pytest.raises(compare.ConfigError, match="--pairs"):
        compare.parse_pairs("A:B,C")


def test_one_config_run_with_and_without_an_override_gives_two_named_systems(tmp_path):
    """Before/after comparisons sweep one config twice, once with an override: the second system is named
    by what it changes, so that --pairs can name both."""
    rng = np.random.default_rng(2)
    for seed in (1, 2):
        fake_run(tmp_path / "after" / f"seed{seed}", "MINI_A", "ligru", seed, list(rng.integers(0, 3, 30)), 20, 20)
        before = tmp_path / "before" / f"seed{seed}"
        fake_run(before, "MINI_A", "ligru", seed, list(rng.integers(2, 5, 30)), 30, 30)
        resolved = before / "config.resolved.cfg"
        resolved.write_text(resolved.read_text().replace("unit = ligru\n", "unit = ligru\nopt_bias_correction = False\n"))
    systems = group(find_runs([str(tmp_path / "*" / "seed*")]))
    assert [(s.name, s.seeds) for s in systems] == [("MINI_A", [1, 2]), ("MINI_A(opt_bias_correction=False)", [1, 2])]
    (pair,) = report.pairs(systems, [("MINI_A", "MINI_A(opt_bias_correction=False)")], "test", replications=300)
    # up to three options name a system; past three, a hash of what it shares
    for variant, options in (("three", ("a = 1", "b = 2", "c = 3")), ("four", ("a = 1", "b = 2", "c = 3", "d = 4"))):
        folder = tmp_path / variant / "seed1"
        fake_run(folder, "MINI_A", "ligru", 1, [1] * 30, 20, 20)
        resolved = folder / "config.resolved.cfg"
        resolved.write_text(resolved.read_text().replace("unit = ligru\n", "unit = ligru\n" + "\n".join(options) + "\n"))
    names = [s.name for s in group(find_runs([str(tmp_path / "*" / "seed*")]))]
    assert "MINI_A(a=1, b=2, c=3)" in names and any(re.fullmatch(r"MINI_A#[0-9a-f]{6}", n) for n in names), names
    assert pair.against_error == 30 and pair.versus["run_level"].probability_better > 0.99
    assert compare.parse_pairs("MINI_A:MINI_A(opt_bias_correction=False)") == [
        ("MINI_A", "MINI_A(opt_bias_correction=False)")]


def test_the_config_given_first_keeps_its_name_and_one_at_the_default_is_named_by_the_default(tmp_path):
    """A recipe's choices table: the recipe's runs, given first, are the baseline under the config's own name
    wherever their folders sort; a variant that sets an option back to its default is named by it."""
    for variant, line in (("b_beam15", "beam = 15.0\n"), ("z_recipe", "beam = 20.0\n"), ("c_default", "")):
        folder = tmp_path / variant / "seed1"
        fake_run(folder, "MINI_A", "ligru", 1, [1] * 30, 20, 20)
        resolved = folder / "config.resolved.cfg"
        resolved.write_text(resolved.read_text() + "[decoding]\n" + line)
    given = [str(tmp_path / v) for v in ("z_recipe", "b_beam15", "c_default")]
    assert [s.name for s in group(find_runs(given))] == [
        "MINI_A", "MINI_A(beam=15.0)", f"MINI_A(beam={option_default('decoding', 'beam')})"]
    # the same runs given in another order: the plain name goes with the first
    assert [s.name for s in group(find_runs([given[1], given[0]]))] == ["MINI_A", "MINI_A(beam=20.0)"]
    # a folder matched twice (by two patterns) is read once, where it first appears
    assert len(find_runs([given[0], str(tmp_path / "z_recipe" / "seed1")])) == 1


def test_the_same_override_in_two_architectures_names_the_system_once(tmp_path):
    """A stack of two architectures (each with its optimiser) swept with the override in both sections is
    named by the option once, the name --pairs gives for every config of the study's seeds-fix table."""
    second = "[architecture2]\narch_name = top\nunit = ubru\nsizes = 8\nbidirectional = False\n"
    for variant in ("after", "before"):
        folder = tmp_path / variant / "seed1"
        fake_run(folder, "MINI_AB", "ligru", 1, [1] * 30, 20, 20)
        resolved = folder / "config.resolved.cfg"
        text = resolved.read_text().replace("[model]\nstack = rec\n", second + "[model]\nstack = rec,top\n")
        if variant == "before":
            text = text.replace("sizes = 8,8\n", "sizes = 8,8\nopt_bias_correction = False\n")
            text = text.replace("sizes = 8\n", "sizes = 8\nopt_bias_correction = False\n")
        resolved.write_text(text)
    systems = group(find_runs([str(tmp_path / "*" / "seed*")]))
    assert [s.name for s in systems] == ["MINI_AB", "MINI_AB(opt_bias_correction=False)"]


@pytest.mark.slow
def test_a_terminated_sweep_stops_the_runs_it_started(tmp_path):
    """kill (SIGTERM) of the sweep ends its runs too, instead of leaving them to train unattended."""
    fake = tmp_path / "python"
    fake.write_text(f"#!{sys.executable}\nimport os, time\nopen({str(tmp_path / 'pid')!r}, 'w').write(str(os.getpid()))\n"
                    "time.sleep(120)\n")
    fake.chmod(0o755)
    (tmp_path / "a.cfg").write_text("[exp]\n")
    script = (f"from bru_kaldi.comparison.sweep import run_sweep\n"
              f"run_sweep([{str(tmp_path / 'a.cfg')!r}], [1], {str(tmp_path / 'out')!r}, python={str(fake)!r})\n")
    sweep = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT)
    deadline = time.time() + 60
    while not (tmp_path / "pid").exists() and time.time() < deadline:
        time.sleep(0.1)
    time.sleep(0.2)
    child = int((tmp_path / "pid").read_text())
    sweep.terminate()
    assert sweep.wait(timeout=30) == 128 + signal.SIGTERM
    assert not _alive(child, wait=10)  # terminated and reaped by the sweep before it exited


def _alive(pid: int, wait: float) -> bool:
    """Whether process ``pid`` still exists after up to ``wait`` seconds."""
    deadline = time.time() + wait
    while time.time() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        time.sleep(0.1)
    return True


def test_the_figures_draw_each_systems_seeds_interval_and_dev_curves(tmp_path, monkeypatch):
    """What the figures show, read back from matplotlib's artists: each seed's error at its place, the
    interval from its low to its high end (asymmetric: the bootstrap's percentiles), each run's dev curve."""
    from bru_kaldi.comparison import figures

    for seed in (1, 2):
        fake_run(tmp_path / "A" / f"seed{seed}", "MINI_A", "ligru", seed, [2, 3] * 15, 30, 29 + seed)
    fake_run(tmp_path / "B" / "seed1", "MINI_B", "libru", 1, [1] * 30, 20, 19)
    systems = group(find_runs([str(tmp_path / "*")]))
    rows = [report.Row("MINI_A", "ligru", 10, 2, 61, 2000, {"test": [30.0, 31.0]}, {"test": (30.5, 28.0, 34.0)}, {}),
            report.Row("MINI_B", "libru", 10, 2, 61, 2000, {"test": [20.0]}, {"test": (20.0, 19.0, 22.5)}, {})]
    drawn = {}
    monkeypatch.setattr(figures, "_save", lambda figure, folder, stem: drawn.setdefault(stem, figure) and [])
    figures.plot(systems, rows, "test", tmp_path / "plots")
    errors = drawn["errors"].axes[0]
    seeds = [line for line in errors.lines if line.get_marker() == "o"]
    assert [list(line.get_xdata()) for line in seeds] == [[30.0, 31.0], [20.0]]
    assert [list(line.get_ydata()) for line in seeds] == [[0, 0], [1]]
    bars = [c.lines[2][0].get_segments()[0] for c in errors.containers]  # each errorbar's horizontal segment
    assert [(seg[0][0], seg[1][0], seg[0][1]) for seg in bars] == [(28.0, 34.0, 0), (19.0, 22.5, 1)]
    curves = drawn["dev_curves"].axes[0].lines
    assert [list(line.get_ydata()) for line in curves] == [[pytest.approx(61.0), pytest.approx(55.0)]] * 3  # percent
    by_size, by_time = drawn["error_vs_cost"].axes
    assert [c.lines[2][0].get_segments()[0][0][0] for c in by_size.containers] == [1e-5, 1e-5]  # parameters / 1e6
    assert [c.lines[2][0].get_segments()[0][0][0] for c in by_time.containers] == [61 / 60, 61 / 60]


def test_a_mean_over_seeds_of_epochs_reads_as_a_number_of_epochs():
    """Runs stopped by patience after 17, 17 and 18 epochs: the table says 17.3, not 17.3333."""
    row = report.Row("MINI_A", "ligru 2x8 bi", 17, 52 / 3, 600.0, 1000.0, {"test": [20.0, 21.0]},
                     {"test": (20.5, 18.0, 23.0)}, {})
    assert "| 17.3 | 10.0 min |" in report.markdown([row], "test")

#!/usr/bin/env python3
"""The run-level test against simulated studies whose variance components are known: how often it calls
a difference that is not there, how often its 95 % interval holds the true difference, and how the test
set's part of the variance (the floor behind "resolved at 80 % power with unlimited seeds") compares with the truth.

Usage: python bench/power_simulation.py [--replicates 4000] [--seed 0] [--smoke] [--markdown F [--section NAME]]

Each setting takes its components from a pair of the archived five-seed study
(``results/study_runs/layout2``; ``statistics.variance_components``): on the phone task Li-BRU : Li-GRU,
whose test set's part is a twelfth of its seed-averaged spread, and UBRU with the Kalman recursion :
UBRU, whose is more than half; on the word task both pairs of its table. A simulated study draws a test
set of ``N`` utterances (with replacement from the real test set's, with their lengths ``n_u`` and the
baseline's mean errors ``c_u``) and ``S`` seeds of each system, with errors (counts; ``w_u = n_u /
mean n``)

    A: c_u + w_u a_s + g[s, u]           B: c_u + b_u + w_u a'_s + g'[s, u]

seed effects ``a_s`` (each system its own variance, from its seeds' spread less its interaction),
seed x utterance interaction ``g[s, u]`` (variance the system's interaction times ``w_u``) and the
systems' disagreement on the utterance ``b_u`` (variance the test set's part times ``w_u``, so that
long utterances vary more, as counts do), all normal. The truth the test is judged against is that of
the population the test sets are drawn from:
- **false positives**: ``b_u`` of mean 0; the share of studies the test calls at 5 %;
- **coverage**: ``b_u`` of mean ``0.01 mean n``, one error more per hundred tokens of an average
  utterance, not of each utterance (a true difference of 1 point, which then does not scale with the
  utterances drawn); the share of studies whose 95 % interval holds the 1 point;
- **the floor** ("resolved at 80 % power with unlimited seeds", 5 % and 80 % power): the true one, from the true test
  set's part of the variance (the variance over the studies' test sets of ``sum b / sum n``, what
  unlimited seeds would measure); the mean over the studies of the floor the test estimates, divided by
  the true one; and the same for the floor the seed-averaged spread would give (it holds the interaction
  once more: what the power columns took before they were corrected).

**Paired seeds.** Seed ``k`` of two configs draws the same batches, so their interactions correlate. The
second table draws ``g'[s, u] = rho g[s, u] sd' / sd + sqrt(1 - rho^2) (independent)`` at ``rho`` 0 and
0.15 (the archives measured -0.05 to +0.17) and compares the floor estimated from the seed-paired
differences (``run_level(..., paired=True)``, what compare.py does where two systems ran the same seeds)
with the floor that subtracts each system's interaction alone, both against the true floor.

``--markdown F --section NAME`` puts the table between ``<!-- bench NAME -->`` and ``<!-- /bench NAME -->``
of ``F`` (how RESULTS.md gets it), under a line with the command and the date. Fixed random seeds: the
same command gives the same table.
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from bru_kaldi.atomic import write_text_atomically  # noqa: E402
from bru_kaldi.comparison import statistics  # noqa: E402
from bru_kaldi.comparison.report import splice  # noqa: E402
from bru_kaldi.comparison.runs import find_runs, group  # noqa: E402

ARCHIVE = ROOT / "results" / "study_runs" / "layout2"
SETTINGS = [("phones", "MINI_liBRU", "MINI_liGRU"), ("phones", "MINI_UBRU_kalman", "MINI_UBRU"),
            ("words", "MINIW_liBRU", "MINIW_liGRU"), ("words", "MINIW_LSTM", "MINIW_liGRU")]
SEEDS = (2, 3, 5)
TRUE_DIFFERENCE = 0.01  # the coverage's: 1 point
CORRELATIONS = (0.0, 0.15)  # of the paired seeds' interactions (module docstring, "Paired seeds")
PAIRED_SEEDS = (3, 5)


class Setting:
    """One pair's components, turned into the parameters of the errors' model (module docstring)."""

    def __init__(self, task: str, system: str, against: str):
        systems = {s.name: s for s in group(find_runs([str(ARCHIVE / task)]))}
        errors_b, lengths, utterances = systems[system].errors("test")
        errors_a, lengths_a, utterances_a = systems[against].errors("test")
        if utterances != utterances_a:
            raise ValueError(f"{system} and {against}: scored on different utterances")
        self.name = f"`{system} : {against}`"
        c = statistics.variance_components(errors_a, errors_b, lengths)
        self.components = c
        count, total = len(lengths), lengths.sum()
        self.lengths, self.base = lengths, errors_a.mean(axis=0)
        # counts per average utterance: a component of the rate's variance times L^2 / N (or / N^2 for a seed's
        # shift of every utterance at once)
        self.interaction = [g * total ** 2 / count for g in c.interaction]
        self.seed = [max(runs - g, 0.0) * total ** 2 / count ** 2 for runs, g in zip(c.runs, c.interaction)]
        self.disagreement = c.test_set * total ** 2 / count

    def study(self, rng: np.random.Generator, seeds: int, shift: float):
        """``(errors_a (S, N), errors_b (S, N), lengths (N,), the test set's sum b / sum n)`` of one study."""
        pick = rng.integers(0, len(self.lengths), len(self.lengths))
        lengths, base = self.lengths[pick], self.base[pick]
        w = lengths / self.lengths.mean()
        b = shift * self.lengths.mean() + rng.normal(0.0, np.sqrt(self.disagreement * w))

        def runs(seed_variance, interaction):
            a = rng.normal(0.0, np.sqrt(seed_variance), (seeds, 1))
            return base + w * a + rng.normal(0.0, np.sqrt(interaction * w), (seeds, len(w)))

        errors_a = runs(self.seed[0], self.interaction[0])
        errors_b = runs(self.seed[1], self.interaction[1]) + b
        return errors_a, errors_b, lengths, b.sum() / lengths.sum()

    def paired_study(self, rng: np.random.Generator, seeds: int, shift: float, correlation: float):
        """As :meth:`study`, with row ``s`` of both systems one seed whose interactions correlate by ``correlation``."""
        pick = rng.integers(0, len(self.lengths), len(self.lengths))
        lengths, base = self.lengths[pick], self.base[pick]
        w = lengths / self.lengths.mean()
        b = shift * self.lengths.mean() + rng.normal(0.0, np.sqrt(self.disagreement * w))
        shared = rng.normal(0.0, 1.0, (seeds, len(w)))
        own = correlation * shared + np.sqrt(1 - correlation ** 2) * rng.normal(0.0, 1.0, (seeds, len(w)))
        errors = []
        for seed_variance, interaction, z in zip(self.seed, self.interaction, (shared, own)):
            a = rng.normal(0.0, np.sqrt(seed_variance), (seeds, 1))
            errors.append(base + w * a + np.sqrt(interaction * w) * z)
        return errors[0], errors[1] + b, lengths, b.sum() / lengths.sum()


def simulate(setting: Setting, seeds: int, replicates: int, rng: np.random.Generator) -> dict:
    """The false-positive rate, the coverage and the floors over ``replicates`` studies."""
    called, covered, test_sets, estimated, spread = 0, 0, [], [], []
    truth = TRUE_DIFFERENCE  # the population's sum b / sum n with b of mean 0.01 mean n
    for _ in range(replicates):
        a, b, lengths, measured = setting.study(rng, seeds, 0.0)
        test = statistics.run_level(a, b, lengths)
        called += test.p_value < 0.05
        test_sets.append(measured)
        estimated.append(test.floor)
        spread.append(statistics.detectable(test.components.spread, len(lengths) - 1, 0.05, 0.8))
        a, b, lengths, _ = setting.study(rng, seeds, TRUE_DIFFERENCE)
        test = statistics.run_level(a, b, lengths)
        covered += test.low <= truth <= test.high
    floor = statistics.detectable(float(np.var(test_sets, ddof=1)), len(setting.lengths) - 1, 0.05, 0.8)
    return {"false positives": called / replicates, "coverage": covered / replicates, "floor": floor,
            "estimated floor": float(np.mean(estimated)) / floor, "seed-averaged floor": float(np.mean(spread)) / floor}


def simulate_paired(setting: Setting, seeds: int, correlation: float, replicates: int,
                    rng: np.random.Generator) -> dict:
    """Paired studies: the false-positive rate and coverage of the paired test, and both floors against the truth."""
    called, covered, test_sets, paired, unpaired = 0, 0, [], [], []
    for _ in range(replicates):
        a, b, lengths, measured = setting.paired_study(rng, seeds, 0.0, correlation)
        test = statistics.run_level(a, b, lengths, paired=True)
        called += test.p_value < 0.05
        test_sets.append(measured)
        paired.append(test.floor)
        unpaired.append(statistics.run_level(a, b, lengths).floor)
        a, b, lengths, _ = setting.paired_study(rng, seeds, TRUE_DIFFERENCE, correlation)
        test = statistics.run_level(a, b, lengths, paired=True)
        covered += test.low <= TRUE_DIFFERENCE <= test.high
    floor = statistics.detectable(float(np.var(test_sets, ddof=1)), len(setting.lengths) - 1, 0.05, 0.8)
    return {"false positives": called / replicates, "coverage": covered / replicates, "floor": floor,
            "paired floor": float(np.mean(paired)) / floor, "unpaired floor": float(np.mean(unpaired)) / floor}


def paired_table(rows: list[tuple[str, int, float, dict]]) -> str:
    lines = ["| components of | seeds a system | correlation of the paired seeds' interactions | false positives at 5 % "
             "(paired) | 95 % interval's coverage (paired) | true floor | floor from the paired differences / true | "
             "floor subtracting each interaction alone / true |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for name, seeds, correlation, r in rows:
        lines.append(f"| {name} | {seeds} | {correlation:g} | {100 * r['false positives']:.1f} % | "
                     f"{100 * r['coverage']:.1f} % | {100 * r['floor']:.2f} | {r['paired floor']:.2f} | "
                     f"{r['unpaired floor']:.2f} |")
    return "\n".join(lines)


def table(rows: list[tuple[str, int, dict]]) -> str:
    lines = ["| components of | seeds a system | false positives at 5 % | 95 % interval's coverage | true floor | "
             "estimated floor / true | seed-averaged floor / true |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for name, seeds, r in rows:
        lines.append(f"| {name} | {seeds} | {100 * r['false positives']:.1f} % | {100 * r['coverage']:.1f} % | "
                     f"{100 * r['floor']:.2f} | {r['estimated floor']:.2f} | {r['seed-averaged floor']:.2f} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--replicates", type=int, default=4000, help="simulated studies per setting and seeds")
    parser.add_argument("--seed", type=int, default=0, help="of the random draws")
    parser.add_argument("--markdown", help="also write the table to this file")
    parser.add_argument("--section", help="with --markdown F: replace that section of F (between "
                                          "<!-- bench SECTION --> and <!-- /bench SECTION -->)")
    parser.add_argument("--smoke", action="store_true", help="40 studies a cell, seconds: what the tests run (the "
                                                             "numbers then mean nothing)")
    args = parser.parse_args(argv)
    if args.section and not args.markdown:
        parser.error("--section needs --markdown FILE (the file whose section is replaced)")
    replicates = 40 if args.smoke else args.replicates
    if replicates < 2:
        parser.error(f"--replicates {replicates}: at least 2 (the truth is a variance over the studies)")
    rows = []
    for task, system, against in SETTINGS:
        setting = Setting(task, system, against)
        name, c = setting.name, setting.components
        print(f"{name} ({c.utterances} test utterances): runs' variance {c.runs[0]:.3g} / {c.runs[1]:.3g}, "
              f"interaction {c.interaction[0]:.3g} / {c.interaction[1]:.3g}, test set {c.test_set:.3g}, "
              f"seed-averaged spread {c.spread:.3g} (rates as fractions, squared)", flush=True)
        for seeds in SEEDS:
            rng = np.random.default_rng([args.seed, seeds, len(rows)])
            rows.append((name, seeds, simulate(setting, seeds, replicates, rng)))
            r = rows[-1][2]
            print(f"  S={seeds}: false positives {100 * r['false positives']:.1f} %, coverage "
                  f"{100 * r['coverage']:.1f} %, floor {100 * r['floor']:.2f} points, estimated "
                  f"{r['estimated floor']:.2f} of it, seed-averaged {r['seed-averaged floor']:.2f}", flush=True)
    paired_rows = []
    for task, system, against in SETTINGS:
        setting = Setting(task, system, against)
        for seeds in PAIRED_SEEDS:
            for correlation in CORRELATIONS:
                rng = np.random.default_rng([args.seed, seeds, len(rows) + len(paired_rows), int(100 * correlation)])
                r = simulate_paired(setting, seeds, correlation, replicates, rng)
                paired_rows.append((setting.name, seeds, correlation, r))
                print(f"  paired, S={seeds}, rho={correlation:g}: floor from the paired differences "
                      f"{r['paired floor']:.2f} of the true one, subtracting each interaction alone "
                      f"{r['unpaired floor']:.2f}", flush=True)
    text = table(rows) + "\n\nPaired seeds (module docstring, \"Paired seeds\"):\n\n" + paired_table(paired_rows)
    print(text)
    if args.markdown:
        command = "python bench/power_simulation.py " + shlex.join(sys.argv[1:] if argv is None else argv)
        text = (f"`{command.strip()}` on {time.strftime('%Y-%m-%d')}: {replicates} simulated studies a row, "
                f"each row with its own random stream\n\n{text}")
        if args.section:
            text = splice(Path(args.markdown).read_text(), args.section, text, tool="bench")
        write_text_atomically(args.markdown, text + ("" if args.section else "\n"))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The comparison table: one row per system, its seeds' errors, their mean and spread, a 95 % bootstrap
interval, and the tests against a baseline system (the run-level test and its P(better), then the
utterance-only ones), as text, Markdown or CSV; and the table of named pairs, whose verdicts come from the
run-level test alone. Long because the three tables (systems, pairs, the papers' claims) are views of one
set of rows and tests, with the marks and notes they share: split, each would import the others' pieces.

>>> row = Row("MINI_liBRU", "libru 2x256 uni", 540000, 8.0, 170.0, 17000.0, {"test": [30.1, 31.7]},
...           {"test": (30.9, 29.2, 32.6)}, {})
>>> print(markdown([row], "test"))  # doctest: +NORMALIZE_WHITESPACE
| system | units | parameters | epochs | training | frames/s | test per seed | test mean ± sd | test 95 % interval (bootstrap) | run-level P(better than baseline), one-sided | run-level p, two-sided | utterance-only p (matched pairs) | utterance-only p (sign test) |
| --- | --- | ---: | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |
| MINI_liBRU | libru 2x256 uni | 0.54M | 8 | 2.8 min | 17000 | 30.10 / 31.70 | 30.90 ± 1.13 | 29.20-32.60 |  |  |  |  |
<BLANKLINE>
Run-level P(better than baseline): 1 - the one-sided p of the run-level t, read as a probability under a flat prior; run-level p: two-sided.
"""

from __future__ import annotations

import csv
import io
import statistics as pystats
from dataclasses import dataclass, field
from typing import Optional, Sequence

from bru_kaldi.comparison import statistics
from bru_kaldi.comparison.runs import System


@dataclass
class Row:
    """One system's line of the table: what it is, what it cost, its errors per seed and set, its tests."""

    name: str
    units: str
    parameters: Optional[int]
    epochs: Optional[float]
    seconds: Optional[float]  # training time, mean over seeds
    frames_per_second: Optional[float]
    errors: dict[str, list[float]]  # set -> error rate (percent) per seed
    intervals: dict[str, tuple[float, float, float]]  # set -> (rate, low, high), percent
    versus: dict  # difference (a fraction), run_level (a RunLevelTest or None), matched_pairs_p, sign_p
    failed: int = 0  # runs of this system without a result (failed, or still running)
    on_edge: list[bool] = field(default_factory=list)  # per finished run: its tuned setting on its grid's edge
    # set -> what its column holds where that is not the whole set: "dev without dev_core" (Run.held_out)
    labels: dict[str, str] = field(default_factory=dict)


EDGE_MARK = "‡"
EDGE_NOTE = (f"{EDGE_MARK}: the run's decoding setting, chosen on its tuning set, is the first or last of its grid "
             "(res.res edge=; for a run decoded before grids grew, its setting against the config's acwt_sweep and "
             "wip_sweep): it may have been decoded below its best.")


def _mean(values):
    values = [v for v in values if v is not None]
    return pystats.fmean(values) if values else None


def rows(systems: Sequence[System], sets: Sequence[str], baseline: Optional[str], test_set: str,
         replications: int = statistics.REPLICATIONS, cost_machine: Optional[str] = None,
         target: Optional[float] = None) -> list[Row]:
    """One :class:`Row` per system; ``test_set`` gets the interval and the tests against ``baseline``.

    ``cost_machine`` (a run's ``machine``, "" for runs whose log does not say): the training time and
    frames/s are the means over that machine's runs alone, so that the cost columns compare systems on
    one machine when the runs of a study come from several (a GPU's minutes beside a CPU's would say
    nothing); a system with no run there has none. The errors and tests use every run: a seed is a seed
    wherever it trained. ``target`` (points): the difference whose seeds the run-level tests give
    (``statistics.run_level``).
    """
    names = [s.name for s in systems]
    if baseline is not None and baseline not in names:
        raise ValueError(f"--baseline {baseline}: no such system; the systems are {', '.join(names)}")
    reference = next((s for s in systems if s.name == baseline), None)
    out = []
    for system in systems:
        done = [r for r in system.runs if r.finished]
        finished = System(system.name, done)
        errors = {name: [r.errors[name] for r in done if name in r.errors] for name in sets}
        labels = {}
        for name in sets:  # a set whose decoding setting was chosen on part of it: the rest, held out
            held = [r.held_out(name) for r in done]
            if name != test_set and done and all(held) and len({r.tuned_on for r in done}) == 1:
                errors[name] = [rate for rate, _, _ in held]
                labels[name] = f"{name} without {done[0].tuned_on}"
        intervals, versus = {}, {}
        if done and all(test_set in r.errors for r in done):
            e, n, _ = finished.errors(test_set)
            iv = statistics.interval(e, n, replications)
            intervals[test_set] = (100 * iv.rate, 100 * iv.low, 100 * iv.high)
            if reference is not None and system is not reference:
                base_runs = System(reference.name, [r for r in reference.runs if r.finished])
                base, base_n, base_utts = base_runs.errors(test_set)
                mine, _, utts = finished.errors(test_set)
                common = sorted(set(base_utts) & set(utts))
                bi = [base_utts.index(u) for u in common]
                mi = [utts.index(u) for u in common]
                lengths = base_n[bi]
                # the same seeds in both (runs sorted by seed): seed k of each drew the same batches, and the
                # interaction is estimated from the seed-paired differences (statistics, "Seeds shared by configs")
                paired = base_runs.seeds == finished.seeds and len(finished.seeds) > 1
                versus = {
                    "difference": (statistics.error_rate(mine[:, mi], lengths)
                                   - statistics.error_rate(base[:, bi], lengths)),
                    "run_level": statistics.run_level(base[:, bi], mine[:, mi], lengths,
                                                    target=None if target is None else target / 100, paired=paired),
                    "matched_pairs_p": statistics.matched_pairs(base[:, bi], mine[:, mi]).p_value,
                    "sign_p": statistics.sign_test(base[:, bi], mine[:, mi]).p_value,
                }
        costed = [r for r in done if cost_machine is None or (r.machine or "") == cost_machine]
        out.append(Row(system.name, system.describe(), _mean([r.parameters for r in done]),
                       _mean([len(r.epochs) for r in done]), _mean([r.training_seconds for r in costed]),
                       _mean([r.frames_per_second for r in costed]), errors, intervals, versus,
                       failed=len(system.runs) - len(done), on_edge=[bool(r.edges) for r in done], labels=labels))
    return out


def _cells(row: Row, sets: Sequence[str], test_set: str) -> list[str]:
    def number(value, fmt):
        return "" if value is None else format(value, fmt)

    cells = [row.name, row.units, "" if row.parameters is None else f"{row.parameters / 1e6:.2f}M",
             number(row.epochs, ".3g"), "" if row.seconds is None else f"{row.seconds / 60:.1f} min",
             number(row.frames_per_second, ".0f")]
    for name in sets:
        values = row.errors.get(name, [])
        marks = row.on_edge if len(row.on_edge) == len(values) else [False] * len(values)
        per_seed = " / ".join(f"{v:.2f}{EDGE_MARK if edge else ''}" for v, edge in zip(values, marks)) + (
            f" ({row.failed} unfinished)" if row.failed else "")
        spread = f"{pystats.fmean(values):.2f} ± {pystats.stdev(values):.2f}" if len(values) > 1 else (
            f"{values[0]:.2f}" if values else "")
        cells += [per_seed, spread]
        if name == test_set:
            iv = row.intervals.get(name)
            cells.append(f"{iv[1]:.2f}-{iv[2]:.2f}" if iv else "")
    v = row.versus
    test = v.get("run_level")
    cells += ["" if test is None else f"{test.probability_better:.3f}", _run_level_p(v),
              number(v.get("matched_pairs_p"), ".3g"), number(v.get("sign_p"), ".3g")]
    return cells


def _run_level_p(versus: dict) -> str:
    """The run-level p-value, "one seed" where a system has one (the runs' variance unknown), or empty."""
    if not versus:
        return ""
    test = versus.get("run_level")
    return "one seed" if test is None else format(test.p_value, ".3g")


def headers(sets: Sequence[str], test_set: str, labels: Optional[dict] = None) -> list[str]:
    names = ["system", "units", "parameters", "epochs", "training", "frames/s"]
    for name in sets:
        label = (labels or {}).get(name, name)
        names += [f"{label} per seed", f"{label} mean ± sd"] + ([f"{name} 95 % interval (bootstrap)"]
                                                                if name == test_set else [])
    return names + ["run-level P(better than baseline), one-sided", "run-level p, two-sided",
                    "utterance-only p (matched pairs)", "utterance-only p (sign test)"]


TABLE_NOTE = ("Run-level P(better than baseline): 1 - the one-sided p of the run-level t, read as a probability "
              "under a flat prior; run-level p: two-sided.")


def _labels(table: Sequence[Row]) -> dict[str, str]:
    return {name: label for row in table for name, label in row.labels.items()}


def notes(table: Sequence[Row]) -> str:
    """What the columns' numbers are, under a table: held-out columns, the run-level ones, the edge mark."""
    held = [f"\"{label}\": {name} less the utterances of {label.split(' without ')[1]}, which chose the decoding setting "
            f"(held out; the whole set's rate is in res.res)." for name, label in _labels(table).items()]
    return " ".join(held + [TABLE_NOTE] + ([EDGE_NOTE] if any(any(row.on_edge) for row in table) else []))


def markdown(table: Sequence[Row], test_set: str, sets: Optional[Sequence[str]] = None) -> str:
    sets = list(sets or table[0].errors)
    head = headers(sets, test_set, _labels(table))
    align = ["---", "---"] + ["---:"] * 4 + [a for name in sets for a in (["---", "---:"] + (["---:"] if name == test_set else []))]
    align += ["---:"] * 4
    lines = ["| " + " | ".join(head) + " |", "| " + " | ".join(align) + " |"]
    lines += ["| " + " | ".join(_cells(row, sets, test_set)) + " |" for row in table]
    return "\n".join(lines) + "\n\n" + notes(table)


def text(table: Sequence[Row], test_set: str, sets: Optional[Sequence[str]] = None) -> str:
    """An aligned plain-text table for the terminal."""
    sets = list(sets or table[0].errors)
    grid = [headers(sets, test_set, _labels(table))] + [_cells(row, sets, test_set) for row in table]
    widths = [max(len(r[i]) for r in grid) for i in range(len(grid[0]))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() for r in grid) + "\n" + notes(table)


def csv_text(table: Sequence[Row], test_set: str, sets: Optional[Sequence[str]] = None) -> str:
    sets = list(sets or table[0].errors)
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(headers(sets, test_set, _labels(table)))
    writer.writerows(_cells(row, sets, test_set) for row in table)
    return buffer.getvalue()


# --------------------------------------------------------------------------- named pairs
@dataclass
class Pair:
    """One system against another on the test set: each one's mean error over its seeds (percent), and
    the tests of :func:`rows` with ``against`` as the baseline."""

    system: str
    against: str
    system_error: Optional[float]  # None: no finished run yet (a study still under way)
    against_error: Optional[float]
    versus: dict
    seeds: tuple[int, int] = (0, 0)  # finished runs of each
    on_edge: int = 0  # finished runs of either whose tuned setting is on its grid's edge (EDGE_NOTE)

    def reading(self, alpha: float = 0.05) -> str:
        """The verdict at level ``alpha``, from the run-level test alone (``statistics.run_level``):
        ``better``/``worse`` (than ``against``), or ``not resolved with S / S seeds``; with one seed in
        either system ``not resolved: one seed, run-to-run variance unknown`` whatever the utterance-only
        tests say; empty before both systems have a finished run."""
        if not self.versus:
            return ""
        test = self.versus["run_level"]
        if test is None:
            return "not resolved: one seed, run-to-run variance unknown"
        return test.reading(alpha)


def pairs(systems: Sequence[System], wanted: Sequence[tuple[str, str]], test_set: str,
          replications: int = statistics.REPLICATIONS, missing_ok: bool = False,
          target: Optional[float] = None) -> list[Pair]:
    """A :class:`Pair` for each ``(system, against)`` of ``wanted`` (names of ``systems``). A name that is
    not one of them is an error, or with ``missing_ok`` (a study whose later runs have not started) a
    pair without results. ``target`` (points): as :func:`rows`'."""
    by_name = {s.name: s for s in systems}
    out = []

    def finished(n):
        return sum(r.finished for r in by_name[n].runs) if n in by_name else 0

    for name, against in wanted:
        missing = [n for n in (name, against) if n not in by_name]
        seeds = (finished(name), finished(against))
        if missing and missing_ok:
            def mean_error(n):
                return _mean([r.errors.get(test_set) for r in by_name[n].runs]) if n in by_name else None

            out.append(Pair(name, against, mean_error(name), mean_error(against), {}, seeds))
            continue
        if missing:
            raise ValueError(f"--pairs {name}:{against}: no system {', '.join(missing)}; the systems are "
                             f"{', '.join(by_name)}")
        mine, base = rows([by_name[name], by_name[against]], [test_set], against, test_set, replications,
                          target=target)
        out.append(Pair(name, against, _mean(mine.errors[test_set]), _mean(base.errors[test_set]), mine.versus, seeds,
                        sum(mine.on_edge) + sum(base.on_edge)))
    return out


PAIR_HEADERS = ("system", "against", "seeds", "{set} error", "against's", "difference", "95 % interval (runs)",
                "relative (95 % interval)", "run-level P(better), one-sided", "run-level p, two-sided",
                "utterance-only p (matched pairs)", "utterance-only p (sign test)", "at 5 % (run level)",
                "resolved at 80 % power", "seeds needed", "resolved at 80 % power with unlimited seeds")
PAIR_NOTE = ("Run-level P(better): 1 - the one-sided p of the run-level t, read as a probability under a flat "
             "prior; run-level p: two-sided. Relative: the difference and its interval over the against system's mean, "
             "taken as fixed. Resolved at 80 % power: what this design finds at 5 % four times in five, not a bound "
             "on the true difference; with unlimited seeds: the same from the test set's part alone (its floor).")


def pairs_markdown(table: Sequence[Pair], test_set: str, target: Optional[float] = None) -> str:
    """The pairs as a Markdown table: both means and their seeds, the difference (the run-level test's
    own ``D``, from the per-utterance counts: it can differ by 0.01 from the difference of the two means,
    which are rounded in ``res.res``) with its run-level interval, the tests (the run-level one and its
    P(better) first; the others see only utterances), the verdict at 5 %
    from the run-level test, the difference the design resolves with 80 % power and the seeds per system
    that would resolve the observed one (``statistics.run_level``; "-" where no number of seeds would,
    on this test set), with ``target`` (points, the pairs made with it: :func:`pairs`) the seeds per
    system that would resolve that difference, and what unlimited seeds would resolve on this test set
    (its floor). The relative difference is the difference and its run-level interval divided by the
    against system's mean error, which is taken as fixed (Kaldi's "relative WER reduction")."""
    headers = [h.format(set=test_set) for h in PAIR_HEADERS]
    if target is not None:
        headers.insert(-1, f"seeds for {target:g} points")
    lines = ["| " + " | ".join(headers) + " |",
             "| " + " | ".join("---" if h in ("system", "against", "seeds", "at 5 % (run level)") else "---:"
                               for h in headers) + " |"]
    for p in table:
        v, seeds = p.versus, f"{p.seeds[0]} / {p.seeds[1]}" + (f" ({p.on_edge} {EDGE_MARK})" if p.on_edge else "")
        if not v:
            lines.append(f"| {p.system} | {p.against} | {seeds} | {_or_dash(p.system_error)} | "
                         f"{_or_dash(p.against_error)} | | no finished run of both yet |" + " |" * (len(headers) - 7))
            continue
        test = v["run_level"]
        if test is None:  # no interval, P(better), p or power without the runs' variance: blank cells
            runs = ["", "", "one seed"] + [""] * (len(headers) - 13)
        else:
            runs = [f"{100 * test.low:+.2f} to {100 * test.high:+.2f}", f"{test.probability_better:.3f}",
                    f"{test.p_value:.3g}", f"{100 * test.resolvable:.2f}", _or_dash(test.seeds_needed, "d")]
            runs += [_or_dash(test.seeds_for_target, "d")] if target is not None else []
            runs += [f"{100 * test.floor:.2f}"]
        difference = 100 * v["difference"]  # the test's own D, not a difference of the rounded means
        relative = _relative(difference, p.against_error)
        if test is not None and p.against_error:  # the test's bounds are fractions, the errors points
            relative += f" ({_relative(100 * test.low, p.against_error)} to {_relative(100 * test.high, p.against_error)})"
        cells = [p.system, p.against, seeds, f"{p.system_error:.2f}", f"{p.against_error:.2f}",
                 f"{difference:+.2f}", runs[0], relative, runs[1], runs[2], f"{v['matched_pairs_p']:.3g}",
                 f"{v['sign_p']:.3g}", p.reading()] + runs[3:]
        lines.append("| " + " | ".join(cells) + " |")
    note = PAIR_NOTE + (f" Seeds ({EDGE_MARK} N): N runs of the two on an edge. {EDGE_NOTE}"
                        if any(p.on_edge for p in table) else "")
    return "\n".join(lines) + "\n\n" + note


def _relative(difference: float, against: float) -> str:
    """``difference`` (points) as a percentage of ``against`` (points): ``-12.5 %``; "" where that is 0.

    >>> _relative(-3.0, 24.0), _relative(0.5, 20.0)
    ('-12.5 %', '+2.5 %')
    """
    return f"{100 * difference / against:+.1f} %" if against else ""


# --------------------------------------------------------------------------- the papers' claims
# What a claim expects of `system` against `against`, and the run-level reading that bears it out or not.
EXPECTATIONS = {"better": ("better", "worse"), "not worse": ("better", "worse"),
                "worse": ("worse", "better"), "not better": ("worse", "better")}


@dataclass
class Claim:
    """A claim of a paper, tested by one pair: ``system`` is ``expects`` (``better``, ``not worse``,
    ``worse``, ``not better``) than ``against``."""

    text: str
    paper: str  # what the paper measured
    expects: str
    system: str
    against: str

    def verdict(self, pair: "Pair", alpha: float = 0.05) -> str:
        """``agrees`` or ``disagrees`` where the run-level test resolves the pair at ``alpha`` (followed by
        ``(an approximate test below 3 seeds)`` where it is one), else its ``not resolved ...`` reading (one
        seed, or too few seeds for the difference); empty before the pair has finished runs of both systems."""
        reading = pair.reading(alpha)
        agreeing, disagreeing = EXPECTATIONS[self.expects]
        test = pair.versus.get("run_level") if pair.versus else None
        approximate = test is not None and test.approximate
        caveat = f" (an approximate test below {statistics.APPROXIMATE_BELOW} seeds)" if approximate else ""
        if reading.startswith(agreeing):
            return "agrees" + caveat
        if reading.startswith(disagreeing):
            return "disagrees" + caveat
        return reading


def read_claims(path) -> list[Claim]:
    """The claims of a tab-separated file: a header line, then ``claim, paper's numbers, expects,
    SYSTEM:AGAINST`` per line (``#`` lines are comments). A malformed line is an error naming its number."""
    claims = []
    with open(path, encoding="utf-8") as f:
        lines = f.read().splitlines()
    for number, line in enumerate(lines[1:], start=2):
        if not line.strip() or line.startswith("#"):
            continue
        fields = line.split("\t")
        pair = fields[3].split(":") if len(fields) == 4 else []
        if len(pair) != 2 or not all(pair) or fields[2] not in EXPECTATIONS:
            raise ValueError(f"{path}:{number}: expected 4 tab-separated fields, claim, paper, one of "
                             f"{', '.join(EXPECTATIONS)}, SYSTEM:AGAINST; got {line!r}")
        claims.append(Claim(fields[0], fields[1], fields[2], pair[0], pair[1]))
    if not claims:
        raise ValueError(f"{path}: no claims (a header line, then one claim a line)")
    return claims


def claims_markdown(claims: Sequence[Claim], table: Sequence[Pair]) -> str:
    """Each claim with its pair's difference, run-level interval and p-value, and the verdict (:meth:`Claim.verdict`)."""
    by_names = {(p.system, p.against): p for p in table}
    lines = ["| claim | the paper's numbers | system : against | difference (95 % interval, runs) | run-level p | "
             "on the built-in corpus |", "| --- | --- | --- | --- | ---: | --- |"]
    for claim in claims:
        pair = by_names[claim.system, claim.against]
        test = pair.versus.get("run_level") if pair.versus else None
        if not pair.versus:
            measured, p_value = "", ""
        elif test is None:
            measured, p_value = f"{100 * pair.versus['difference']:+.2f}", "one seed"
        else:
            measured = f"{100 * test.difference:+.2f} ({100 * test.low:+.2f} to {100 * test.high:+.2f})"
            p_value = f"{test.p_value:.3g}"
        word, _, rest = claim.verdict(pair).partition(" ")
        verdict = f"**{word}** {rest}".rstrip() if word in ("agrees", "disagrees") else f"{word} {rest}".rstrip()
        lines.append(f"| {claim.text} | {claim.paper} | `{claim.system} : {claim.against}` | {measured} | {p_value} | "
                     f"{verdict} |")
    return "\n".join(lines)


def _or_dash(value, fmt: str = ".2f") -> str:
    return "-" if value is None else format(value, fmt)


def splice(document: str, name: str, text: str, tool: str = "compare.py") -> str:
    """``document`` with the lines between ``<!-- TOOL NAME -->`` and ``<!-- /TOOL NAME -->`` replaced by
    ``text``: how a generated table goes into a hand-written page (``tool``: what generates it).

    >>> print(splice("a\\n<!-- compare.py t -->\\nold\\n<!-- /compare.py t -->\\nb", "t", "new"))
    a
    <!-- compare.py t -->
    new
    <!-- /compare.py t -->
    b
    """
    begin, end = f"<!-- {tool} {name} -->", f"<!-- /{tool} {name} -->"
    if document.count(begin) != 1 or document.count(end) != 1 or document.index(begin) > document.index(end):
        raise ValueError(f"expected one line '{begin}' followed by one line '{end}' to put the table between")
    head, rest = document.split(begin, 1)
    _, tail = rest.split(end, 1)
    return f"{head}{begin}\n{text.strip()}\n{end}{tail}"


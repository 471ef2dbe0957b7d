"""The comparison table: one row per system, its seeds' errors, their mean and spread, a 95 % interval,
and matched-pair tests against a baseline system, as text, Markdown or CSV.

>>> row = Row("MINI_liBRU", "libru 2x256 uni", 540000, 8.0, 170.0, 17000.0, {"test": [30.1, 31.7]},
...           {"test": (30.9, 29.2, 32.6)}, {})
>>> print(markdown([row], "test"))  # doctest: +NORMALIZE_WHITESPACE
| system | units | parameters | epochs | training | frames/s | test per seed | test mean ± sd | test 95 % interval | P(better than baseline) | matched pairs p | sign test p |
| --- | --- | ---: | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: |
| MINI_liBRU | libru 2x256 uni | 0.54M | 8 | 2.8 min | 17000 | 30.10 / 31.70 | 30.90 ± 1.13 | 29.20-32.60 | | | |
"""

from __future__ import annotations

import csv
import io
import statistics as pystats
from dataclasses import dataclass
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
    versus: dict[str, float]  # probability_of_improvement, matched_pairs_p, sign_p (against the baseline)
    failed: int = 0  # runs of this system without a result (failed, or still running)


def _mean(values):
    values = [v for v in values if v is not None]
    return pystats.fmean(values) if values else None


def rows(systems: Sequence[System], sets: Sequence[str], baseline: Optional[str], test_set: str,
         replications: int = statistics.REPLICATIONS) -> list[Row]:
    """One :class:`Row` per system; ``test_set`` gets the interval and the tests against ``baseline``."""
    names = [s.name for s in systems]
    if baseline is not None and baseline not in names:
        raise ValueError(f"--baseline {baseline}: no such system; the systems are {', '.join(names)}")
    reference = next((s for s in systems if s.name == baseline), None)
    out = []
    for system in systems:
        done = [r for r in system.runs if r.finished]
        finished = System(system.name, done)
        errors = {name: [r.errors[name] for r in done if name in r.errors] for name in sets}
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
                versus = {
                    "probability_of_improvement": statistics.probability_of_improvement(base[:, bi], mine[:, mi], lengths,
                                                                                        replications),
                    "matched_pairs_p": statistics.matched_pairs(base[:, bi], mine[:, mi]).p_value,
                    "sign_p": statistics.sign_test(base[:, bi], mine[:, mi]).p_value,
                }
        out.append(Row(system.name, system.describe(), _mean([r.parameters for r in done]),
                       _mean([len(r.epochs) for r in done]), _mean([r.training_seconds for r in done]),
                       _mean([r.frames_per_second for r in done]), errors, intervals, versus,
                       failed=len(system.runs) - len(done)))
    return out


def _cells(row: Row, sets: Sequence[str], test_set: str) -> list[str]:
    def number(value, fmt):
        return "" if value is None else format(value, fmt)

    cells = [row.name, row.units, "" if row.parameters is None else f"{row.parameters / 1e6:.2f}M",
             number(row.epochs, ".3g"), "" if row.seconds is None else f"{row.seconds / 60:.1f} min",
             number(row.frames_per_second, ".0f")]
    for name in sets:
        values = row.errors.get(name, [])
        per_seed = " / ".join(f"{v:.2f}" for v in values) + (f" ({row.failed} unfinished)" if row.failed else "")
        spread = f"{pystats.fmean(values):.2f} ± {pystats.stdev(values):.2f}" if len(values) > 1 else (
            f"{values[0]:.2f}" if values else "")
        cells += [per_seed, spread]
        if name == test_set:
            iv = row.intervals.get(name)
            cells.append(f"{iv[1]:.2f}-{iv[2]:.2f}" if iv else "")
    v = row.versus
    cells += [number(v.get("probability_of_improvement"), ".3f"), number(v.get("matched_pairs_p"), ".3g"),
              number(v.get("sign_p"), ".3g")]
    return cells


def headers(sets: Sequence[str], test_set: str) -> list[str]:
    names = ["system", "units", "parameters", "epochs", "training", "frames/s"]
    for name in sets:
        names += [f"{name} per seed", f"{name} mean ± sd"] + ([f"{name} 95 % interval"] if name == test_set else [])
    return names + ["P(better than baseline)", "matched pairs p", "sign test p"]


def markdown(table: Sequence[Row], test_set: str, sets: Optional[Sequence[str]] = None) -> str:
    sets = list(sets or table[0].errors)
    head = headers(sets, test_set)
    align = ["---", "---"] + ["---:"] * 4 + [a for name in sets for a in (["---", "---:"] + (["---:"] if name == test_set else []))]
    align += ["---:"] * 3
    lines = ["| " + " | ".join(head) + " |", "| " + " | ".join(align) + " |"]
    lines += ["| " + " | ".join(_cells(row, sets, test_set)) + " |" for row in table]
    return "\n".join(lines)


def text(table: Sequence[Row], test_set: str, sets: Optional[Sequence[str]] = None) -> str:
    """An aligned plain-text table for the terminal."""
    sets = list(sets or table[0].errors)
    grid = [headers(sets, test_set)] + [_cells(row, sets, test_set) for row in table]
    widths = [max(len(r[i]) for r in grid) for i in range(len(grid[0]))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() for r in grid)


def csv_text(table: Sequence[Row], test_set: str, sets: Optional[Sequence[str]] = None) -> str:
    sets = list(sets or table[0].errors)
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(headers(sets, test_set))
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
    versus: dict[str, float]
    seeds: tuple[int, int] = (0, 0)  # finished runs of each

    def reading(self, alpha: float = 0.05) -> str:
        """What the matched-pairs test says at level ``alpha``: ``better``/``worse`` (than ``against``)
        or ``no significant difference``; empty before both systems have a finished run."""
        if not self.versus:
            return ""
        if self.versus["matched_pairs_p"] >= alpha:
            return "no significant difference"
        return f"{'better' if self.system_error < self.against_error else 'worse'} (p < {alpha:g})"


def pairs(systems: Sequence[System], wanted: Sequence[tuple[str, str]], test_set: str,
          replications: int = statistics.REPLICATIONS, missing_ok: bool = False) -> list[Pair]:
    """A :class:`Pair` for each ``(system, against)`` of ``wanted`` (names of ``systems``). A name that is
    not one of them is an error, or with ``missing_ok`` (a study whose later runs have not started) a
    pair without results."""
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
        mine, base = rows([by_name[name], by_name[against]], [test_set], against, test_set, replications)
        out.append(Pair(name, against, _mean(mine.errors[test_set]), _mean(base.errors[test_set]), mine.versus, seeds))
    return out


def pairs_markdown(table: Sequence[Pair], test_set: str) -> str:
    """The pairs as a Markdown table: both means and their seeds, the difference, the three tests, and
    what the matched-pairs test says at the 5 % level."""
    lines = [f"| system | against | seeds | {test_set} error | against's | difference | P(better) | matched pairs p | "
             "sign test p | at 5 % |",
             "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    for p in table:
        v, seeds = p.versus, f"{p.seeds[0]} / {p.seeds[1]}"
        if not v:
            lines.append(f"| {p.system} | {p.against} | {seeds} | {_or_dash(p.system_error)} | "
                         f"{_or_dash(p.against_error)} | | no finished run of both yet | | | |")
            continue
        lines.append(f"| {p.system} | {p.against} | {seeds} | {p.system_error:.2f} | {p.against_error:.2f} | "
                     f"{p.system_error - p.against_error:+.2f} | {v['probability_of_improvement']:.3f} | "
                     f"{v['matched_pairs_p']:.3g} | {v['sign_p']:.3g} | {p.reading()} |")
    return "\n".join(lines)


def _or_dash(value: Optional[float]) -> str:
    return "-" if value is None else f"{value:.2f}"


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


"""The settings tried on the tuning set: a grid of acoustic scales (or Kaldi's LM weights) and word insertion
penalties, scored point by point, grown past an edge that the best setting sits on.

A decoder turns settings into :class:`~bru_kaldi.decoding.sets.Pass` es (the Python decoder decodes the set
again at each, Kaldi's ``score.sh`` rescores its lattices); :func:`tune` scores a :class:`Grid`, chooses the
pass with the fewest errors (:func:`choose`), and while that choice is the first or last value of an axis,
better than the value next to it, adds a value beyond it (:func:`grow`) and scores the new settings. A best
setting on a grid's edge is a system decoded below its best: the grid grows until the best is inside, or
until ``[decoding] grid_extensions`` growths an edge, and the edge left is recorded (``res.res`` ``edge=``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

from bru_kaldi import scoring
from bru_kaldi.decoding.sets import Pass


# How an axis of the grid grows past an edge: an acoustic scale by the ratio of its last two values (a
# scale is a ratio, and LM weights 1 / scale are what Kaldi steps through), a penalty by the step between
# its last two values, Kaldi's integer LM weight by the same step but never below 1.
GEOMETRIC, ARITHMETIC, LM_WEIGHT = "geometric", "arithmetic", "lm weight"


def grow(values: Sequence[float], best: float, rule: str) -> Optional[float]:
    """The value one step beyond the edge of ``values`` on which ``best`` sits; None where ``best`` is inside,
    where the grid has a single value (a fixed setting, not a grid), or where the edge cannot move (an LM
    weight of 1).

    >>> grow([0.07, 0.1, 0.15, 0.2], 0.2, GEOMETRIC), grow([0.1, 0.15, 0.2], 0.1, GEOMETRIC)
    (0.267, 0.0667)
    >>> grow([0.0, 0.5, 1.0], 0.0, ARITHMETIC), grow([0.0, 0.5, 1.0], 0.5, ARITHMETIC), grow([0.2], 0.2, GEOMETRIC)
    (-0.5, None, None)
    >>> grow([1, 2, 3], 1, LM_WEIGHT), grow([5, 6, 7], 7, LM_WEIGHT)
    (None, 8)
    """
    values = sorted(values)
    if len(values) < 2 or values[0] < best < values[-1]:
        return None
    edge, neighbour = (values[-1], values[-2]) if best == values[-1] else (values[0], values[1])
    if rule == GEOMETRIC:
        return float(f"{edge * edge / neighbour:.3g}")
    new = edge + (edge - neighbour)
    if rule == LM_WEIGHT:
        return int(new) if new >= 1 else None
    return round(new, 6)


@dataclass
class Grid:
    """The settings tried on the tuning set: named axes (``acwt`` and ``wip``, or Kaldi's ``lmwt`` and
    ``wip``), each a list of values and the rule it grows by (:func:`grow`); a setting is a tuple with one
    value per axis, in their order. ``edges``: the axes on whose edge :func:`tune` left the chosen setting.

    >>> grid = Grid({"acwt": [0.1, 0.2], "wip": [0.0]}, {"acwt": GEOMETRIC, "wip": ARITHMETIC})
    >>> grid.settings(), grid.describe()
    ([(0.1, 0.0), (0.2, 0.0)], 'acwt:0.1,0.2 wip:0')
    """

    axes: dict[str, list[float]]
    rules: dict[str, str]
    edges: list[str] = field(default_factory=list)

    def settings(self) -> list[tuple]:
        combos: list[tuple] = [()]
        for values in self.axes.values():
            combos = [c + (v,) for c in combos for v in sorted(values)]
        return combos

    def describe(self) -> str:
        return " ".join(f"{name}:{','.join(f'{v:g}' for v in sorted(values))}" for name, values in self.axes.items())


def _edges(grid: Grid, chosen: "Pass", scored: dict) -> list[tuple[int, bool]]:
    """``(axis index, upper edge)`` of each axis on whose edge ``chosen`` sits with strictly fewer errors than
    the setting one step inside: a choice that only ties its neighbour (the penalty changing nothing, say)
    shares the best with a setting inside the grid, and growing the grid that way could find nothing better."""
    out = []
    for i, values in enumerate(grid.axes.values()):
        values = sorted(values)
        best = chosen.value[i]
        if len(values) < 2 or values[0] < best < values[-1]:
            continue
        upper = best == values[-1]
        inside = chosen.value[:i] + (values[-2] if upper else values[1],) + chosen.value[i + 1:]
        if chosen.score.total.errors < scored[inside].score.total.errors:
            out.append((i, upper))
    return out


def tune(grid: Grid, evaluate: Callable[[list[tuple]], list["Pass"]], extensions: int,
         log: Callable[[str], None] = lambda line: None) -> tuple[list["Pass"], "Pass"]:
    """Score every setting of ``grid`` (``evaluate`` turns settings into passes whose ``value`` is the setting)
    and choose the best (:func:`choose`); while the best sits on the edge of an axis, with fewer errors than
    the setting one step inside, grow that axis a step beyond it (:func:`grow`) and score the new settings,
    at most ``extensions`` times an edge. ``grid`` is left as it was finally tried, its ``edges`` naming
    the axes whose edge the choice is still on. Returns every pass and the chosen one.

    >>> def evaluate(settings):  # errors fall as the scale grows, up to 0.3
    ...     return [Pass(f"acwt={s:g}", {}, {}, [], scoring.Score(scoring.ErrorCounts(subs=round(abs(s - 0.3) * 100),
    ...                  ref_len=100)), value=(s,), order=(s,)) for (s,) in settings]
    >>> grid = Grid({"acwt": [0.1, 0.15, 0.2]}, {"acwt": GEOMETRIC})
    >>> passes, chosen = tune(grid, evaluate, extensions=4)
    >>> chosen.value, grid.describe(), grid.edges
    ((0.267,), 'acwt:0.1,0.15,0.2,0.267,0.356', [])
    >>> grid = Grid({"acwt": [0.1, 0.15]}, {"acwt": GEOMETRIC})
    >>> passes, chosen = tune(grid, evaluate, extensions=1)
    >>> chosen.value, grid.edges
    ((0.225,), ['acwt'])
    """
    scored: dict[tuple, Pass] = {}
    grown: dict[tuple[int, bool], int] = {}  # (axis, upper edge) -> times grown
    names = list(grid.axes)
    while True:
        todo = [s for s in grid.settings() if s not in scored]
        for run in evaluate(todo):
            scored[run.value] = run
        chosen = choose([scored[s] for s in grid.settings()])
        edges = _edges(grid, chosen, scored)
        more = False
        for i, upper in edges:
            name = names[i]
            new = grow(grid.axes[name], chosen.value[i], grid.rules[name])
            if new is None or grown.get((i, upper), 0) >= extensions:
                continue
            grown[i, upper] = grown.get((i, upper), 0) + 1
            grid.axes[name] = sorted(grid.axes[name] + [new])
            more = True
            log(f"the best setting so far, {chosen.setting}, is on the edge of the {name} grid: trying {name}={new:g}")
        if not more:
            grid.edges = [names[i] for i, _ in edges]
            return [scored[s] for s in grid.settings()], chosen


def choose(passes: Sequence[Pass]) -> Pass:
    """The pass with the fewest errors on the tuning set; ties go to the smallest ``order`` (see decode_sets)."""
    return min(passes, key=lambda r: (r.score.total.errors, r.order))

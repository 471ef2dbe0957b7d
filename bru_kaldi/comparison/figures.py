"""The figures a comparison goes into a paper with, each as PNG and SVG:

* ``errors.{png,svg}``: the test error of every system, its seeds as dots and its 95 % interval as a bar;
* ``dev_curves.{png,svg}``: the dev frame error per epoch of every run, one colour per system;
* ``error_vs_cost.{png,svg}``: test error against parameters and against training time.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from bru_kaldi.atomic import write_atomically
from bru_kaldi.comparison.report import Row
from bru_kaldi.comparison.runs import System


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # no display on servers
    import matplotlib.pyplot as plt

    return plt


def _save(figure, folder: Path, stem: str) -> list[Path]:
    """Write ``figure`` as PNG and SVG. The same figure gives the same bytes each time (no date in the
    metadata, SVG ids from a fixed salt), so remaking a committed figure from unchanged runs changes no file."""
    import matplotlib

    paths = []
    for kind in ("png", "svg"):
        path = folder / f"{stem}.{kind}"
        with matplotlib.rc_context({"svg.hashsalt": "bru-kaldi"}):
            write_atomically(path, lambda tmp: figure.savefig(tmp, format=kind, dpi=120, bbox_inches="tight",
                                                              metadata={"Date": None} if kind == "svg" else None))
        paths.append(path)
    return paths


def plot(systems: Sequence[System], table: Sequence[Row], test_set: str, folder) -> list[Path]:
    """Write the three figures into ``folder``; returns their paths."""
    plt = _pyplot()
    folder = Path(folder)
    colours = plt.get_cmap("tab10")
    written = []

    figure, axis = plt.subplots(figsize=(7, 0.45 * len(table) + 1.2))
    for i, row in enumerate(table):
        values = row.errors.get(test_set, [])
        axis.plot(values, [i] * len(values), "o", color=colours(i % 10), alpha=0.6, markersize=4)
        if test_set in row.intervals:
            rate, low, high = row.intervals[test_set]
            axis.errorbar([rate], [i], xerr=[[rate - low], [high - rate]], fmt="s", color=colours(i % 10), capsize=3)
    axis.set_yticks(range(len(table)), [row.name for row in table])
    axis.invert_yaxis()
    axis.set_xlabel(f"{test_set} error (%), seeds and 95 % interval")
    axis.grid(axis="x", alpha=0.3)
    written += _save(figure, folder, "errors")
    plt.close(figure)

    figure, axis = plt.subplots(figsize=(7, 4))
    for i, system in enumerate(systems):
        for k, run in enumerate(system.runs):
            axis.plot([e["epoch"] for e in run.epochs], [100 * e["dev_err"] for e in run.epochs], "-", marker=".",
                      color=colours(i % 10), alpha=0.7, label=system.name if k == 0 else None)
    axis.set_xlabel("epoch")
    axis.set_ylabel("dev frame error (%)")
    axis.grid(alpha=0.3)
    axis.legend(fontsize=7)
    written += _save(figure, folder, "dev_curves")
    plt.close(figure)

    figure, (by_size, by_time) = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
    for i, row in enumerate(table):
        if test_set not in row.intervals:
            continue
        rate, low, high = row.intervals[test_set]
        for axis, x in ((by_size, row.parameters and row.parameters / 1e6), (by_time, row.seconds and row.seconds / 60)):
            if x:
                axis.errorbar([x], [rate], yerr=[[rate - low], [high - rate]], fmt="o", color=colours(i % 10), capsize=3)
                axis.annotate(row.name, (x, rate), fontsize=7, xytext=(4, 2), textcoords="offset points")
    by_size.set_xlabel("parameters (millions)")
    by_time.set_xlabel("training time (minutes)")
    by_size.set_ylabel(f"{test_set} error (%)")
    for axis in (by_size, by_time):
        axis.grid(alpha=0.3)
    written += _save(figure, folder, "error_vs_cost")
    plt.close(figure)
    return written

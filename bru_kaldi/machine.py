"""What machine a measurement ran on, for the line above a benchmark's or a comparison's numbers.

>>> isinstance(cpu_model(), str) and len(cpu_model()) > 0
True
"""

from __future__ import annotations

import os
import platform
import time


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``), or what ``platform`` knows where there is none."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def load_average() -> str:
    """The 1, 5 and 15 minute load averages, or ``n/a``."""
    try:
        return " ".join(f"{v:.2f}" for v in os.getloadavg())
    except OSError:
        return "n/a"


def run_line(device: str, threads: int, torch_version: str) -> str:
    """Where and when a run ran, as ``run_exp.py`` writes it into ``log.txt`` and ``compare.py`` reads it
    back (``machine: DATE, WHERE``: a table's runs may come from several sittings and machines).

    >>> run_line("cpu", 1, "2.13.0+cpu").split(", ")[-3:]
    ['1 thread', 'torch 2.13.0+cpu', 'device cpu']
    """
    return (f"machine: {time.strftime('%Y-%m-%d')}, {cpu_model()}, {os.cpu_count()} cores, "
            f"{threads} thread{'s' if threads != 1 else ''}, torch {torch_version}, device {device}")

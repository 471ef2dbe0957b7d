"""What machine a measurement ran on, for the line above a benchmark's or a comparison's numbers.

>>> isinstance(cpu_model(), str) and len(cpu_model()) > 0
True
"""

from __future__ import annotations

import os
import platform


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

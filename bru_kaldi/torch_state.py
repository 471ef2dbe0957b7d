"""torch's process-wide settings that a run changes (threads, flushing of subnormal floats), read and
put back: a run started in-process (``run_exp.main`` from a test or another program) leaves torch as it
found it.

>>> import torch
>>> before = torch_settings()
>>> with run_settings(threads=1, flush_denormal=True):
...     torch.get_num_threads(), flushes_denormals()
(1, True)
>>> torch_settings() == before
True
"""

from __future__ import annotations

import contextlib
from typing import Iterator, Optional

import torch


def flushes_denormals() -> bool:
    """Whether torch flushes subnormal floats to zero (``torch.set_flush_denormal``, which has no getter):
    a subnormal float32 times one stays subnormal unless it is flushed."""
    return bool((torch.tensor([1e-40], dtype=torch.float32) * 1.0)[0] == 0)


def torch_settings() -> dict:
    """What :func:`run_settings` changes and restores, as it is now."""
    return {"threads": torch.get_num_threads(), "flush_denormal": flushes_denormals()}


@contextlib.contextmanager
def run_settings(threads: Optional[int] = None, flush_denormal: Optional[bool] = None) -> Iterator[None]:
    """torch's threads and denormal flushing set for a block (``None``: left as they are), restored after it."""
    before = torch_settings()
    try:
        if threads is not None:
            torch.set_num_threads(threads)
        if flush_denormal is not None:
            torch.set_flush_denormal(flush_denormal)
        yield
    finally:
        torch.set_num_threads(before["threads"])
        torch.set_flush_denormal(before["flush_denormal"])

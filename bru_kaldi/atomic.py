"""Atomic writes: every file the toolkit writes appears whole or not at all.

A file is written under a temporary name in its own folder (``.NAME.tmp.PID``: hidden, so that a glob
such as ``lat.*.gz`` never picks it up, and per process, so that two writers never share one), flushed
to disk, and moved into place with ``os.replace``, which is atomic on POSIX file systems. A reader, or
a run resumed after a kill, therefore sees the old file or the new one, never half of one; a write
that fails (an exception, a full disk) leaves the old file untouched and removes its temporary.

>>> import tempfile, pathlib
>>> path = pathlib.Path(tempfile.mkdtemp()) / "res.res"
>>> write_text_atomically(path, "epoch=001\\n")
>>> path.read_text(), sorted(p.name for p in path.parent.iterdir())
('epoch=001\\n', ['res.res'])
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator


def temporary_name(path: Path) -> Path:
    """The temporary file beside ``path`` that this process writes before moving it into place."""
    path = Path(path)
    return path.with_name(f".{path.name}.tmp.{os.getpid()}")


def _sync(path: Path) -> None:
    """Flush ``path``'s data to the disk, so that a machine crash cannot leave a renamed but empty file."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextmanager
def atomic_path(path, sync: bool = True) -> Iterator[Path]:
    """Yield a temporary path to write; on success it replaces ``path``, on an exception it is removed.

    The folder of ``path`` is created if needed. ``sync=False`` skips the flush to disk (for files
    that are cheap to redo).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temporary_name(path)
    try:
        yield tmp
        if sync:
            _sync(tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_atomically(path, write: Callable[[Path], None], sync: bool = True) -> None:
    """Call ``write(tmp)`` on a temporary file beside ``path``, then move it into place (see the module)."""
    with atomic_path(path, sync) as tmp:
        write(tmp)


def write_text_atomically(path, text: str, sync: bool = True) -> None:
    """Write ``text`` (UTF-8) to ``path`` atomically."""
    write_atomically(path, lambda tmp: tmp.write_text(text, encoding="utf-8"), sync)

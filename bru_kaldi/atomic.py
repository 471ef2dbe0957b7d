"""Atomic writes: every file the toolkit writes appears whole or not at all.

A file is written under a temporary name in its own folder (``.NAME.tmp.PID``: hidden, so that a glob
such as ``lat.*.gz`` never picks it up, and per process, so that two writers never share one), flushed
to disk, and moved into place with ``os.replace``, which is atomic on POSIX file systems. A reader, or
a run resumed after a kill, therefore sees the old file or the new one, never half of one; a write
that fails (an exception, a full disk) leaves the old file untouched, removes its temporary, and
raises :class:`WriteError` naming the file (and saying so when the disk was full).

>>> import tempfile, pathlib
>>> path = pathlib.Path(tempfile.mkdtemp()) / "res.res"
>>> write_text_atomically(path, "epoch=001\\n")
>>> path.read_text(), sorted(p.name for p in path.parent.iterdir())
('epoch=001\\n', ['res.res'])
>>> import errno, pickle
>>> error = pickle.loads(pickle.dumps(WriteError(path, OSError(errno.ENOSPC, "No space left on device"))))
>>> error.no_room, error.errno == errno.ENOSPC, str(error).startswith(f"[Errno 28] cannot write {path}: no room left")
(True, True, True)
"""

from __future__ import annotations

import errno
import os
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

# What a write that ran out of room fails with: a full disk, a quota, a file-size limit.
NO_ROOM = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


class WriteError(OSError):
    """A file could not be written; the message names it, says why, and that the old file is intact.

    ``no_room`` is true when the disk (or a quota or size limit) was full: the run can go on once
    space is freed.
    """

    def __init__(self, path: Path, cause: BaseException):
        code = getattr(cause, "errno", None)
        self.no_room = code in NO_ROOM
        why = getattr(cause, "strerror", None) or str(cause)
        if self.no_room:
            why = (f"no room left ({why}): the disk holding {Path(path).parent} is full or a size limit was "
                   f"reached; free space and run the same command again")
        super().__init__(code or errno.EIO, f"cannot write {path}: {why}; the previous {Path(path).name}, if any, "
                                            "is intact")
        self.path = Path(path)

    def __reduce__(self):
        # as it was, across processes (a pool worker's error reaches the parent by pickle)
        return _rebuilt_write_error, (str(self.path), self.errno, self.strerror, self.no_room)


def _rebuilt_write_error(path: str, code: int, message: str, no_room: bool) -> WriteError:
    error = WriteError.__new__(WriteError)
    OSError.__init__(error, code, message)
    error.path, error.no_room = Path(path), no_room
    return error


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
    tmp = temporary_name(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise WriteError(path, error) from error
    try:
        try:
            yield tmp
        except OSError as error:
            # the writing failed (the temporary could not be opened, or no room was left); an error
            # of something the caller read on the way (a missing input) goes on as it is
            if isinstance(error, WriteError) or not (error.errno in NO_ROOM or error.filename in (str(tmp), tmp)):
                raise
            raise WriteError(path, error) from error
        try:
            if sync:
                _sync(tmp)
            os.replace(tmp, path)
        except OSError as error:
            raise WriteError(path, error) from error
    finally:
        tmp.unlink(missing_ok=True)


def write_atomically(path, write: Callable[[Path], None], sync: bool = True) -> None:
    """Call ``write(tmp)`` on a temporary file beside ``path``, then move it into place (see the module)."""
    with atomic_path(path, sync) as tmp:
        write(tmp)


def write_text_atomically(path, text: str, sync: bool = True) -> None:
    """Write ``text`` (UTF-8) to ``path`` atomically."""
    write_atomically(path, lambda tmp: tmp.write_text(text, encoding="utf-8"), sync)

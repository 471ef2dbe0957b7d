"""Where a Kaldi table comes from: rspecifiers, files (gzipped or not) and shell pipelines whose exit
status is checked, and the loop that reads records from any of them with errors that name the source.

A Kaldi *rspecifier* names a table: ``ark:feats.ark``, ``scp:feats.scp``, ``ark,s,cs:...``, or a shell
pipeline ``ark:gunzip -c ali.1.gz |``. Every pipeline runs under ``bash -o pipefail`` and its exit
status is checked when its output ends, so a failing Kaldi command can never pass for a short
archive. A pipeline runs only where a config or a caller names one: a config is as trusted as a script.
"""

from __future__ import annotations

import gzip
import subprocess
import tempfile
from dataclasses import dataclass
from typing import IO, Iterator, Optional


class KaldiIOError(Exception):
    """A Kaldi file, archive entry or pipeline that cannot be used.

    The message names the file (or command), the utterance where there is one, and what was expected.
    """


@dataclass(frozen=True)
class Rspecifier:
    """A parsed Kaldi rspecifier: ``kind`` is ``"ark"`` or ``"scp"``; ``target`` a path or a command."""

    kind: str
    target: str

    @property
    def is_pipe(self) -> bool:
        return self.target.rstrip().endswith("|")

    def __str__(self) -> str:
        return f"{self.kind}:{self.target}"


def parse_rspecifier(spec: str) -> Rspecifier:
    """Parse ``ark:...``/``scp:...`` (Kaldi's options such as ``ark,s,cs:`` are accepted and ignored).

    A bare path is an ``scp`` if it ends in ``.scp``, else an archive (``.gz`` archives are gunzipped).

    >>> parse_rspecifier("ark,s,cs:gunzip -c ali.1.gz |").is_pipe, parse_rspecifier("data/feats.scp").kind
    (True, 'scp')
    """
    spec = spec.strip()
    head, sep, rest = spec.partition(":")
    options = head.split(",")
    kaldi_options = ("s", "cs", "ns", "p", "o", "b", "t", "f", "nf")  # sorted, called-sorted, permissive...
    if sep and options[0] in ("ark", "scp") and all(o in kaldi_options for o in options[1:]):
        if not rest.strip():
            raise KaldiIOError(f"rspecifier {spec!r}: nothing after {head}:")
        return Rspecifier(options[0], rest.strip())
    if not spec:
        raise KaldiIOError("empty rspecifier: expected ark:PATH, scp:PATH, ark:COMMAND | or a path")
    return Rspecifier("scp" if spec.endswith(".scp") else "ark", spec)


class Pipe:
    """The stdout of a shell pipeline, read as a binary file; its exit status is checked on close.

    ``bash -o pipefail`` makes the status non-zero when any command of the pipeline fails, not only
    the last one (``copy-feats ... | add-deltas ...`` would otherwise hide a failing copy-feats).
    """

    def __init__(self, command: str):
        self.command = command.rstrip().rstrip("|").strip()
        self._stderr = tempfile.TemporaryFile()
        try:
            self._proc = subprocess.Popen(["bash", "-o", "pipefail", "-c", self.command],
                                          stdout=subprocess.PIPE, stderr=self._stderr)
        except OSError as error:
            self._stderr.close()
            raise KaldiIOError(f"cannot start the pipeline `{self.command}`: {error}") from None
        self.stdout = self._proc.stdout

    def _failure(self, status: int) -> str:
        self._stderr.seek(0)
        tail = self._stderr.read()[-2000:].decode(errors="replace").strip()
        return (f"the pipeline `{self.command}` exited with status {status}"
                + (f"; its error output ends with:\n{tail}" if tail else " and wrote no error output"))

    def failure(self) -> str:
        """Why the pipeline failed, if it has already exited with an error; else an empty string."""
        try:
            status = self._proc.wait(timeout=1.0)
        except subprocess.TimeoutExpired:
            return ""
        return self._failure(status) if status != 0 else ""

    def close(self, check: bool = True) -> None:
        """Wait for the pipeline; with ``check`` raise if it failed, else stop it (output abandoned)."""
        if not check and self._proc.poll() is None:
            self._proc.kill()
        self.stdout.close()
        status = self._proc.wait()
        message = self._failure(status) if check and status != 0 else ""
        self._stderr.close()
        if message:
            raise KaldiIOError(message)


def open_archive(target: str) -> tuple[IO[bytes], Optional[Pipe]]:
    """Open an archive path or pipeline for binary reading; gzipped files are decompressed."""
    if target.rstrip().endswith("|"):
        pipe = Pipe(target)
        return pipe.stdout, pipe
    try:
        raw = open(target, "rb")
    except OSError as error:
        raise KaldiIOError(f"cannot open the archive {target}: {error.strerror}") from None
    if raw.read(2) == b"\x1f\x8b":  # gzip magic: ali.*.gz are gzipped archives
        raw.seek(0)
        return gzip.GzipFile(fileobj=raw, mode="rb"), None
    raw.seek(0)
    return raw, None


def read_records(spec: Rspecifier, parse) -> Iterator[tuple[str, object]]:
    """Run ``parse(file)`` (a generator of records) over an archive, wrapping errors and checking pipes."""
    stream, pipe = open_archive(spec.target)
    last = None
    finished = False
    try:
        try:
            for key, value in parse(stream):
                last = key
                yield key, value
            finished = True
        except KaldiIOError:
            raise
        except Exception as error:  # kaldiio raises AssertionError/ValueError/struct.error on bad bytes
            where = f"after utterance {last!r}" if last else "at its first entry"
            cause = pipe.failure() if pipe is not None else ""  # a failed command explains a cut archive
            raise KaldiIOError(f"{spec}: unreadable archive {where}: {type(error).__name__}: {error}"
                               + (f"; {cause}" if cause else "")) from error
    finally:
        if pipe is not None:
            pipe.close(check=finished)  # a consumer that stops early abandons the pipe's output
        else:
            stream.close()

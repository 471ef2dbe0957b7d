"""Kaldi tables (``ark`` / ``scp`` archives) read and written without Kaldi: the layer under ``data_io``.

Kaldi keeps per-utterance objects in archives: ``key<space>object`` records, where a binary object
starts with ``"\\0B"`` and a type token (``FM`` float matrix, ``CM``/``CM2``/``CM3`` compressed
matrix, ``\\4`` int32 vector, ...). An ``scp`` file maps each key to ``path.ark:byte-offset``.
Where a table comes from (rspecifiers, gzipped files, checked pipelines) is
``bru_kaldi.kaldi.rspecifiers``.

Long because reading and writing of every table type share one record format and its checks.
Matrices are parsed by kaldiio; int32 vectors (alignments) by our own reader, because kaldiio reads
them one element at a time in Python. Every error is a :class:`KaldiIOError` naming the file (or
command) and the utterance.

>>> import tempfile, numpy as np
>>> d = tempfile.mkdtemp()
>>> with ArkWriter(f"{d}/out.ark", f"{d}/out.scp") as w:
...     w.write("utt1", np.ones((3, 2), dtype=np.float32))
>>> [(k, m.shape) for k, m in read_matrices(f"scp:{d}/out.scp")]
[('utt1', (3, 2))]
"""

from __future__ import annotations

import os
import struct
from pathlib import Path
from typing import IO, Iterable, Iterator, Optional

import kaldiio
import numpy as np

from bru_kaldi.atomic import WriteError, temporary_name, write_text_atomically
from bru_kaldi.kaldi.rspecifiers import KaldiIOError, Pipe, Rspecifier, parse_rspecifier, read_records

__all__ = ["KaldiIOError", "Rspecifier", "parse_rspecifier", "check_matrix", "read_matrices", "ScpTable",
           "read_int_vectors", "read_text_table", "read_kaldi_vector", "write_kaldi_vector", "ArkWriter"]


# --------------------------------------------------------------------------- matrices
def check_matrix(array, source: str, key: str, dtype=np.float32) -> np.ndarray:
    """A finite, non-empty 2-D copy of ``array`` (float32 unless ``dtype`` says otherwise).

    Otherwise :class:`KaldiIOError` naming ``source`` and ``key``.
    """
    if not isinstance(array, np.ndarray) or array.ndim != 2:
        shape = getattr(array, "shape", type(array).__name__)
        raise KaldiIOError(f"{source}: utterance {key!r} is not a matrix (got {shape}); expected (frames, dims)")
    if array.shape[0] == 0 or array.shape[1] == 0:
        raise KaldiIOError(f"{source}: utterance {key!r} is an empty matrix of shape {array.shape}")
    array = np.array(array, dtype=dtype)  # a copy: kaldiio's arrays may view a shared buffer
    finite = np.isfinite(array)
    if not finite.all():
        frame = int(np.argwhere(~finite)[0, 0])
        raise KaldiIOError(f"{source}: utterance {key!r} has NaN or Inf values (first at frame {frame})")
    return array


def read_matrices(rspecifier: str, dtype=np.float32) -> Iterator[tuple[str, np.ndarray]]:
    """Iterate ``(key, (T, F) float32)`` over an ark, scp or pipeline of float or compressed matrices.

    Each matrix is checked (2-D, non-empty, finite); a pipeline's exit status is checked at its end.

    >>> import tempfile, numpy as np, kaldiio
    >>> d = tempfile.mkdtemp()
    >>> kaldiio.save_ark(f"{d}/a.ark", {"u": np.zeros((4, 3), np.float32)}, compression_method=2)
    >>> next(read_matrices(f"ark:cat {d}/a.ark |"))[1].shape
    (4, 3)
    """
    spec = parse_rspecifier(rspecifier)
    if spec.kind == "scp":
        table = ScpTable(spec.target)
        yield from table.load(table.keys, dtype)
        return
    for key, value in read_records(spec, kaldiio.load_ark):
        yield key, check_matrix(value, str(spec), key, dtype)


def _matrix_shape(stream: IO[bytes]) -> Optional[tuple[int, int]]:
    """(rows, cols) from a binary matrix header at the stream position; ``None`` if it is not one."""
    head = stream.read(2)
    if head != b"\0B":
        return None
    token = bytearray()
    while (c := stream.read(1)) not in (b" ", b""):
        token += c
    kind = token.decode(errors="replace")
    if kind in ("FM", "DM"):
        size_r, rows, size_c, cols = struct.unpack("<bibi", stream.read(10))
        return (rows, cols) if size_r == 4 and size_c == 4 else None
    if kind in ("CM", "CM2", "CM3"):  # GlobalHeader: float min, float range, int32 rows, int32 cols
        _, _, rows, cols = struct.unpack("<ffii", stream.read(16))
        return rows, cols
    return None


class ScpTable:
    """Random access to the entries of an ``scp`` file (``key path.ark:offset`` lines).

    Args:
        path: the scp file. Keys must be unique.

    ``load(keys)`` reads those entries, each archive opened once; ``shapes()`` reads only headers.

    >>> import tempfile, numpy as np
    >>> d = tempfile.mkdtemp()
    >>> with ArkWriter(f"{d}/f.ark", f"{d}/f.scp") as w:
    ...     for i in range(3):
    ...         w.write(f"u{i}", np.zeros((i + 1, 2), np.float32))
    >>> table = ScpTable(f"{d}/f.scp")
    >>> table.shapes()["u2"], [k for k, _ in table.load(["u2", "u0"])]
    ((3, 2), ['u0', 'u2'])
    """

    def __init__(self, path: str):
        self.path = str(path)
        self.locations: dict[str, str] = {}
        try:
            lines = Path(path).read_text().splitlines()
        except OSError as error:
            raise KaldiIOError(f"cannot read the scp file {path}: {error.strerror}") from None
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            parts = line.strip().split(None, 1)
            if len(parts) != 2:
                raise KaldiIOError(f"{path} line {number}: expected 'key location', got {line!r}")
            key, location = parts
            if key in self.locations:
                raise KaldiIOError(f"{path} line {number}: utterance {key!r} appears twice")
            self.locations[key] = location
        if not self.locations:
            raise KaldiIOError(f"the scp file {path} has no entries")
        self.keys = list(self.locations)

    def __len__(self) -> int:
        return len(self.locations)

    def __contains__(self, key: str) -> bool:
        return key in self.locations

    def _split(self, key: str) -> tuple[str, Optional[int], bool]:
        """(archive, offset, simple): ``simple`` is False for pipes and row/column ranges."""
        location = self.locations[key]
        if location.rstrip().endswith("|") or location.endswith("]"):
            return location, None, False
        ark, _, offset = location.rpartition(":")
        if ark and offset.isdigit():
            return ark, int(offset), True
        return location, None, True

    def _ordered(self, keys: Iterable[str]) -> list[tuple[str, Optional[int], bool, str]]:
        entries = []
        for key in keys:
            if key not in self.locations:
                raise KaldiIOError(f"{self.path}: no utterance {key!r}")
            entries.append((*self._split(key), key))
        return sorted(entries, key=lambda e: (e[0], e[1] or 0))  # sequential reads, archive by archive

    def load(self, keys: Iterable[str], dtype=np.float32) -> Iterator[tuple[str, np.ndarray]]:
        """Yield ``(key, (T, F) float32)`` for ``keys``, checked, in archive order (not in ``keys`` order).

        ``dtype=np.float64`` keeps double matrices (CMVN stats) exact.
        """
        handles: dict[str, IO[bytes]] = {}
        try:
            for ark, offset, simple, key in self._ordered(keys):
                where = f"{self.path} (utterance {key!r} at {self.locations[key]})"
                try:
                    if simple:  # kaldiio keeps each archive open in `handles` and seeks to the offset
                        value = kaldiio.load_mat(self.locations[key], fd_dict=handles)
                    else:
                        value = self._load_special(key)
                except KaldiIOError:
                    raise
                except OSError as error:
                    raise KaldiIOError(f"{where}: cannot read the archive: {error.strerror or error}") from None
                except Exception as error:
                    raise KaldiIOError(f"{where}: unreadable entry: {type(error).__name__}: {error}") from error
                yield key, check_matrix(value, self.path, key, dtype)
        finally:
            for handle in handles.values():
                handle.close()

    def _load_special(self, key: str) -> np.ndarray:
        location = self.locations[key]
        if location.rstrip().endswith("|"):  # an scp entry that is a command: one object on its stdout
            pipe = Pipe(location)
            try:
                value = kaldiio.matio.read_kaldi(pipe.stdout)
            except Exception:
                pipe.close(check=False)
                raise
            pipe.close()
            return value
        return kaldiio.load_mat(location)

    def shapes(self, keys: Optional[Iterable[str]] = None) -> dict[str, tuple[int, int]]:
        """``{key: (frames, dims)}`` from the matrix headers alone (whole entries only where needed)."""
        keys = self.keys if keys is None else list(keys)
        shapes: dict[str, tuple[int, int]] = {}
        handles: dict[str, IO[bytes]] = {}
        try:
            for ark, offset, simple, key in self._ordered(keys):
                shape = None
                if simple:
                    try:
                        if ark not in handles:
                            handles[ark] = open(ark, "rb")
                        handles[ark].seek(offset or 0)
                        shape = _matrix_shape(handles[ark])
                    except OSError as error:
                        raise KaldiIOError(f"{self.path}: cannot read {ark} for utterance {key!r}: "
                                           f"{error.strerror}") from None
                    except struct.error:
                        raise KaldiIOError(f"{self.path}: {ark} ends inside the header of utterance {key!r}") from None
                if shape is None:  # text matrices, ranges, pipes: read the entry itself
                    shape = next(iter(self.load([key])))[1].shape
                elif shape[0] <= 0 or shape[1] <= 0:
                    raise KaldiIOError(f"{self.path}: utterance {key!r} is an empty matrix of shape {shape}")
                shapes[key] = shape
        finally:
            for handle in handles.values():
                handle.close()
        return {key: shapes[key] for key in keys}  # in the order asked, not the archive order


# --------------------------------------------------------------------------- int32 vectors (alignments)
def _int_vector_records(stream: IO[bytes]) -> Iterator[tuple[str, np.ndarray]]:
    """Binary (``\\0B \\4 n`` then n times ``\\4 value``) or text (``key v1 v2 ...``) int32 vectors."""
    record = np.dtype([("size", "i1"), ("value", "<i4")])
    while True:
        key = bytearray()
        while (c := stream.read(1)) and not c.isspace():
            key += c
        if not key:
            if not c:
                return
            continue  # whitespace between text records
        name = key.decode()
        first = stream.read(1)
        if first == b"\0":
            if stream.read(1) != b"B":
                raise KaldiIOError(f"utterance {name!r}: bad binary header")
            head = stream.read(5)
            if len(head) != 5 or head[0] != 4:
                raise KaldiIOError(f"utterance {name!r}: expected an int32 vector (size byte 4)")
            (count,) = struct.unpack("<i", head[1:])
            body = np.frombuffer(stream.read(5 * count), dtype=record)
            if len(body) != count or (body["size"] != 4).any():
                raise KaldiIOError(f"utterance {name!r}: truncated or malformed int32 vector of {count} values")
            yield name, body["value"].astype(np.int32)
        else:  # text: the rest of the line ("key \n" is an empty vector)
            line = first if first in (b"\n", b"") else first + stream.readline()
            try:
                yield name, np.array(line.split(), dtype=np.int32)
            except ValueError:
                raise KaldiIOError(f"utterance {name!r}: expected integers, got {line[:60]!r}") from None


def read_int_vectors(rspecifier: str) -> Iterator[tuple[str, np.ndarray]]:
    """Iterate ``(key, (T,) int32)`` over an archive of int32 vectors (binary or text, gzipped or a pipe).

    >>> import tempfile, gzip
    >>> path = tempfile.mkdtemp() + "/ali.1.gz"
    >>> with gzip.open(path, "wt") as f:
    ...     _ = f.write("u1 4 4 5\\nu2 7\\n")
    >>> [(k, v.tolist()) for k, v in read_int_vectors(path)]
    [('u1', [4, 4, 5]), ('u2', [7])]
    """
    spec = parse_rspecifier(rspecifier)
    if spec.kind == "scp":
        raise KaldiIOError(f"{rspecifier}: int32 vectors are read from archives, not scp files")
    yield from read_records(spec, _int_vector_records)


# --------------------------------------------------------------------------- text tables and vectors
def read_text_table(path: str) -> dict[str, str]:
    """A ``key value`` file (``utt2spk``, ``spk2utt``, ``text``) as a dict; keys must be unique."""
    table: dict[str, str] = {}
    try:
        lines = Path(path).read_text().splitlines()
    except OSError as error:
        raise KaldiIOError(f"cannot read {path}: {error.strerror}") from None
    for number, line in enumerate(lines, 1):
        parts = line.split(None, 1)
        if not parts:
            continue
        if len(parts) != 2:
            raise KaldiIOError(f"{path} line {number}: expected 'key value', got {line!r}")
        if parts[0] in table:
            raise KaldiIOError(f"{path} line {number}: key {parts[0]!r} appears twice")
        table[parts[0]] = parts[1].strip()
    return table


def read_kaldi_vector(path: str) -> np.ndarray:
    """A Kaldi vector file (``analyze-counts`` output), text ``[ 1 2 3 ]`` or binary ``FV``/``DV``, as float64."""
    try:
        data = Path(path).read_bytes()
    except OSError as error:
        raise KaldiIOError(f"cannot read {path}: {error.strerror}") from None
    if data.startswith(b"\0B"):
        kind, size_byte, dim = data[2:5], data[5], struct.unpack("<i", data[6:10])[0]
        dtype = {b"FV ": "<f4", b"DV ": "<f8"}.get(kind)
        if dtype is None or size_byte != 4:
            raise KaldiIOError(f"{path}: expected a binary Kaldi vector (FV or DV), got {data[2:6]!r}")
        values = np.frombuffer(data[10:], dtype=dtype, count=dim)
        return values.astype(np.float64)
    text = data.decode(errors="replace").split()
    if len(text) < 2 or text[0] != "[" or text[-1] != "]":
        raise KaldiIOError(f"{path}: expected a Kaldi text vector '[ v1 v2 ... ]'")
    try:
        return np.array(text[1:-1], dtype=np.float64)
    except ValueError as error:
        raise KaldiIOError(f"{path}: {error}") from None


def write_kaldi_vector(path: str, values: np.ndarray) -> None:
    """Write a text Kaldi vector ``[ v1 v2 ... ]`` atomically (the format ``analyze-counts --binary=false`` writes)."""
    text = " [ " + " ".join(f"{v:g}" for v in np.asarray(values).tolist()) + " ]\n"
    write_text_atomically(path, text)


# --------------------------------------------------------------------------- writing archives
class ArkWriter:
    """Write float32 matrices to an ``ark`` (and its ``scp``) atomically.

    Records go to hidden temporary files in the same directory; only when the ``with`` block ends
    without an exception are they moved into place with ``os.replace`` (ark first, then scp, whose
    offsets point into the final ark name). After an exception the temporaries are removed, so no
    half-written archive is ever left under the final name.

    Args:
        ark_path: the archive to write.
        scp_path: its scp, or ``None``.

    The records are Kaldi binary float matrices (``\\0BFM``), what ``latgen-faster-mapped`` reads.

    >>> import tempfile, numpy as np, kaldiio
    >>> d = tempfile.mkdtemp()
    >>> with ArkWriter(f"{d}/ll.ark", f"{d}/ll.scp") as w:
    ...     w.write("u1", np.full((2, 3), -1.5))
    >>> kaldiio.load_scp(f"{d}/ll.scp")["u1"].shape
    (2, 3)
    """

    def __init__(self, ark_path: str, scp_path: Optional[str] = None):
        self.ark_path = Path(ark_path)
        self.scp_path = Path(scp_path) if scp_path else None
        self._keys: set[str] = set()
        self._ark = self._scp = None

    def __enter__(self) -> "ArkWriter":
        try:
            self._ark = open(temporary_name(self.ark_path), "wb")
            if self.scp_path:
                self._scp = open(temporary_name(self.scp_path), "w")
        except OSError as error:
            self._discard()
            raise KaldiIOError(f"cannot write {self.ark_path}: {error.strerror}") from None
        return self

    def write(self, key: str, matrix: np.ndarray) -> None:
        """Append ``matrix`` ``(T, F)`` (converted to float32) under ``key``."""
        if self._ark is None:
            raise RuntimeError("ArkWriter.write outside its `with` block")
        if not key or any(c.isspace() for c in key) or key in self._keys:
            raise KaldiIOError(f"{self.ark_path}: bad or duplicate utterance key {key!r}")
        matrix = np.ascontiguousarray(matrix, dtype="<f4")
        if matrix.ndim != 2:
            raise KaldiIOError(f"{self.ark_path}: utterance {key!r} must be a (frames, dims) matrix, "
                               f"got shape {matrix.shape}")
        self._keys.add(key)
        try:
            self._ark.write(key.encode() + b" ")
            offset = self._ark.tell()
            # Kaldi binary matrix: "\0B", token "FM ", then rows and cols as size-prefixed int32
            self._ark.write(b"\0BFM " + struct.pack("<bibi", 4, matrix.shape[0], 4, matrix.shape[1]))
            self._ark.write(matrix.tobytes())
            if self._scp:
                self._scp.write(f"{key} {self.ark_path}:{offset}\n")
        except OSError as error:  # a full disk: the archive was never complete, and is not left behind
            self._discard()
            raise WriteError(self.ark_path, error) from error

    def _discard(self) -> None:
        for handle, path in ((self._ark, self.ark_path), (self._scp, self.scp_path)):
            if handle is not None:
                try:
                    handle.close()
                except OSError:  # its buffer could not be flushed: the file is removed anyway
                    pass
            if path is not None and temporary_name(path).exists():
                temporary_name(path).unlink()
        self._ark = self._scp = None

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            self._discard()
            return
        try:
            for handle in (self._ark, self._scp):
                if handle is not None:
                    handle.flush()
                    os.fsync(handle.fileno())
                    handle.close()
            os.replace(temporary_name(self.ark_path), self.ark_path)
            if self.scp_path:
                os.replace(temporary_name(self.scp_path), self.scp_path)
        except OSError as error:
            self._discard()
            raise WriteError(self.ark_path, error) from error
        self._ark = self._scp = None

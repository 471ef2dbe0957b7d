"""Padded batches of utterances, and the background worker that prepares the next chunk.

Nothing here knows about Kaldi: ``data_io`` loads chunks of :class:`Utterance` and hands them here.

* :func:`make_batches` sorts a chunk's utterances by length, cuts batches and shuffles their order.
* :func:`collate` pads them into a batch-first :class:`Batch`: padding carries a mask and the label
  ``IGNORE`` (-100, skipped by ``torch.nn.functional.cross_entropy``), so it never reaches a loss, an
  error count or a statistic.
* :class:`Prefetcher` builds item k+1 in a thread while item k is consumed. A failure in the thread
  is re-raised in the consumer with its original traceback, at the next batch (:meth:`Prefetcher.check`),
  never swallowed and never waited on forever.

>>> import numpy as np
>>> utts = [Utterance(f"u{i}", np.ones((n, 2), np.float32), {"pdf": np.zeros(n, np.int64)})
...         for i, n in enumerate([3, 5, 2])]
>>> b = collate(utts)
>>> b.x.shape, b.lengths.tolist(), b.labels["pdf"][2].tolist()
(torch.Size([3, 5, 2]), [3, 5, 2], [0, 0, -100, -100, -100])
"""

from __future__ import annotations

import queue
import threading
from dataclasses import dataclass, field
from typing import Callable, Generic, Iterator, Optional, Sequence, TypeVar

import numpy as np
import torch

IGNORE = -100  # label of padded frames (torch cross_entropy's default ignore_index)


@dataclass
class Utterance:
    """One utterance ready for batching: ``feats`` ``(T, F)`` float32, ``labels`` name -> ``(T,)`` int64."""

    key: str
    feats: np.ndarray
    labels: dict[str, np.ndarray] = field(default_factory=dict)

    @property
    def num_frames(self) -> int:
        return len(self.feats)


@dataclass
class Batch:
    """A padded batch.

    Attributes:
        x: ``(B, T, F)`` float32, zeros on padded frames.
        lengths: ``(B,)`` int64, real frames per sequence.
        mask: ``(B, T)`` bool, True on real frames.
        labels: name -> ``(B, T)`` int64, ``IGNORE`` on padded frames.
        keys: the ``B`` utterance keys.
        chunk: the index of the chunk it was cut from (the trainer checkpoints at chunk boundaries).
    """

    x: torch.Tensor
    lengths: torch.Tensor
    mask: torch.Tensor
    labels: dict[str, torch.Tensor]
    keys: list[str]
    chunk: int = 0

    @property
    def num_frames(self) -> int:
        return int(self.lengths.sum())

    def to(self, device, non_blocking: bool = False) -> "Batch":
        """The batch with every tensor on ``device`` (``non_blocking`` pays off with pinned memory)."""
        move = lambda t: t.to(device, non_blocking=non_blocking)  # noqa: E731
        return Batch(move(self.x), move(self.lengths), move(self.mask),
                     {k: move(v) for k, v in self.labels.items()}, self.keys, self.chunk)

    def select(self, rows: slice) -> "Batch":
        """The sequences ``rows`` of the batch (distributed training gives each rank a share), padding trimmed."""
        lengths = self.lengths[rows]
        T = int(lengths.max()) if len(lengths) else 0
        return Batch(self.x[rows, :T], lengths, self.mask[rows, :T], {k: v[rows, :T] for k, v in self.labels.items()},
                     self.keys[rows], self.chunk)


def collate(utterances: Sequence[Utterance]) -> Batch:
    """Pad ``B`` utterances to the longest: see :class:`Batch` for the shapes."""
    if not utterances:
        raise ValueError("cannot make a batch of no utterances")
    lengths = np.array([u.num_frames for u in utterances], dtype=np.int64)
    B, T, F = len(utterances), int(lengths.max()), utterances[0].feats.shape[1]
    x = np.zeros((B, T, F), dtype=np.float32)
    names = list(utterances[0].labels)
    labels = {name: np.full((B, T), IGNORE, dtype=np.int64) for name in names}
    for i, u in enumerate(utterances):
        x[i, :len(u.feats)] = u.feats
        for name in names:
            labels[name][i, :len(u.feats)] = u.labels[name]
    mask = np.arange(T)[None, :] < lengths[:, None]  # (B, T)
    return Batch(torch.from_numpy(x), torch.from_numpy(lengths), torch.from_numpy(mask),
                 {name: torch.from_numpy(v) for name, v in labels.items()}, [u.key for u in utterances])


def make_batches(lengths: Sequence[int], batch_size: int, rng: Optional[np.random.Generator]) -> list[list[int]]:
    """Indices of utterances grouped into batches of similar length.

    Utterances are sorted by length (ties by position) and cut into groups of ``batch_size``; the
    order of the groups is shuffled with ``rng`` (kept sorted when ``rng`` is None).

    >>> make_batches([5, 1, 4, 2, 3], 2, None)
    [[1, 3], [4, 2], [0]]
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    order = np.argsort(np.asarray(lengths), kind="stable").tolist()
    batches = [order[i:i + batch_size] for i in range(0, len(order), batch_size)]
    if rng is not None:
        batches = [batches[i] for i in rng.permutation(len(batches))]
    return batches


T = TypeVar("T")


class Prefetcher(Generic[T]):
    """Iterate ``produce(0), produce(1), ..., produce(count - 1)``, each built in a background thread.

    At most two items are alive: the one being consumed and the one being built (the worker starts
    item k+1 only when the consumer takes item k, so the consumer must let go of item k-1 by then,
    as a ``for`` loop does when it moves on). An exception in ``produce`` is re-raised by
    the consumer, with the worker's traceback and a note naming the item, at the next ``__next__``
    or :meth:`check`. ``close()`` (also on garbage collection of the iterator) stops the worker.

    >>> list(Prefetcher(lambda i: i * i, 4))
    [0, 1, 4, 9]
    """

    def __init__(self, produce: Callable[[int], T], count: int, name: str = "chunk", poll_seconds: float = 0.5):
        self._produce, self._count, self._name, self._poll = produce, count, name, poll_seconds
        self._queue: queue.Queue = queue.Queue()
        self._credit = threading.Semaphore(1)  # one item may be built ahead of the consumer
        self._stop = threading.Event()
        self._error: Optional[BaseException] = None
        self._thread = threading.Thread(target=self._work, name=f"prefetch-{name}", daemon=True)
        self._thread.start()

    def _work(self) -> None:
        for index in range(self._count):
            while not self._credit.acquire(timeout=self._poll):
                if self._stop.is_set():
                    return
            if self._stop.is_set():
                return
            try:
                item = self._produce(index)
            except BaseException as error:  # noqa: B902 -- everything must reach the consumer
                error.add_note(f"(raised in the background {self._name} loader while preparing {self._name} {index})")
                self._error = error
                self._queue.put(("error", error))
                return
            self._queue.put(("item", item))
            del item

    def check(self) -> None:
        """Raise now if the worker has failed (the consumer calls this between batches)."""
        if self._error is not None:
            error, self._error = self._error, None
            self.close()
            raise error

    def __iter__(self) -> Iterator[T]:
        try:
            for _ in range(self._count):
                while True:
                    try:
                        kind, value = self._queue.get(timeout=self._poll)
                        break
                    except queue.Empty:
                        if not self._thread.is_alive() and self._queue.empty():
                            raise RuntimeError(f"the background {self._name} loader stopped without a result") from None
                if kind == "error":
                    self._error = None
                    raise value
                self._credit.release()  # this item is taken: the worker may build the next one
                yield value
                del value
        finally:
            self.close()

    def close(self) -> None:
        """Stop the worker (it finishes the item it is building, then exits)."""
        self._stop.set()
        self._credit.release()

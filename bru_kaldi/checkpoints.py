"""Checkpoints: where a training run stands (:class:`Progress`), written atomically and read back safely.

A checkpoint holds the model's and every optimiser's state, the :class:`Progress` (epoch, chunk, history,
optimiser steps, rollbacks) and the resolved config; it is written to a temporary name and moved into
place (``bru_kaldi.atomic``), and read with ``weights_only=True``, so that a pickle planted in an
experiment folder is refused, never run.

>>> Progress(epoch=2, rollbacks=[(0, 1)]).lr_scale
0.5
"""

from __future__ import annotations

import io
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Sequence

import torch

from bru_kaldi.atomic import write_atomically
from bru_kaldi.learning_rate import rollback_scale


@dataclass
class Progress:
    """Where training stands: the next (epoch, chunk) to run, the optimiser steps taken, the per-epoch
    history, and the blow-ups survived (each halved the learning rate from then on)."""

    epoch: int = 0
    chunk: int = 0
    history: list = field(default_factory=list)  # one dict per finished epoch (res.res values)
    chunk_stats: list = field(default_factory=list)  # (loss_sum, errors, frames) of this epoch's finished chunks
    step: int = 0  # optimiser steps taken (the warmup counts them)
    rollbacks: list = field(default_factory=list)  # (epoch, chunk) of every blow-up rolled back from

    @property
    def dev_errors(self) -> list[float]:
        """The dev frame error of every finished epoch, in order."""
        return [h["dev_err"] for h in self.history]

    def dev_scores(self, criterion: str) -> list[float]:
        """What the rate halving, patience and the best epoch follow (``training.dev_criterion``), for every
        finished epoch in order: the dev frame error (``"frame_error"``) or the dev loss (``"loss"``)."""
        return self.dev_errors if criterion == "frame_error" else [h["dev_loss"] for h in self.history]

    @property
    def lr_scale(self) -> float:
        """The factor on every learning rate from the rollbacks so far (``bru_kaldi.learning_rate``)."""
        return rollback_scale(self.rollbacks)

    def as_dict(self) -> dict:
        return {"epoch": self.epoch, "chunk": self.chunk, "history": self.history, "chunk_stats": self.chunk_stats,
                "step": self.step, "rollbacks": [list(r) for r in self.rollbacks]}


def save_tensors(obj, path) -> None:
    """``torch.save`` of ``obj`` to ``path``, atomically. Serialised in memory first, then written by
    Python: a full disk is then an ``OSError`` with its errno (torch's own writer reports it as an
    unexplained position mismatch)."""
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    write_atomically(path, lambda tmp: tmp.write_bytes(buffer.getbuffer()))


def save_checkpoint(path, model: torch.nn.Module, optimizers: Sequence[torch.optim.Optimizer], progress: Progress,
                    config_text: str) -> None:
    """Write a checkpoint atomically: a temporary file in the same folder, then ``os.replace``."""
    state = {
        "model": model.state_dict(),
        "optimizers": [o.state_dict() for o in optimizers],
        "progress": progress.as_dict(),
        "config": config_text,
    }
    save_tensors(state, path)


class CheckpointError(ValueError):
    """A checkpoint that cannot be loaded; the message names the file and what to do."""


def load_checkpoint(path, model: torch.nn.Module, optimizers: Sequence[torch.optim.Optimizer]) -> Optional[Progress]:
    """Restore ``model`` and ``optimizers`` from ``path`` (``weights_only=True``); ``None`` if there is none."""
    path = Path(path)
    if not path.is_file():
        return None
    try:  # weights only: a pickle planted in an experiment folder is refused, never run
        state = torch.load(path, map_location="cpu", weights_only=True)
        progress = state["progress"]
    except Exception as error:
        raise CheckpointError(f"{path} cannot be read as a checkpoint of this toolkit ({type(error).__name__}: "
                              f"{str(error).splitlines()[0] if str(error) else ''}); it was damaged or not written by "
                              "run_exp.py: move it away to train from the start (or use --force)") from None
    model.load_state_dict(state["model"])
    if len(state["optimizers"]) != len(optimizers):
        raise CheckpointError(f"{path}: {len(state['optimizers'])} optimiser states saved, the config has {len(optimizers)}")
    for optimizer, saved in zip(optimizers, state["optimizers"]):
        optimizer.load_state_dict(saved)
    p = progress
    return Progress(p["epoch"], p["chunk"], list(p["history"]), [tuple(s) for s in p["chunk_stats"]],
                    p.get("step", 0), [tuple(r) for r in p.get("rollbacks", [])])

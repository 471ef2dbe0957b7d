"""The learning rate, in one place: each architecture's rate at each optimiser step of a run.

``rate = epoch rate x rollback scale x warmup factor``:

* the **epoch rate** (:func:`epoch_rate`): ``[architectureN] arch_lr_schedule``'s value for the epoch
  when there is one (pytorch-kaldi: a progressive rate is never halved), else ``arch_lr`` halved (times
  ``arch_halving_factor``) after every epoch whose relative dev improvement fell under
  ``arch_improvement_threshold`` (:func:`halved_rate`, as pytorch-kaldi and the TPAMI paper do);
* the **rollback scale** (:func:`rollback_scale`): halved by each rollback after a blow-up;
* the **warmup factor** (:func:`warmup`): ``arch_warmup_steps`` of linear warmup from the first step.

Each is a pure function of the config and the recorded history (epochs, dev errors, optimiser steps,
rollbacks), as nanoGPT's ``get_lr(it)``: a resumed run recomputes its rates instead of trusting saved
state.

>>> from types import SimpleNamespace as Arch
>>> arch = Arch(arch_name="a", arch_lr=0.004, arch_lr_schedule=[], arch_halving_factor=0.5,
...             arch_improvement_threshold=0.001, arch_warmup_steps=4)
>>> rates = epoch_rates([arch], epoch=2, epochs=8, dev_errors=[0.5, 0.5], rollbacks=[(0, 3)])
>>> rates, step_rate(rates["a"], arch, step=1)  # halved by the plateau and by the rollback; warmup 2/4
({'a': 0.001}, 0.0005)
"""

from __future__ import annotations

from typing import Sequence

from bru_kaldi.schedules import scheduled_lr


def epoch_rates(archs, epoch: int, epochs: int, dev_errors: Sequence[float], rollbacks: Sequence) -> dict[str, float]:
    """Each architecture's rate for ``epoch`` (from 0) before warmup: what ``res.res`` records."""
    return {a.arch_name: rollback_scale(rollbacks) * epoch_rate(a, epoch, epochs, dev_errors) for a in archs}


def step_rate(rate: float, arch, step: int) -> float:
    """The rate of optimiser step ``step`` (from 0, counted over the whole run): the epoch's ``rate`` times warmup."""
    return rate * warmup(step, arch.arch_warmup_steps)


def rollback_scale(rollbacks: Sequence) -> float:
    """The factor on every rate after ``rollbacks`` (one entry per rollback): halved by each."""
    return 0.5 ** len(rollbacks)


def epoch_rate(arch, epoch: int, epochs: int, dev_errors: Sequence[float]) -> float:
    """``arch``'s rate for ``epoch`` (from 0): its ``arch_lr_schedule`` value for that epoch when it has
    one (pytorch-kaldi: a progressive rate is never halved), else :func:`halved_rate` of ``arch_lr``."""
    scheduled = scheduled_lr(arch, epoch, epochs)
    if scheduled is not None:
        return scheduled
    return halved_rate(arch.arch_lr, arch.arch_halving_factor, arch.arch_improvement_threshold, dev_errors)


def halved_rate(initial: float, halving_factor: float, threshold: float, dev_errors: Sequence[float]) -> float:
    """The learning rate for the epoch after ``dev_errors`` (one per finished epoch).

    Halved (times ``halving_factor``) after every epoch whose relative dev improvement
    ``(previous - current) / |current|`` fell under ``threshold``, as pytorch-kaldi and the TPAMI paper do
    (``|current|``: an LF-MMI loss, the objective negated, may be below 0; a frame error of 0 halves).

    >>> halved_rate(0.1, 0.5, 0.01, [0.5, 0.4, 0.399, 0.3]), halved_rate(0.1, 0.5, 0.01, [-0.1, -0.2, -0.201])
    (0.05, 0.05)
    """
    lr = initial
    for previous, current in zip(dev_errors, dev_errors[1:]):
        if current == 0 or (previous - current) / abs(current) < threshold:
            lr *= halving_factor
    return lr


def warmup(step: int, steps: int) -> float:
    """The factor on the learning rate at optimiser step ``step`` (from 0) of a ``steps``-step linear warmup:
    ``(step + 1) / steps`` until it reaches 1 (no warmup when ``steps`` is 0).

    >>> [warmup(s, 4) for s in range(6)], warmup(0, 0)
    ([0.25, 0.5, 0.75, 1.0, 1.0, 1.0], 1.0)
    """
    return 1.0 if steps <= 0 else min(1.0, (step + 1) / steps)

"""Values that change from epoch to epoch: pure functions of (config, epoch), as nanoGPT's ``get_lr(it)``.

Progressive values are written in pytorch-kaldi's compact form: ``value*count`` items joined by ``|``,
``"0.0004*10|0.0002*5"`` (10 epochs at 0.0004, then 5 at 0.0002). A single value without a count holds
for every epoch. pytorch-kaldi requires the counts to add up to the number of epochs exactly; so do we.

>>> expand_schedule("128*2|64", int, 3), expand_schedule("0.5", float, 2)
([128, 128, 64], [0.5, 0.5])
>>> seq_len_curriculum(100, 2, [1000, 1000, 250, 250])
[100, 200, 400, 250]
"""

from __future__ import annotations

from typing import Sequence


def expand_schedule(text: str, kind, epochs: int) -> list:
    """``text`` (``v*n|v*n|v``) as one value of ``kind`` (int or float) per epoch.

    Raises ValueError naming the item that is not a ``kind`` or a count, or when the counts do not add
    up to ``epochs``.
    """
    items = [item.strip() for item in str(text).split("|")]
    values: list = []
    for item in items:
        value, _, count = item.partition("*")
        try:
            number = kind(value.strip())
        except ValueError:
            raise ValueError(f"{value.strip()!r} in {text!r} is not {'an integer' if kind is int else 'a number'}") from None
        try:
            repeat = int(count) if count else 1
        except ValueError:
            raise ValueError(f"the count {count!r} in {text!r} is not an integer") from None
        values.extend([number] * repeat)
    if len(items) == 1 and "*" not in items[0]:
        values = values * epochs  # one plain value: every epoch
    if len(values) != epochs:
        raise ValueError(f"{text!r} gives {len(values)} epochs' values, the config trains {epochs} epochs "
                         f"(the counts after '*' must add up to n_epochs_tr)")
    return values


def seq_len_curriculum(start: int, factor: int, max_lengths: Sequence[int]) -> list[int]:
    """pytorch-kaldi's ``increase_seq_length_train``: the length limit of each epoch.

    Epoch 1 trains on ``start`` frames; after each epoch the limit is multiplied by ``factor`` and
    capped at that (finished) epoch's ``max_seq_length_train`` (pytorch-kaldi's ``create_lists`` order).
    """
    lengths, current = [], start
    for epoch, cap in enumerate(max_lengths):
        lengths.append(current)
        current = min(current * factor, cap)
    return lengths


def epoch_values(config, epoch: int) -> dict:
    """What ``[batches]`` sets for training epoch ``epoch`` (from 0): ``batch_size`` and ``max_seq_length``.

    ``config`` is a :class:`bru_kaldi.config.Config`; schedules and the curriculum are applied here.
    """
    b, epochs = config.batches, config.exp.n_epochs_tr
    sizes = expand_schedule(b.batch_size_train_schedule, int, epochs) if b.batch_size_train_schedule else [b.batch_size_train] * epochs
    caps = (expand_schedule(b.max_seq_length_train_schedule, int, epochs) if b.max_seq_length_train_schedule
            else [b.max_seq_length_train] * epochs)
    if b.seq_len_start:
        caps = seq_len_curriculum(b.seq_len_start, b.seq_len_factor, caps)
    return {"batch_size": sizes[epoch], "max_seq_length": caps[epoch]}


def dropout_schedule(text: str, layers: int, epochs: int) -> list[list[float]]:
    """``[architectureN] dropout_schedule`` as the rates of each layer for each epoch: ``rates[epoch][layer]``.

    ``text`` holds one compact schedule per layer, joined by commas (pytorch-kaldi's ``dnn_drop =
    0.15*12|0.2*12,0.15``), or one for every layer. Raises ValueError naming the layer whose schedule is not
    one, whose counts do not add up to ``epochs``, or whose rate is outside [0, 1).

    >>> dropout_schedule("0.1*1|0.2*2,0.3", 2, 3)
    [[0.1, 0.3], [0.2, 0.3], [0.2, 0.3]]
    """
    items = [item.replace(" ", "") for item in str(text).split(",")]
    if len(items) == 1:
        items = items * layers
    if len(items) != layers:
        raise ValueError(f"{text!r}: expected one schedule for every layer or one per layer ({layers}), got {len(items)}")
    per_layer = []
    for layer, item in enumerate(items, 1):
        try:
            rates = expand_schedule(item, float, epochs)
        except ValueError as error:
            raise ValueError(f"layer {layer}: {error}") from None
        if not all(0.0 <= rate < 1.0 for rate in rates):
            raise ValueError(f"layer {layer}: {item!r} has a rate outside [0, 1)")
        per_layer.append(rates)
    return [list(epoch) for epoch in zip(*per_layer)]


def scheduled_dropout(arch, epoch: int, epochs: int):
    """``arch``'s dropout rate of each layer in ``epoch`` (from 0) from its ``dropout_schedule``, or None when it
    has none (then ``dropout`` holds for every epoch)."""
    if not arch.dropout_schedule:
        return None
    return dropout_schedule(arch.dropout_schedule, len(arch.sizes), epochs)[epoch]


def scheduled_lr(arch, epoch: int, epochs: int):
    """``arch``'s rate for ``epoch`` from its ``arch_lr_schedule``, or None when it has none (then
    ``arch_lr`` with halving on dev plateaus applies)."""
    if not arch.arch_lr_schedule:
        return None
    return expand_schedule(arch.arch_lr_schedule, float, epochs)[epoch]

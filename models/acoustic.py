"""The acoustic model: recurrent stacks, a senone (pdf) output, and an optional monophone output."""

from __future__ import annotations

from typing import Optional, Sequence

import torch
from torch import nn

from models.fast.products import linear
from models.recurrent import RecurrentStack


class AcousticModel(nn.Module):
    """Stacks of recurrent layers applied in order, then linear outputs over senones (and monophones).

    The monophone head is the auxiliary task of pytorch-kaldi's multi-task recipes: it shares every
    recurrent layer and only adds its own output layer. ``xent_head`` adds a second senone output layer,
    ``"xent"``: the cross-entropy regularisation of LF-MMI training, whose own output (``"senone"``) is
    not a distribution over senones. ``mse_stack = k`` also returns the output of
    ``stacks[k]`` as ``"mse"``, what pytorch-kaldi's ``mse(out, fea)`` compares with a feature stream.

    Shapes: ``x`` ``(B, T, F)``, ``lengths`` ``(B,)`` -> dict of logits, ``"senone"`` ``(B, T, num_senones)``
    and, when ``num_mono`` is set, ``"mono"`` ``(B, T, num_mono)``; with ``mse_stack``, ``"mse"``
    ``(B, T, stacks[mse_stack].output_size)``.

    >>> import models
    >>> stack = models.build_stack("libru", 13, [8, 8])
    >>> net = AcousticModel([stack], num_senones=20, num_mono=5)
    >>> out = net(torch.randn(2, 7, 13), torch.tensor([7, 4]))
    >>> out["senone"].shape, out["mono"].shape
    (torch.Size([2, 7, 20]), torch.Size([2, 7, 5]))
    """

    def __init__(self, stacks: Sequence[RecurrentStack], num_senones: int, num_mono: Optional[int] = None,
                 mse_stack: Optional[int] = None, xent_head: bool = False):
        super().__init__()
        if not stacks:
            raise ValueError("an acoustic model needs at least one stack of layers")
        if mse_stack is not None and not 0 <= mse_stack < len(stacks):
            raise ValueError(f"mse_stack must index one of the {len(stacks)} stacks, got {mse_stack}")
        self.mse_stack = mse_stack
        for before, after in zip(stacks, stacks[1:]):
            if before.output_size != after.input_size:
                raise ValueError(f"a stack of output size {before.output_size} feeds one of input size {after.input_size}")
        self.stacks = nn.ModuleList(stacks)
        width = stacks[-1].output_size
        self.senone = nn.Linear(width, num_senones)
        self.mono = nn.Linear(width, num_mono) if num_mono else None
        self.xent = nn.Linear(width, num_senones) if xent_head else None
        self.input_size = stacks[0].input_size

    def forward(self, x: torch.Tensor, lengths) -> dict[str, torch.Tensor]:
        out = {}
        for index, stack in enumerate(self.stacks):
            x = stack(x, lengths)
            if index == self.mse_stack:
                out["mse"] = x
        # The heads' products in aligned rows on the CPU (models.fast.products): their input gradient is
        # as wide as the last layer, 1100 floats for 550 units both ways, the width that slows GEMM.
        out["senone"] = linear(x, self.senone.weight, self.senone.bias)
        if self.mono is not None:
            out["mono"] = linear(x, self.mono.weight, self.mono.bias)
        if self.xent is not None:
            out["xent"] = linear(x, self.xent.weight, self.xent.bias)
        return out

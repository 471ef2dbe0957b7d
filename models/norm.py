"""Normalisation of feed-forward projections whose statistics ignore padded frames."""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn
from torch.nn import functional as F

NORMS = (None, "batch", "layer")


class MaskedBatchNorm(nn.Module):
    """Batch norm over the real frames of a padded batch.

    In training the mean and variance come from frames where ``mask`` is true only (pytorch-kaldi
    counted padding in them); running statistics are used in evaluation, as in ``nn.BatchNorm1d``.

    Shapes: ``x`` ``(B, T, C)``, ``mask`` ``(B, T)`` bool -> ``(B, T, C)``.

    >>> norm = MaskedBatchNorm(4)
    >>> x, mask = torch.randn(2, 3, 4), torch.tensor([[True, True, True], [True, False, False]])
    >>> norm(x, mask).shape
    torch.Size([2, 3, 4])
    """

    def __init__(self, num_features: int, momentum: float = 0.1, eps: float = 1e-5):
        super().__init__()
        self.momentum, self.eps = momentum, eps
        self.weight = nn.Parameter(torch.ones(num_features))
        self.bias = nn.Parameter(torch.zeros(num_features))
        self.register_buffer("running_mean", torch.zeros(num_features))
        self.register_buffer("running_var", torch.ones(num_features))

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        if self.training:
            frames = x[mask]  # (N, C): real frames only
            n = frames.size(0)
            mean = frames.mean(0)
            var = frames.var(0, unbiased=False)
            with torch.no_grad():
                unbiased = var * n / max(n - 1, 1)
                self.running_mean.lerp_(mean.detach().to(self.running_mean.dtype), self.momentum)
                self.running_var.lerp_(unbiased.detach().to(self.running_var.dtype), self.momentum)
        else:
            mean, var = self.running_mean, self.running_var
        return (x - mean) * torch.rsqrt(var + self.eps) * self.weight + self.bias


class BlockLayerNorm(nn.Module):
    """Layer norm applied separately to each ``H``-wide block (one gate of one direction).

    Normalising gates together would let one gate's scale set another's; per block, each gate
    of each direction is normalised on its own. Frame-local, so padding cannot leak in.

    Shapes: ``x`` ``(B, T, G*H)`` -> ``(B, T, G*H)``.
    """

    def __init__(self, num_features: int, block: int, eps: float = 1e-5):
        super().__init__()
        self.block, self.eps = block, eps
        self.weight = nn.Parameter(torch.ones(num_features))
        self.bias = nn.Parameter(torch.zeros(num_features))

    def forward(self, x: torch.Tensor, mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        blocks = x.unflatten(-1, (-1, self.block))  # (B, T, G, H)
        normed = F.layer_norm(blocks, (self.block,), eps=self.eps).flatten(-2)
        return normed * self.weight + self.bias


def make_norm(kind: Optional[str], num_features: int, block: int) -> Optional[nn.Module]:
    """Build the norm named by a config (``None``, ``"batch"``, ``"layer"``)."""
    if kind is None:
        return None
    if kind == "batch":
        return MaskedBatchNorm(num_features)
    if kind == "layer":
        return BlockLayerNorm(num_features, block)
    raise ValueError(f"norm must be one of {NORMS}, got {kind!r}")

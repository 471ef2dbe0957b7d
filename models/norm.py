"""Normalisation of feed-forward projections whose statistics ignore padded frames, and of an
architecture's input features (:class:`InputNorm`)."""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn
from torch.autograd.function import once_differentiable
from torch.nn import functional as F

from models.fast.native import native_ops

NORMS = (None, "batch", "layer")
# Norms of an architecture's input features (InputNorm): pytorch-kaldi's *_use_batchnorm_inp,
# *_use_laynorm_inp, and both (layer norm first, as its LSTM, GRU, liGRU, RNN and MLP classes apply them).
INPUT_NORMS = (None, "batch", "layer", "layer+batch")


def _normalise(x, mean, inv_std, weight, bias):
    """``((x - mean) inv_std weight + bias, inv_std weight)``: one pass over ``x``, as ``x scale + shift``."""
    scale = weight * inv_std
    return torch.addcmul(torch.addcmul(bias, mean, scale, value=-1.0), x, scale), scale


class _MaskedBatchNormFunction(torch.autograd.Function):
    """Training-mode batch norm of frames ``x`` ``(N, C)`` whose statistics come from the frames where
    ``real`` ``(N,)`` is 1 (``None``: every frame), with the backward pass written out.

    Autograd's own version (gather the real frames, ``mean``, ``var``, then four elementwise ops) copied
    the real frames forward, scattered their gradient back, and made a pass per op each way; here the
    statistics are matrix-vector products with ``real`` and the output one ``addcmul``. The real frames
    are normalised with those statistics and the padded ones set to 0 (the layer would otherwise copy
    the output to zero them), so padded frames pass no gradient and the sums run over real frames::

        dx_i = real_i (scale g_i - (scale / n) (sum_j g_j + xhat_i sum_j g_j xhat_j)),  scale = w / sqrt(var + eps),
        sums over the real frames j

    Returns ``(y, mean, var)``; ``mean`` and ``var`` (biased) are for the running statistics.
    """

    @staticmethod
    def forward(ctx, x, real, weight, bias, eps: float):
        ctx.eps = eps
        ops = native_ops(x)
        if ops is not None:  # the same sums in two passes (one C++ kernel each way)
            real_or_empty = x.new_empty(0) if real is None else real.contiguous()
            y, mean, var = ops.batch_norm_forward(x.contiguous(), real_or_empty, weight.contiguous(),
                                                  bias.contiguous(), eps)
            ctx.native = True
            ctx.save_for_backward(x, real_or_empty, mean, var, weight)
            ctx.mark_non_differentiable(mean, var)
            return y, mean, var
        ctx.native = False
        n = x.size(0) if real is None else real.sum()
        ones = x.new_ones(x.size(0)) if real is None else real
        mean = (ones @ x) / n
        var = (ones @ (x - mean).square_()) / n
        inv = torch.rsqrt(var + eps)
        y, scale = _normalise(x, mean, inv, weight, bias)
        if real is not None:  # a fill, not a product: padding that is not finite still comes out as 0
            y.masked_fill_(real[:, None] == 0, 0.0)
        ctx.save_for_backward(x, real, mean, inv, scale)
        ctx.n = n
        ctx.mark_non_differentiable(mean, var)
        return y, mean, var

    @staticmethod
    @once_differentiable
    def backward(ctx, grad, _mean, _var):
        if ctx.native:
            x, real, mean, var, weight = ctx.saved_tensors
            grad_x, grad_weight, grad_bias = native_ops(x).batch_norm_backward(
                grad.contiguous(), x.contiguous(), real, mean, var, weight.contiguous(), ctx.eps)
            return grad_x, None, grad_weight, grad_bias, None
        x, real, mean, inv, scale = ctx.saved_tensors
        padding = None if real is None else real[:, None] == 0
        if padding is not None:  # the padded outputs are constant 0
            grad = grad.masked_fill(padding, 0.0)
        grad_bias = grad.sum(0)
        grad_weight = inv * ((grad * x).sum(0) - mean * grad_bias)  # sum_j g_j xhat_j
        c1 = scale * inv * grad_weight / ctx.n
        c0 = scale * grad_bias / ctx.n - mean * c1
        grad_x = torch.mul(grad, scale).sub_(torch.addcmul(c0, x, c1))  # c0 + c1 x: what the statistics add
        if padding is not None:
            grad_x.masked_fill_(padding, 0.0)
        return grad_x, None, grad_weight, grad_bias, None


class MaskedBatchNorm(nn.Module):
    """Batch norm over the real frames of a padded batch.

    In training the mean and variance come from frames where ``mask`` is true only (pytorch-kaldi
    counted padding in them); running statistics are used in evaluation, as in ``nn.BatchNorm1d``.
    Padded frames (``mask`` false) come out as 0 in both modes, and pass no gradient back.

    Shapes: ``x`` ``(..., C)`` frames in any layout, ``mask`` ``(...)`` bool or ``None`` (every frame
    real) -> ``(..., C)``.

    >>> norm = MaskedBatchNorm(4)
    >>> x, mask = torch.randn(2, 3, 4), torch.tensor([[True, True, True], [True, False, False]])
    >>> y = norm(x, mask)
    >>> y.shape, bool((y[1, 1:] == 0).all())
    (torch.Size([2, 3, 4]), True)
    """

    zeroes_padding = True  # the layer need not zero the padded frames of its output again

    def __init__(self, num_features: int, momentum: float = 0.1, eps: float = 1e-5):
        super().__init__()
        self.momentum, self.eps = momentum, eps
        self.weight = nn.Parameter(torch.ones(num_features))
        self.bias = nn.Parameter(torch.zeros(num_features))
        self.register_buffer("running_mean", torch.zeros(num_features))
        self.register_buffer("running_var", torch.ones(num_features))

    def forward(self, x: torch.Tensor, mask: Optional[torch.Tensor] = None,
                part: tuple[int, int] = (0, 1)) -> torch.Tensor:
        """``part=(d, D)``: ``x`` holds only the ``d``-th of ``D`` equal column blocks (a direction of a
        bidirectional layer), normalised with that block's parameters and statistics."""
        weight, bias, running_mean, running_var = (t.chunk(part[1])[part[0]] for t in (
            self.weight, self.bias, self.running_mean, self.running_var))
        if not self.training:
            y = _normalise(x, running_mean, torch.rsqrt(running_var + self.eps), weight, bias)[0]
            return y if mask is None else y.masked_fill_(~mask[..., None], 0.0)
        frames = x.reshape(-1, x.size(-1))  # no copy for contiguous x
        real = None if mask is None else mask.reshape(-1).to(x.dtype)
        y, mean, var = _MaskedBatchNormFunction.apply(frames, real, weight, bias, self.eps)
        with torch.no_grad():  # n stays a tensor: no host-device synchronisation on a GPU
            n = frames.new_tensor(frames.size(0)) if real is None else real.sum()
            unbiased = var * n / (n - 1).clamp_min(1)
            running_mean.lerp_(mean.to(running_mean.dtype), self.momentum)  # views: in place in the buffers
            running_var.lerp_(unbiased.to(running_var.dtype), self.momentum)
        return y.view(x.shape)


class BlockLayerNorm(nn.Module):
    """Layer norm applied separately to each ``H``-wide block (one gate of one direction).

    Normalising gates together would let one gate's scale set another's; per block, each gate
    of each direction is normalised on its own. Frame-local, so padding cannot leak in; padded frames
    are normalised like the others (the layer zeroes them).

    Shapes: ``x`` ``(B, T, G*H)`` -> ``(B, T, G*H)``.
    """

    zeroes_padding = False

    def __init__(self, num_features: int, block: int, eps: float = 1e-5):
        super().__init__()
        self.block, self.eps = block, eps
        self.weight = nn.Parameter(torch.ones(num_features))
        self.bias = nn.Parameter(torch.zeros(num_features))

    def forward(self, x: torch.Tensor, mask: Optional[torch.Tensor] = None,
                part: tuple[int, int] = (0, 1)) -> torch.Tensor:
        """``part=(d, D)``: ``x`` holds only the ``d``-th of ``D`` equal column blocks, with its parameters."""
        weight, bias = (t.chunk(part[1])[part[0]] for t in (self.weight, self.bias))
        blocks = x.unflatten(-1, (-1, self.block))  # (B, T, G, H)
        normed = F.layer_norm(blocks, (self.block,), eps=self.eps).flatten(-2)
        return torch.addcmul(bias, normed, weight)


def make_norm(kind: Optional[str], num_features: int, block: int) -> Optional[nn.Module]:
    """Build the norm named by a config (``None``, ``"batch"``, ``"layer"``)."""
    if kind is None:
        return None
    if kind == "batch":
        return MaskedBatchNorm(num_features)
    if kind == "layer":
        return BlockLayerNorm(num_features, block)
    raise ValueError(f"norm must be one of {NORMS}, got {kind!r}")


class FeatureLayerNorm(nn.Module):
    """pytorch-kaldi's own ``LayerNorm`` (``neural_networks.py``), which is not ``torch.nn.LayerNorm``: over
    the last dimension, ``gamma (x - mean) / (std + eps) + beta`` with ``std`` the *unbiased* standard
    deviation (divided by ``F - 1``) and ``eps = 1e-6`` added to it, not to the variance. Frame-local, so
    padding cannot leak in.

    Shapes: ``x`` ``(..., F)``, ``F >= 2`` -> ``(..., F)``.

    >>> norm = FeatureLayerNorm(3)
    >>> [round(v, 4) for v in norm(torch.tensor([[1.0, 2.0, 3.0]]))[0].tolist()]
    [-1.0, 0.0, 1.0]
    """

    def __init__(self, num_features: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(num_features))  # pytorch-kaldi's gamma
        self.bias = nn.Parameter(torch.zeros(num_features))  # beta

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.size(-1) < 2:
            raise ValueError(f"layer norm of the input needs at least 2 features (its deviation is over them), "
                             f"got {x.size(-1)}")
        mean = x.mean(-1, keepdim=True)
        return torch.addcmul(self.bias, self.weight, (x - mean) / (x.std(-1, keepdim=True) + self.eps))


class InputNorm(nn.Module):
    """The norm of an architecture's input features, before its first layer: pytorch-kaldi's
    ``*_use_laynorm_inp`` (:class:`FeatureLayerNorm`) and ``*_use_batchnorm_inp`` (its
    ``BatchNorm1d(momentum=0.05)``, here :class:`MaskedBatchNorm`, whose statistics leave padded frames
    out); ``"layer+batch"`` applies the layer norm, then the batch norm, as pytorch-kaldi does with both.

    Shapes: ``x`` ``(B, T, F)``, ``mask`` ``(B, T)`` bool or ``None`` (every frame real) -> ``(B, T, F)``.

    >>> norm = InputNorm(4, "layer+batch")
    >>> norm(torch.randn(2, 3, 4), torch.tensor([[True, True, True], [True, False, False]])).shape
    torch.Size([2, 3, 4])
    """

    def __init__(self, num_features: int, kind: str, momentum: float = 0.05):
        super().__init__()
        if kind not in INPUT_NORMS or kind is None:
            raise ValueError(f"input norm must be one of {INPUT_NORMS[1:]}, got {kind!r}")
        self.kind = kind
        self.layer = FeatureLayerNorm(num_features) if "layer" in kind else None
        self.batch = MaskedBatchNorm(num_features, momentum=momentum) if "batch" in kind else None

    def forward(self, x: torch.Tensor, mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        if self.layer is not None:
            x = self.layer(x)
        if self.batch is not None:
            x = self.batch(x, mask)
        return x

    def extra_repr(self) -> str:
        return f"kind={self.kind!r}"

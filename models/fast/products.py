"""The gradients of the layers' projections on the CPU, written into rows that start on 32-byte boundaries.

MKL's single-precision GEMM slowed down by about a third on an AMD EPYC (AVX2) when the rows of its
*output* were not a whole number of 32-byte vectors: with 2 threads, a
``(3200, 2200) @ (2200, N)`` product reached 80 GFLOP/s at ``N = 1100`` and 120 at ``N = 1104``, and
writing the ``N = 1100`` product into rows of 1104 floats (a view of a wider buffer) gave 117 again.
``N = 1100`` is exactly the width of every bidirectional layer of 550 units (the TIMIT recipes'
size) and of their gradients. So the products here go into a buffer whose row stride is rounded up
to 32 bytes (one AVX2 vector) and return a ``(rows, N)`` view of it; the elementwise op that reads
them next takes strided input at no cost. Rounding up to 64 bytes made no product faster there
(``N = 2200``, 32-byte rows, ran as fast unpadded); an AVX-512 CPU was not measured.

:func:`linear` is ``torch.nn.functional.linear`` with both backward products (the input's and the
weight's gradients) written that way on the CPU; its forward product is an ordinary contiguous one,
which the norm's kernel and the cells take as it is. Anywhere else (CUDA), and under the CPU's
autocast, it is ``F.linear`` itself.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch.nn import functional as F

ROW_BYTES = 32  # the row alignment: one AVX2 vector


def aligned_empty(rows: int, cols: int, like: torch.Tensor) -> torch.Tensor:
    """An uninitialised ``(rows, cols)`` tensor (``like``'s dtype and device) whose rows start every
    multiple of :data:`ROW_BYTES` bytes: a view of a wider buffer when ``cols`` needs it."""
    per_row = max(1, ROW_BYTES // like.element_size())
    stride = -(-cols // per_row) * per_row
    if stride == cols:
        return like.new_empty(rows, cols)
    return like.new_empty(rows, stride)[:, :cols]


def aligned_mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a @ b`` for ``(M, K)`` and ``(K, N)`` matrices, written into aligned rows (see above)."""
    return torch.mm(a, b, out=aligned_empty(a.size(0), b.size(1), a))


class _AlignedLinear(torch.autograd.Function):
    """``x W^T + b`` over frames ``(M, F)``; the backward products in aligned rows."""

    @staticmethod
    def forward(ctx, x, weight, bias):
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None
        # Contiguous: the norm's kernel and the cells need it so. The width that slows GEMM down is
        # the input's (1100 at H = 550), which only backward writes. A product for both directions is
        # 2200 wide there (whole 32-byte vectors); a first layer's per-direction products are 1100
        # wide but have 40 inputs, a small part of the step.
        return x.mm(weight.t()) if bias is None else torch.addmm(bias, x, weight.t())

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        # With create_graph (a second derivative) the products must be recorded: torch's own, then.
        mm = torch.mm if torch.is_grad_enabled() else aligned_mm
        grad_x = mm(grad, weight) if ctx.needs_input_grad[0] else None
        # An aligned (N, F) view: autograd copies it into the parameter's own layout when it stores it.
        grad_weight = mm(grad.t(), x) if ctx.needs_input_grad[1] else None
        grad_bias = grad.sum(0) if ctx.has_bias and ctx.needs_input_grad[2] else None
        return grad_x, grad_weight, grad_bias


def linear(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``F.linear(x, weight, bias)``; on the CPU its gradients are written into aligned rows.

    Shapes: ``x`` ``(..., F)``, ``weight`` ``(N, F)``, ``bias`` ``(N,)`` or ``None`` -> ``(..., N)``, contiguous;
    on the CPU the input's gradient may be a view of a wider buffer (``stride(-2) >= F``).

    >>> x, w = torch.randn(4, 3, 5), torch.randn(6, 5)
    >>> torch.allclose(linear(x, w), x @ w.t(), atol=1e-6)
    True
    """
    if x.device.type != "cpu" or x.dim() < 2 or torch.is_autocast_enabled("cpu"):
        return F.linear(x, weight, bias)  # under autocast, torch's own op casts its operands
    frames = x.reshape(-1, x.size(-1))
    out = _AlignedLinear.apply(frames, weight, bias)
    return out.view(*x.shape[:-1], weight.size(0))

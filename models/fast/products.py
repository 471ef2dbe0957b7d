"""Large matrix products on the CPU written into rows that start on 32-byte boundaries.

MKL's single-precision GEMM slows down by about a third on this project's x86 CPUs when the rows of
its *output* are not a whole number of 32-byte vectors: with 2 threads of an AMD EPYC, a
``(3200, 2200) @ (2200, N)`` product reached 80 GFLOP/s at ``N = 1100`` and 120 at ``N = 1104``, and
writing the ``N = 1100`` product into rows of 1104 floats (a view of a wider buffer) gave 117 again.
``N = 1100`` is exactly the width of every bidirectional layer of 550 units (the TIMIT recipes'
size) and of their gradients. So the products here go into a buffer whose row stride is rounded up
to 32 bytes (one AVX2 vector) and return a ``(rows, N)`` view of it; the elementwise op that reads
them next takes strided input at no cost. Rounding up to 64 bytes made no product faster there
(``N = 2200``, 32-byte rows, ran as fast unpadded); an AVX-512 CPU was not measured.

:func:`linear` is ``torch.nn.functional.linear`` with its forward and both backward products written
that way on the CPU; anywhere else (CUDA) it is ``F.linear`` itself, whose libraries choose their own
layouts.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch.autograd.function import once_differentiable
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
    """``x W^T + b`` over frames ``(M, F)``; forward and backward products in aligned rows."""

    @staticmethod
    def forward(ctx, x, weight, bias):
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None
        out = aligned_mm(x, weight.t())
        return out if bias is None else out.add_(bias)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        grad_x = aligned_mm(grad, weight) if ctx.needs_input_grad[0] else None
        # An aligned (N, F) view: autograd copies it into the parameter's own layout when it stores it.
        grad_weight = aligned_mm(grad.t(), x) if ctx.needs_input_grad[1] else None
        grad_bias = grad.sum(0) if ctx.has_bias and ctx.needs_input_grad[2] else None
        return grad_x, grad_weight, grad_bias


def linear(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``F.linear(x, weight, bias)``; on the CPU its products are written into aligned rows.

    Shapes: ``x`` ``(..., F)``, ``weight`` ``(N, F)``, ``bias`` ``(N,)`` or ``None`` -> ``(..., N)``; on the
    CPU the result's rows may be a view of a wider buffer (``stride(-2) >= N``).

    >>> x, w = torch.randn(4, 3, 5), torch.randn(6, 5)
    >>> torch.allclose(linear(x, w), x @ w.t(), atol=1e-6)
    True
    """
    if x.device.type != "cpu" or x.dim() < 2:
        return F.linear(x, weight, bias)
    frames = x.reshape(-1, x.size(-1))
    out = _AlignedLinear.apply(frames, weight, bias)
    return out.view(*x.shape[:-1], weight.size(0))

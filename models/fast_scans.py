"""Fast elementwise recursions with hand-written backward passes (issue 7): the UBRU forward pass, its
Kalman and HMM backward passes, and the smoothing passes of the TPAMI units.

Every recursion here is one of three forms, each a ``torch.autograd.Function`` whose loop runs one to
four ``out=`` kernels per step; all the rest (log-transitions, gates, masks for padding) is ordinary
vectorised PyTorch over all frames at once, so autograd handles it with a few large kernels.

* :class:`SoftplusRecurrence` ``x_t = c_t + softplus(x_{t-1} + K_t[0]) - softplus(x_{t-1} + K_t[1])``.
  The UBRU forward pass is this form in log-odds (``logit p_t`` is a difference of two ``logaddexp``),
  and so is its HMM backward pass for ``log beta_t - log beta-bar_t``. Its gradient is the linear
  recursion ``g_{t-1} = dL/dx_{t-1} + D_t g_t`` with ``D_t = sigma(.)[0] - sigma(.)[1]``.
* :class:`LinearRecurrence` ``y_t = A_t y_{t+-1} + B_t``: the Kalman backward pass (field notes: affine in
  gamma), the TPAMI unit-wise smoothing (eq. 51), and the gradients of both.
* :class:`MatrixRecurrence` ``y_t = A_t (W y_{t+1} + b) + B_t``: the TPAMI layer-wise smoothing (eq. 78).

The field notes point out that the first two are associative scans. On a CPU the sequential loop is
the faster of the two: at ``T = 400`` a parallel (Hillis-Steele) scan does ``log2 T = 9`` passes over
all ``T*B*H`` values, i.e. about 9x the arithmetic, while the loop's cost is per-step launch overhead
on ``B*H`` values, one to four kernels a step. A scan would pay on a GPU, where launches dominate.

Layout: time-major ``(T, B, H)``. Padding is the caller's job: a frame where a backward recursion
restarts gets ``A_t = 0``.
"""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

_softplus = torch._C._nn.softplus  # has an out= overload


class SoftplusRecurrence(torch.autograd.Function):
    """Shapes: ``c`` ``(T, B, H)``, ``K`` ``(T, B, 2, H)`` (may be an expanded view), ``x0`` ``(B, H)``
    -> ``x`` ``(T, B, H)``."""

    @staticmethod
    def forward(ctx, c, K, x0):
        T, B, H = c.shape
        out = c.new_empty(T, B, H)
        y = c.new_empty(B, 2, H)
        x = x0
        for t in range(T):
            _softplus(torch.add(x.unsqueeze(1), K[t], out=y), 1, 20, out=y)
            torch.add(c[t], y[:, 0], out=out[t]).sub_(y[:, 1])
            x = out[t]
        if any(ctx.needs_input_grad):
            ctx.save_for_backward(K, x0, out)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out):
        K, x0, out = ctx.saved_tensors
        x_previous = torch.cat([x0.unsqueeze(0), out[:-1]])  # (T, B, H)
        S = torch.sigmoid(x_previous.unsqueeze(2) + K)  # (T, B, 2, H)
        D = S[:, :, 0] - S[:, :, 1]  # dx_t / dx_{t-1}
        G = _linear_loop(D, grad_out.contiguous(), reverse=True, shift=True)
        grad_K = G.unsqueeze(2) * S
        grad_K[:, :, 1].neg_()
        return G, grad_K, D[0] * G[0]


def _linear_loop(A, B, reverse, shift=False):
    """``y_t = A_t y_{t-1} + B_t`` (``reverse``: ``y_t = A_t y_{t+1} + B_t``), started from zero.

    With ``shift`` the coefficient linking ``t`` and its neighbour ``n`` is ``A_n``: the transposed
    recursion, which back-propagates a recursion running the other way in time.
    """
    T = B.size(0)
    y = torch.empty_like(B)
    order = range(T - 1, -1, -1) if reverse else range(T)
    offset = 1 if reverse else -1  # the neighbour already computed
    y[order[0]].copy_(B[order[0]])
    for t in order[1:]:
        n = t + offset
        torch.addcmul(B[t], A[n] if shift else A[t], y[n], out=y[t])
    return y


class LinearRecurrence(torch.autograd.Function):
    """``y_t = A_t y_{t-1} + B_t`` from ``y_{-1} = 0``, or with ``reverse`` ``y_t = A_t y_{t+1} + B_t`` from
    ``y_T = 0``. Shapes: ``A``, ``B`` ``(T, B, H)`` -> ``(T, B, H)``."""

    @staticmethod
    def forward(ctx, reverse, A, B):
        y = _linear_loop(A, B, reverse)
        ctx.reverse = reverse
        if any(ctx.needs_input_grad):
            ctx.save_for_backward(A, y)
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_y):
        A, y = ctx.saved_tensors
        G = _linear_loop(A, grad_y.contiguous(), not ctx.reverse, shift=True)
        neighbour = torch.zeros_like(y)  # y_{t+1} (reverse) or y_{t-1}
        if ctx.reverse:
            neighbour[:-1] = y[1:]
        else:
            neighbour[1:] = y[:-1]
        return None, G * neighbour, G


class MatrixRecurrence(torch.autograd.Function):
    """``y_t = A_t (W y_{t+1} + b) + B_t`` from ``y_T = 0`` (so ``y_{T-1} = B_{T-1}`` when ``A_{T-1} = 0``).

    Shapes: ``A``, ``B`` ``(T, B, H)``, ``weight`` ``(H, H)``, ``bias`` ``(H,)`` -> ``(T, B, H)``.
    """

    @staticmethod
    def forward(ctx, A, B, weight, bias):
        T = B.size(0)
        y = torch.empty_like(B)
        lin = torch.zeros_like(B)  # W y_{t+1} + b, kept for backward
        lin[T - 1] = bias  # y_T = 0
        torch.addcmul(B[T - 1], A[T - 1], lin[T - 1], out=y[T - 1])
        weight_t = weight.t()
        for t in range(T - 2, -1, -1):
            torch.addcmul(B[t], A[t], torch.addmm(bias, y[t + 1], weight_t, out=lin[t]), out=y[t])
        if any(ctx.needs_input_grad):
            ctx.save_for_backward(A, weight, y, lin)
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_y):
        A, weight, y, lin = ctx.saved_tensors
        T = A.size(0)
        grad_y = grad_y.contiguous()
        G = torch.empty_like(grad_y)  # dL/dy_t, everything included
        GA = torch.empty_like(grad_y)  # G_t * A_t = dL/d(W y_{t+1} + b)
        G[0].copy_(grad_y[0])
        torch.mul(G[0], A[0], out=GA[0])
        for t in range(1, T):
            torch.addmm(grad_y[t], GA[t - 1], weight, out=G[t])
            torch.mul(G[t], A[t], out=GA[t])
        grad_weight = GA[:-1].flatten(0, 1).t().mm(y[1:].flatten(0, 1))
        return G * lin, G, grad_weight, GA.sum((0, 1))

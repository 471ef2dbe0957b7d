"""Fast elementwise recursions with hand-written backward passes: the UBRU forward pass, its
Kalman and HMM backward passes, and the gradients of all of them.

Every recursion here is one of a few forms, each a ``torch.autograd.Function``:

* :class:`SoftplusRecurrence` ``x_t = c_t + softplus(x_{t-1} + k_0) - softplus(x_{t-1} + k_1)`` (or
  backwards in time). The UBRU forward pass is this form in log-odds (``logit p_t`` is a difference of
  two ``logaddexp``), and so is its HMM backward pass for ``log beta_t - log beta-bar_t``. Its gradient
  is the linear recursion ``g_{t-1} = dL/dx_{t-1} + D_t g_t`` with ``D_t = sigma(.)[0] - sigma(.)[1]``.
* :class:`KalmanSmoother` the Kalman backward pass (eq. 21): given the forward pass it is affine in
  gamma, ``gamma_t = A_t gamma_{t+1} + B_t`` with ``|A_t| <= 1`` (contractive).
* :class:`LinearRecurrence` ``y_t = A_t y_{t+-1} + B_t``: the Kalman pass where :class:`KalmanSmoother`
  does not run (off the CPU), and there the gradients of the recursions above.
* :class:`MatrixRecurrence` ``y_t = A_t (W y_{t+1} + b) + (1 - A_t) h_t``: the TPAMI layer-wise smoothing (eq. 78),
  a recursion with a matrix: TorchScript loops on the CPU, the Triton kernels' on a GPU.

On the CPU the nonlinear forms run in the C++ kernels (:mod:`models.fast.native`): one call per pass, the
time loop inside, the threads splitting the units (every unit's recursion is independent). They are
associative scans (the UBRU forward step is linear in the unnormalised 2-vector of state
probabilities, a product of 2x2 matrices), but on a CPU a sequential loop over time that is
vectorised across ``B*H`` units does the least arithmetic, so that is what the kernels do. On a GPU
the Triton kernels (:class:`models.fast.triton_loops.ScanOps`, the same signatures) do the same, a
block of units per program with the time loop inside. Elsewhere (no compiler, no Triton) they run as
TorchScript loops: the nonlinear form four kernels a step, the linear form as a two-level (chunked)
scan, ``~2 sqrt(T)`` small steps instead of ``T`` (:func:`_chunked`), since there the cost is the
launches.

Layout: time-major ``(T, B, H)``. Padding is the caller's job: a frame where a backward recursion
restarts gets ``A_t = 0``.
"""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

from models.fast import triton_loops
from models.fast.gated import _script
from models.fast.native import native_ops


def scan_ops(example: torch.Tensor):
    """The kernels of the elementwise recursions for tensors like ``example``: the C++ kernels on the CPU
    (:mod:`models.fast.native`), the Triton kernels on a GPU (:class:`models.fast.triton_loops.ScanOps`, the
    same signatures), or ``None`` (the TorchScript loops below)."""
    ops = native_ops(example)
    return ops if ops is not None else triton_loops.scan_ops(example)


@_script
def _softplus_loop(c: torch.Tensor, k: torch.Tensor, x0: torch.Tensor, out: torch.Tensor):
    """``out[t] = c[t] + softplus(x_{t-1} + k[0]) - softplus(x_{t-1} + k[1])``, ``x_{-1} = x0``."""
    y = torch.empty(x0.size(0), 2, x0.size(1), dtype=c.dtype, device=c.device)
    x = x0
    for t in range(c.size(0)):
        torch.add(x.unsqueeze(1), k, out=y)
        torch._C._nn.softplus(y, 1, 20, out=y)
        x = torch.add(c[t], y[:, 0], out=out[t]).sub_(y[:, 1])
    return out


class SoftplusRecurrence(torch.autograd.Function):
    """Shapes: ``c`` ``(T, B, H)``, ``k`` ``(2, H)``, ``x0`` ``(B, H)`` -> ``x`` ``(T, B, H)``; with ``reverse``
    the recursion runs backwards in time (``x_t`` from ``x_{t+1}``, ``x_T = x0``).

    On a CPU both passes are one call of the C++ kernels (:mod:`models.fast.native`), threads split by unit.
    """

    @staticmethod
    def forward(ctx, c, k, x0, reverse=False):
        ops = scan_ops(c)
        out = None if ops is None else ops.softplus_scan(c.contiguous(), k.contiguous(), x0.contiguous(), reverse)
        if out is None:
            flip = (lambda v: v.flip(0)) if reverse else (lambda v: v)
            out = flip(_softplus_loop(flip(c), k, x0, torch.empty_like(c)))
        ctx.reverse = reverse
        if any(ctx.needs_input_grad):
            ctx.save_for_backward(k, x0, out)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out):
        k, x0, out = ctx.saved_tensors
        ops = scan_ops(out)
        result = None if ops is None else ops.softplus_scan_backward(grad_out.contiguous(), k.contiguous(),
                                                                     x0.contiguous(), out, ctx.reverse)
        if result is not None:
            G, grad_k, grad_x0 = result
            return G, grad_k.sum(1), grad_x0, None
        return (*_softplus_backward(grad_out, k, x0, out, ctx.reverse), None)


def _softplus_backward(grad_out, k, x0, out, reverse):
    """The gradient of :class:`SoftplusRecurrence` off its kernels: ``(dL/dc, dL/dk (2, H), dL/dx0)``."""
    flip = (lambda v: v.flip(0)) if reverse else (lambda v: v)
    out, grad_out = flip(out), flip(grad_out)
    # In place wherever possible: on a CPU, fresh buffers of T*B*2*H floats cost page faults
    # comparable to the arithmetic.
    T, B, H = out.shape
    S = torch.empty(T, B, 2, H, dtype=out.dtype, device=out.device)  # sigma(x_{t-1} + k), (T, B, 2, H)
    torch.add(x0.unsqueeze(1), k, out=S[0])
    torch.add(out[:-1].unsqueeze(2), k, out=S[1:])
    S.sigmoid_()
    D = torch.sub(S[:, :, 0], S[:, :, 1])  # D_t = dx_t / dx_{t-1}
    G = _linear_loop(D, grad_out.contiguous(), reverse=True, shift=True)
    grad_x0 = D[0] * G[0]
    grad_K = S.mul_(G.unsqueeze(2))
    grad_K[:, :, 1].neg_()
    return flip(G), grad_K.sum((0, 1)), grad_x0


def _linear_loop(A, B, reverse, shift=False):
    """``y_t = A_t y_{t-1} + B_t`` (``reverse``: ``y_t = A_t y_{t+1} + B_t``), started from zero.

    With ``shift`` the coefficient linking ``t`` and its neighbour ``n`` is ``A_n``: the transposed
    recursion, which back-propagates a recursion running the other way in time.
    """
    y = torch.empty_like(B)
    if shift:  # coef[t] = A[t -+ 1]: the coefficient linking t to its neighbour
        coef = torch.empty_like(A)
        if reverse:
            coef[:-1] = A[1:]
            coef[-1:].zero_()
        else:
            coef[1:] = A[:-1]
            coef[:1].zero_()
    else:
        coef = A
    _chunked(coef, B, y, reverse)
    return y


def _chunked(coef, B, y, reverse):
    """The linear recursion as a two-level scan: ``C`` chunks of ``L ~ sqrt(T)`` frames.

    1. within every chunk at once, the recursion from zero and the running product ``Q`` of its
       coefficients (``L`` steps over ``(C, B, H)``);
    2. the chunks' boundary values in order (``C`` steps over ``(B, H)``);
    3. one update of every frame with its chunk's incoming value times ``Q``.

    About ``2 sqrt(T)`` small steps instead of ``T``, for twice the arithmetic: on a CPU the loop's
    cost is launch overhead, not arithmetic. Each frame sums the same terms as in the plain loop,
    only grouped differently; ``Q`` multiplies coefficients of magnitude at most one here, so it
    can only underflow, towards the exact (negligible) value.
    """
    T = B.size(0)
    L = max(1, int(round(T**0.5)))
    C = T // L
    r = T - C * L  # frames left over, run in order after the chunks
    body = slice(r, T) if reverse else slice(0, C * L)
    a, b, out = (v[body].unflatten(0, (C, L)) for v in (coef, B, y))  # (C, L, B, H)
    Q = torch.empty_like(a)
    steps = range(L - 1, -1, -1) if reverse else range(L)
    first, n = steps[0], (1 if reverse else -1)
    out[:, first].copy_(b[:, first])
    Q[:, first].copy_(a[:, first])
    for l in steps[1:]:
        torch.addcmul(b[:, l], a[:, l], out[:, l + n], out=out[:, l])
        torch.mul(a[:, l], Q[:, l + n], out=Q[:, l])
    last = steps[-1]  # the frame of each chunk computed last: it feeds the next chunk
    chunks = range(C - 1, -1, -1) if reverse else range(C)
    for k in chunks[1:]:
        out[k, last].addcmul_(Q[k, last], out[k + n, last])
    # every other frame of chunks 1.. (in processing order) gets Q times the previous chunk's last frame
    inner = slice(1, L) if reverse else slice(0, L - 1)
    if reverse:
        out[:-1, inner].addcmul_(Q[:-1, inner], out[1:, last : last + 1])
    else:
        out[1:, inner].addcmul_(Q[1:, inner], out[:-1, last : last + 1])
    if r:
        rest = range(r - 1, -1, -1) if reverse else range(C * L, T)
        for t in rest:
            torch.addcmul(B[t], coef[t], y[t + n], out=y[t])


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


class KalmanSmoother(torch.autograd.Function):
    """The UBRU Kalman backward pass in one kernel call each way (:func:`scan_ops`: C++ or Triton): ``gamma_t = (S_0 - S_1) gamma_{t+1} + S_1``
    with ``S_j = sigma(x_t + k_j)``, and ``gamma_t = sigma(x_t)`` from each sequence's last frame on.

    Shapes: ``x`` ``(T, B, H)`` (logit alpha), ``k`` ``(2, H)``, ``last`` ``(B,)`` int64 -> ``(T, B, H)``. The same
    function as ``fast.paths._kalman`` builds from :class:`LinearRecurrence` (the path on other devices),
    without materialising ``S``, ``A`` and ``B`` for autograd.
    """

    @staticmethod
    def forward(ctx, x, k, last):
        ops = scan_ops(x)
        x, k, last = x.contiguous(), k.contiguous(), last.contiguous()
        gamma = ops.kalman_smoother(x, k, last)
        ctx.save_for_backward(x, k, last, gamma)
        return gamma

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        x, k, last, gamma = ctx.saved_tensors
        grad_x, grad_k = scan_ops(x).kalman_smoother_backward(grad.contiguous(), x, k, last, gamma)
        return grad_x, grad_k.sum(1), None


# The value the HMM pass's r takes after a sequence's end: far enough below any real one that
# ``softplus(r + j)`` is exactly 0, yet finite, so that no ``inf - inf`` appears.
_NO_FUTURE = -1e30


class HMMSmoother(torch.autograd.Function):
    """The UBRU's HMM backward pass and its posteriors, ``gamma_t = sigma(x_t + r_t - a_t)`` with ``r`` the
    backward recursion of :func:`models.fast.paths._hmm_inputs` restarted at each sequence's last frame: on a
    GPU one Triton kernel each way (``triton_kernels.hmm_smoother``), elsewhere (or where the kernel refuses)
    :func:`_hmm_loop`. (On the CPU :func:`models.fast.paths.ubru` runs the pass as a :class:`SoftplusRecurrence`
    of the C++ kernels instead.)

    Shapes: ``x`` ``(T, B, H)`` (logit alpha), ``a`` ``(T, B, H)`` (the unit's inputs), ``j`` ``(2, H)``
    (``[logit tau11, logit tau01]``), ``c`` ``(H,)`` (``log(1 - tau11) - log(1 - tau01)``), ``last`` ``(B,)``
    int64 -> ``(T, B, H)``.
    """

    @staticmethod
    def forward(ctx, x, a, j, c, last):
        ops = triton_loops.scan_ops(x)
        result = None if ops is None else ops.hmm_smoother(x, a, j, c, last)
        gamma, r = result if result is not None else _hmm_loop(x, a, j, c, last)
        ctx.save_for_backward(j, last, gamma, r)
        return gamma

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        j, last, gamma, r = ctx.saved_tensors
        ops = triton_loops.scan_ops(gamma)
        result = None if ops is None else ops.hmm_smoother_backward(grad, j, last, gamma, r)
        if result is None:
            return (*_hmm_loop_backward(grad, j, last, gamma, r), None)
        grad_x, grad_a, grad_jc = result
        sums = grad_jc.sum(1)  # (3, H): [dL/dj_0, dL/dj_1, dL/dc]
        return grad_x, grad_a, sums[:2], sums[2], None


def _restarts(a, last):
    """``(T, 1, 1)`` frame numbers and ``(1, B, 1)`` last frames, to compare."""
    return torch.arange(a.size(0), device=a.device)[:, None, None], last[None, :, None]


def hmm_term(a, c, last):
    """The per-frame term of the HMM pass's recursion (:func:`models.fast.paths._hmm_inputs`): ``a_t + c``
    before each sequence's last frame ``last[b]``, ``a_t`` at it, ``_NO_FUTURE`` after it. ``(T, B, H)``."""
    t, end = _restarts(a, last)
    return torch.where(t == end, a, a + c).masked_fill(t > end, _NO_FUTURE)


def _hmm_loop(x, a, j, c, last):
    """:class:`HMMSmoother`'s forward pass off its kernel, ``(gamma, r)``: ``r`` by :func:`_softplus_loop`
    backwards in time from :func:`hmm_term`."""
    term = hmm_term(a, c, last)
    r = _softplus_loop(term.flip(0), j, torch.full_like(a[0], _NO_FUTURE), torch.empty_like(a)).flip(0)
    return torch.sigmoid(x + r - a), r


def _hmm_loop_backward(grad, j, last, gamma, r):
    """The gradient of :func:`_hmm_loop`: ``(dL/dx, dL/da, dL/dj (2, H), dL/dc (H,))``, through
    :func:`_softplus_backward`."""
    d = grad * gamma * (1 - gamma)  # dL/dx_t, and dL/dr_t before the recursion
    G, grad_j, _ = _softplus_backward(d, j, torch.full_like(r[0], _NO_FUTURE), r, True)  # dL/d(the term)
    t, end = _restarts(r, last)
    return d, G.masked_fill(t > end, 0.0) - d, grad_j, G.masked_fill(t >= end, 0.0).sum((0, 1))


@_script
def _matrix_loop(A: torch.Tensor, h: torch.Tensor, weight_t: torch.Tensor, bias: torch.Tensor,
                 y: torch.Tensor, lin: torch.Tensor):
    """``lin[t] = W y[t + 1] + b`` (``b`` at ``T - 1``) and ``y[t] = lerp(h[t], lin[t], A[t])``, backwards in time."""
    T = h.size(0)
    lin[T - 1].copy_(bias)  # y_T = 0
    torch.lerp(h[T - 1], lin[T - 1], A[T - 1], out=y[T - 1])
    for t in range(T - 2, -1, -1):
        torch.addmm(bias, y[t + 1], weight_t, out=lin[t])
        torch.lerp(h[t], lin[t], A[t], out=y[t])


@_script
def _matrix_backward_loop(A: torch.Tensor, grad_y: torch.Tensor, weight: torch.Tensor, G: torch.Tensor,
                          GA: torch.Tensor):
    """``G[t] = grad_y[t] + GA[t - 1] W`` and ``GA[t] = G[t] A[t]``, forwards in time."""
    G[0].copy_(grad_y[0])
    torch.mul(G[0], A[0], out=GA[0])
    for t in range(1, A.size(0)):
        torch.addmm(grad_y[t], GA[t - 1], weight, out=G[t])
        torch.mul(G[t], A[t], out=GA[t])


class MatrixRecurrence(torch.autograd.Function):
    """``y_t = A_t (W y_{t+1} + b) + (1 - A_t) h_t`` from ``y_T = 0`` (so ``y_t = h_t`` where ``A_t = 0``).

    Shapes: ``A``, ``h`` ``(T, B, H)``, ``weight`` ``(H, H)``, ``bias`` ``(H,)`` -> ``(T, B, H)``. The
    interpolation is inside, not an input ``(1 - A) h``, so that autograd keeps no copy of ``1 - A``.
    Both loops are TorchScript (two kernels a step; the product dominates), or on a GPU one Triton kernel each
    (``triton_kernels.matrix_forward`` and ``matrix_backward``: the programs split the units, a barrier a step).
    """

    @staticmethod
    def forward(ctx, A, h, weight, bias):
        result = triton_loops.matrix_forward(A, h, weight, bias)
        if result is not None:
            y, lin = result  # lin = W y_{t+1} + b, kept for backward
        else:
            y, lin = torch.empty_like(h), torch.empty_like(h)
            _matrix_loop(A, h, weight.t(), bias, y, lin)
        if any(ctx.needs_input_grad):
            ctx.save_for_backward(A, h, weight, y, lin)
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_y):
        A, h, weight, y, lin = ctx.saved_tensors
        result = triton_loops.matrix_backward(A, grad_y, weight)
        if result is not None:
            G, GA = result
        else:
            G = torch.empty_like(h)  # dL/dy_t, everything included
            GA = torch.empty_like(h)  # G_t * A_t = dL/d(W y_{t+1} + b)
            _matrix_backward_loop(A, grad_y.contiguous(), weight, G, GA)
        grad_weight = GA[:-1].flatten(0, 1).t().mm(y[1:].flatten(0, 1))
        return G * (lin - h), G - GA, grad_weight, GA.sum((0, 1))

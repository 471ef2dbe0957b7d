"""TorchScript time loops of the cells with a recurrent matrix: the backend of
:mod:`models.fast.gated` wherever neither the C++ kernels (CPU) nor the Triton kernels (GPU) can run.

Each loop is a handful of ``out=`` kernels a step into buffers allocated once, so that without
gradients nothing is allocated per step; their backward loops do per step only what is sequential
(the gate gradients from ``dL/dh_t`` and one product through the recurrent matrix), everything else
for all frames at once. They mirror the C++ kernels of ``csrc/recurrences.cpp`` (``gated_forward``,
``gated_backward``, ``lbru_*``), and the tests hold both to the reference loop of every unit.

The gated family (BRU, Li-BRU, Li-GRU, GRU, LSTM, MGU, RNN) is reached through :func:`gated_forward`
and :func:`gated_backward`, which pick a unit's loops by its name from ``_GATED`` (the names of the C++
table: ``models.UNITS``, and ``rnn_tanh`` / ``rnn_relu``). What each keeps for backward:

============  =======================================================  ====================
unit          kept per frame besides ``h_t``                            values per unit
============  =======================================================  ====================
``bru``       nothing (``1 - sigma(a) = -expm1(log h)``)               0
``libru``     ``[log z, log h~]``, ``log h_{t-1} - a_z``               3 (C++: 4)
``ligru``     the pre-activations ``[a_z, a_h]``                        2
``rnn_*``     nothing (both derivatives come from ``h_t``)             0
``gru``       ``[r, z, n]`` and ``U h_{t-1} + b_hh`` (all three gates)  6 (C++: 4)
``lstm``      ``[i, f, g, o]`` and ``c_t``                              5
``mgu``       ``[f, h~]``                                              2
============  =======================================================  ====================

The units with a candidate (``MASKED``: Li-GRU, GRU, LSTM, RNN) take an optional candidate mask
``(B, H)``, pytorch-kaldi's inner dropout (``models.gated.InnerDropout``): their loops multiply the
candidate by it at every step and keep the candidate undropped, their backward passes multiply the
candidate's derivative by it. ``None`` leaves every loop as it is without one.

Where a tensor is on a GPU with Triton (:mod:`models.fast.triton_loops`), :func:`gated_forward` and the
sequential parts of the backward passes (``_gated_backward``, ``_lstm_backward``, ``_mgu_backward``) hand
their loop to one Triton kernel, which keeps exactly what the loop here keeps: the glue that forms the
gate derivatives before a backward loop is shared. Long because every loop is in this one
module, each beside its backward pass, as the C++ kernels have them.

Layout: time-major, ``proj`` ``(T, B, G*H)``, ``weight_t`` ``(H, G*H)``, ``h0`` ``(B, H)``.
"""

from __future__ import annotations

import warnings
from typing import Optional

import torch

from models.fast import triton_loops


def _script(fn):
    """``torch.jit.script`` for the time loops: the TorchScript interpreter launches each small kernel
    for about half the overhead of the Python interpreter, which dominates at ``B*H`` of a few
    thousand. (TorchScript is deprecated in favour of ``torch.compile``, which needs a C++ compiler at
    run time; the plain Python function is used wherever scripting fails.)"""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            return torch.jit.script(fn)
    except Exception:  # pragma: no cover - depends on the torch build
        return fn


def _scratch(proj, width, train):
    """A ``(T, B, width)`` buffer kept for backward, or two ``(B, width)`` slices reused in turn."""
    T, B = proj.shape[:2]
    return proj.new_empty(T if train else 2, B, width)


# --------------------------------------------------------------------------- forward loops
@_script
def _libru_loop(proj: torch.Tensor, weight_t: torch.Tensor, h0: torch.Tensor, out: torch.Tensor,
                log_gates: torch.Tensor, diff: torch.Tensor, train: bool):
    """Eq. 7c in log space: ``log h_t = log z + logaddexp(log h~, log h_{t-1} - a_z)``, as
    ``log(1 - z) = log z - a_z``. Writes ``log_gates[t] = [log z, log h~]`` and ``diff[t] = log h_{t-1} - a_z``
    (index 0 only, without ``train``), which is all that backward needs with ``out``."""
    H = weight_t.size(0)
    a = torch.empty_like(proj[0])  # (B, 2H)
    m = torch.empty_like(h0)
    h = h0
    for t in range(proj.size(0)):
        i = t if train else 0
        torch.addmm(proj[t], h, weight_t, out=a)
        ls = torch._C._nn.log_sigmoid(a, out=log_gates[i])
        d = torch.sub(h, a[:, :H], out=diff[i])
        torch.logaddexp(ls[:, H:], d, out=m)
        h = torch.add(ls[:, :H], m, out=out[t])
    return out


@_script
def _ligru_loop(proj: torch.Tensor, weight_t: torch.Tensor, h0: torch.Tensor, out: torch.Tensor,
                pre: torch.Tensor, train: bool, mask: Optional[torch.Tensor]):
    """Eq. 8: ``h_t = h_{t-1} + z (m relu(a_h) - h_{t-1})``, ``m`` the candidate mask (1 for ``None``);
    ``pre[t]`` the pre-activations (index 0 only without ``train``)."""
    H = weight_t.size(0)
    work = torch.empty_like(proj[0])
    h = h0
    for t in range(proj.size(0)):
        a = torch.addmm(proj[t], h, weight_t, out=pre[t if train else 0])
        z = torch.sigmoid(a[:, :H], out=work[:, :H])
        step = torch.clamp_min(a[:, H:], 0.0, out=work[:, H:])
        if mask is not None:
            step.mul_(mask)
        h = torch.addcmul(h, z, step.sub_(h), out=out[t])
    return out


@_script
def _bru_loop(proj: torch.Tensor, weight_t: torch.Tensor, h0: torch.Tensor, out: torch.Tensor,
              pre: torch.Tensor, train: bool):
    """Eq. 6: ``log h_t = log sigma(a_t)``."""
    h = h0
    for t in range(proj.size(0)):
        a = torch.addmm(proj[t], h, weight_t, out=pre[t if train else 0])
        h = torch._C._nn.log_sigmoid(a, out=out[t])
    return out


@_script
def _rnn_loop(proj: torch.Tensor, weight_t: torch.Tensor, h0: torch.Tensor, out: torch.Tensor, relu: bool,
              mask: Optional[torch.Tensor]):
    """``h_t = m tanh(a_t)`` or ``m relu(a_t)`` (``m`` the candidate mask, 1 for ``None``), in place in ``out``."""
    h = h0
    for t in range(proj.size(0)):
        a = torch.addmm(proj[t], h, weight_t, out=out[t])
        h = a.relu_() if relu else a.tanh_()
        if mask is not None:
            h = h.mul_(mask)
    return out


@_script
def _gru_loop(proj: torch.Tensor, weight_t: torch.Tensor, bias: torch.Tensor, h0: torch.Tensor, out: torch.Tensor,
              gates: torch.Tensor, hidden: torch.Tensor, train: bool, mask: Optional[torch.Tensor]):
    """PyTorch's GRU: ``gates[t] = [r, z, n]``, ``hidden[t] = U h_{t-1} + b_hh`` (index 0 only without
    ``train``); ``n = tanh(p_n + r (U_n h_{t-1} + b_hn))``, ``h_t = m n + z (h_{t-1} - m n)``, ``m`` the
    candidate mask (1 for ``None``; ``gates`` keeps ``n`` undropped)."""
    H = h0.size(1)
    work = torch.empty_like(h0)
    dropped = torch.empty_like(h0)
    h = h0
    for t in range(proj.size(0)):
        i = t if train else 0
        u = torch.addmm(bias, h, weight_t, out=hidden[i])
        rz = torch.add(proj[t, :, : 2 * H], u[:, : 2 * H], out=gates[i, :, : 2 * H]).sigmoid_()
        n = torch.addcmul(proj[t, :, 2 * H :], rz[:, :H], u[:, 2 * H :], out=gates[i, :, 2 * H :]).tanh_()
        if mask is not None:
            n = torch.mul(n, mask, out=dropped)
        h = torch.addcmul(n, rz[:, H:], torch.sub(h, n, out=work), out=out[t])
    return out


@_script
def _lstm_loop(proj: torch.Tensor, weight_t: torch.Tensor, h0: torch.Tensor, out: torch.Tensor,
               gates: torch.Tensor, cell: torch.Tensor, train: bool, mask: Optional[torch.Tensor]):
    """PyTorch's LSTM, ``proj`` with ``b_hh`` added: ``gates[t] = [i, f, g, o]`` (index 0 only without
    ``train``; ``g`` undropped), ``cell[t] = c_t = f c_{t-1} + i m g`` (two slots in turn without ``train``),
    ``c_{-1} = 0``, ``m`` the candidate mask (1 for ``None``)."""
    H = h0.size(1)
    work = torch.empty_like(h0)
    dropped = torch.empty_like(h0)
    c = torch.zeros_like(h0)
    h = h0
    for t in range(proj.size(0)):
        a = torch.addmm(proj[t], h, weight_t, out=gates[t if train else 0])
        a[:, : 2 * H].sigmoid_()
        g = a[:, 2 * H : 3 * H].tanh_()
        a[:, 3 * H :].sigmoid_()
        if mask is not None:
            g = torch.mul(g, mask, out=dropped)
        c = torch.mul(a[:, H : 2 * H], c, out=cell[t if train else t % 2]).addcmul_(a[:, :H], g)
        h = torch.mul(a[:, 3 * H :], torch.tanh(c, out=work), out=out[t])
    return out


@_script
def _mgu_loop(proj: torch.Tensor, weight_t: torch.Tensor, h0: torch.Tensor, out: torch.Tensor, gates: torch.Tensor,
              train: bool):
    """Minimal gated unit: ``gates[t] = [f, h~]`` (index 0 only without ``train``),
    ``h~ = tanh(p_h + U_h (f h_{t-1}))``, ``h_t = h_{t-1} + f (h~ - h_{t-1})``."""
    H = h0.size(1)
    s = torch.empty_like(h0)
    work = torch.empty_like(h0)
    h = h0
    for t in range(proj.size(0)):
        kept = gates[t if train else 0]
        f = torch.addmm(proj[t, :, :H], h, weight_t[:, :H], out=kept[:, :H]).sigmoid_()
        torch.mul(f, h, out=s)
        c = torch.addmm(proj[t, :, H:], s, weight_t[:, H:], out=kept[:, H:]).tanh_()
        h = torch.addcmul(h, f, torch.sub(c, h, out=work), out=out[t])
    return out


# --------------------------------------------------------------------------- backward loops
def _gated_backward(K, C, grad_out, weight):
    """:func:`_gated_backward_loop`, or the same as one Triton kernel (:mod:`models.fast.triton_loops`)."""
    result = triton_loops.sequential_backward("gated", K, C, grad_out, weight)
    return result if result is not None else _gated_backward_loop(K, C, grad_out, weight)


@_script
def _gated_backward_loop(K: torch.Tensor, C: Optional[torch.Tensor], grad_out: torch.Tensor, weight: torch.Tensor):
    """The sequential part of the units whose gate gradients are linear in ``g_t = dL/dh_t``.

    With ``g_t`` everything through ``h_{t+1}`` included, the gates get ``da_t = K_t * g_t`` (``K``
    ``(T, B, G'*H)``, ``g_t`` repeated per gate) and ``g_{t-1} = grad_out_{t-1} + C_t * g_t +
    da_t[:, :G*H] @ weight`` (``C`` ``None``: no direct path); ``K`` may hold more gates than ``weight``
    (GRU: the projection's gradient of ``n`` besides that of ``U_n h + b_hn``).

    Returns ``da`` ``(T, B, G'*H)`` and ``dL/dh_0`` ``(B, H)``.
    """
    T, B, H = grad_out.size(0), grad_out.size(1), grad_out.size(2)
    width = weight.size(0)
    da = torch.empty_like(K)
    K4, da4 = K.view(T, B, K.size(2) // H, H), da.view(T, B, K.size(2) // H, H)
    g = grad_out[T - 1].clone()
    carried = torch.empty_like(g)
    for t in range(T - 1, -1, -1):
        torch.mul(K4[t], g.unsqueeze(1), out=da4[t])  # (B, G', H)
        following = grad_out[t - 1] if t > 0 else torch.zeros_like(g)
        if C is not None:
            following = torch.addcmul(following, C[t], g, out=carried)
        g = torch.addmm(following, da[t, :, :width], weight)  # (B, G*H) @ (G*H, H)
    return da, g


def _lstm_backward(gates, cell, grad_out, weight, mask):
    """With ``dc`` carried from ``t + 1``: ``dc_t = dc + g_t o (1 - tanh^2 c_t)``, the gates
    ``[dc m g i(1-i), dc c_{t-1} f(1-f), dc i m (1-g^2), g_t tanh(c_t) o(1-o)]`` (``m`` the candidate mask,
    1 for ``None``), ``dc <- dc_t f``. Returns ``da`` ``(T, B, 4H)`` and ``dL/dh_0``."""
    H = grad_out.size(2)
    i, f, gg, o = gates[..., :H], gates[..., H : 2 * H], gates[..., 2 * H : 3 * H], gates[..., 3 * H :]
    tc = torch.tanh(cell)
    c_previous = torch.cat([torch.zeros_like(cell[:1]), cell[:-1]])
    A = o * (1 - tc * tc)
    candidate, derivative = gg, 1 - gg * gg  # of the candidate m g, per unit of dc i
    if mask is not None:
        candidate, derivative = gg * mask, derivative * mask
    K = torch.cat([candidate * i * (1 - i), c_previous * f * (1 - f), i * derivative, tc * o * (1 - o)], -1)
    result = triton_loops.sequential_backward("lstm", K, None, grad_out, weight, A=A, F=f)
    return result if result is not None else _lstm_backward_loop(K, A, f, grad_out, weight)


@_script
def _lstm_backward_loop(K: torch.Tensor, A: torch.Tensor, f: torch.Tensor, grad_out: torch.Tensor,
                        weight: torch.Tensor):
    """The sequential part of :func:`_lstm_backward`."""
    T, B, H = grad_out.size(0), grad_out.size(1), grad_out.size(2)
    da = torch.empty_like(K)
    K4, da4 = K.view(T, B, 4, H), da.view(T, B, 4, H)
    g = grad_out[T - 1].clone()
    dc = torch.zeros_like(g)
    for t in range(T - 1, -1, -1):
        dc = torch.addcmul(dc, g, A[t])
        torch.mul(K4[t, :, :3], dc.unsqueeze(1), out=da4[t, :, :3])
        torch.mul(K4[t, :, 3], g, out=da4[t, :, 3])
        dc = dc * f[t]
        following = grad_out[t - 1] if t > 0 else torch.zeros_like(g)
        g = torch.addmm(following, da[t], weight)
    return da, g


def _mgu_backward(gates, out, h0, grad_out, weight):
    """``da_h = g f (1 - h~^2)``, ``ds = da_h @ U_h`` (the gradient of ``s = f h_{t-1}``), ``da_f = (g (h~ - h_{t-1})
    + ds h_{t-1}) f (1 - f)``, ``g_{t-1} = grad_out_{t-1} + g (1 - f) + ds f + da_f @ U_f``.
    Returns ``da`` ``(T, B, 2H)`` and ``dL/dh_0``."""
    H = grad_out.size(2)
    f, c = gates[..., :H], gates[..., H:]
    h_previous = torch.cat([h0.unsqueeze(0), out[:-1]])
    df = f * (1 - f)
    K = torch.cat([(c - h_previous) * df, f * (1 - c * c), h_previous * df], -1)  # [K_f, K_h, K_s]
    C = 1 - f
    result = triton_loops.sequential_backward("mgu", K, C, grad_out, weight, F=f)
    if result is not None:
        return result[0][..., : 2 * H], result[1]
    return _mgu_backward_loop(K, C, f, grad_out, weight)


@_script
def _mgu_backward_loop(K: torch.Tensor, C: torch.Tensor, f: torch.Tensor, grad_out: torch.Tensor,
                       weight: torch.Tensor):
    """The sequential part of :func:`_mgu_backward`, ``K = [K_f, K_h, K_s]``."""
    T, H = grad_out.size(0), grad_out.size(2)
    K_f, K_h, K_s = K[..., :H], K[..., H : 2 * H], K[..., 2 * H :]
    da = torch.empty(T, grad_out.size(1), 2 * H, dtype=K.dtype, device=K.device)
    g = grad_out[T - 1].clone()
    for t in range(T - 1, -1, -1):
        dh = torch.mul(K_h[t], g, out=da[t, :, H:])
        ds = torch.mm(dh, weight[H:])
        torch.mul(K_f[t], g, out=da[t, :, :H]).addcmul_(K_s[t], ds)
        following = grad_out[t - 1] if t > 0 else torch.zeros_like(g)
        carried = torch.addcmul(following, C[t], g).addcmul_(f[t], ds)
        g = torch.addmm(carried, da[t, :, :H], weight[:H])
    return da, g


# --------------------------------------------------------------------------- the gated family, by name
def _previous(out, h0):
    return torch.cat([h0.unsqueeze(0), out[:-1]])  # h_{t-1}, (T, B, H)


def _bru(proj, weight_t, bias, h0, out, train, mask):
    _bru_loop(proj, weight_t, h0, out, _scratch(proj, proj.size(2), False), False)
    return []  # 1 - sigma(a) = -expm1(log h)


def _bru_grad(kept, out, h0, grad_out, weight, mask):
    return _gated_backward(torch.expm1(out).neg_(), None, grad_out, weight)


def _libru(proj, weight_t, bias, h0, out, train, mask):
    kept = [_scratch(proj, proj.size(2), train), _scratch(proj, h0.size(1), train)]  # [log z, log h~], diff
    _libru_loop(proj, weight_t, h0, out, kept[0], kept[1], train)
    return kept


def _libru_grad(kept, out, h0, grad_out, weight, mask):
    (log_gates, diff), H = kept, out.size(2)
    log_z, log_c = log_gates[..., :H], log_gates[..., H:]
    K = torch.empty_like(log_gates)  # [dlog h_t / da_z, dlog h_t / da_h]
    ratio = torch.sub(log_z, out)  # log z - log h_t
    C = torch.add(diff, ratio).exp_()  # (1 - z) h_{t-1} / h_t
    w = ratio.add_(log_c).exp_()  # z h~ / h_t, the weight of the new candidate in (7c)
    torch.sub(w, log_z.exp(), out=K[..., :H])
    torch.mul(w, torch.expm1(log_c).neg_(), out=K[..., H:])  # 1 - h~ = -expm1(log h~)
    return _gated_backward(K, C, grad_out, weight)


def _ligru(proj, weight_t, bias, h0, out, train, mask):
    pre = _scratch(proj, proj.size(2), train)  # pre-activations a_t
    _ligru_loop(proj, weight_t, h0, out, pre, train, mask)
    return [pre]


def _ligru_grad(kept, out, h0, grad_out, weight, mask):
    (a,), H = kept, out.size(2)
    a_z, a_h = a[..., :H], a[..., H:]
    z = torch.sigmoid(a_z)
    C = 1 - z
    candidate, derivative = a_h.clamp_min(0), z * (a_h > 0)  # m relu(a_h) and its derivative
    if mask is not None:
        candidate, derivative = candidate * mask, derivative * mask
    K = torch.cat([(candidate - _previous(out, h0)) * z * C, derivative], dim=-1)
    return _gated_backward(K, C, grad_out, weight)


def _rnn(relu):
    def forward(proj, weight_t, bias, h0, out, train, mask):
        _rnn_loop(proj, weight_t, h0, out, relu, mask)
        return []

    def backward(kept, out, h0, grad_out, weight, mask):
        if relu:  # h_t > 0 exactly where a_t > 0 and m > 0; the derivative is m there
            K = (out > 0).to(out.dtype) if mask is None else (out > 0) * mask
        elif mask is None:
            K = torch.addcmul(torch.ones_like(out), out, out, value=-1.0)
        else:  # m (1 - tanh^2 a) = m - h^2 / m, 0 where m is (h is 0 there too)
            K = mask - out * out / torch.where(mask == 0, torch.ones_like(mask), mask)
        return _gated_backward(K, None, grad_out, weight)

    return forward, backward


def _gru(proj, weight_t, bias, h0, out, train, mask):
    T, B, width = proj.shape
    slots = T if train else 1
    gates, hidden = proj.new_empty(slots, B, width), proj.new_empty(slots, B, width)
    _gru_loop(proj, weight_t, bias if bias is not None else proj.new_zeros(width), h0, out, gates, hidden, train, mask)
    return [gates, hidden]


def _gru_grad(kept, out, h0, grad_out, weight, mask):
    (gates, hidden), H = kept, out.size(2)
    r, z, n, e = gates[..., :H], gates[..., H : 2 * H], gates[..., 2 * H :], hidden[..., 2 * H :]
    dq = (1 - z) * (1 - n * n)  # dh_t / d(p_n + r e)
    candidate = n  # m n
    if mask is not None:
        dq, candidate = dq * mask, n * mask
    K = torch.cat([dq * e * r * (1 - r), (_previous(out, h0) - candidate) * z * (1 - z), dq * r, dq], -1)
    da, grad_h0 = _gated_backward(K, z, grad_out, weight)
    return da[..., : 3 * H], da[..., 3 * H :], grad_h0


def _lstm(proj, weight_t, bias, h0, out, train, mask):
    T, B, width = proj.shape
    gates, cell = proj.new_empty(T if train else 1, B, width), _scratch(proj, h0.size(1), train)
    _lstm_loop(proj if bias is None else proj + bias, weight_t, h0, out, gates, cell, train, mask)
    return [gates, cell]


def _lstm_grad(kept, out, h0, grad_out, weight, mask):
    return _lstm_backward(kept[0], kept[1], grad_out, weight, mask)


def _mgu(proj, weight_t, bias, h0, out, train, mask):
    gates = proj.new_empty(proj.size(0) if train else 1, *proj.shape[1:])
    _mgu_loop(proj, weight_t, h0, out, gates, train)
    return [gates]


def _mgu_grad(kept, out, h0, grad_out, weight, mask):
    return _mgu_backward(kept[0], out, h0, grad_out, weight)


# name -> (forward, backward): forward(proj, weight_t, bias, h0, out, train, mask) fills out and returns what
# it keeps; backward(kept, out, h0, grad_out, weight, mask) returns (da, dL/dh_0) or (du, dq, dL/dh_0). The
# mask is None except for the units of MASKED (gated_forward checks it).
_GATED = {
    "bru": (_bru, _bru_grad),
    "libru": (_libru, _libru_grad),
    "ligru": (_ligru, _ligru_grad),
    "rnn_tanh": _rnn(relu=False),
    "rnn_relu": _rnn(relu=True),
    "gru": (_gru, _gru_grad),
    "lstm": (_lstm, _lstm_grad),
    "mgu": (_mgu, _mgu_grad),
}
# The units whose candidate a mask multiplies (the C++ kernels' kMasked units).
MASKED = ("ligru", "rnn_tanh", "rnn_relu", "gru", "lstm")


def gated_forward(kind: str, proj, weight_t, bias, h0, train: bool, mask=None):
    """``(out (T, B, H), kept)``: the loop of unit ``kind``; ``kept`` is what its backward needs (scratch
    without ``train``). ``bias`` is ``b_hh`` ``(G*H,)`` or ``None``; ``mask`` the candidate mask ``(B, H)``
    of a unit of ``MASKED``, or ``None``."""
    if mask is not None and kind not in MASKED:
        raise ValueError(f"unit {kind} has no candidate to mask (inner dropout: {', '.join(MASKED)})")
    result = triton_loops.gated_forward(kind, proj, weight_t, bias, h0, train, mask)
    if result is not None:
        return result
    out = proj.new_empty(proj.size(0), proj.size(1), h0.size(1))
    return out, _GATED[kind][0](proj, weight_t, bias, h0, out, train, mask)


def gated_backward(kind: str, kept, out, h0, grad_out, weight, mask=None):
    """``(du, dq or None, dL/dh_0)``: ``du`` ``(T, B, G*H)`` the gradient of ``W h_{t-1} + b`` per gate, ``dq``
    (GRU) that of the projection of ``n``, where it differs from ``du``'s; ``mask`` that of the forward pass."""
    result = _GATED[kind][1](kept, out, h0, grad_out, weight, mask)
    return result if len(result) == 3 else (result[0], None, result[1])


# --------------------------------------------------------------------------- the layer-wise BRU
@_script
def _lbru_loop(proj: torch.Tensor, weight_t: torch.Tensor, bias: torch.Tensor, h0: torch.Tensor,
               out: torch.Tensor, s_out: torch.Tensor, pre: torch.Tensor, kept: Optional[torch.Tensor],
               hidden: torch.Tensor, train: bool, input_gate: bool):
    """Eq. 72-75 (77): see :class:`models.fast.gated.LBRURecurrence`. ``pre`` and ``hidden`` have ``T`` slots
    when kept for backward, else two used in turn; ``kept`` is ``[a_z, q(, a_s)]`` per frame
    (``input_gate=False``)."""
    H = h0.size(1)
    width = proj.size(2)
    u = torch.empty_like(proj[0])  # (B, G*H)
    sig = torch.empty_like(proj[:2])  # ping-pong: keeps z_{t-1} while z_t is formed
    work = torch.empty_like(h0)
    h, z_previous = h0, torch.zeros_like(h0)
    for t in range(proj.size(0)):
        torch.mm(h, weight_t, out=u)
        a = torch.add(proj[t], u, out=pre[t if train and input_gate else t % 2])  # [a_z, a_r, ., a_s] (72), (73), (77)
        e = torch.add(u[:, 2 * H : 3 * H], bias, out=hidden[t if train else t % 2])
        torch.addcmul(proj[t, :, 2 * H : 3 * H], z_previous, e, out=a[:, 2 * H : 3 * H])  # (74)
        if kept is not None:
            kept[t, :, :H].copy_(a[:, :H])
            kept[t, :, H:].copy_(a[:, 2 * H :])
        gate = torch.sigmoid(a, out=sig[t % 2])  # [z, r, n, s]
        n = gate[:, 2 * H : 3 * H]
        if input_gate:
            h = torch.addcmul(n, gate[:, H : 2 * H], torch.sub(h, n, out=work), out=out[t])  # (75)
        else:
            h = out[t].copy_(n)  # (36)
        if width == 4 * H:
            s_out[t].copy_(gate[:, 3 * H :])
        z_previous = gate[:, :H]
    return out


@_script
def _lbru_backward(P: torch.Tensor, M: torch.Tensor, C: torch.Tensor, grad_h: torch.Tensor, weight: torch.Tensor,
                   du: torch.Tensor, G: torch.Tensor):
    """The sequential part of :meth:`models.fast.gated.LBRURecurrence.backward`: ``G[t] = dL/dh_t`` (all
    included) and the slots ``[a_z, a_r, U_n h_{t-1}]`` of ``du``, from ``du_z[t] = G[t+1] M[t]``,
    ``[du_r, du_n][t] = G[t] P[t]`` and ``G[t-1] = grad_h[t-1] + C[t] G[t] + du[t] @ weight``. Returns ``dL/dh_0``."""
    T, B, H = grad_h.size(0), grad_h.size(1), grad_h.size(2)
    du4 = du.view(T, B, du.size(2) // H, H)
    G[T - 1].copy_(grad_h[T - 1])
    du4[T - 1, :, 0].zero_()
    carried = torch.empty_like(grad_h[0])
    for t in range(T - 1, -1, -1):
        g = G[t]
        torch.mul(P[t], g.unsqueeze(1), out=du4[t, :, 1:3])
        if t < T - 1:
            torch.mul(G[t + 1], M[t], out=du4[t, :, 0])
        if t > 0:
            torch.addcmul(grad_h[t - 1], C[t], g, out=carried)
            torch.addmm(carried, du[t], weight, out=G[t - 1])
    return torch.addmm(C[0] * G[0], du[0], weight)

"""Fast time loops for the cells with a recurrent matrix: BRU and Li-BRU (log form), Li-GRU, LBRU.

Each is a ``torch.autograd.Function`` with a hand-written backward pass. Autograd on the
reference loop (``Cell.forward``) records every small step; here

* the forward loop runs one matrix product and one fused elementwise pass per step, and saves only
  what backward needs,
* the backward pass runs one short loop over time for the part that really is sequential (per step
  the gate gradients and one product through the recurrent matrix); everything else is done for all
  frames at once,
* the weight gradient is one ``(G*H, B*T) @ (B*T, H)`` product.

Two backends run the loops (:mod:`models.fast.native`): on the CPU the C++ kernels of
``models/fast/csrc/recurrences.cpp``, where the threads split the hidden units for the whole loop (each
multiplies by its own columns of every gate and runs the elementwise step of its own units, one
barrier a step; for LBRU the backward loop also forms the per-frame gate derivatives); and the
TorchScript loops below (:func:`_script`), a handful of ``out=`` kernels a step, for CUDA tensors and
wherever the extension cannot be built. Both are tested against the reference loop.

Layout inside this module is time-major, ``(T, B, G*H)``, so that each step reads contiguous memory.
The forward recursions never look at ``lengths``: like the reference loop they run over padded frames
(whose projections the layer has zeroed) and the layer masks those outputs. Saved activations per
frame: ``G*H`` pre-activations or gate values (plus ``H`` for Li-BRU and LBRU), against the many
intermediates autograd keeps for the reference loop. Without gradients nothing is allocated per step.
"""

from __future__ import annotations

import warnings
from typing import Optional

import torch
from torch.autograd.function import once_differentiable

from models.fast.native import native_ops




def _needs_grad(ctx) -> bool:
    return any(ctx.needs_input_grad)


def _scratch(proj, width, train):
    """A ``(T, B, width)`` buffer kept for backward, or two ``(B, width)`` slices reused in turn."""
    T, B = proj.shape[:2]
    return proj.new_empty(T if train else 2, B, width)


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
                pre: torch.Tensor, train: bool):
    """Eq. 8: ``h_t = h_{t-1} + z (relu(a_h) - h_{t-1})``; ``pre[t]`` the pre-activations (index 0 only
    without ``train``)."""
    H = weight_t.size(0)
    work = torch.empty_like(proj[0])
    h = h0
    for t in range(proj.size(0)):
        a = torch.addmm(proj[t], h, weight_t, out=pre[t if train else 0])
        z = torch.sigmoid(a[:, :H], out=work[:, :H])
        step = torch.clamp_min(a[:, H:], 0.0, out=work[:, H:]).sub_(h)
        h = torch.addcmul(h, z, step, out=out[t])
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
def _gated_backward(K: torch.Tensor, C: torch.Tensor, grad_out: torch.Tensor, weight: torch.Tensor, gates: int):
    """The sequential part shared by BRU, Li-BRU and Li-GRU.

    With ``g_t = dL/dh_t`` (everything through ``h_{t+1}`` included), the gate pre-activations get
    ``da_t = K_t * g_t`` (``K`` ``(T, B, G*H)``, ``g_t`` repeated per gate) and
    ``g_{t-1} = grad_out_{t-1} + C_t * g_t + da_t @ weight``.

    Returns ``da`` ``(T, B, G*H)`` and ``dL/dh_0`` ``(B, H)``.
    """
    T, B, H = grad_out.size(0), grad_out.size(1), grad_out.size(2)
    da = torch.empty_like(K)
    K4, da4 = K.view(T, B, gates, H), da.view(T, B, gates, H)
    g = grad_out[T - 1].clone()
    carried = torch.empty_like(g)
    following = torch.zeros_like(g)
    for t in range(T - 1, -1, -1):
        torch.mul(K4[t], g.unsqueeze(1), out=da4[t])  # (B, G, H)
        if t > 0:
            following = grad_out[t - 1]
        else:
            following = torch.zeros_like(g)
        torch.addcmul(following, C[t], g, out=carried)
        g = torch.addmm(carried, da[t], weight)  # (B, G*H) @ (G*H, H)
    return da, g


def _weight_grad(da, h_previous):
    """``sum_t da_t^T h_{t-1}``: ``(G*H, T*B) @ (T*B, H)``."""
    return da.flatten(0, 1).t().mm(h_previous.flatten(0, 1))


class GatedRecurrence(torch.autograd.Function):
    """``h_t = cell(proj_t + W h_{t-1}, h_{t-1})`` for ``kind`` in ``"bru"``, ``"libru"`` (both in log
    space: ``h`` here is ``log h``), ``"ligru"``.

    Shapes: ``proj`` ``(T, B, G*H)`` contiguous, ``weight`` ``(G*H, H)``, ``h0`` ``(B, H)`` -> ``(T, B, H)``.
    """

    @staticmethod
    def forward(ctx, kind, proj, weight, h0):
        T, B, width = proj.shape
        H = weight.size(1)
        train = _needs_grad(ctx)
        weight_t = weight.t().contiguous()  # (H, G*H): a plain (not transposed) operand is faster for small B
        ops = native_ops(proj)
        if ops is not None:
            out, *saved = ops.gated_forward(kind, proj, weight_t, h0.contiguous(), train)
            saved = saved if kind == "libru" else saved[:1] if kind == "ligru" else []
        elif kind == "libru":
            out = proj.new_empty(T, B, H)
            saved = (_scratch(proj, width, train), _scratch(proj, H, train))  # [log z, log h~], log h_{t-1} - a_z
            _libru_loop(proj, weight_t, h0, out, *saved, train)
        else:
            out = proj.new_empty(T, B, H)
            pre = _scratch(proj, width, train and kind == "ligru")  # pre-activations a_t
            (_bru_loop if kind == "bru" else _ligru_loop)(proj, weight_t, h0, out, pre, train and kind == "ligru")
            saved = [pre] if kind == "ligru" else []  # BRU: 1 - sigma(a) = -expm1(log h)
        ctx.kind = kind
        if train:
            ctx.save_for_backward(weight, h0, out, *saved)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out):
        weight, h0, out, *saved = ctx.saved_tensors
        H = weight.size(1)
        h_previous = torch.cat([h0.unsqueeze(0), out[:-1]])  # (T, B, H)
        if ctx.kind == "bru":  # d log sigma(a) / da = 1 - sigma(a) = -expm1(log h)
            K, C, gates = torch.expm1(out).neg_(), torch.zeros_like(out), 1
        elif ctx.kind == "libru":
            log_gates, diff = saved
            log_z, log_c = log_gates[..., :H], log_gates[..., H:]
            K = torch.empty_like(log_gates)  # [dlog h_t / da_z, dlog h_t / da_h]
            ratio = torch.sub(log_z, out)  # log z - log h_t
            C = torch.add(diff, ratio).exp_()  # (1 - z) h_{t-1} / h_t
            w = ratio.add_(log_c).exp_()  # z h~ / h_t, the weight of the new candidate in (7c)
            torch.sub(w, log_z.exp(), out=K[..., :H])
            torch.mul(w, torch.expm1(log_c).neg_(), out=K[..., H:])  # 1 - h~ = -expm1(log h~)
            gates = 2
        else:
            (a,) = saved
            a_z, a_h = a[..., :H], a[..., H:]
            z = torch.sigmoid(a_z)
            C = 1 - z
            K = torch.cat([(a_h.clamp_min(0) - h_previous) * z * C, z * (a_h > 0)], dim=-1)
            gates = 2
        ops = native_ops(out)
        if ops is not None:
            da, grad_h0 = ops.gated_backward(K.contiguous(), C.contiguous(), grad_out.contiguous(), weight.contiguous())
        else:
            da, grad_h0 = _gated_backward(K, C, grad_out.contiguous(), weight, gates)
        grad_weight = _weight_grad(da, h_previous) if ctx.needs_input_grad[2] else None
        return None, da, grad_weight, grad_h0 if ctx.needs_input_grad[3] else None


@_script
def _lbru_loop(proj: torch.Tensor, weight_t: torch.Tensor, bias: torch.Tensor, h0: torch.Tensor,
               out: torch.Tensor, s_out: torch.Tensor, pre: torch.Tensor, kept: Optional[torch.Tensor],
               hidden: torch.Tensor, train: bool, input_gate: bool):
    """Eq. 72-75 (77): see :class:`LBRURecurrence`. ``pre`` and ``hidden`` have ``T`` slots when kept for
    backward, else two used in turn; ``kept`` is ``[a_z, q(, a_s)]`` per frame (``input_gate=False``)."""
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
    """The sequential part of :meth:`LBRURecurrence.backward`: ``G[t] = dL/dh_t`` (all included) and the
    slots ``[a_z, a_r, U_n h_{t-1}]`` of ``du``, from ``du_z[t] = G[t+1] M[t]``, ``[du_r, du_n][t] = G[t] P[t]``
    and ``G[t-1] = grad_h[t-1] + C[t] G[t] + du[t] @ weight``. Returns ``dL/dh_0``."""
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


class LBRURecurrence(torch.autograd.Function):
    """TPAMI layer-wise BRU forward (eq. 72-75, 77): gates ``[z, r, n(, s)]``, state ``(h, z_{t-1})``.

    Shapes: ``proj`` ``(T, B, G*H)``, ``weight`` ``(G*H, H)``, ``bias`` ``(H,)`` (``b_hh``), ``h0`` ``(B, H)``
    -> ``h`` ``(T, B, H)`` and ``s`` ``(T, B, H)`` (empty unless ``G = 4``).

    Saved per frame: ``[z, r, n, s]`` (C++ kernels: the gate values) or ``[a_z, a_r, q, a_s]`` (TorchScript:
    the pre-activations, ``q`` that of ``n``, eq. 74), ``U_n h_{t-1} + b_hh`` and ``h``: ``(G + 2) H`` values;
    without the input gate ``h_t = n_t`` and ``r`` is unused, so ``G H``.
    """

    @staticmethod
    def forward(ctx, input_gate, proj, weight, bias, h0):
        T, B, width = proj.shape
        H = weight.size(1)
        gates = width // H
        train = _needs_grad(ctx)
        ops = native_ops(proj)
        ctx.native = ops is not None
        if ctx.native:  # the gate values [z, r, n(, s)], or [z, n(, s)] without the input gate
            out, s_out, pre, hidden = ops.lbru_forward(proj, weight.t().contiguous(), bias.contiguous(),
                                                       h0.contiguous(), train, input_gate)
            kept = pre
        else:
            out = proj.new_empty(T, B, H)
            s_out = proj.new_empty(T, B, H) if gates == 4 else proj.new_empty(0)
            # Without the input gate the r slot is dead: keep [a_z, q(, a_s)] only, as autograd would.
            pre = _scratch(proj, width, train and input_gate)
            kept = proj.new_empty(T, B, width - H) if train and not input_gate else None
            hidden = _scratch(proj, H, train)  # U_n h_{t-1} + b_hh
            _lbru_loop(proj, weight.t().contiguous(), bias, h0, out, s_out, pre, kept, hidden, train, input_gate)
        ctx.input_gate = input_gate
        if train and input_gate:
            ctx.save_for_backward(weight, h0, pre, hidden, out)
        elif train:  # h_t = n_t, kept (C++) or recomputed from q_t
            ctx.save_for_backward(weight, h0, kept, hidden)
        return out, s_out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_h, grad_s):
        # Few and in-place temporaries: on a CPU each fresh (T, B, H) buffer costs page faults
        # comparable to the arithmetic, and this glue, not the loop, was half of the backward pass.
        weight, h0, pre, E, *out = ctx.saved_tensors
        H = weight.size(1)
        if ctx.native:  # everything per frame inside the loop (see the C++ kernel's comment); pre: gate values
            ops, empty = native_ops(pre), pre.new_empty(0)
            grad_s = grad_s.contiguous() if weight.size(0) == 4 * H else empty
            du, dq, g = ops.lbru_backward(pre, E, out[0] if out else empty, h0.contiguous(), grad_h.contiguous(),
                                          grad_s, weight.contiguous(), ctx.input_gate)
            h = out[0] if out else pre[..., H : 2 * H]  # without the input gate h_t = n_t
            grad_weight = torch.addmm(du[0].t().mm(h0), du[1:].flatten(0, 1).t(), h[:-1].flatten(0, 1))
            grad_bias = du[..., 2 * H : 3 * H].sum((0, 1))
            du[..., 2 * H : 3 * H] = dq  # du becomes the gradient of the projections
            return None, du, grad_weight, grad_bias, g
        if not ctx.input_gate:  # [a_z, q(, a_s)] -> [a_z, 0, q(, a_s)]
            pre = torch.cat([pre[..., :H], torch.zeros_like(pre[..., :H]), pre[..., H:]], dim=-1)
        T, B, width = pre.shape
        gates = width // H
        sig = torch.sigmoid(pre)
        z, r, n = sig[..., :H], sig[..., H : 2 * H], sig[..., 2 * H : 3 * H]
        out = out[0] if out else n
        h_previous = torch.cat([h0.unsqueeze(0), out[:-1]])
        P = torch.empty(T, B, 2, H, dtype=pre.dtype, device=pre.device)  # du_r, du_n per unit of dL/dh_t
        K1 = torch.addcmul(n, n, n, value=-1.0)  # n (1 - n)
        if ctx.input_gate:
            K1.addcmul_(K1, r, value=-1.0)  # dq / dh_t = (1 - r) n (1 - n)
            torch.sub(h_previous, n, out=P[:, :, 1])  # scratch for h_{t-1} - n
            torch.addcmul(r, r, r, value=-1.0, out=P[:, :, 0]).mul_(P[:, :, 1])  # d a_r / dh_t = (h_{t-1} - n) r (1 - r)
            C = r
        else:
            P[:, :, 0].zero_()
            C = torch.zeros_like(n)
        torch.mul(K1[1:], z[:-1], out=P[1:, :, 1])  # K1 z_{t-1}
        P[0, :, 1].zero_()  # z_0 = 0
        du = torch.empty_like(pre)  # gradients of [a_z, a_r, U_n h_{t-1}, a_s]
        if gates == 4:
            s = sig[..., 3 * H :]
            torch.addcmul(s, s, s, value=-1.0, out=du[..., 3 * H :]).mul_(grad_s)
        M = torch.addcmul(z, z, z, value=-1.0)  # du_z[t] = dL/dh_{t+1} K1_{t+1} E_{t+1} z_t (1 - z_t):
        M[:-1].mul_(K1[1:]).mul_(E[1:])  # z_t enters n_{t+1}
        M[-1].zero_()
        G = torch.empty_like(K1)
        g = _lbru_backward(P, M, C, grad_h.contiguous(), weight, du, G)
        grad_weight = _weight_grad(du, h_previous)
        grad_bias = du[..., 2 * H : 3 * H].sum((0, 1))
        torch.mul(G, K1, out=du[..., 2 * H : 3 * H])  # dq: du becomes the gradient of the projections
        return None, du, grad_weight, grad_bias, g

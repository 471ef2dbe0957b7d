"""Fast paths of the cells with a recurrent matrix: the gated family (BRU and Li-BRU in log form,
Li-GRU, GRU, LSTM, MGU, RNN) and the TPAMI layer-wise BRU, as ``torch.autograd.Function`` s with
hand-written backward passes.

Autograd on the reference loop (``Cell.forward``) records every small step; here

* the forward loop runs one matrix product and one fused elementwise pass per step (MGU: two, its
  candidate multiplies ``f * h_{t-1}``), and saves only what backward needs,
* the backward pass runs one short loop over time for the part that really is sequential (per step
  the gate gradients and one product through the recurrent matrix); everything else is done for all
  frames at once,
* the weight gradient is one ``(G*H, B*T) @ (B*T, H)`` product.

Three backends run the loops: on the CPU the C++ kernels of ``models/fast/csrc/recurrences.cpp``
(:mod:`models.fast.native`), where the threads split the hidden units for the whole loop (each
multiplies by its own columns of every gate and runs the elementwise step of its own units, one
barrier a step), and the backward loop forms the gate derivatives from what the forward pass kept; on
a GPU the Triton kernels (:mod:`models.fast.triton_loops`), one launch a pass, the programs splitting
the units in the same way; and the TorchScript loops of :mod:`models.fast.loops`, a handful of ``out=``
kernels a step, wherever neither can run. All are tested against the reference loop.

Layout inside this module is time-major, ``(T, B, G*H)``, so that each step reads contiguous memory.
The forward recursions never look at ``lengths``: like the reference loop they run over padded frames
(whose projections the layer has zeroed) and the layer masks those outputs. What each unit keeps for
backward is listed in :mod:`models.fast.loops`; without gradients nothing is allocated per step.
"""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

from models.fast import loops, triton_loops
from models.fast.loops import _lbru_backward, _lbru_loop, _scratch
from models.fast.loops import _script  # noqa: F401  (models.fast.scans takes it from here)
from models.fast.native import native_ops


def _needs_grad(ctx, grad_mode: bool) -> bool:
    """Whether a backward pass can follow, so that what it needs must be kept: an input requires a gradient
    and the caller records the graph. (``ctx.needs_input_grad`` stays true under ``torch.no_grad()``, and
    inside ``forward`` the grad mode is always off: the caller passes its ``torch.is_grad_enabled()``.)"""
    return grad_mode and any(ctx.needs_input_grad)


def _weight_grad(kind, du, kept, out, h0):
    """``sum_t du_t^T h_{t-1}`` ``(G*H, H)``, without a copy of ``h_{t-1}`` for all frames; the MGU's
    candidate rows multiply ``s_t = f_t h_{t-1}`` instead."""

    def times_previous(du, h):  # sum_t du_t^T h_{t-1} for h_{-1} = h0 and h_t = h[t]
        return torch.addmm(du[0].t().mm(h0), du[1:].flatten(0, 1).t(), h[:-1].flatten(0, 1))

    if kind == "mgu":
        H = out.size(2)
        f, s = kept[0][..., :H], torch.empty_like(out)  # s_t = f_t h_{t-1}, what U_h multiplies
        torch.mul(f[0], h0, out=s[0])
        torch.mul(f[1:], out[:-1], out=s[1:])
        return torch.cat([times_previous(du[..., :H], out), du[..., H:].flatten(0, 1).t().mm(s.flatten(0, 1))])
    return times_previous(du, out)


class GatedRecurrence(torch.autograd.Function):
    """``h_t = step(proj_t + W h_{t-1} + b, h_{t-1})`` for the unit named ``kind``: ``"bru"``, ``"libru"``
    (both in log space: ``h`` here is ``log h``), ``"ligru"``, ``"gru"``, ``"lstm"`` (``c_{-1} = 0``), ``"mgu"``,
    ``"rnn_tanh"``, ``"rnn_relu"``; the C++ kernels and the TorchScript loops know each by that name.

    ``mask`` ``(B, H)`` or ``None``: pytorch-kaldi's inner dropout (``models.gated.InnerDropout``), the
    candidate multiplied by ``mask`` at every step, for the units that have a candidate (``ligru``, ``gru``,
    ``lstm``, ``rnn_*``: ``loops.MASKED``); it gets no gradient.

    ``grad_mode``: the caller's ``torch.is_grad_enabled()``; without it nothing is kept for backward (the
    kernels' inference variants run).

    Shapes: ``proj`` ``(T, B, G*H)`` contiguous, ``weight`` ``(G*H, H)``, ``bias`` ``b_hh`` ``(G*H,)`` or ``None``,
    ``h0`` ``(B, H)`` -> ``(T, B, H)``.
    """

    @staticmethod
    def forward(ctx, kind, proj, weight, bias, h0, mask=None, grad_mode=True):
        train = _needs_grad(ctx, grad_mode)
        weight_t = weight.t().contiguous()  # (H, G*H): a plain (not transposed) operand is faster for small B
        mask = proj.new_empty(0) if mask is None else mask.contiguous()  # empty: no inner dropout
        ops = native_ops(proj)
        if ops is not None:
            b = proj.new_empty(0) if bias is None else bias.contiguous()
            out, *kept = ops.gated_forward(kind, proj, weight_t, b, h0.contiguous(), mask, train)  # kept, LSTM's c
        else:
            out, kept = loops.gated_forward(kind, proj, weight_t, bias, h0, train, mask if mask.numel() else None)
        ctx.kind, ctx.native = kind, ops is not None
        if train:
            ctx.save_for_backward(weight, h0, mask, out, *kept)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out):
        weight, h0, mask, out, *kept = ctx.saved_tensors
        grad_out = grad_out.contiguous()
        bias_grad = ctx.needs_input_grad[3]
        if ctx.native:  # the kernel sums the bias gradient on the way, a pass over du less
            du, dq, grad_h0, grad_bias = native_ops(out).gated_backward(ctx.kind, *kept, out, h0.contiguous(), mask,
                                                                        grad_out, weight.contiguous(), bias_grad)
        else:
            du, dq, grad_h0 = loops.gated_backward(ctx.kind, kept, out, h0, grad_out, weight,
                                                   mask if mask.numel() else None)
            grad_bias = du.sum((0, 1)) if bias_grad else None
        grad_weight = _weight_grad(ctx.kind, du, kept, out, h0) if ctx.needs_input_grad[2] else None
        if dq is not None and dq.numel():  # GRU: du's n slot is the gradient of U_n h + b_hn, not of p_n
            du[..., -dq.size(2) :] = dq
        return (None, du, grad_weight, grad_bias if bias_grad else None, grad_h0 if ctx.needs_input_grad[4] else None,
                None, None)


class LBRURecurrence(torch.autograd.Function):
    """TPAMI layer-wise BRU forward (eq. 72-75, 77): gates ``[z, r, n(, s)]``, state ``(h, z_{t-1})``.

    Shapes: ``proj`` ``(T, B, G*H)``, ``weight`` ``(G*H, H)``, ``bias`` ``(H,)`` (``b_hh``), ``h0`` ``(B, H)``
    -> ``h`` ``(T, B, H)`` and ``s`` ``(T, B, H)`` (empty unless ``G = 4``); ``grad_mode`` as
    :class:`GatedRecurrence`'s.

    Saved per frame: ``[z, r, n, s]`` (C++ kernels: the gate values) or ``[a_z, a_r, q, a_s]`` (TorchScript:
    the pre-activations, ``q`` that of ``n``, eq. 74), ``U_n h_{t-1} + b_hh`` and ``h``: ``(G + 2) H`` values;
    without the input gate ``h_t = n_t`` and ``r`` is unused, so ``G H``.
    """

    @staticmethod
    def forward(ctx, input_gate, proj, weight, bias, h0, grad_mode=True):
        T, B, width = proj.shape
        H = weight.size(1)
        gates = width // H
        train = _needs_grad(ctx, grad_mode)
        ops = native_ops(proj)
        ctx.native = ops is not None
        result = None if ctx.native else triton_loops.lbru_forward(input_gate, proj, weight.t(), bias, h0, train)
        if ctx.native:  # the gate values [z, r, n(, s)], or [z, n(, s)] without the input gate
            out, s_out, pre, hidden = ops.lbru_forward(proj, weight.t().contiguous(), bias.contiguous(),
                                                       h0.contiguous(), train, input_gate)
            kept = pre
        elif result is not None:  # the Triton kernel, which keeps what the TorchScript loop keeps
            out, s_out, pre, hidden = result
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
            return None, du, grad_weight, grad_bias, g, None
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
        g = triton_loops.lbru_backward(P, M, C, grad_h, weight, du, G)
        if g is None:
            g = _lbru_backward(P, M, C, grad_h.contiguous(), weight, du, G)
        grad_weight = du.flatten(0, 1).t().mm(h_previous.flatten(0, 1))  # sum_t du_t^T h_{t-1}
        grad_bias = du[..., 2 * H : 3 * H].sum((0, 1))
        torch.mul(G, K1, out=du[..., 2 * H : 3 * H])  # dq: du becomes the gradient of the projections
        return None, du, grad_weight, grad_bias, g, None

"""Fast time loops for the cells with a recurrent matrix: BRU and Li-BRU (log form), Li-GRU, LBRU.

Each is a ``torch.autograd.Function`` with a hand-written backward pass (issue 7). Autograd on the
reference loop (``Cell.forward``) records every small step; here the forward loop runs a handful of
``out=`` kernels per step into preallocated buffers and saves only the pre-activations, and the
backward pass

* recomputes every gate derivative for all frames at once (a few large elementwise kernels),
* runs one short loop over time for the part that really is sequential: per step an elementwise
  product for the gate gradients and one ``addmm`` through the recurrent matrix,
* forms the weight gradient as one ``(G*H, B*T) @ (B*T, H)`` product.

Layout inside this module is time-major, ``(T, B, G*H)``, so that each step reads contiguous memory;
the cell methods in ``fast_forward`` transpose from and to the layer's ``(B, T, ...)``.

The forward recursions never look at ``lengths``: like the reference loop they run over padded frames
(whose projections the layer has zeroed) and the layer masks those outputs. Saved activations per
frame: ``G*H`` pre-activations (plus ``H`` for Li-BRU), against the many intermediates autograd keeps
for the reference loop. Without gradients nothing is allocated per step: the loop writes into the
output and into two ping-pong scratch buffers.
"""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable
from torch.nn import functional as F

_log_sigmoid = torch._C._nn.log_sigmoid  # has an out= overload; F.logsigmoid does not


def _needs_grad(ctx) -> bool:
    return any(ctx.needs_input_grad)


def _scratch(proj, width, train):
    """A ``(T, B, width)`` buffer kept for backward, or two ``(B, width)`` slices reused in turn."""
    T, B = proj.shape[:2]
    return proj.new_empty(T if train else 2, B, width)


def _gated_backward(K, C, grad_out, weight, gates):
    """The sequential part shared by BRU, Li-BRU and Li-GRU.

    With ``g_t = dL/dh_t`` (everything through ``h_{t+1}`` included), the gate pre-activations get
    ``da_t = K_t * g_t`` (``K`` ``(T, B, G*H)``, ``g_t`` repeated per gate) and
    ``g_{t-1} = grad_out_{t-1} + C_t * g_t + da_t @ weight``.

    Returns ``da`` ``(T, B, G*H)`` and ``dL/dh_0`` ``(B, H)``.
    """
    T, B, H = grad_out.shape
    da = torch.empty_like(K)
    K4, da4 = K.view(T, B, gates, H), da.view(T, B, gates, H)
    g = grad_out[T - 1].clone()
    for t in range(T - 1, -1, -1):
        torch.mul(K4[t], g.unsqueeze(1), out=da4[t])  # (B, G, H)
        following = grad_out[t - 1] if t > 0 else torch.zeros_like(g)
        g = torch.addmm(torch.addcmul(following, C[t], g), da[t], weight)  # (B, G*H) @ (G*H, H)
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
        out = proj.new_empty(T, B, H)
        pre = _scratch(proj, width, train)  # pre-activations a_t
        extra = _scratch(proj, H, train) if kind == "libru" else None  # Li-BRU: m_t below
        work, diff = proj.new_empty(B, width), proj.new_empty(B, H)
        weight_t = weight.t()
        h = h0
        for t in range(T):
            i = t if train else t % 2
            a = torch.addmm(proj[t], h, weight_t, out=pre[i])  # (B, G*H)
            if kind == "bru":
                _log_sigmoid(a, out=out[t])  # eq. 6: log h = log sigma(a)
            elif kind == "libru":
                # eq. 7c: log h_t = log z + logaddexp(log h~, log h_{t-1} - a_z), as log(1 - z) = log z - a_z
                ls = _log_sigmoid(a, out=work)  # [log z, log h~]
                d = torch.sub(h, a[:, :H], out=diff)
                m = torch.logaddexp(ls[:, H:], d, out=extra[i])
                torch.add(ls[:, :H], m, out=out[t])
            else:  # ligru, eq. 8: h_t = h_{t-1} + z (relu(a_h) - h_{t-1})
                z = torch.sigmoid(a[:, :H], out=work[:, :H])
                step = torch.clamp_min(a[:, H:], 0, out=work[:, H:]).sub_(h)
                torch.addcmul(h, z, step, out=out[t])
            h = out[t]
        ctx.kind = kind
        if train:
            ctx.save_for_backward(weight, h0, pre, out, *(() if extra is None else (extra,)))
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out):
        weight, h0, a, out, *extra = ctx.saved_tensors
        H = weight.size(1)
        h_previous = torch.cat([h0.unsqueeze(0), out[:-1]])  # (T, B, H)
        if ctx.kind == "bru":
            K, C, gates = torch.sigmoid(-a), torch.zeros_like(out), 1  # d log sigma(a) / da = 1 - sigma(a)
        elif ctx.kind == "libru":
            (m,) = extra
            a_z, a_h = a[..., :H], a[..., H:]
            log_z, log_c = F.logsigmoid(a_z), F.logsigmoid(a_h)
            w = torch.exp(log_c - m)  # z h~ / h_t: the weight of the new candidate in (7c)
            C = torch.exp(h_previous - a_z - m)  # (1 - z) h_{t-1} / h_t = 1 - w
            K = torch.cat([w - log_z.exp(), w * torch.sigmoid(-a_h)], dim=-1)
            gates = 2
        else:
            a_z, a_h = a[..., :H], a[..., H:]
            z = torch.sigmoid(a_z)
            C = 1 - z
            K = torch.cat([(a_h.clamp_min(0) - h_previous) * z * C, z * (a_h > 0)], dim=-1)
            gates = 2
        grad_out = grad_out.contiguous()
        da, grad_h0 = _gated_backward(K, C, grad_out, weight, gates)
        grad_weight = _weight_grad(da, h_previous) if ctx.needs_input_grad[2] else None
        return None, da, grad_weight, grad_h0 if ctx.needs_input_grad[3] else None


class LBRURecurrence(torch.autograd.Function):
    """TPAMI layer-wise BRU forward (eq. 72-75, 77): gates ``[z, r, n(, s)]``, state ``(h, z_{t-1})``.

    Shapes: ``proj`` ``(T, B, G*H)``, ``weight`` ``(G*H, H)``, ``bias`` ``(H,)`` (``b_hh``), ``h0`` ``(B, H)``
    -> ``h`` ``(T, B, H)`` and ``s`` ``(T, B, H)`` (empty unless ``G = 4``).

    Saved per frame: the pre-activations ``[a_z, a_r, q, a_s]`` (``q`` that of ``n``, eq. 74),
    ``U_n h_{t-1} + b_hh`` and ``h``: ``(G + 2) H`` values; without the input gate ``h_t = n_t`` and ``a_r``
    is unused, so ``G H``.
    """

    @staticmethod
    def forward(ctx, input_gate, proj, weight, bias, h0):
        T, B, width = proj.shape
        H = weight.size(1)
        gates = width // H
        train = _needs_grad(ctx)
        n_slot = slice(2 * H, 3 * H)
        out = proj.new_empty(T, B, H)
        s_out = proj.new_empty(T, B, H) if gates == 4 else proj.new_empty(0)
        # Without the input gate the r slot is dead: keep [a_z, q(, a_s)] only, as autograd would.
        pre = _scratch(proj, width, train and input_gate)
        kept = proj.new_empty(T, B, width - H) if train and not input_gate else None
        hidden = _scratch(proj, H, train)  # U_n h_{t-1} + b_hh
        sig = proj.new_empty(2, B, width)  # ping-pong: keeps z_{t-1} while z_t is formed
        u, work = proj.new_empty(B, width), proj.new_empty(B, H)
        weight_t = weight.t()
        h, z_previous = h0, torch.zeros_like(h0)
        for t in range(T):
            i = t if train and input_gate else t % 2
            torch.mm(h, weight_t, out=u)
            a = torch.add(proj[t], u, out=pre[i])  # [a_z, a_r, ., a_s] (72), (73), (77)
            e = torch.add(u[:, n_slot], bias, out=hidden[t if train else t % 2])
            torch.addcmul(proj[t, :, n_slot], z_previous, e, out=a[:, n_slot])  # (74)
            if kept is not None:
                kept[t, :, :H].copy_(a[:, :H])
                kept[t, :, H:].copy_(a[:, 2 * H :])
            gate = torch.sigmoid(a, out=sig[t % 2])  # [z, r, n, s]
            n = gate[:, n_slot]
            if input_gate:
                torch.addcmul(n, gate[:, H : 2 * H], torch.sub(h, n, out=work), out=out[t])  # (75)
            else:
                out[t].copy_(n)  # (36)
            if gates == 4:
                s_out[t].copy_(gate[:, 3 * H :])
            h, z_previous = out[t], gate[:, :H]
        ctx.input_gate = input_gate
        if train and input_gate:
            ctx.save_for_backward(weight, h0, pre, hidden, out)
        elif train:  # h_t = n_t is recomputed from q_t
            ctx.save_for_backward(weight, h0, kept, hidden)
        return out, s_out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_h, grad_s):
        weight, h0, pre, E, *out = ctx.saved_tensors
        H = weight.size(1)
        if not ctx.input_gate:  # [a_z, q(, a_s)] -> [a_z, 0, q(, a_s)]
            pre = torch.cat([pre[..., :H], torch.zeros_like(pre[..., :H]), pre[..., H:]], dim=-1)
        T, B, width = pre.shape
        gates = width // H
        sig = torch.sigmoid(pre)
        z, r, n = sig[..., :H], sig[..., H : 2 * H], sig[..., 2 * H : 3 * H]
        out = out[0] if out else n
        z_previous = torch.cat([torch.zeros_like(h0).unsqueeze(0), z[:-1]])
        h_previous = torch.cat([h0.unsqueeze(0), out[:-1]])
        if ctx.input_gate:
            K1 = (1 - r) * n * (1 - n)  # dq / dh_t
            K2 = (h_previous - n) * r * (1 - r)  # d a_r / dh_t
            C = r
        else:
            K1, K2, C = n * (1 - n), torch.zeros_like(n), torch.zeros_like(n)
        K3 = z * (1 - z)
        du = torch.empty_like(pre)  # gradients of [a_z, a_r, U_n h_{t-1}, a_s]
        if gates == 4:
            s = sig[..., 3 * H :]
            du[..., 3 * H :] = grad_s * s * (1 - s)
        dq = torch.empty_like(out)
        grad_h = grad_h.contiguous()
        g, gz = grad_h[T - 1].clone(), torch.zeros_like(h0)
        for t in range(T - 1, -1, -1):
            dq_t = torch.mul(g, K1[t], out=dq[t])
            torch.mul(gz, K3[t], out=du[t, :, :H])
            torch.mul(g, K2[t], out=du[t, :, H : 2 * H])
            torch.mul(dq_t, z_previous[t], out=du[t, :, 2 * H : 3 * H])
            gz = dq_t * E[t]  # through z_{t-1} in n_t
            following = grad_h[t - 1] if t > 0 else torch.zeros_like(g)
            g = torch.addmm(torch.addcmul(following, C[t], g), du[t], weight)
        grad_x = du.clone()
        grad_x[..., 2 * H : 3 * H] = dq
        grad_weight = _weight_grad(du, h_previous)
        grad_bias = (dq * z_previous).sum((0, 1))
        return None, grad_x, grad_weight, grad_bias, g

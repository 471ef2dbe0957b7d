"""The fast path of each accelerated cell: the same function as ``Cell.reference_forward``.

Each function takes the cell, the layer's projections ``proj`` ``(B, T, G*H)`` and ``lengths`` ``(B,)``
and returns what the reference returns, ``(output, probabilities or None)``, both ``(B, T, H)``. The time
loops live in :mod:`models.fast.gated` (cells with a recurrent matrix) and :mod:`models.fast.scans`
(elementwise recursions); here is only vectorised glue over all frames, in time-major ``(T, B, ...)``.

A cell calls these from its ``fast_forward`` and returns ``None`` for the options they do not cover,
which sends ``Cell.forward`` to the reference loop (see ``FAST`` below for what is covered).
"""

from __future__ import annotations

import torch

from models.fast.gated import GatedRecurrence, LBRURecurrence
from models.fast import triton_loops
from models.fast.scans import (_NO_FUTURE, HMMSmoother, KalmanSmoother, LinearRecurrence, MatrixRecurrence,
                               SoftplusRecurrence, hmm_term, scan_ops)
from models.recurrent import log_sigmoid_pair

# unit -> the options with a fast path; anything else runs the reference loop.
FAST = {
    "bru": "form='log' (the default)",
    "libru": "form='log' (the default)",
    "ligru": "all (inner_dropout too)",
    "gru": "all (inner_dropout too)",
    "lstm": "all (inner_dropout too)",
    "mgu": "all",
    "rnn": "activation='tanh' (the default) or 'relu' (inner_dropout too)",
    "lbru": "all (backward=None or 'layer', input_gate True or False)",
    "ubru": "all (backward=None, 'kalman', 'hmm')",
    "qlstm": "activation='tanh' (the default): the LSTM's loop with the Hamilton matrix formed once a sequence",
    "fusionrnn": "all: the Li-GRU's loop, on the microphones fused (act, reduce, norm) before it",
}


def _time_major(x: torch.Tensor) -> torch.Tensor:
    return x.transpose(0, 1).contiguous()  # (B, T, ...) -> (T, B, ...)


def _at_end(lengths: torch.Tensor, T: int) -> torch.Tensor:
    """``(T, B, 1)``: frame ``t`` is a sequence's last real frame or padding (a backward recursion restarts)."""
    return (torch.arange(T, device=lengths.device)[:, None] >= lengths[None, :] - 1).unsqueeze(-1)


def gated(cell, kind: str, proj: torch.Tensor, lengths: torch.Tensor):
    """The gated family, a cell with a recurrent matrix ``cell.recurrent`` (its bias, if any, is ``b_hh``)
    and an elementwise step: ``kind`` names the step (see :class:`GatedRecurrence`). The state starts from
    the cell's ``initial_state`` (the LSTM's ``c`` from zero, as its cell's), drawn once as the reference
    loop draws it: a cell with ``candidate_mask`` (``models.gated.InnerDropout``) gets the same inner-dropout
    mask for the same random state, ``(B, H)`` in training and ``1 - p`` everywhere in evaluation."""
    state = cell.initial_state(proj)
    mask = cell.candidate_mask(state) if hasattr(cell, "candidate_mask") else None
    if mask is not None:
        mask = mask.expand(proj.size(0), cell.hidden_size)
    out = GatedRecurrence.apply(kind, _time_major(proj), cell.recurrent.weight, cell.recurrent.bias, state[0],
                                mask, torch.is_grad_enabled())  # (T, B, H)
    return cell.finish(proj, (out.transpose(0, 1),), lengths)


def lbru(cell, proj: torch.Tensor, lengths: torch.Tensor):
    """TPAMI layer-wise BRU, eq. 72-75 forward and eq. 77-78 backward (``backward="layer"``)."""
    T = proj.size(1)
    h0 = proj.new_full((proj.size(0), cell.hidden_size), 0.5)
    h, s = LBRURecurrence.apply(cell.input_gate, _time_major(proj), cell.recurrent.weight, cell.hidden_bias, h0,
                                torch.is_grad_enabled())
    if cell.backward == "layer":
        # h'_t = s_{t+1} (U_b h'_{t+1} + b_b) + (1 - s_{t+1}) h_t, restarted at h'_t = h_t at each last frame
        s_next = torch.cat([s[1:], torch.zeros_like(s[:1])])  # (T, B, H)
        at_end = _at_end(lengths, T)
        A = s_next.masked_fill(at_end, 0.0)
        h = MatrixRecurrence.apply(A, h, cell.backward_recurrent.weight, cell.backward_recurrent.bias)
    h = h.transpose(0, 1)
    return h, h


def ubru(cell, a: torch.Tensor, lengths: torch.Tensor):
    """Forward-backward UBRU: alpha in log-odds, then gamma by the Kalman or the HMM recursion.

    With ``x = logit(alpha)`` eq. 10 reads ``logit p_t = log tau01 - log(1 - tau01)
    + softplus(x_{t-1} + k_0) - softplus(x_{t-1} + k_1)``, ``k = [log tau11 - log tau01,
    log(1 - tau11) - log(1 - tau01)]``, and eq. 9 adds ``a_t``.
    """
    B, T, H = a.shape
    log_t11, log_not_t11 = log_sigmoid_pair(cell.tau11_logit)
    log_t01, log_not_t01 = log_sigmoid_pair(cell.tau01_logit)
    k = torch.stack([log_t11 - log_t01, log_not_t11 - log_not_t01])  # (2, H)
    x0 = cell.rho0_logit.expand(B, H)
    at = _time_major(a)  # (T, B, H)
    c = at + (log_t01 - log_not_t01)
    if cell.backward == "hmm":
        if triton_loops.scan_ops(at) is not None:  # a GPU: the HMM pass and gamma in one kernel each way
            x = SoftplusRecurrence.apply(c, k, x0)
            gamma = HMMSmoother.apply(x, at, torch.stack([cell.tau11_logit, cell.tau01_logit]),
                                      log_not_t11 - log_not_t01, lengths - 1).transpose(0, 1)
            return gamma, gamma
        c_back, j = _hmm_inputs(cell, at, log_not_t11 - log_not_t01, lengths)
        r0 = torch.full_like(x0, _NO_FUTURE)
        if scan_ops(at) is not None:  # one kernel call each way (C++: threads split by unit)
            x = SoftplusRecurrence.apply(c, k, x0)
            r = SoftplusRecurrence.apply(c_back, j, r0, True)
        else:
            # alpha and the HMM backward pass are independent recursions of the same form: one loop of
            # width 2H runs both, the backward one on time-flipped inputs, so that each step launches
            # the kernels of one recursion (the cost of a TorchScript loop is its launches).
            both = SoftplusRecurrence.apply(torch.cat([c, c_back.flip(0)], -1), torch.cat([k, j], -1),
                                            torch.cat([x0, r0], -1))
            x, r = both[..., :H], both[..., H:].flip(0)
        gamma = torch.sigmoid(x + r - at).transpose(0, 1)  # rho_t = r_t - a_t
        return gamma, gamma
    x = SoftplusRecurrence.apply(c, k, x0)  # logit alpha (9)
    if cell.backward is None:
        alpha = torch.sigmoid(x).transpose(0, 1)
        return alpha, alpha
    if scan_ops(x) is not None:
        gamma = KalmanSmoother.apply(x, k, lengths - 1)
    else:
        gamma = _kalman(x, k, _at_end(lengths, T))
    gamma = gamma.transpose(0, 1)
    return gamma, gamma


def _kalman(x, k, at_end):
    """Eq. 21 as the affine recursion ``gamma_t = A_t gamma_{t+1} + B_t`` (given alpha, gamma enters linearly).

    The two terms of eq. 21 are ``alpha_t tau11 / p_{t+1}`` and ``alpha_t (1 - tau11) / (1 - p_{t+1})``;
    with ``p_{t+1} = tau11 alpha_t + tau01 (1 - alpha_t)`` (eq. 10) they are ``sigma(logit alpha_t + k_0)``
    and ``sigma(logit alpha_t + k_1)``, so ``gamma_t = S_0 gamma_{t+1} + S_1 (1 - gamma_{t+1})``: one
    sigmoid over all frames, no division by ``p``.
    """
    S = torch.sigmoid(x.unsqueeze(2) + k)  # (T, B, 2, H)
    A = (S[:, :, 0] - S[:, :, 1]).masked_fill(at_end, 0.0)
    B = torch.where(at_end, torch.sigmoid(x), S[:, :, 1])  # gamma_T = alpha_T
    return LinearRecurrence.apply(True, A, B)


def _hmm_inputs(cell, at, c, lengths):
    """Eq. 17-18 through ``rho_t = log beta_t - log beta-bar_t``, so that ``gamma_t = sigma(logit alpha_t + rho_t)``.

    Since ``alpha beta + (1 - alpha) beta-bar = 1`` (eq. 11), ``rho`` fixes gamma. Dividing eq. 17 by eq. 18
    and using ``log(alpha / p) - log((1 - alpha) / (1 - p)) = a`` (eq. 9) gives
    ``rho_t = c + softplus(rho_{t+1} + a_{t+1} + j_0) - softplus(rho_{t+1} + a_{t+1} + j_1)`` with
    ``c = log(1 - tau11) - log(1 - tau01)`` and ``j = [logit tau11, logit tau01]``. In ``r_t = rho_t + a_t``
    it is the form of the forward pass with constant ``j``, run backwards in time:
    ``r_t = a_t + c + softplus(r_{t+1} + j_0) - softplus(r_{t+1} + j_1)``. At each sequence's last frame
    ``rho = 0`` (``beta_T = beta-bar_T = 1``), so ``r = a``; after it (padding) ``r`` is ``_NO_FUTURE``,
    where both softplus terms are exactly 0: the restart is exact and no gradient crosses it. (On a GPU
    :class:`models.fast.scans.HMMSmoother` runs this recursion and gamma in one kernel each way.)

    Returns the per-frame term ``(T, B, H)`` (time-major) and ``j`` ``(2, H)``.
    """
    return hmm_term(at, c, lengths - 1), torch.stack([cell.tau11_logit, cell.tau01_logit])

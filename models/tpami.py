"""Bayesian recurrent units of "A Bayesian Approach to Recurrence in Neural Networks"
(Garner and Tong, IEEE TPAMI 43(8), 2021): the final cells of its section VI.

Registry names:

* ``ubru_tpami``: unit-wise recursion with a probabilistic forget gate (eq. 24-29), its unit-wise
  backward recursion (eq. 38-51), and the input gate (eq. 65-75). Not the same unit as ``ubru``
  (forward-backward paper): here the prior mixes the previous output with a trained unconditional
  prior ``p`` through a context gate ``z``, instead of HMM transition probabilities.
* ``lbru``: layer-wise recursion (eq. 30-36), its layer-wise backward recursion with its own
  parameters (eq. 52-64, 77-78), and the input gate (eq. 72-75).

Both retain the paper's ad-hoc gate recurrence (``U h_{t-1}`` in the gates, eq. 72-73), and the forget
gate used at step ``t`` is the one computed at step ``t - 1`` (eq. 27, 74). With ``input_gate=False``
a cell is eq. 20/29 (unit-wise) or eq. 36 (layer-wise) alone: ``h_t = n_t``.

Stability (sec. IV-B): the paper finds the unit-wise recursion unstable because
``logit(prior)`` of eq. 29 tends to +-inf. Here the state is ``(log h, log(1 - h))`` and the prior's logit is
formed as a difference of two ``logaddexp``, so it stays finite (bounded by the gate and prior logits);
the layer-wise cell works in probabilities, which are bounded.

Output ``h_t`` (probabilities), or the smoothed ``h'_t`` when ``backward`` is set.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from models import fast
from models.recurrent import RecurrentMatrixCell, backward_scan, log_sigmoid_pair, orthogonal_blocks_


class UBRUTpamiCell(RecurrentMatrixCell):
    """Unit-wise BRU of TPAMI sec. VI. Gates ``[z, r, n]`` from ``x_t`` and ``h_{t-1}``::

        z_t     = sigma(W_z x_t + U_z h_{t-1} + b_z)                          (72)
        r_t     = sigma(W_r x_t + U_r h_{t-1} + b_r)                          (73)
        prior_t = (1 - z_{t-1}) p + z_{t-1} h_{t-1}                           (27)
        n_t     = sigma(W_n x_t + U_n h_{t-1} + b_n + logit(prior_t))         (20), (29)
        h_t     = (1 - r_t) n_t + r_t h_{t-1}                                 (75)

    with ``h_0 = p`` and ``z_0 = 0`` (sec. IV-A). ``p`` (``(H,)``, trained) is the unconditional prior;
    ``U_n h_{t-1}`` is the ad-hoc layer-wise recurrence of fig. 4. ``backward="unit"`` smooths
    (eq. 48-51): ``h'_T = h_T``, ``h'_{t-1} = (1 - z_{t-1}) h_{t-1} + z_{t-1} h'_t``. Eq. 76 writes the
    gate as ``z_t``; we use the gate of the transition ``t-1 -> t``, as derived in eq. 38-51.

    >>> import models
    >>> models.build("ubru_tpami", 3, 4, backward="unit")(torch.randn(2, 5, 3), [5, 2]).shape
    torch.Size([2, 5, 4])
    """

    num_gates = 3
    has_posteriors = True
    BACKWARDS = (None, "unit")
    variants = ({"backward": "unit"}, {"input_gate": False})

    def __init__(self, hidden_size: int, backward: Optional[str] = None, input_gate: bool = True):
        if backward not in self.BACKWARDS:
            raise ValueError(f"backward must be one of {self.BACKWARDS} for ubru_tpami, got {backward!r}")
        super().__init__(hidden_size)
        self.backward, self.input_gate = backward, bool(input_gate)
        self.prior_logit = nn.Parameter(torch.zeros(hidden_size))  # p = 0.5

    @property
    def prior(self) -> torch.Tensor:
        return torch.sigmoid(self.prior_logit)

    @property
    def causal(self) -> bool:
        return self.backward is None  # the smoothing of eq. 51 runs from the last frame back

    def initial_state(self, proj):
        batch = proj.size(0)
        log_p, log_not_p = (v.expand(batch, -1) for v in log_sigmoid_pair(self.prior_logit))
        # (log h_0, log(1 - h_0), logit(prior_1)): h_0 = p and z_0 = 0 give prior_1 = p.
        return log_p, log_not_p, self.prior_logit.expand(batch, -1)

    def step(self, proj_t, state):
        log_h, log_not_h, prior_logit = state
        x_z, x_r, x_n = proj_t.chunk(3, dim=-1)
        u_z, u_r, u_n = self.recurrent(log_h.exp()).chunk(3, dim=-1)
        log_n, log_not_n = log_sigmoid_pair(x_n + u_n + prior_logit)  # (20), (29)
        if self.input_gate:
            log_r, log_not_r = log_sigmoid_pair(x_r + u_r)  # (73)
            log_h, log_not_h = (
                torch.logaddexp(log_not_r + log_n, log_r + log_h),  # (75)
                torch.logaddexp(log_not_r + log_not_n, log_r + log_not_h),
            )
        else:
            log_h, log_not_h = log_n, log_not_n
        log_z, log_not_z = log_sigmoid_pair(x_z + u_z)  # (72)
        log_p, log_not_p = log_sigmoid_pair(self.prior_logit)
        prior_logit = torch.logaddexp(log_not_z + log_p, log_z + log_h) - torch.logaddexp(
            log_not_z + log_not_p, log_z + log_not_h
        )  # logit of (27) for step t + 1
        return (log_h, log_z), (log_h, log_not_h, prior_logit)

    def finish(self, proj, emitted, lengths):
        log_h, log_z = emitted
        h = log_h.exp()
        if self.backward == "unit":
            z = log_z.exp()  # z[:, t] links frames t and t + 1

            def step(t, following):
                (smoothed_next,) = following
                return ((1 - z[:, t]) * h[:, t] + z[:, t] * smoothed_next,)  # (51)

            (h,) = backward_scan(step, (h,), lengths)
        return h, h

    def extra_repr(self) -> str:
        return f"hidden_size={self.hidden_size}, backward={self.backward!r}, input_gate={self.input_gate}"


class LBRUCell(RecurrentMatrixCell):
    """Layer-wise BRU of TPAMI sec. VI. Gates ``[z, r, n]`` (and ``s`` with the backward recursion)::

        z_t = sigma(W_z x_t + U_z h_{t-1} + b_z)                               (72)
        r_t = sigma(W_r x_t + U_r h_{t-1} + b_r)                               (73)
        n_t = sigma(W_n x_t + b_n + z_{t-1} * (U_n h_{t-1} + b_hh))            (36), (74)
        h_t = (1 - r_t) n_t + r_t h_{t-1}                                      (75)

    with ``h_0 = 0.5`` and ``z_0 = 0``. ``backward="layer"`` adds the future-context gate and a backward
    matrix ``U_b`` with bias ``b_b`` (eq. 59-64, 77-78)::

        s_t      = sigma(W_s x_t + U_s h_{t-1} + b_s)                           (77)
        h'_T     = h_T,   h'_{t-1} = s_t * (U_b h'_t + b_b) + (1 - s_t) * h_{t-1}  (78)

    >>> import models
    >>> models.build("lbru", 3, 4, backward="layer")(torch.randn(2, 5, 3), [5, 2]).shape
    torch.Size([2, 5, 4])
    """

    has_posteriors = True
    BACKWARDS = (None, "layer")
    variants = ({"backward": "layer"}, {"input_gate": False}, {"input_gate": False, "backward": "layer"})

    def __init__(self, hidden_size: int, backward: Optional[str] = None, input_gate: bool = True):
        if backward not in self.BACKWARDS:
            raise ValueError(f"backward must be one of {self.BACKWARDS} for lbru, got {backward!r}")
        self.num_gates = 4 if backward == "layer" else 3
        super().__init__(hidden_size)
        self.backward, self.input_gate = backward, bool(input_gate)
        self.hidden_bias = nn.Parameter(torch.zeros(hidden_size))  # b_hh of (74)
        if backward == "layer":
            self.backward_recurrent = nn.Linear(hidden_size, hidden_size)  # U_b, b_b of (78)
            orthogonal_blocks_(self.backward_recurrent.weight, hidden_size)
            nn.init.zeros_(self.backward_recurrent.bias)

    @property
    def causal(self) -> bool:
        return self.backward is None  # eq. 78 runs from the last frame back

    def initial_state(self, proj):
        h = proj.new_full((proj.size(0), self.hidden_size), 0.5)
        return h, torch.zeros_like(h)  # (h_0, z_0)

    def step(self, proj_t, state):
        h, z_previous = state
        gates_x = proj_t.chunk(self.num_gates, dim=-1)
        gates_h = self.recurrent(h).chunk(self.num_gates, dim=-1)
        n = torch.sigmoid(gates_x[2] + z_previous * (gates_h[2] + self.hidden_bias))  # (74)
        z = torch.sigmoid(gates_x[0] + gates_h[0])  # (72)
        if self.input_gate:
            r = torch.sigmoid(gates_x[1] + gates_h[1])  # (73)
            h_next = (1 - r) * n + r * h  # (75)
        else:
            h_next = n  # (36)
        if self.backward == "layer":
            s = torch.sigmoid(gates_x[3] + gates_h[3])  # (77)
            return (h_next, s), (h_next, z)
        return (h_next,), (h_next, z)

    def finish(self, proj, emitted, lengths):
        h = emitted[0]
        if self.backward == "layer":
            s = emitted[1]

            def step(t, following):
                (smoothed_next,) = following
                gate = s[:, t + 1]  # s_{t+1} links frames t and t + 1
                return (gate * self.backward_recurrent(smoothed_next) + (1 - gate) * h[:, t],)  # (78)

            (h,) = backward_scan(step, (h,), lengths)
        return h, h

    def fast_forward(self, proj, lengths):
        return fast.lbru(self, proj, lengths)

    def extra_repr(self) -> str:
        return f"hidden_size={self.hidden_size}, backward={self.backward!r}, input_gate={self.input_gate}"

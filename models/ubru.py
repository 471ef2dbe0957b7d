"""Unit-wise Bayesian recurrent unit of "Bayesian Recurrent Units and the Forward-Backward Algorithm"
(Bittar and Garner, Interspeech 2022). Registry name ``ubru``.

Each of the ``H`` units is a 2-state HMM (feature present / absent) with trainable initial
probability ``rho0 = P(phi_0)`` and transitions ``tau11 = P(phi_t | phi_{t-1})``,
``tau01 = P(phi_t | not phi_{t-1})``, stored unconstrained as logits. The input projection gives the
log-likelihood ratio ``a_t = W x_t + b = log p(x_t | phi) - log p(x_t | not phi)`` (eq. 5, 6:
``r_t = exp(-a_t)``). There is no recurrent matrix.

Forward (alpha) pass, computed in log-odds (``logit alpha_t = logit p_t + a_t``) so that nothing saturates::

    p_t     = tau11 alpha_{t-1} + tau01 (1 - alpha_{t-1})          (10)
    alpha_t = sigma(a_t + logit(p_t))                                (9), equivalent to (8)

with ``alpha_0 = rho0`` (sec. 3.5), so ``p_1 = tau11 rho0 + tau01 (1 - rho0)``.
``1 - p_t`` is formed as ``(1 - tau11) alpha + (1 - tau01)(1 - alpha)``, never by subtraction.

Backward (gamma) pass, ``backward=``:

* ``None``: the output is ``alpha_t = P(phi_t | x_1..x_t)``.
* ``"kalman"``: eq. 21, ``gamma_T = alpha_T`` and
  ``gamma_t = alpha_t (tau11 gamma_{t+1} / p_{t+1} + (1 - tau11)(1 - gamma_{t+1}) / (1 - p_{t+1}))``;
  ``1 - gamma_t`` is carried alongside by its twin, eq. 26.
* ``"hmm"``: eq. 15-18, ``gamma_t = alpha_t beta_t``, with ``beta_T = beta-bar_T = 1``, run in log space.
  Eq. 17-18 divide by ``p_{t+1} + r_{t+1}(1 - p_{t+1})``; by eq. 8 that denominator equals
  ``p_{t+1} / alpha_{t+1}`` and ``r_{t+1} alpha_{t+1} / p_{t+1} = (1 - alpha_{t+1}) / (1 - p_{t+1})`` (eq. 22),
  which avoids overflowing ``r = exp(-a)``.

Both give ``gamma_t = P(phi_t | x_1..x_T)`` (sec. 3.4); the tests check them against a brute-force
sum over all state sequences. The output is ``gamma`` (or ``alpha``), a probability in ``[0, 1]``.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from models import fast
from models.recurrent import Cell, backward_scan, log_sigmoid_pair, logit

BACKWARDS = (None, "kalman", "hmm")


class UBRUCell(Cell):
    """One direction of a ``ubru`` layer (see the module docstring for the equations).

    Args:
        hidden_size: ``H``.
        backward: ``None``, ``"kalman"`` (eq. 21) or ``"hmm"`` (eq. 17-18).
        rho0, tau11, tau01: initial probabilities. The default is "sticky" (tau11 high, tau01 low) so
            that the recursion is on from the start; ``tau11 = tau01`` would make the unit memoryless.

    >>> import models
    >>> layer = models.build("ubru", 3, 4, backward="kalman")
    >>> layer(torch.randn(2, 5, 3), [5, 2]).shape, layer.tau11.shape
    (torch.Size([2, 5, 4]), torch.Size([4]))
    """

    has_posteriors = True
    variants = ({"backward": "kalman"}, {"backward": "hmm"})

    def __init__(self, hidden_size: int, backward: Optional[str] = None, rho0: float = 0.5, tau11: float = 0.9, tau01: float = 0.1):
        if backward not in BACKWARDS:
            raise ValueError(f"backward must be one of {BACKWARDS}, got {backward!r}")
        for name, value in (("rho0", rho0), ("tau11", tau11), ("tau01", tau01)):
            if not 0.0 < value < 1.0:
                raise ValueError(f"{name} must be a probability in (0, 1), got {value}")
        super().__init__(hidden_size)
        self.backward = backward
        self.rho0_logit = nn.Parameter(torch.full((hidden_size,), logit(rho0)))
        self.tau11_logit = nn.Parameter(torch.full((hidden_size,), logit(tau11)))
        self.tau01_logit = nn.Parameter(torch.full((hidden_size,), logit(tau01)))

    @property
    def rho0(self) -> torch.Tensor:
        return torch.sigmoid(self.rho0_logit)

    @property
    def tau11(self) -> torch.Tensor:
        return torch.sigmoid(self.tau11_logit)

    @property
    def tau01(self) -> torch.Tensor:
        return torch.sigmoid(self.tau01_logit)

    def _log_transitions(self):
        """``log tau11, log(1 - tau11), log tau01, log(1 - tau01)``, each ``(H,)``."""
        return (*log_sigmoid_pair(self.tau11_logit), *log_sigmoid_pair(self.tau01_logit))

    @property
    def causal(self) -> bool:
        return self.backward is None  # the Kalman and HMM passes run from the last frame back

    def initial_state(self, proj):
        # State: logit(alpha_{t-1}); alpha_0 = rho0 (sec. 3.5).
        return (self.rho0_logit.expand(proj.size(0), -1),)

    def step(self, a_t, state):
        (alpha_logit,) = state
        log_t11, log_not_t11, log_t01, log_not_t01 = self._log_transitions()
        log_alpha, log_not_alpha = log_sigmoid_pair(alpha_logit)
        log_p = torch.logaddexp(log_t11 + log_alpha, log_t01 + log_not_alpha)  # (10)
        log_not_p = torch.logaddexp(log_not_t11 + log_alpha, log_not_t01 + log_not_alpha)
        alpha_logit = a_t + log_p - log_not_p  # (9)
        return (alpha_logit, log_p, log_not_p), (alpha_logit,)

    def finish(self, a, emitted, lengths):
        alpha_logit, log_p, log_not_p = emitted  # (B, T, H) each
        alpha = torch.sigmoid(alpha_logit)
        if self.backward is None:
            return alpha, alpha
        if self.backward == "kalman":
            gamma = self._kalman(alpha, alpha_logit, log_p, log_not_p, lengths)
        else:
            gamma = self._hmm(alpha_logit, log_p, log_not_p, lengths)
        return gamma, gamma

    def fast_forward(self, a, lengths):
        return fast.ubru(self, a, lengths)

    def _kalman(self, alpha, alpha_logit, log_p, log_not_p, lengths):
        """Eq. 21 for gamma and eq. 26 for 1 - gamma, both started at gamma_T = alpha_T."""
        not_alpha = torch.sigmoid(-alpha_logit)
        inv_p, inv_not_p = torch.exp(-log_p), torch.exp(-log_not_p)  # 1 / p_t, 1 / (1 - p_t)
        t11, t01 = self.tau11, self.tau01
        not_t11, not_t01 = torch.sigmoid(-self.tau11_logit), torch.sigmoid(-self.tau01_logit)

        def step(t, following):
            gamma_next, not_gamma_next = following
            ratio_on = gamma_next * inv_p[:, t + 1]  # gamma_{t+1} / p_{t+1}
            ratio_off = not_gamma_next * inv_not_p[:, t + 1]  # (1 - gamma_{t+1}) / (1 - p_{t+1})
            gamma = alpha[:, t] * (t11 * ratio_on + not_t11 * ratio_off)  # (21)
            not_gamma = not_alpha[:, t] * (t01 * ratio_on + not_t01 * ratio_off)  # (26)
            return gamma, not_gamma

        gamma, _ = backward_scan(step, (alpha, not_alpha), lengths)
        return gamma

    def _hmm(self, alpha_logit, log_p, log_not_p, lengths):
        """Eq. 17-18 in log space; gamma_t = alpha_t beta_t (eq. 11)."""
        log_t11, log_not_t11, log_t01, log_not_t01 = self._log_transitions()
        log_alpha, log_not_alpha = log_sigmoid_pair(alpha_logit)
        # alpha_{t+1} / p_{t+1} and (1 - alpha_{t+1}) / (1 - p_{t+1}) in log space (eq. 22)
        log_on = log_alpha - log_p
        log_off = log_not_alpha - log_not_p

        def step(t, following):
            log_beta_next, log_beta_bar_next = following
            on = log_on[:, t + 1] + log_beta_next
            off = log_off[:, t + 1] + log_beta_bar_next
            log_beta = torch.logaddexp(log_t11 + on, log_not_t11 + off)  # (17)
            log_beta_bar = torch.logaddexp(log_t01 + on, log_not_t01 + off)  # (18)
            return log_beta, log_beta_bar

        zeros = torch.zeros_like(log_alpha)  # beta_T = beta-bar_T = 1
        log_beta, _ = backward_scan(step, (zeros, zeros), lengths)
        return torch.exp(log_alpha + log_beta)

    def extra_repr(self) -> str:
        return f"hidden_size={self.hidden_size}, backward={self.backward!r}"

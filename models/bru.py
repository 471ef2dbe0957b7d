"""Layer-wise Bayesian recurrent units of the Li-BRU paper (Bittar and Garner, ICASSP 2021).

Both units output ``log h_t`` (log-probabilities): the paper feeds a layer's log-probabilities to the
next layer (sec. "Adding a context relevance gate") and back into its own gates. ``posteriors()``
returns ``h_t`` itself.

Each unit has two forms that compute the same function:

* ``form="log"`` (default) works in log space throughout; it is the stable one. For T = 2000 and
  pre-activations of |50| it stays finite, because ``log sigma(a) = -softplus(-a)`` and the mixture
  of eq. 7c is a ``logaddexp``.
* ``form="prob"`` follows eq. 5 / 7 literally in probabilities. ``h`` can underflow to 0 in float32
  (``log h < -87``); its safeguard clamps ``h`` at the smallest normal float before the log, which
  keeps values finite but zeroes gradients through saturated units.

The initial state is ``h_0 = 0.5``: starting from ``h_0 = 0`` would feed ``log(0 + eps)``, a large negative
vector, through the orthogonal ``V`` and saturate most units at t = 1.
"""

from __future__ import annotations

import math

import torch
from torch.nn import functional as F

from models import fast
from models.recurrent import RecurrentMatrixCell, log_sigmoid_pair

FORMS = ("log", "prob")


class _LogStateCell(RecurrentMatrixCell):
    """Shared by BRU and Li-BRU: the state is ``log h_{t-1}``, starting from ``log 0.5``."""

    has_posteriors = True
    variants = ({"form": "prob"},)

    def __init__(self, hidden_size: int, form: str = "log"):
        if form not in FORMS:
            raise ValueError(f"form must be one of {FORMS}, got {form!r}")
        super().__init__(hidden_size)
        self.form = form

    def initial_state(self, proj):
        return (proj.new_full((proj.size(0), self.hidden_size), math.log(0.5)),)

    def _safe_log(self, h):
        return torch.log(h.clamp_min(torch.finfo(h.dtype).tiny))

    def probabilities(self, output, probabilities):
        return output.exp()  # h_t from log h_t

    def fast_forward(self, proj, lengths):
        return fast.gated(self, self.fast_kind, proj, lengths) if self.form == "log" else None

    def extra_repr(self) -> str:
        return f"hidden_size={self.hidden_size}, form={self.form!r}"


class BRUCell(_LogStateCell):
    """Bayesian recurrent unit without gate, eq. 5 (sigmoid) and eq. 6 (softplus, log-probabilities)::

        h_t     = sigma(W_h x_t + V_h log h_{t-1} + b_h)                  (5)
        log h_t = -softplus(-(W_h x_t + V_h log h_{t-1} + b_h))           (6)

    Eq. 6 is written in the paper with signs absorbed into the weights; ``-softplus(-a) = log sigma(a)``.

    >>> import models
    >>> layer = models.build("bru", 3, 4)
    >>> layer(torch.randn(2, 5, 3), [5, 2]).shape
    torch.Size([2, 5, 4])
    """

    fast_kind = "bru"

    def step(self, proj_t, state):
        (log_h,) = state
        a = proj_t + self.recurrent(log_h)
        if self.form == "log":
            log_h = -F.softplus(-a)  # (6)
        else:
            log_h = self._safe_log(torch.sigmoid(a))  # (5)
        return (log_h,), (log_h,)


class LiBRUCell(_LogStateCell):
    """Light Bayesian recurrent unit, eq. 7a-c of the Li-BRU paper. Gates ``[z, h~]``::

        z_t  = sigma(W_z x_t + V_z log h_{t-1} + b_z)                    (7a)
        h~_t = sigma(W_h x_t + V_h log h_{t-1} + b_h)                    (7b)
        h_t  = z_t * h~_t + (1 - z_t) * h_{t-1}                          (7c)

    In log space (7c) is ``log h_t = logaddexp(log z_t + log h~_t, log(1 - z_t) + log h_{t-1})``
    (mixing ``exp(-log h) = 1/h`` instead, as a naive port of eq. 7c to ``l = -log h`` does, would be a
    different, harmonic, model).

    >>> import models
    >>> layer = models.build("libru", 3, 4, bidirectional=True)
    >>> x, lengths = torch.randn(2, 5, 3), torch.tensor([5, 2])
    >>> layer(x, lengths).shape, bool((layer.posteriors(x, lengths) <= 1).all())
    (torch.Size([2, 5, 8]), True)
    """

    num_gates = 2
    fast_kind = "libru"

    def step(self, proj_t, state):
        (log_h,) = state
        a_z, a_h = (proj_t + self.recurrent(log_h)).chunk(2, dim=-1)
        if self.form == "log":
            log_z, log_not_z = log_sigmoid_pair(a_z)  # (7a)
            log_candidate = -F.softplus(-a_h)  # (7b)
            log_h = torch.logaddexp(log_z + log_candidate, log_not_z + log_h)  # (7c)
        else:
            z, candidate = torch.sigmoid(a_z), torch.sigmoid(a_h)  # (7a), (7b)
            log_h = self._safe_log(z * candidate + (1 - z) * log_h.exp())  # (7c)
        return (log_h,), (log_h,)

"""Baseline units: GRU, LSTM, Li-GRU, minimal gated unit, vanilla RNN, and the frame-wise MLP.

Each cell is only its recursion; projection, norm, dropout and direction live in
:class:`models.recurrent.RecurrentLayer`. ``proj_t`` below is the layer's ``W x_t + b`` for one
frame, ``(B, G*H)``, split into the gates in the order given by each class.
"""

from __future__ import annotations

import torch
from torch.nn import functional as F

from models import fast
from models.recurrent import Cell, RecurrentMatrixCell

ACTIVATIONS = {"tanh": torch.tanh, "relu": torch.relu, "sigmoid": torch.sigmoid, "softplus": F.softplus}


def _activation(name: str):
    if name not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {sorted(ACTIVATIONS)}, got {name!r}")
    return ACTIVATIONS[name]


class GRUCell(RecurrentMatrixCell):
    """Gated recurrent unit (Cho et al. 2014), in PyTorch's convention so weights load from ``nn.GRU``.

    Gates ``[r, z, n]``; the reset gate multiplies ``U_n h + b_hn`` (PyTorch), not ``h``::

        r = sigma(W_r x + b_ir + U_r h + b_hr)
        z = sigma(W_z x + b_iz + U_z h + b_hz)
        n = tanh(W_n x + b_in + r * (U_n h + b_hn))
        h_t = (1 - z) * n + z * h_{t-1}

    >>> import models
    >>> models.build("gru", 3, 4)(torch.randn(2, 5, 3), [5, 2]).shape
    torch.Size([2, 5, 4])
    """

    num_gates = 3
    recurrent_bias = True

    def step(self, proj_t, state):
        (h,) = state
        xr, xz, xn = proj_t.chunk(3, dim=-1)
        hr, hz, hn = self.recurrent(h).chunk(3, dim=-1)
        r = torch.sigmoid(xr + hr)
        z = torch.sigmoid(xz + hz)
        n = torch.tanh(xn + r * hn)
        h = (1 - z) * n + z * h
        return (h,), (h,)

    def fast_forward(self, proj, lengths):
        return fast.gated(self, "gru", proj, lengths)


class LSTMCell(RecurrentMatrixCell):
    """Long short-term memory (Hochreiter and Schmidhuber 1997, with forget gate), PyTorch's gate order.

    Gates ``[i, f, g, o]``: ``c_t = f * c_{t-1} + i * g``, ``h_t = o * tanh(c_t)``; zero initial state.

    >>> import models
    >>> models.build("lstm", 3, 4, bidirectional=True)(torch.randn(2, 5, 3), [5, 2]).shape
    torch.Size([2, 5, 8])
    """

    num_gates = 4
    recurrent_bias = True

    def initial_state(self, proj):
        zeros = proj.new_zeros(proj.size(0), self.hidden_size)
        return zeros, zeros

    def step(self, proj_t, state):
        h, c = state
        i, f, g, o = (proj_t + self.recurrent(h)).chunk(4, dim=-1)
        c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
        h = torch.sigmoid(o) * torch.tanh(c)
        return (h,), (h, c)

    def fast_forward(self, proj, lengths):
        return fast.gated(self, "lstm", proj, lengths)


class LiGRUCell(RecurrentMatrixCell):
    """Light GRU (Ravanelli et al. 2018), as eq. 8 of the Li-BRU paper. Gates ``[z, h~]``::

        z_t  = sigma(W_z x_t + V_z h_{t-1} + b_z)        (8a)
        h~_t = ReLU(W_h x_t + V_h h_{t-1} + b_h)         (8b)
        h_t  = z_t * h~_t + (1 - z_t) * h_{t-1}          (8c)

    >>> import models
    >>> models.build("ligru", 3, 4, norm="batch")(torch.randn(2, 5, 3), [5, 2]).shape
    torch.Size([2, 5, 4])
    """

    num_gates = 2

    def step(self, proj_t, state):
        (h,) = state
        a_z, a_h = (proj_t + self.recurrent(h)).chunk(2, dim=-1)
        z = torch.sigmoid(a_z)  # (8a)
        candidate = torch.relu(a_h)  # (8b)
        h = z * candidate + (1 - z) * h  # (8c)
        return (h,), (h,)

    def fast_forward(self, proj, lengths):
        return fast.gated(self, "ligru", proj, lengths)


class MGUCell(RecurrentMatrixCell):
    """Minimal gated unit (Zhou et al. 2016): one forget gate doubles as the reset gate. Gates ``[f, h~]``::

        f_t  = sigma(W_f x_t + U_f h_{t-1} + b_f)
        h~_t = tanh(W_h x_t + U_h (f_t * h_{t-1}) + b_h)
        h_t  = (1 - f_t) * h_{t-1} + f_t * h~_t

    >>> import models
    >>> models.build("mgu", 3, 4)(torch.randn(2, 5, 3), [5, 2]).shape
    torch.Size([2, 5, 4])
    """

    num_gates = 2

    def step(self, proj_t, state):
        (h,) = state
        x_f, x_h = proj_t.chunk(2, dim=-1)
        u_f, u_h = self.recurrent.weight.chunk(2, dim=0)  # (H, H) each
        f = torch.sigmoid(x_f + F.linear(h, u_f))
        candidate = torch.tanh(x_h + F.linear(f * h, u_h))
        h = (1 - f) * h + f * candidate
        return (h,), (h,)

    def fast_forward(self, proj, lengths):
        return fast.gated(self, "mgu", proj, lengths)


class RNNCell(RecurrentMatrixCell):
    """Elman RNN: ``h_t = act(W x_t + U h_{t-1} + b)``, ``act`` tanh (default) or relu.

    >>> import models
    >>> models.build("rnn", 3, 4, activation="relu")(torch.randn(2, 5, 3), [5, 2]).shape
    torch.Size([2, 5, 4])
    """

    variants = ({"activation": "relu"},)

    def __init__(self, hidden_size: int, activation: str = "tanh"):
        super().__init__(hidden_size)
        self.activation = _activation(activation)
        self.activation_name = activation

    def step(self, proj_t, state):
        (h,) = state
        h = self.activation(proj_t + self.recurrent(h))
        return (h,), (h,)

    def fast_forward(self, proj, lengths):
        if self.activation_name not in ("tanh", "relu"):  # the fused steps; sigmoid and softplus loop
            return None
        return fast.gated(self, "rnn_" + self.activation_name, proj, lengths)


class MLPCell(Cell):
    """Frame-wise feed-forward layer, ``h_t = act(W x_t + b)``: no recurrence, so no time loop.

    >>> import models
    >>> models.build("mlp", 3, 4)(torch.randn(2, 5, 3), [5, 2]).shape
    torch.Size([2, 5, 4])
    """

    def __init__(self, hidden_size: int, activation: str = "relu"):
        super().__init__(hidden_size)
        self.activation = _activation(activation)

    def forward(self, proj, lengths):
        return self.activation(proj), None

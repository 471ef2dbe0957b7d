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

# "linear": the identity (pytorch-kaldi's MLP act "linear", e.g. a layer regressing features for its mse);
# "leaky_relu" with pytorch-kaldi's negative slope, nn.LeakyReLU(0.2) in its act_fun, not torch's default 0.01;
# "elu": torch's, alpha 1, as pytorch-kaldi's nn.ELU()
LEAKY_RELU_SLOPE = 0.2
ACTIVATIONS = {"tanh": torch.tanh, "relu": torch.relu, "sigmoid": torch.sigmoid, "softplus": F.softplus,
               "linear": lambda x: x, "leaky_relu": lambda x: F.leaky_relu(x, LEAKY_RELU_SLOPE), "elu": F.elu}


class InnerDropout:
    """pytorch-kaldi's dropout place for a cell with a candidate state: ``inner_dropout = p`` (an attribute,
    0 by default; ``bru_kaldi.network`` sets it for ``dropout_at = inside``) multiplies the candidate by
    one mask per sequence drawn at the first frame, ``(B, H)`` of 0 and 1, *not* rescaled, and by
    ``1 - p`` in evaluation, as pytorch-kaldi's LSTM, GRU, liGRU and RNN do (the layer's own dropout is on
    its input and inverted). The mask rides in the state, after the unit's own tensors
    (:meth:`candidate_mask` finds it); the fast paths take it from there (``models.fast.paths.gated``),
    so they draw the same mask as the reference loop for the same random state.
    """

    inner_dropout = 0.0

    def _inner_mask(self, proj) -> tuple:
        if not self.inner_dropout:
            return ()
        keep = 1.0 - self.inner_dropout
        if self.training:
            return (proj.new_empty(proj.size(0), self.hidden_size).bernoulli_(keep),)
        return (proj.new_full((1, 1), keep),)

    def candidate_mask(self, state):
        """The mask of ``state`` (from :meth:`initial_state`): ``(B, H)`` of 0 and 1 in training, ``(1, 1)``
        of ``1 - p`` in evaluation; ``None`` without ``inner_dropout``."""
        return state[-1] if self.inner_dropout else None

    def _dropped(self, candidate, state):
        mask = self.candidate_mask(state)
        return candidate if mask is None else candidate * mask


def _activation(name: str):
    if name not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {sorted(ACTIVATIONS)}, got {name!r}")
    return ACTIVATIONS[name]


class GRUCell(InnerDropout, RecurrentMatrixCell):
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
        h = state[0]
        xr, xz, xn = proj_t.chunk(3, dim=-1)
        hr, hz, hn = self.recurrent(h).chunk(3, dim=-1)
        r = torch.sigmoid(xr + hr)
        z = torch.sigmoid(xz + hz)
        n = self._dropped(torch.tanh(xn + r * hn), state)
        h = (1 - z) * n + z * h
        return (h,), (h,) + state[1:]

    def initial_state(self, proj):
        return super().initial_state(proj) + self._inner_mask(proj)

    def fast_forward(self, proj, lengths):
        return fast.gated(self, "gru", proj, lengths)


class LSTMCell(InnerDropout, RecurrentMatrixCell):
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
        return (zeros, zeros) + self._inner_mask(proj)

    def step(self, proj_t, state):
        h, c = state[:2]
        i, f, g, o = (proj_t + self.recurrent(h)).chunk(4, dim=-1)
        c = torch.sigmoid(f) * c + torch.sigmoid(i) * self._dropped(torch.tanh(g), state)
        h = torch.sigmoid(o) * torch.tanh(c)
        return (h,), (h, c) + state[2:]

    def fast_forward(self, proj, lengths):
        return fast.gated(self, "lstm", proj, lengths)


class LiGRUCell(InnerDropout, RecurrentMatrixCell):
    """Light GRU (Ravanelli et al. 2018), as eq. 8 of the Li-BRU paper. Gates ``[z, h~]``::

        z_t  = sigma(W_z x_t + V_z h_{t-1} + b_z)        (8a)
        h~_t = ReLU(W_h x_t + V_h h_{t-1} + b_h)         (8b)
        h_t  = z_t * h~_t + (1 - z_t) * h_{t-1}          (8c)

    The update gate's convention is the Li-BRU paper's: ``z`` weighs the candidate. pytorch-kaldi's
    ``liGRU`` (``neural_networks.py``) writes ``h_t = z' h_{t-1} + (1 - z') h~_t``, so its gate is
    ``z' = 1 - z``. Since ``1 - sigma(a) = sigma(-a)``, the two cells compute the same function when the
    gate's weights are negated: ours ``W_z = -W'_z``, ``V_z = -V'_z``, ``b_z = -b'_z`` (with batch norm on the
    projection: the norm's shift negated, its scale kept), ``W_h, V_h, b_h`` unchanged. Layout: the layer's
    projection rows are ``[z; h~]`` (``layer.proj``), the recurrent matrix ``[V_z; V_h]``
    (``cell.recurrent``). ``tests/test_pytorch_kaldi_units.py`` checks the mapping against a
    transcription of pytorch-kaldi's step to 1e-12 in float64.

    >>> import models
    >>> models.build("ligru", 3, 4, norm="batch")(torch.randn(2, 5, 3), [5, 2]).shape
    torch.Size([2, 5, 4])
    """

    num_gates = 2

    def step(self, proj_t, state):
        h = state[0]
        a_z, a_h = (proj_t + self.recurrent(h)).chunk(2, dim=-1)
        z = torch.sigmoid(a_z)  # (8a)
        candidate = self._dropped(torch.relu(a_h), state)  # (8b)
        h = z * candidate + (1 - z) * h  # (8c)
        return (h,), (h,) + state[1:]

    def initial_state(self, proj):
        return super().initial_state(proj) + self._inner_mask(proj)

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


class RNNCell(InnerDropout, RecurrentMatrixCell):
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
        h = self._dropped(self.activation(proj_t + self.recurrent(state[0])), state)
        return (h,), (h,) + state[1:]

    def initial_state(self, proj):
        return super().initial_state(proj) + self._inner_mask(proj)

    def fast_forward(self, proj, lengths):
        if self.activation_name not in ("tanh", "relu"):  # the fused steps; the other activations loop
            return None
        return fast.gated(self, "rnn_" + self.activation_name, proj, lengths)


class MLPCell(Cell):
    """Frame-wise feed-forward layer, ``h_t = act(W x_t + b)``: no recurrence, so no time loop.

    >>> import models
    >>> models.build("mlp", 3, 4)(torch.randn(2, 5, 3), [5, 2]).shape
    torch.Size([2, 5, 4])
    """

    # pytorch-kaldi's MLP drops each layer's output (per frame, inverted); bru_kaldi.network sets it
    inner_dropout = 0.0

    def __init__(self, hidden_size: int, activation: str = "relu"):
        super().__init__(hidden_size)
        self.activation = _activation(activation)

    def forward(self, proj, lengths):
        return F.dropout(self.activation(proj), self.inner_dropout, self.training), None

    def stream(self, proj, state):
        return self.forward(proj, None), None  # frame by frame: nothing to carry

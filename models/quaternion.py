"""Quaternion LSTM (Parcollet et al., "Quaternion recurrent neural networks", ICLR 2019), as pytorch-kaldi's
``QLSTM`` (``quaternion_neural_networks.py``).

A feature vector of ``4n`` numbers is read as ``n`` quaternions ``q = r + i x + j y + k z``, stored by component:
``[r_1..r_n, i_1..i_n, j_1..j_n, k_1..k_n]``. A quaternion weight ``W = R + I i + J j + K k`` (``R, I, J, K``
real ``(m, n)``) maps ``x`` to the Hamilton product ``W (x) x``, a real matrix with shared blocks::

    [y_r]   [R  -I  -J  -K] [x_r]
    [y_i] = [I   R  -K   J] [x_i]          (Hamilton product, weight on the left)
    [y_j]   [J   K   R  -I] [x_j]
    [y_k]   [K  -J   I   R] [x_k]

a quarter of the parameters of a real ``(4m, 4n)`` matrix. The QLSTM is an LSTM whose input and recurrent
products are such maps, one per gate; the gates act elementwise ("split" activations)::

    i, f, o = sigma(W_. (x) x_t + b_. + U_. (x) h_{t-1})
    c_t = f c_{t-1} + i act(W_c (x) x_t + b_c + U_c (x) h_{t-1})
    h_t = o act(c_t)                       (act: tanh unless lstm_act says otherwise)

Sizes that are not multiples of 4: pytorch-kaldi fails at the first batch ("Quaternion Tensors must be
divisible by 4"). Here a map from ``F`` to ``H`` numbers is the top-left ``(H, F)`` block of the Hamilton
matrix of ``ceil(H/4)`` by ``ceil(F/4)`` quaternions: the input is zero-padded at its end (the last
quaternions' ``k`` components) and the extra outputs are dropped. With sizes that are multiples of 4 this
is exactly pytorch-kaldi's map; ``bru_kaldi.pytorch_kaldi.architectures`` refuses layer sizes that are not.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from models import fast
from models.gated import InnerDropout, _activation
from models.recurrent import Cell, RecurrentLayer

QUATERNION_INITS = ("quaternion", "unitary")


def hamilton_matrix(components: torch.Tensor, rows: int, columns: int) -> torch.Tensor:
    """The real ``(rows, columns)`` matrix of the quaternion weights ``components`` ``(..., 4, m, n)``
    (``[R, I, J, K]``, ``m = ceil(rows/4)``, ``n = ceil(columns/4)``), blocks stacked along the leading
    dimensions: ``(..., rows, columns)``, each the top-left block of the ``(4m, 4n)`` Hamilton matrix.

    >>> w = torch.zeros(4, 1, 1); w[0] = 1.0  # the quaternion 1: the identity
    >>> torch.equal(hamilton_matrix(w, 4, 4), torch.eye(4))
    True
    """
    r, i, j, k = components.unbind(-3)  # (..., m, n) each
    full = torch.cat([torch.cat([r, -i, -j, -k], -1),
                      torch.cat([i, r, -k, j], -1),
                      torch.cat([j, k, r, -i], -1),
                      torch.cat([k, -j, i, r], -1)], -2)  # (..., 4m, 4n)
    return full[..., :rows, :columns]


def quaternion_init_(components: torch.Tensor, init: str = "quaternion") -> torch.Tensor:
    """Initialise ``components`` ``(..., 4, m, n)`` in place as pytorch-kaldi's ``quaternion_init`` (polar
    form: modulus ~ chi(4) scaled by Glorot's ``1 / sqrt(2 (m + n))``, a random purely imaginary unit axis,
    a phase uniform in ``[-pi, pi]``) or ``unitary_init`` (uniform components normalised to unit quaternions)."""
    if init not in QUATERNION_INITS:
        raise ValueError(f"init must be one of {QUATERNION_INITS}, got {init!r}")
    m, n = components.shape[-2:]
    shape = components.shape[:-3] + (m, n)
    with torch.no_grad():
        if init == "quaternion":
            scale = 1.0 / math.sqrt(2 * (m + n))
            modulus = torch.randn((4,) + shape).pow(2).sum(0).sqrt() * scale  # chi with 4 degrees of freedom
            axis = torch.randn((3,) + shape)
            axis = axis / (axis.pow(2).sum(0) + 1e-4).sqrt()
            phase = torch.empty(shape).uniform_(-math.pi, math.pi)
            parts = [modulus * torch.cos(phase)] + [modulus * a * torch.sin(phase) for a in axis]
        else:
            bound = math.sqrt(3.0) / math.sqrt(2 * (m + n))
            v = torch.empty((4,) + shape).uniform_(-bound, bound)
            parts = list(v / (v.pow(2).sum(0).sqrt() + 1e-4))
        components.copy_(torch.stack(parts, dim=-3))
    return components


class QuaternionLinear(nn.Module):
    """``blocks`` quaternion maps from ``in_features`` to ``out_features`` numbers each, stacked: ``weight`` is
    the real ``(blocks * out_features, in_features)`` matrix they make (formed from the ``(blocks, 4, m, n)``
    parameter ``components`` at each use), so the layer's products (``models.fast.products.linear``) and the
    fast recurrences read it as any other weight.

    >>> q = QuaternionLinear(8, 4, blocks=2)
    >>> q.weight.shape, q(torch.randn(3, 8)).shape
    (torch.Size([8, 8]), torch.Size([3, 8]))
    """

    def __init__(self, in_features: int, out_features: int, blocks: int = 1, bias: bool = True,
                 init: str = "quaternion"):
        super().__init__()
        self.in_features, self.block_features = in_features, out_features
        self.out_features = blocks * out_features
        self.components = nn.Parameter(torch.empty(blocks, 4, -(-out_features // 4), -(-in_features // 4)))
        quaternion_init_(self.components, init)
        self.bias = nn.Parameter(torch.zeros(self.out_features)) if bias else None  # zero, as pytorch-kaldi's

    @property
    def weight(self) -> torch.Tensor:
        blocks = hamilton_matrix(self.components, self.block_features, self.in_features)  # (blocks, out, in)
        return blocks.reshape(self.out_features, self.in_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.linear(x, self.weight, self.bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


class QLSTMCell(InnerDropout, Cell):
    """One direction of a quaternion LSTM (see the module docstring). Gates ``[i, f, g, o]`` as ``lstm``; the
    recurrent map ``cell.recurrent`` is a :class:`QuaternionLinear` of 4 blocks without bias (pytorch-kaldi's
    ``uih, ufh, uch, uoh``). ``activation`` (pytorch-kaldi's ``lstm_act``) acts on the candidate and on ``c``.

    >>> import models
    >>> models.build("qlstm", 8, 4, bidirectional=True)(torch.randn(2, 5, 8), [5, 2]).shape
    torch.Size([2, 5, 8])
    """

    num_gates = 4
    variants = ({"activation": "relu"},)

    def __init__(self, hidden_size: int, activation: str = "tanh", init: str = "quaternion"):
        super().__init__(hidden_size)
        self.activation, self.activation_name, self.init = _activation(activation), activation, init
        self.recurrent = QuaternionLinear(hidden_size, hidden_size, blocks=4, bias=False, init=init)

    def initial_state(self, proj):
        zeros = proj.new_zeros(proj.size(0), self.hidden_size)
        return (zeros, zeros) + self._inner_mask(proj)

    def step(self, proj_t, state):
        h, c = state[:2]
        i, f, g, o = (proj_t + self.recurrent(h)).chunk(4, dim=-1)
        c = torch.sigmoid(f) * c + torch.sigmoid(i) * self._dropped(self.activation(g), state)
        h = torch.sigmoid(o) * self.activation(c)
        return (h,), (h, c) + state[2:]

    def fast_forward(self, proj, lengths):
        # the LSTM's fused loop takes any recurrent matrix: here the Hamilton matrix, formed once per sequence
        return fast.gated(self, "lstm", proj, lengths) if self.activation_name == "tanh" else None


class QuaternionLayer(RecurrentLayer):
    """A ``qlstm`` layer: :class:`models.recurrent.RecurrentLayer` whose input projection is quaternion,
    ``proj`` a :class:`QuaternionLinear` of ``directions * 4`` blocks (pytorch-kaldi's ``wix, wfx, wcx, wox``
    per direction), with a zero-initialised bias unless a norm follows it.

    >>> layer = QuaternionLayer(lambda: QLSTMCell(8), 12, 8)
    >>> layer.proj.components.shape, layer(torch.randn(2, 3, 12), [3, 1]).shape
    (torch.Size([4, 4, 2, 3]), torch.Size([2, 3, 8]))
    """

    def __init__(self, cell_factory, input_size, hidden_size, bidirectional=False, dropout=0.0, norm=None):
        super().__init__(cell_factory, input_size, hidden_size, bidirectional, dropout, norm)
        cell = self.cells[0]
        self.proj = QuaternionLinear(input_size, hidden_size, blocks=self.num_directions * cell.num_gates,
                                     bias=norm is None, init=cell.init)


QLSTMCell.layer_class = QuaternionLayer  # models.build builds a qlstm layer with it

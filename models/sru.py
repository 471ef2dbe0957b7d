"""Simple recurrent unit (Lei et al., "Simple recurrent units for highly parallelizable recurrence", EMNLP
2018), as the ``sru`` package 2.1 that pytorch-kaldi's ``SRU`` wraps (its options ``n_proj``, ``use_relu``,
``use_selu``, ``is_input_normalized`` are those of sru 2.1.3).

Every product is feed-forward; the recurrence is elementwise, with vectors ``v_f``, ``v_r``::

    [u_t, a_f, a_r, x'_t] = W x_t               (x'_t = scale * x_t when x already has the output width)
    f_t = sigma(a_f + v_f * c_{t-1} + b_f)        forget gate
    r_t = sigma(a_r + v_r * c_{t-1} + b_r)        reset (highway) gate, b_r initialised to highway_bias
    c_t = f_t * c_{t-1} + (1 - f_t) * u_t
    h_t = r_t * (g(c_t) * m) + (1 - r_t) * x'_t   (skip=False: h_t = r_t * g(c_t) * m)

``g`` is the identity unless ``activation`` is tanh, relu or selu; ``m`` the cell's ``state_dropout`` mask
(sru's ``dropout``: one mask per sequence, ``1/(1-p)`` on kept units, in training only). The highway input
``x'`` is a fourth learned projection (``highway = "learned"``, the default: a bidirectional layer is then
two unidirectional ones, as every unit here), or, with ``highway = "auto"`` (sru's rule, what pytorch-kaldi
configs get), the layer input itself when its width is the layer's output width (``H``, or ``2H``
bidirectional: the forward direction reads its first half, the backward its second), scaled by
``sqrt(1 + 2 exp(highway_bias))`` with ``rescale``. With
``projection_size`` ``P`` (sru's ``n_proj``, used when ``P`` is below both the input width and ``H``), ``W``
is the product of ``(F, P)`` and ``(P, 4H)`` factors. Initialisation follows sru 2.1.3.

Differences from sru: the layer's input dropout (sru's ``rnn_dropout``) reaches the identity highway too
(sru adds the undropped input), and sru's ``weight_norm``, ``layer_norm`` and ``is_input_normalized`` are
not offered (``bru_kaldi.pytorch_kaldi.architectures`` refuses them).
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

from models.recurrent import Cell, RecurrentLayer

HIGHWAYS = ("learned", "auto")  # auto: the input itself where it has the output width (sru)
SRU_ACTIVATIONS = {"identity": lambda c: c, "tanh": torch.tanh, "relu": torch.relu, "selu": F.selu}


class SRUCell(Cell):
    """One direction of an SRU: the elementwise recursion above. ``proj_t`` is ``[u, a_f, a_r, x']``
    ``(B, 4H)`` from :class:`SRULayer`; the cell's only weights are ``recurrent_weight`` ``(2, H)``
    (``[v_f; v_r]``). The options that shape the projection (``highway_bias``, ``rescale``,
    ``projection_size``) are read by the layer from its cell.

    >>> import models
    >>> models.build("sru", 3, 4, bidirectional=True, highway_bias=-1.0)(torch.randn(2, 5, 3), [5, 2]).shape
    torch.Size([2, 5, 8])
    """

    num_gates = 4
    variants = ({"activation": "tanh", "highway_bias": -1.0}, {"skip": False}, {"rescale": False})

    def __init__(self, hidden_size: int, activation: str = "identity", highway_bias: float = 0.0, skip: bool = True,
                 rescale: bool = True, projection_size: int = 0, state_dropout: float = 0.0, highway: str = "learned"):
        super().__init__(hidden_size)
        if highway not in HIGHWAYS:
            raise ValueError(f"highway must be one of {HIGHWAYS}, got {highway!r}")
        self.highway = highway
        if activation not in SRU_ACTIVATIONS:
            raise ValueError(f"activation must be one of {sorted(SRU_ACTIVATIONS)}, got {activation!r}")
        if not 0.0 <= state_dropout < 1.0:
            raise ValueError(f"state_dropout must be in [0, 1), got {state_dropout}")
        if projection_size < 0:
            raise ValueError(f"projection_size must be 0 (none) or positive, got {projection_size}")
        self.activation_name, self.activation = activation, SRU_ACTIVATIONS[activation]
        self.highway_bias, self.skip, self.rescale = float(highway_bias), bool(skip), bool(rescale)
        self.projection_size, self.state_dropout = int(projection_size), float(state_dropout)
        # sru 2.1.3: v uniform with variance 1, times sqrt(0.5)
        bound = math.sqrt(3.0) * math.sqrt(0.5)
        self.recurrent_weight = nn.Parameter(torch.empty(2, hidden_size).uniform_(-bound, bound))

    def initial_state(self, proj):
        c = proj.new_zeros(proj.size(0), self.hidden_size)
        if self.training and self.state_dropout > 0:  # one inverted mask per sequence, as sru's mask_c
            keep = 1.0 - self.state_dropout
            return c, proj.new_empty(proj.size(0), self.hidden_size).bernoulli_(keep).div_(keep)
        return (c,)

    def step(self, proj_t, state):
        c = state[0]
        u, a_f, a_r, highway = proj_t.chunk(4, dim=-1)
        v_f, v_r = self.recurrent_weight
        f = torch.sigmoid(a_f + v_f * c)
        r = torch.sigmoid(a_r + v_r * c)
        c = f * c + (1 - f) * u
        g = self.activation(c)
        if len(state) > 1:
            g = g * state[1]
        h = r * g + (1 - r) * highway if self.skip else r * g
        return (h,), (c,) + state[1:]

    def extra_repr(self) -> str:
        return (f"hidden_size={self.hidden_size}, activation={self.activation_name}, highway_bias={self.highway_bias}, "
                f"skip={self.skip}, projection_size={self.projection_size}, state_dropout={self.state_dropout}")


class SRUProjection(nn.Module):
    """The SRU's feed-forward products for ``D`` directions: ``weight`` ``(D*4H, F)``, rows ``[u; a_f; a_r; x']``
    per direction, and ``bias`` ``(D*4H,)``, zero but for ``b_f``, ``b_r`` (``gate_bias`` ``(D*2H,)``).

    ``x'`` is a fixed scaled selection of the input when ``F == D*H`` (``identity`` True), else learned; with
    ``skip`` False it is zero. ``projection_size`` ``P`` factors the learned rows as ``(·, P) @ (P, F)``.
    """

    def __init__(self, input_size: int, hidden_size: int, directions: int, cell: SRUCell, gate_bias: bool,
                 input_dropout: float):
        super().__init__()
        H, D = hidden_size, directions
        self.in_features, self.hidden_size, self.directions = input_size, H, D
        self.out_features = D * 4 * H
        self.skip = cell.skip
        self.identity = cell.skip and cell.highway == "auto" and input_size == D * H
        self.learned = 4 if cell.skip and not self.identity else 3  # sru's k
        self.scale = math.sqrt(1 + 2 * math.exp(cell.highway_bias)) if cell.rescale and cell.skip else 1.0
        P = cell.projection_size
        use_projection = 0 < P < input_size and P < H  # sru 2.1.3: only where it saves something
        fan_in = P if use_projection else input_size
        self.down = nn.Parameter(torch.empty(P, input_size)) if use_projection else None
        self.learned_weight = nn.Parameter(torch.empty(D * self.learned * H, fan_in))
        self.gate_bias = nn.Parameter(torch.zeros(D * 2 * H)) if gate_bias else None
        with torch.no_grad():  # sru 2.1.3's reset_parameters
            bound = math.sqrt(3.0 / fan_in)
            self.learned_weight.uniform_(-bound, bound)
            if self.down is not None:
                self.down.uniform_(-math.sqrt(3.0 / input_size), math.sqrt(3.0 / input_size))
            if self.gate_bias is not None:
                self.gate_bias.view(D, 2, H)[:, 1] = cell.highway_bias  # b_r
            w = self.learned_weight.view(D, self.learned, H, fan_in)
            w[:, 1:3] *= math.sqrt(0.5)
            if cell.rescale:  # sru returns before the dropout scalings without rescale
                if self.learned == 4:
                    w[:, 3] *= self.scale
                if cell.state_dropout > 0:
                    w[:, 0] *= math.sqrt(1 - cell.state_dropout)
                if input_dropout > 0:
                    w *= math.sqrt(1 - input_dropout)

    @property
    def weight(self) -> torch.Tensor:
        D, H, F_ = self.directions, self.hidden_size, self.in_features
        learned = self.learned_weight if self.down is None else self.learned_weight @ self.down
        learned = learned.view(D, self.learned, H, F_)
        if self.learned == 3:
            if self.identity:  # x' = scale * x, direction d reading input columns [dH, (d+1)H)
                fixed = torch.eye(D * H, F_, dtype=learned.dtype, device=learned.device).mul_(self.scale)
            else:  # no highway: h = r * g(c)
                fixed = learned.new_zeros(D * H, F_)
            learned = torch.cat([learned, fixed.view(D, 1, H, F_)], dim=1)
        return learned.reshape(D * 4 * H, F_)

    @property
    def bias(self):
        if self.gate_bias is None:
            return None
        D, H = self.directions, self.hidden_size
        zeros = self.gate_bias.new_zeros(D, 1, H)
        return torch.cat([zeros, self.gate_bias.view(D, 2, H), zeros], dim=1).reshape(-1)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, identity_highway={self.identity}, "
                f"projection={None if self.down is None else self.down.size(0)}, scale={self.scale:.4f}")


class SRULayer(RecurrentLayer):
    """An ``sru`` layer: :class:`models.recurrent.RecurrentLayer` with :class:`SRUProjection` as its ``proj``.

    >>> layer = SRULayer(lambda: SRUCell(4, highway="auto"), 8, 4, bidirectional=True)
    >>> layer.proj.identity, layer(torch.randn(2, 3, 8), [3, 1]).shape
    (True, torch.Size([2, 3, 8]))
    """

    def __init__(self, cell_factory, input_size, hidden_size, bidirectional=False, dropout=0.0, norm=None):
        super().__init__(cell_factory, input_size, hidden_size, bidirectional, dropout, norm)
        self.proj = SRUProjection(input_size, hidden_size, self.num_directions, self.cells[0], norm is None, dropout)


SRUCell.layer_class = SRULayer  # models.build builds an sru layer with it

"""FusionRNN's first layer: a Li-GRU whose gate inputs fuse several microphones with shared weights.

Parcollet, Qiu and Lane, "FusionRNN: Shared Neural Parameters for Multi-Channel Distant Speech
Recognition" (Interspeech 2020), as pytorch-kaldi's ``fusionRNN_jit`` / ``liGRU_layer`` /
``FusionLinearConv`` (``neural_networks.py``) compute it. The input frame is ``M`` microphones of
``f`` values each, concatenated: ``x_t = [x_t^1 ... x_t^M]``. Each gate ``g`` in ``{z, h~}`` has one
weight matrix and bias shared by every microphone (pytorch-kaldi's ``Conv1d(1, H, kernel=f, stride=f)``),
a fusion activation ``act`` (pytorch-kaldi's ``fusion_act``), and a reduction over the microphones::

    f^g_t   = reduce_m act_g(W_g x_t^m + b_g)                  reduce: sum or mean over m = 1..M
    z'_t    = sigma(BN_z(f^z_t) + U'_z h_{t-1})
    h~_t    = ReLU(BN_h(f^h_t) + U_h h_{t-1})
    h_t     = z'_t * h_{t-1} + (1 - z'_t) * h~_t                  (pytorch-kaldi's gate weighs h_{t-1})

``BN`` is the layer's norm (pytorch-kaldi: batch norm, always), here *after* the fusion as there, so it
lives in the cell (:class:`FusionLiGRUCell` ``norm``) rather than on the layer's projection. With
``mics=1`` and ``fusion_act="linear"`` (the defaults) nothing is fused: the layer is pytorch-kaldi's
``liGRU_layer`` without fusion, the layers after the first of its ``fusionRNN_jit``.

How it sits in :class:`models.recurrent.RecurrentLayer`: the layer's projection computes every
microphone's ``W_g x^m + b_g`` at once (:class:`SharedMicrophoneLinear`, a block-diagonal product with
one block repeated ``M`` times), the cell applies ``act``, ``reduce`` and the norm over whole sequences,
then runs :class:`models.gated.LiGRUCell`'s recursion (and its fast path) on ``[-BN_z f^z, BN_h f^h]``:
the negated update-gate input turns our Li-GRU's ``z`` (which weighs the candidate) into pytorch-kaldi's
``1 - z'`` for *any* fusion activation, with ``U_z = -U'_z``.
"""

from __future__ import annotations

import math
from typing import Optional

import torch
from torch import nn
from torch.nn import functional as F

from models.gated import LiGRUCell
from models.norm import make_norm
from models.recurrent import RecurrentLayer

# pytorch-kaldi's FusionLinearConv: nn.LeakyReLU() with torch's default slope 0.01 (not its act_fun's 0.2);
# nn.PReLU(): one learned slope per fusion, starting at 0.25. "linear": no fusion activation (no fusion).
FUSION_ACTS = ("linear", "prelu", "relu", "leaky_relu", "tanh")
FUSION_LEAKY_SLOPE = 0.01
PRELU_INIT = 0.25
FUSION_REDUCES = ("sum", "mean")


class SharedMicrophoneLinear(nn.Module):
    """``W x^m + b`` for every microphone ``m`` of ``x = [x^1 ... x^M]``, with one ``W``, ``b`` for all of them.

    ``shared_weight`` is ``(R, f)``, ``shared_bias`` ``(R,)``, rows in blocks of ``H`` (one per direction and
    gate, direction-major). ``weight`` and ``bias`` are what :class:`models.recurrent.RecurrentLayer` multiplies
    by: ``(R*M, M*f)`` block-diagonal and ``(R*M,)``, output columns ordered (block, microphone, unit).

    Shapes: ``weight`` ``(R*M, M*f)``; as a projection, ``(..., M*f) -> (..., R*M)``.

    >>> proj = SharedMicrophoneLinear(mics=3, in_per_mic=2, rows=4, block=2)
    >>> proj.weight.shape, proj.out_features
    (torch.Size([12, 6]), 12)
    """

    def __init__(self, mics: int, in_per_mic: int, rows: int, block: int, fan_out_per_input: bool = True):
        super().__init__()
        self.mics, self.block = mics, block
        self.in_features, self.out_features = mics * in_per_mic, rows * mics
        self.shared_weight = nn.Parameter(torch.empty(rows, in_per_mic))
        self.shared_bias = nn.Parameter(torch.zeros(rows))  # pytorch-kaldi's biases start at 0
        # xavier_normal_ per block as pytorch-kaldi: of the Conv1d weight (H, 1, f) when it fuses (fan_out H f),
        # of nn.Linear's (H, f) when it does not
        fan_out = block * in_per_mic if fan_out_per_input else block
        with torch.no_grad():
            self.shared_weight.normal_(0.0, math.sqrt(2.0 / (in_per_mic + fan_out)))

    @property
    def weight(self) -> torch.Tensor:
        rows, f = self.shared_weight.shape
        blocks = self.shared_weight.view(rows // self.block, self.block, f)  # (R/H, H, f)
        eye = torch.eye(self.mics, dtype=blocks.dtype, device=blocks.device)
        # (R/H, M, H, M, f): block r of microphone m reads only microphone m's f inputs
        return torch.einsum("ahi,mn->amhni", blocks, eye).reshape(self.out_features, self.in_features)

    @property
    def bias(self) -> torch.Tensor:
        rows = self.shared_bias.numel()
        return self.shared_bias.view(rows // self.block, 1, self.block).expand(-1, self.mics, -1).reshape(-1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)

    def extra_repr(self) -> str:
        return f"mics={self.mics}, in_per_mic={self.shared_weight.size(1)}, rows={self.shared_weight.size(0)}"


class FusionLiGRUCell(LiGRUCell):
    """A Li-GRU direction whose gate inputs are the fusion of ``mics`` microphones (module docstring).

    Args:
        hidden_size: ``H``, each microphone's and the fused width (pytorch-kaldi's ``fusion_layer_size / M``).
        mics: ``M``, the microphones the layer's input holds, concatenated in equal widths.
        fusion_act: ``linear`` (none), ``prelu`` (a learned slope per gate, from 0.25), ``relu``,
            ``leaky_relu`` (slope 0.01), ``tanh``.
        fusion_reduce: ``sum`` or ``mean`` over the microphones.

    ``forward`` takes the layer's per-microphone projection ``(B, T, 2*M*H)`` (columns: gate, microphone,
    unit) and returns ``(h, None)``, ``h`` ``(B, T, H)``. ``norm`` (set by :class:`FusionLayer`) normalises the
    fused ``(B, T, 2H)``. Inner dropout (``inner_dropout``) is pytorch-kaldi's ``liGRU_layer``'s: torch's
    ``Dropout`` on a mask of ones, so ``m / (1 - p)`` in training and 1 in evaluation.

    >>> import models
    >>> layer = models.build("fusionrnn", 6, 4, mics=3, fusion_act="prelu", norm="batch", bidirectional=True)
    >>> layer(torch.randn(2, 5, 6), [5, 3]).shape
    torch.Size([2, 5, 8])
    """

    variants = ({"fusion_act": "prelu"}, {"fusion_act": "tanh", "fusion_reduce": "mean"}, {"fusion_act": "relu"},
                {"fusion_act": "leaky_relu"})
    # the microphones are the input of a stack, so only its first layer fuses them (pytorch-kaldi's fusionRNN_jit)
    options_first_layer_only = True

    @classmethod
    def smallest_input(cls, options: dict) -> int:
        return options.get("mics", 1)  # one value per microphone

    def __init__(self, hidden_size: int, mics: int = 1, fusion_act: str = "linear", fusion_reduce: str = "sum"):
        super().__init__(hidden_size)
        if isinstance(mics, bool) or not isinstance(mics, int) or mics < 1:
            raise ValueError(f"mics must be a positive number of microphones, got {mics!r}")
        if fusion_act not in FUSION_ACTS:
            raise ValueError(f"fusion_act must be one of {', '.join(FUSION_ACTS)}, got {fusion_act!r}")
        if fusion_reduce not in FUSION_REDUCES:
            raise ValueError(f"fusion_reduce must be one of {', '.join(FUSION_REDUCES)}, got {fusion_reduce!r}")
        self.mics, self.fusion_act, self.fusion_reduce = mics, fusion_act, fusion_reduce
        self.fuses = mics > 1 or fusion_act != "linear"  # pytorch-kaldi's do_fusion
        # nn.PReLU() per FusionLinearConv: one slope for the update gate's fusion, one for the candidate's
        self.slope = nn.Parameter(torch.full((2, 1, 1), PRELU_INIT)) if fusion_act == "prelu" else None
        self.norm: Optional[nn.Module] = None
        # the update gate's input is negated: our Li-GRU's z is pytorch-kaldi's 1 - z' (sigma(-a) = 1 - sigma(a))
        self.register_buffer("gate_sign", torch.cat([-torch.ones(hidden_size), torch.ones(hidden_size)]),
                             persistent=False)

    def _activation(self, a: torch.Tensor) -> torch.Tensor:
        """``act`` of ``a`` ``(T, B, 2, M, H)``."""
        if self.fusion_act == "prelu":
            return torch.where(a >= 0, a, self.slope.to(a.dtype) * a)
        if self.fusion_act == "leaky_relu":
            return F.leaky_relu(a, FUSION_LEAKY_SLOPE)
        return {"linear": lambda v: v, "relu": torch.relu, "tanh": torch.tanh}[self.fusion_act](a)

    def fuse(self, proj: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """The recursion's input ``[-BN_z f^z, BN_h f^h]`` ``(B, T, 2H)`` from the per-microphone projection
        ``(B, T, 2*M*H)``; computed time-major, as the layer hands it (a view of ``(T, B, ...)`` memory)."""
        B, T, _ = proj.shape
        per_mic = proj.transpose(0, 1).unflatten(-1, (2, self.mics, self.hidden_size))  # (T, B, 2, M, H)
        acted = self._activation(per_mic)
        fused = (acted.mean(-2) if self.fusion_reduce == "mean" else acted.sum(-2)).flatten(-2)  # (T, B, 2H)
        real = torch.arange(T, device=proj.device)[:, None] < lengths[None, :]  # (T, B)
        padded = bool((lengths < T).any())
        if self.norm is not None:
            fused = self.norm(fused, real if padded else None)  # statistics over real frames only
        if padded:  # padding never reaches the recursion (act(0) is 0, a layer norm's shift is not)
            fused = fused.masked_fill(~real[..., None], 0.0)
        return (fused * self.gate_sign.to(fused.dtype)).transpose(0, 1)  # (B, T, 2H)

    def forward(self, proj: torch.Tensor, lengths: torch.Tensor):
        return super().forward(self.fuse(proj, lengths), lengths)

    def stream(self, proj: torch.Tensor, state):
        return super().stream(self.fuse(proj, torch.full((proj.size(0),), proj.size(1), device=proj.device)), state)

    def _inner_mask(self, proj) -> tuple:
        return tuple(m / (1.0 - self.inner_dropout) for m in super()._inner_mask(proj))

    def extra_repr(self) -> str:
        return f"hidden_size={self.hidden_size}, mics={self.mics}, fusion_act={self.fusion_act}, " \
               f"fusion_reduce={self.fusion_reduce}"


class FusionLayer(RecurrentLayer):
    """A :class:`models.recurrent.RecurrentLayer` of :class:`FusionLiGRUCell`: its projection is
    :class:`SharedMicrophoneLinear` (always with a bias: the fusion activation sits between it and the norm),
    and its ``norm`` is in each cell, after the fusion (``cells[d].norm``; ``layer.norm`` is ``None``).

    Shapes: ``x`` ``(B, T, M*f)``, ``lengths`` ``(B,)`` -> ``(B, T, H)`` or ``(B, T, 2H)``.
    Raises ``ValueError`` when the input width is not ``M`` equal parts.

    >>> import models
    >>> layer = models.build("fusionrnn", 4, 3, mics=2, fusion_act="relu")
    >>> layer.proj.shared_weight.shape, layer(torch.randn(1, 2, 4), [2]).shape
    (torch.Size([6, 2]), torch.Size([1, 2, 3]))
    """

    def __init__(self, cell_factory, input_size: int, hidden_size: int, bidirectional: bool = False,
                 dropout: float = 0.0, norm: Optional[str] = None):
        super().__init__(cell_factory, input_size, hidden_size, bidirectional, dropout, None)
        cell = self.cells[0]
        if input_size % cell.mics:
            raise ValueError(f"fusionrnn with mics={cell.mics}: an input of {input_size} values per frame is not "
                             f"{cell.mics} microphones of equal width")
        self.proj = SharedMicrophoneLinear(cell.mics, input_size // cell.mics, self.num_directions * 2 * hidden_size,
                                           hidden_size, fan_out_per_input=cell.fuses)
        for c in self.cells:
            c.norm = make_norm(norm, 2 * hidden_size, hidden_size)
        self.fused_norm = norm


FusionLiGRUCell.layer_class = FusionLayer  # models.build builds a fusionrnn layer with it

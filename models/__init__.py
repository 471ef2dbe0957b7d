"""Recurrent units and networks of bru-kaldi.

One layout everywhere: batch-first. A layer takes ``x`` of shape ``(B, T, F)`` and ``lengths`` ``(B,)``
(each in ``[1, T]``) and returns ``(B, T, H)``, or ``(B, T, 2H)`` when bidirectional, with zeros on
padded frames. Kaldi's per-utterance matrices are ``(T, F)``; ``data_io`` pads them into batches.

Units (``UNITS``), each documented in its module with the paper and equations it implements:

=============  ==========================================================================  ===============
name           unit                                                                        module
=============  ==========================================================================  ===============
``bru``        BRU, Li-BRU paper eq. 5 (sigmoid) / eq. 6 (softplus, log-probabilities)      ``models.bru``
``libru``      Li-BRU, Li-BRU paper eq. 7a-c, probability and log-space forms             ``models.bru``
``ubru``       unit-wise BRU of the forward-backward paper, eq. 8-10, 15-18, 21            ``models.ubru``
``ubru_tpami`` TPAMI unit-wise BRU with forget gate (eq. 27-29, 48-51) and input gate       ``models.tpami``
``lbru``       TPAMI layer-wise BRU (eq. 32-36, 59-64, 77-78) with input gate (eq. 72-75)  ``models.tpami``
``ligru``      Li-GRU, Li-BRU paper eq. 8                                                  ``models.gated``
``gru``        GRU in PyTorch's convention                                                 ``models.gated``
``lstm``       LSTM in PyTorch's convention                                                ``models.gated``
``mgu``        minimal gated unit                                                          ``models.gated``
``rnn``        Elman RNN (tanh or relu)                                                    ``models.gated``
``mlp``        frame-wise feed-forward layer                                               ``models.gated``
``cudnn_gru``  ``torch.nn.GRU`` (cuDNN / oneDNN), for speed comparisons                    ``models.vendor``
``cudnn_lstm`` ``torch.nn.LSTM`` (cuDNN / oneDNN), for speed comparisons                   ``models.vendor``
``sru``        SRU (Lei et al. 2018), as the ``sru`` package 2.1 that pytorch-kaldi wraps  ``models.sru``
``qlstm``      quaternion LSTM (Parcollet et al. 2019), Hamilton-product weights           ``models.quaternion``
``fusionrnn``  FusionRNN Li-GRU, microphones fused with shared weights (Parcollet 2020)  ``models.fusion``
=============  ==========================================================================  ===============

The modules, bottom up: ``recurrent`` (the :class:`Cell` base classes, the layer, the stack: one
time loop, projection, norm, dropout, bidirection and padding for every unit), ``norm``, the unit
families (``bru``, ``ubru``, ``tpami``, ``gated``, ``vendor``), ``fast/`` (hand-written backward
passes and the C++ kernels for the units that have them) and ``acoustic`` (stacks plus the senone
and monophone outputs).

Adding a unit
-------------
A unit without a fast path touches two files:

1. **Its cell**, in its family's module (``models/gated.py`` for another baseline) or in a new
   ``models/<family>.py``: a subclass of :class:`models.recurrent.Cell`, or of
   :class:`models.recurrent.RecurrentMatrixCell` when it has a recurrent matrix ``U`` (``(G*H, H)``,
   orthogonal per gate). It sets ``num_gates`` (the layer projects every frame to ``G*H`` at once),
   and defines ``initial_state(proj)`` and ``step(proj_t, state) -> (emitted, new_state)``, one time
   step with the paper's equation numbers in comments; ``finish`` too if it has a backward
   recursion, and ``probabilities`` if what ``posteriors()`` returns follows from its output (as
   ``h = exp(log h)`` for Li-BRU: formed only when asked). Its unit-specific options are the keyword arguments of its ``__init__`` (validated
   there, with a ``ValueError`` naming the allowed values), and ``variants`` lists the option
   settings besides the defaults that the tests should sweep. Projection, norm, dropout, bidirection
   and padding are the layer's: the cell never sees them.
2. **This file**: one line in ``_CELLS`` below, the name users write in ``[architectureN] unit`` (lower
   case) -> the cell class.

Nothing else registers it. Configs accept the name (checked when ``bru_kaldi.network`` builds the
model, before any data is read), ``build`` and ``build_stack`` build it, and these tests pick it up
from :data:`UNITS` and :func:`variants`, never from a list of their own: ``tests/test_units.py``
(shapes, padded frames zero and without influence, step-by-step equals whole sequence,
bidirectional width and reversal, float64 gradcheck for inputs and every parameter, stability over
long sequences, eval-mode determinism) and ``tests/test_fast_recurrences.py`` (fast path or fallback
equals the reference loop). ``tests/test_unit_equations.py`` fails for a unit that has no independent
reference: give it a float64 NumPy transcription of the paper's equations there (written from the
paper, not from the cell). A fast path is optional and lives in ``models/fast/`` (its docstring).

Frame-wise convolutional stacks (``CONV_UNITS``: ``cnn``, ``sincnet``, pytorch-kaldi's ``CNN`` and ``SincNet``)
are not cells: each frame's input vector is one 1-D signal, convolved, pooled and flattened. They live in
``models/conv.py`` and are built whole by :func:`build_conv_stack` (filters per layer, kernel and pooling
widths per layer), not by ``build``; ``tests/test_conv_units.py`` checks them against a NumPy reference.

>>> import torch, models
>>> layer = models.build("libru", 40, 16, bidirectional=True, dropout=0.2, norm="batch")
>>> layer(torch.randn(3, 7, 40), torch.tensor([7, 5, 2])).shape
torch.Size([3, 7, 32])
"""

from __future__ import annotations

import difflib
import functools
import inspect
from typing import Optional, Sequence, Union

import torch

from models.bru import BRUCell, LiBRUCell
from models.conv import CONV_UNITS, ConvStack, build_conv_stack
from models.fusion import FusionLiGRUCell
from models.gated import GRUCell, LiGRUCell, LSTMCell, MGUCell, MLPCell, RNNCell
from models.norm import INPUT_NORMS, NORMS
from models.quaternion import QLSTMCell
from models.recurrent import Cell, RecurrentLayer, RecurrentStack, per_layer
from models.sru import SRUCell
from models.tpami import LBRUCell, UBRUTpamiCell
from models.ubru import UBRUCell
from models.vendor import VendorRNN


class UBRULayer(RecurrentLayer):
    """A ``ubru`` layer; exposes the HMM parameters of its (forward-direction) cell as probabilities.

    ``rho0``, ``tau11``, ``tau01`` are ``(H,)`` tensors; with ``bidirectional=True`` the reverse
    direction's own parameters are at ``layer.cells[1]``. Unidirectional with ``norm=None``,
    ``layer.proj`` is the ``torch.nn.Linear`` computing ``a_t = W x_t + b``.
    """

    @property
    def rho0(self) -> torch.Tensor:
        return self.cells[0].rho0

    @property
    def tau11(self) -> torch.Tensor:
        return self.cells[0].tau11

    @property
    def tau01(self) -> torch.Tensor:
        return self.cells[0].tau01


# The registry: the name a config writes -> the cell class. One line per unit (see "Adding a unit").
_CELLS: dict[str, type[Cell]] = {
    "bru": BRUCell,
    "libru": LiBRUCell,
    "ubru": UBRUCell,
    "ubru_tpami": UBRUTpamiCell,
    "lbru": LBRUCell,
    "ligru": LiGRUCell,
    "gru": GRUCell,
    "lstm": LSTMCell,
    "mgu": MGUCell,
    "rnn": RNNCell,
    "mlp": MLPCell,
    "sru": SRUCell,
    "qlstm": QLSTMCell,
    "fusionrnn": FusionLiGRUCell,
}
_VENDOR = {"cudnn_gru": "gru", "cudnn_lstm": "lstm"}
UNITS: tuple[str, ...] = tuple(_CELLS) + tuple(_VENDOR)
# Units whose layers offer `posteriors()` (the probabilities of the Bayesian units).
BAYESIAN_UNITS: tuple[str, ...] = tuple(name for name, cell in _CELLS.items() if cell.has_posteriors)


def variants(unit: Optional[str] = None) -> list[tuple[str, dict]]:
    """``(unit, options)`` for every unit (or one): its defaults, then each setting of its cell's
    ``variants``. What the tests sweep over.

    >>> variants("ubru")
    [('ubru', {}), ('ubru', {'backward': 'kalman'}), ('ubru', {'backward': 'hmm'})]
    """
    if unit is not None and unit not in UNITS:
        raise _unknown("unit", str(unit), UNITS)
    found = []
    for name in UNITS if unit is None else (unit,):
        found.append((name, {}))
        found.extend((name, dict(options)) for options in (_CELLS[name].variants if name in _CELLS else ()))
    return found


def _unknown(kind: str, value: str, accepted: Sequence[str]) -> ValueError:
    close = difflib.get_close_matches(value, accepted, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return ValueError(f"unknown {kind} {value!r}{hint}; expected one of {', '.join(accepted)}")


def cell_options(unit: str) -> tuple[str, ...]:
    """The unit-specific options ``build`` accepts for ``unit`` (e.g. ``backward`` for ``ubru``)."""
    if unit not in _CELLS:
        return ()
    params = inspect.signature(_CELLS[unit].__init__).parameters
    return tuple(name for name in params if name not in ("self", "hidden_size"))


def build(
    unit: str,
    input_size: int,
    hidden_size: int,
    *,
    bidirectional: bool = False,
    dropout: float = 0.0,
    norm: Optional[str] = None,
    **options,
) -> torch.nn.Module:
    """Build one layer of ``unit``.

    Args:
        unit: a name from ``UNITS`` (lower case).
        input_size, hidden_size: ``F`` and ``H``.
        bidirectional: a second direction with its own weights (output ``2H``).
        dropout: inverted dropout on the layer input, one mask per sequence shared over time.
        norm: ``None``, ``"batch"`` or ``"layer"`` on the feed-forward projections.
        **options: unit-specific, see ``cell_options(unit)``; e.g. ``backward`` (``ubru``: ``None``,
            ``"kalman"``, ``"hmm"``; ``ubru_tpami``: ``None``, ``"unit"``; ``lbru``: ``None``, ``"layer"``),
            ``form`` (``bru``/``libru``: ``"log"``, ``"prob"``), ``activation`` (``rnn``/``mlp``).

    Returns:
        A module with ``forward(x, lengths)``, ``input_size`` and ``output_size``.
    """
    if not isinstance(unit, str) or unit not in UNITS:
        raise _unknown("unit", str(unit), UNITS)
    if norm not in NORMS:
        raise ValueError(f"norm must be one of {NORMS}, got {norm!r}")
    if unit in _VENDOR:
        if options:
            raise ValueError(f"{unit} takes no unit-specific options, got {sorted(options)}")
        return VendorRNN(_VENDOR[unit], input_size, hidden_size, bidirectional, dropout, norm)
    accepted = cell_options(unit)
    for name in options:
        if name not in accepted:
            raise _unknown(f"option for {unit}", name, accepted or ("(none)",))
    if unit == "mlp" and bidirectional:
        raise ValueError("mlp is frame-wise and has no direction: bidirectional must be False")
    cell_factory = functools.partial(_CELLS[unit], hidden_size, **options)
    # a cell whose projection is not a plain matrix (sru, qlstm) names its layer class
    layer_class = UBRULayer if unit == "ubru" else getattr(_CELLS[unit], "layer_class", RecurrentLayer)
    return layer_class(cell_factory, input_size, hidden_size, bidirectional, dropout, norm)


def build_stack(
    units: Union[str, Sequence[str]],
    input_size: int,
    sizes: Sequence[int],
    *,
    dropout: Union[float, Sequence[float]] = 0.0,
    norm: Union[Optional[str], Sequence[Optional[str]]] = None,
    bidirectional: Union[bool, Sequence[bool]] = False,
    options: Union[dict, Sequence[dict], None] = None,
    input_norm: Optional[str] = None,
) -> RecurrentStack:
    """Build a stack of layers; every argument is one value for all layers or a list with one per layer,
    except ``input_norm`` (``None``, ``"batch"``, ``"layer"``, ``"layer+batch"``), the norm of the stack's
    input features before its first layer (:class:`models.norm.InputNorm`).

    Shapes: ``(B, T, input_size)`` -> ``(B, T, output_size)`` (``sizes[-1]``, doubled if the last layer
    is bidirectional).

    >>> import models
    >>> stack = models.build_stack("libru", 13, [8, 8], bidirectional=True, dropout=[0.2, 0.0])
    >>> stack.output_size
    16
    """
    count = len(sizes)
    if count == 0:
        raise ValueError("sizes must name at least one layer")
    if input_norm not in INPUT_NORMS:
        raise ValueError(f"input_norm must be one of {INPUT_NORMS}, got {input_norm!r}")
    units = per_layer("units", units, count)
    dropouts = per_layer("dropout", dropout, count)
    norms = per_layer("norm", norm, count)
    directions = per_layer("bidirectional", bidirectional, count)
    extras = per_layer("options", options or {}, count)
    layers = []
    for unit, size, drop, nrm, bidir, extra in zip(units, sizes, dropouts, norms, directions, extras):
        layer = build(unit, input_size, size, bidirectional=bidir, dropout=drop, norm=nrm, **extra)
        layers.append(layer)
        input_size = layer.output_size
    return RecurrentStack(layers, input_norm)


__all__ = ["UNITS", "BAYESIAN_UNITS", "CONV_UNITS", "build", "build_stack", "build_conv_stack", "cell_options", "per_layer",
           "variants", "ConvStack", "RecurrentLayer", "RecurrentStack", "UBRULayer"]

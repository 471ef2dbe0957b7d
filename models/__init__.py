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
1. **Its cell**, in its family's module (``models/gated.py`` for another baseline) or in a new
   ``models/<family>.py``: a subclass of :class:`models.recurrent.Cell`, or of
   :class:`models.recurrent.RecurrentMatrixCell` when it has a recurrent matrix ``U`` (``(G*H, H)``,
   orthogonal per gate). It sets ``num_gates`` (the layer projects every frame to ``G*H`` at once),
   and defines ``initial_state(proj)`` and ``step(proj_t, state) -> (emitted, new_state)``, one time
   step with the paper's equation numbers in comments; ``finish`` too if it has a backward
   recursion, and ``probabilities`` if what ``posteriors()`` returns follows from its output (as
   ``h = exp(log h)`` for Li-BRU: formed only when asked). Projection, norm, dropout, bidirection
   and padding are the layer's: the cell never sees them.
2. **Its options**: the keyword arguments of its ``__init__`` after ``hidden_size``, each with a type
   annotation (what a config's text is read as: ``bool``, ``int``, ``float``, ``str``, or ``Optional[str] =
   None`` where ``None`` is a setting) and a default, validated there with a ``ValueError`` naming the
   allowed values. That signature is the one declaration (:func:`unit_options`): ``build`` checks against
   it, and a config's ``[architectureN]`` accepts each option by that name, typed, one value for every layer
   or one per layer, with nothing else to edit (``bru_kaldi.network`` reads it; ``bru_kaldi.config`` keeps
   what it does not know as the unit's).
3. **Class attributes**, where they apply: ``variants``, the option settings besides the defaults that
   the tests sweep; ``has_posteriors`` for a Bayesian unit; an ``inner_dropout`` attribute (the
   :class:`models.gated.InnerDropout` mixin) if it takes pytorch-kaldi's dropout place (``dropout_at =
   inside``, :func:`has_inner_dropout`); ``options_first_layer_only`` if a stack's first layer alone takes
   its options (:func:`first_layer_options`), and ``smallest_input`` if a layer cannot read an input of
   width 1 (``fusionrnn``'s microphones); ``layer_class`` if its layer is not the plain
   :class:`models.recurrent.RecurrentLayer` (another projection: ``sru``, ``qlstm``, ``fusionrnn``).
4. **Its name**: one line in ``_CELLS`` below, the name users write in ``[architectureN] unit`` (lower
   case) -> the cell class. A unit defined outside this package is registered with :func:`register_unit`
   instead (``tests/test_unit_options.py`` trains such a unit from a config).
5. **Its reference**: ``tests/test_unit_equations.py`` fails for a unit that has no independent reference:
   give it a float64 NumPy transcription of the paper's equations there (written from the paper, not from
   the cell). The other unit tests pick the unit up from :data:`UNITS` and :func:`variants`, never from a
   list of their own: ``tests/test_units.py`` (shapes, padded frames zero and without influence,
   step-by-step equals whole sequence, bidirectional width and reversal, float64 gradcheck for inputs and
   every parameter, stability over long sequences, eval-mode determinism) and
   ``tests/test_fast_recurrences.py`` (fast path or fallback equals the reference loop).
6. **Its documentation**: a row in README.md's unit table ("Recurrent units") and in the table above, and
   each option in ``cfg/README.md``'s table of unit options with the values it takes;
   ``tests/test_unit_options.py`` fails until both list it as the code declares it.
7. Optionally a fast path, in ``models/fast/`` (its docstring), and a config in ``cfg/``.

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

from models import conv
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


UBRUCell.layer_class = UBRULayer  # models.build builds a ubru layer with it


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


def register_unit(name: str, cell: type[Cell]) -> None:
    """Make ``cell`` (a :class:`Cell` subclass) the unit ``name`` (lower case, not taken), as a line of
    ``_CELLS`` does for the units of this package: for a unit defined elsewhere (another project, a test).
    From then on ``build`` builds it and configs accept it with its options (:func:`unit_options`)."""
    global UNITS, BAYESIAN_UNITS
    if not (isinstance(name, str) and name.isidentifier() and name == name.lower()):
        raise ValueError(f"a unit's name is a lower-case identifier, got {name!r}")
    if name in UNITS or name in CONV_UNITS:
        raise ValueError(f"unit {name!r} exists already")
    if not (isinstance(cell, type) and issubclass(cell, Cell)):
        raise TypeError(f"unit {name!r}: expected a subclass of models.recurrent.Cell, got {cell!r}")
    _CELLS[name] = cell
    UNITS = tuple(_CELLS) + tuple(_VENDOR)
    BAYESIAN_UNITS = tuple(n for n, c in _CELLS.items() if c.has_posteriors)


def unit_options(unit: str) -> dict[str, inspect.Parameter]:
    """The options ``unit`` takes, as its code declares them: option name -> ``inspect.Parameter`` (its
    ``default``, ``Parameter.empty`` where it is required, and its ``annotation``, the type a config's text
    is read as). A cell's are the keyword arguments of its ``__init__`` after ``hidden_size``; ``cnn``'s
    and ``sincnet``'s those of :func:`models.conv.conv_options`; the vendor units take none. This is the one
    declaration of each option: ``build``, the configs (``bru_kaldi.network``) and the docs' tables read it.

    >>> {name: p.default for name, p in unit_options("ubru").items()}
    {'backward': None, 'rho0': 0.5, 'tau11': 0.9, 'tau01': 0.1}
    """
    if unit in CONV_UNITS:
        return conv.conv_options(unit)
    if unit in _VENDOR:
        return {}
    if unit not in _CELLS:
        raise _unknown("unit", str(unit), UNITS + CONV_UNITS)
    params = inspect.signature(_CELLS[unit].__init__, eval_str=True).parameters
    return {name: p for name, p in params.items() if name not in ("self", "hidden_size")
            and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}


def first_layer_options(unit: str) -> tuple[str, ...]:
    """The options of ``unit`` that only its first layer takes (the later layers keep the defaults): all of a
    cell's with ``options_first_layer_only`` (``fusionrnn``'s microphones), ``sincnet``'s sinc filters."""
    if unit in CONV_UNITS:
        return tuple(conv.first_layer_options(unit))
    return tuple(unit_options(unit)) if getattr(_CELLS.get(unit), "options_first_layer_only", False) else ()


def has_inner_dropout(unit: str) -> bool:
    """Whether ``unit`` has pytorch-kaldi's dropout place (a config's ``dropout_at = inside``): a cell with an
    ``inner_dropout`` attribute (:class:`models.gated.InnerDropout`, the mlp's output), the conv units'
    dropout after each activation."""
    return unit in CONV_UNITS or hasattr(_CELLS.get(unit), "inner_dropout")


def smallest_input(unit: str, options: Sequence[dict]) -> int:
    """An input width a stack of ``unit`` with these options (one dict per layer) reads: what the check of a
    config's architectures builds its throwaway layers with, before the data says the real width."""
    if unit in CONV_UNITS:
        return conv.smallest_input(options)
    cell = _CELLS.get(unit)
    return cell.smallest_input(options[0] if options else {}) if cell is not None else 1


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
        **options: unit-specific, the keyword arguments of its cell (:func:`unit_options`); e.g. ``backward``
            (``ubru``: ``None``, ``"kalman"``, ``"hmm"``), ``form`` (``bru``/``libru``: ``"log"``, ``"prob"``).

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
    accepted = tuple(unit_options(unit))
    for name in options:
        if name not in accepted:
            raise _unknown(f"option for {unit}", name, accepted or ("(none)",))
    if unit == "mlp" and bidirectional:
        raise ValueError("mlp is frame-wise and has no direction: bidirectional must be False")
    cell_factory = functools.partial(_CELLS[unit], hidden_size, **options)
    # a cell whose layer is not the plain one (ubru's properties; sru's, qlstm's, fusionrnn's projections) names it
    layer_class = getattr(_CELLS[unit], "layer_class", RecurrentLayer)
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


__all__ = ["UNITS", "BAYESIAN_UNITS", "CONV_UNITS", "build", "build_stack", "build_conv_stack", "first_layer_options",
           "has_inner_dropout", "per_layer", "register_unit", "smallest_input", "unit_options", "variants", "ConvStack",
           "RecurrentLayer", "RecurrentStack", "UBRULayer"]

"""The acoustic model a config describes: ``[architectureN]`` stacks of ``models`` units, in the
order of ``[model] stack``, under a senone (and optional monophone) output, with one parameter group
per architecture for its own optimiser.

This is where unit names and unit options are checked (:func:`check_architectures`): reading a config
needs neither torch nor ``models``, so ``run_exp.py`` calls the check right after parsing, before any
data is read.

>>> from bru_kaldi.config import parse_config_text
>>> cfg = parse_config_text('''
... [exp]
... out_folder = exp/demo
... [dataset1]
... data_name = train
... fea = fea_name=fbank
...     fea_lst=data/train/feats.scp
... [data_use]
... train_with = train
... valid_with = train
... [architecture1]
... arch_name = rnn
... unit = ubru
... sizes = 8
... backward = kalman
... [model]
... stack = rnn
... ''')
>>> model, groups = build_model(cfg, input_dim=13, num_pdfs=20, num_mono=None)
>>> model.stacks[0].layers[0].cells[0].backward, len(groups)
('kalman', 1)
"""

from __future__ import annotations

import dataclasses
import difflib
import inspect
import typing
from pathlib import Path
from typing import Optional

import torch

import models
from bru_kaldi.config import (Architecture, Config, ConfigError, left_to_the_unit, parse_scalar, raise_problems,
                              split_items)
from bru_kaldi.kaldi.alignments import label_kind
from bru_kaldi.schedules import scheduled_dropout
from models.acoustic import AcousticModel
from models.norm import MaskedBatchNorm


_LEFT = object()  # an option left at the unit's default (none, default)


def layer_options(arch: Architecture, layers: Optional[int] = None) -> list[dict]:
    """The unit options ``arch`` sets (``arch.unit_options``, text as the config wrote it), one dict of keyword
    arguments per layer (``layers``, by default one per size), each value read as the type its unit declares.

    The unit's code is the one declaration of its options (:func:`models.unit_options`: a cell's ``__init__``
    signature). Each option takes one value for every layer or one per layer; ``none`` or ``default`` leaves
    the unit's own default (that layer's key is left out); the options of ``models.first_layer_options`` take one
    value, for the first layer alone. An option the unit does not take is a :class:`ConfigError` naming the
    units that do, or the closest name when none does, unless it is left to the unit
    (:func:`bru_kaldi.config.left_to_the_unit`: an older resolved config reads back).

    >>> from bru_kaldi.config import Architecture
    >>> layer_options(Architecture(arch_name="a", unit="rnn", sizes=[4, 4], unit_options={"activation": "relu,default"}))
    [{'activation': 'relu'}, {}]
    """
    where = f"architecture {arch.arch_name}"
    declared = models.unit_options(arch.unit)
    first_only = models.first_layer_options(arch.unit)
    count = len(arch.sizes) if layers is None else layers
    found: list[dict] = [{} for _ in range(count)]
    for name, text in arch.unit_options.items():
        if name not in declared and left_to_the_unit("architecture", name, text):
            continue  # says nothing (an older resolved config lists every unit's options, left so)
        if name not in declared:
            raise _not_an_option(arch, name)
        kind = _scalar_kind(declared[name])
        items = split_items(text) or ["none"]
        values = [_LEFT if item.lower() in ("none", "default") else parse_scalar(item, kind, f"{where} option {name}")
                  for item in items]
        if name in first_only:
            if len(values) > 1:
                raise ConfigError(f"{where}: {name} takes one value, its first layer's (unit {arch.unit}: the later "
                                  f"layers keep the unit's default), got {text.strip()!r}")
            values += [_LEFT] * (count - 1)
        for options, value in zip(found, models.per_layer(name, values, count)):
            if value is not _LEFT:
                options[name] = value
    for name, parameter in declared.items():
        if parameter.default is parameter.empty and name not in found[0]:
            raise ConfigError(f"{where} (unit {arch.unit}): {name} is required (the unit has no default for it)")
    return found


def _scalar_kind(parameter: inspect.Parameter) -> type:
    """The type a config's values of this option are read as: its annotation's (``Optional[X]``, ``Union[X,
    Sequence[X]]`` and ``Sequence[X]`` read as ``X``), else its default's; ``str`` when neither says."""
    candidates = [parameter.annotation] if parameter.annotation is not parameter.empty else []
    while candidates:
        kind = candidates.pop(0)
        if kind in (bool, int, float, str):
            return kind
        candidates += [a for a in typing.get_args(kind) if a is not type(None)]
    default = parameter.default
    return type(default) if isinstance(default, (bool, int, float, str)) else str


def _not_an_option(arch: Architecture, name: str) -> ConfigError:
    """The error for ``[architectureN] name`` that ``arch``'s unit does not take: an option of other units
    (naming them), or of none (naming the closest option of any)."""
    units = models.UNITS + models.CONV_UNITS
    takes = sorted(u for u in units if name in models.unit_options(u))
    where = f"architecture {arch.arch_name}"
    if takes:
        return ConfigError(f"{where}: unit {arch.unit} takes no {name} option (units that do: {', '.join(takes)})")
    known = [f.name for f in dataclasses.fields(Architecture) if f.name != "unit_options"]
    close = difflib.get_close_matches(name, known + sorted({o for u in units for o in models.unit_options(u)}), n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    own = ", ".join(models.unit_options(arch.unit)) or "none"
    return ConfigError(f"{where}: unknown option {name!r}{hint}; an [architectureN] takes those of "
                       f"bru_kaldi.config.Architecture and its unit's ({arch.unit}: {own})")


def check_architectures(config: Config) -> None:
    """Check every ``[architectureN]`` with the models themselves, and give its per-layer options one value
    per layer (``models.per_layer``).

    The unit must exist and accept its options, dropout, norm and direction: a stack of one-unit layers
    is built and thrown away, so the units say what they accept (with the random state put back
    afterwards, so that calling it changes no initial weight). ``[model] stack`` may name an
    architecture once. Errors are :class:`ConfigError` naming the architecture.
    """
    problems = []
    for arch in config.architectures:
        where = f"{config.source} [architecture arch_name={arch.arch_name}]"
        n = len(arch.sizes)
        if not n:  # an output layer's optimiser only (config.validate allows it for senone_arch / mono_arch)
            continue
        try:
            arch.dropout = models.per_layer("dropout", arch.dropout, n)
            arch.norm = [None if v is None or str(v).lower() == "none" else v for v in models.per_layer("norm", arch.norm, n)]
            arch.bidirectional = models.per_layer("bidirectional", arch.bidirectional, n)
            with torch.random.fork_rng(devices=[]):  # the check must not move the seeded initial weights
                _build_stack(arch, models.smallest_input(arch.unit, layer_options(arch)), [1] * n)
        except ValueError as error:  # ConfigError from layer_options too
            problems.append(f"{where}: {error}")
    if len(set(config.model.stack)) != len(config.model.stack):
        problems.append(f"{config.source} [model] stack: an architecture appears twice: {config.model.stack}")
    raise_problems(problems, config.source)


def _build_conv_stack(arch: Architecture, input_size: int, sizes):
    """``arch``'s ``cnn`` / ``sincnet`` stack (:func:`models.build_conv_stack`): ``dropout_at = inside`` is
    pytorch-kaldi's place, each layer's output after its activation; ``input`` each layer's input."""
    where = f"architecture {arch.arch_name} (unit {arch.unit})"
    if any(arch.bidirectional):
        raise ConfigError(f"{where}: bidirectional = True: a frame-wise convolution has no direction")
    per_layer = layer_options(arch, len(sizes))
    declared, first_only = models.unit_options(arch.unit), models.first_layer_options(arch.unit)
    # build_conv_stack takes each option as one list over the layers, the first layer's alone as a value
    options = {name: [layer.get(name, declared[name].default) for layer in per_layer]
               for name in declared if name not in first_only and any(name in layer for layer in per_layer)}
    options.update({name: value for name, value in per_layer[0].items() if name in first_only})
    try:
        stack = models.build_conv_stack(
            arch.unit, input_size, sizes, dropout=arch.dropout, norm=arch.norm,
            dropout_at="output" if arch.dropout_at == "inside" else "input",
            input_norm=None if arch.input_norm == "none" else arch.input_norm, **options)
    except ValueError as error:
        raise ConfigError(f"{where} reading {input_size} values per frame: {error}") from None
    for module in stack.modules():
        if isinstance(module, MaskedBatchNorm):
            module.momentum = arch.norm_momentum
    return stack


def _build_stack(arch: Architecture, input_size: int, sizes):
    """``arch``'s layers: its unit and options, its dropout where ``dropout_at`` puts it, its input norm, its
    batch-norm momentum (the input norm's too)."""
    if arch.unit in models.CONV_UNITS:
        return _build_conv_stack(arch, input_size, sizes)
    inside = arch.dropout_at == "inside"
    if inside and not models.has_inner_dropout(arch.unit) and any(arch.dropout):
        takes = [unit for unit in models.UNITS + models.CONV_UNITS if models.has_inner_dropout(unit)]
        raise ConfigError(f"dropout_at = inside: unit {arch.unit} has no candidate state to drop "
                          f"(units that do: {', '.join(takes)})")
    stack = models.build_stack(arch.unit, input_size, sizes, dropout=0.0 if inside else arch.dropout, norm=arch.norm,
                               bidirectional=arch.bidirectional, options=layer_options(arch, len(sizes)),
                               input_norm=None if arch.input_norm == "none" else arch.input_norm)
    for layer, p in zip(stack.layers, arch.dropout):
        for cell in getattr(layer, "cells", ()):
            if inside:
                cell.inner_dropout = float(p)
    for module in stack.modules():
        if isinstance(module, MaskedBatchNorm):
            module.momentum = arch.norm_momentum
    return stack


def set_epoch_dropout(model: AcousticModel, config: Config, epoch: int) -> dict[str, list[float]]:
    """Give each stack of ``model`` whose architecture has a ``dropout_schedule`` the rates of ``epoch`` (from 0),
    where its ``dropout_at`` puts them; called at the start of every epoch (a resumed one too: the rates are a
    function of the epoch alone) and, with the last epoch, before forward, as pytorch-kaldi forwards with the
    last epoch's config (it matters where dropout is not inverted: ``inside`` a gated cell scales by ``1 - p``).
    Returns the rates set, per layer, by architecture.

    >>> from bru_kaldi.config import parse_config_text
    >>> cfg = parse_config_text("\\n".join([
    ...     "[exp]", "out_folder = exp/demo", "n_epochs_tr = 3", "[dataset1]", "data_name = train",
    ...     "fea = fea_name=fbank", "    fea_lst=data/train/feats.scp", "[data_use]", "train_with = train",
    ...     "valid_with = train", "[architecture1]", "arch_name = mlp", "unit = mlp", "sizes = 8,8",
    ...     "dropout_at = inside", "dropout_schedule = 0.1*1|0.2*2,0.3", "[model]", "stack = mlp"]))
    >>> model, _ = build_model(cfg, input_dim=5, num_pdfs=4, num_mono=None)
    >>> set_epoch_dropout(model, cfg, 2)
    {'mlp': [0.2, 0.3]}
    >>> [layer.cells[0].inner_dropout for layer in model.stacks[0].layers]
    [0.2, 0.3]
    """
    done = {}
    for name, stack in zip(config.model.stack, model.stacks):
        arch = config.architecture(name)
        rates = scheduled_dropout(arch, epoch, config.exp.n_epochs_tr)
        if rates is None:
            continue
        done[name] = rates
        for layer, rate in zip(stack.layers, rates):
            if arch.dropout_at == "inside" and hasattr(layer, "cells"):  # a conv layer's dropout is its own attribute
                for cell in getattr(layer, "cells", ()):
                    cell.inner_dropout = float(rate)
            else:
                layer.dropout = float(rate)
    return done


def trained_architectures(config: Config) -> list[Architecture]:
    """The architectures with an optimiser, in the order of :func:`build_model`'s groups: those of
    ``[model] stack``, then ``senone_arch`` and ``mono_arch`` where they are not in it."""
    names = list(config.model.stack)
    heads = [config.model.senone_arch] + ([config.model.mono_arch] if config.model.mono_lab != "none" else [])
    for name in heads:
        if name and name not in names:
            names.append(name)
    return [config.architecture(name) for name in names]


def build_model(config: Config, input_dim: int, num_pdfs: int, num_mono: Optional[int], mse_dim: Optional[int] = None,
                stream_dims: Optional[dict] = None):
    """The acoustic model of ``[model] stack`` and the parameter groups of each architecture.

    Returns ``(model, groups)``: ``groups[i]`` holds the parameters of the i-th architecture of
    :func:`trained_architectures`; the senone output layer trains with ``[model] senone_arch``'s
    optimiser, the monophone one with ``mono_arch``'s (each by default the last of the stack). With
    ``[model] mse_arch`` the model also returns that architecture's output (``"mse"``); ``mse_dim``, the
    width of ``mse_target`` where it is known (training), must be that output's. ``stream_dims``
    (``fea_name`` -> values per frame) places the streams an ``[architectureN] inputs`` names in the
    input, the ``[model] inputs`` concatenated (needed only when it names some of several streams).
    ``[model] senone_size`` / ``mono_size``, when set, must match ``num_pdfs`` / ``num_mono``.
    """
    check_architectures(config)
    check_output_sizes(config, num_pdfs, num_mono)
    sources = _sources(config, input_dim, stream_dims)
    factor, subsampling = config.model.frame_subsampling_factor, config.model.frame_subsampling
    spliced = factor if factor > 1 and subsampling == "splice" else 1  # frames side by side in the first input
    if spliced > 1 and sources is not None:
        raise ConfigError(f"{config.source} [model] frame_subsampling = splice: not with [architectureN] inputs "
                          "(their columns are those of one frame); use frame_subsampling = output")
    stacks = []
    for k, name in enumerate(config.model.stack):
        arch = config.architecture(name)
        if sources is None:
            size = stacks[-1].output_size if stacks else input_dim * spliced
        else:
            size = sum(i.stop - i.start if isinstance(i, slice) else stacks[i].output_size for i in sources[k])
        stacks.append(_build_stack(arch, size, arch.sizes))
    mse_stack = config.model.stack.index(config.model.mse_arch) if config.model.mse_arch else None
    if mse_stack is not None and mse_dim is not None and stacks[mse_stack].output_size != mse_dim:
        raise ConfigError(f"{config.source} [model] mse_arch = {config.model.mse_arch}: its output has "
                          f"{stacks[mse_stack].output_size} values per frame, the feature stream mse_target = "
                          f"{config.model.mse_target} it is compared with has {mse_dim}; expected equal sizes")
    features = config.model.stack.index(config.model.features_arch) if config.model.features_arch else None
    model = AcousticModel(stacks, num_pdfs if config.model.senone_output else 0, num_mono, mse_stack,
                          xent_head=config.model.objective == "lfmmi", sources=sources,
                          input_size=input_dim if sources is not None else None, feature_stack=features,
                          frame_subsampling_factor=factor, frame_subsampling=subsampling)
    names = [a.arch_name for a in trained_architectures(config)]
    groups = [list(stack.parameters()) for stack in model.stacks] + [[] for _ in names[len(stacks):]]
    last = config.model.stack[-1]
    heads = (("senone", config.model.senone_arch or last), ("xent", config.model.senone_arch or last),
             ("mono", config.model.mono_arch or last))
    for head, owner in heads:
        if getattr(model, head) is not None:
            groups[names.index(owner)] += list(getattr(model, head).parameters())
    return model, groups


def _sources(config: Config, input_dim: int, stream_dims: Optional[dict]) -> Optional[list]:
    """``AcousticModel``'s ``sources`` for the ``[architectureN] inputs`` of the stack (and of ``senone_arch`` out of
    it, what the output layers read); None when every one reads the default (a chain)."""
    model = config.model
    head = config.model.senone_arch if config.model.senone_arch not in model.stack else ""
    readers = list(model.stack) + ([head] if head else [])
    if not any(config.architecture(name).inputs for name in readers if name):
        return None
    streams = model.inputs or [s.fea_name for s in config.dataset(config.data_use.train_with).fea]
    if stream_dims is None and len(streams) == 1:
        stream_dims = {streams[0]: input_dim}
    columns = {}
    if stream_dims is not None:
        missing = [name for name in streams if name not in stream_dims]
        if missing or sum(stream_dims[name] for name in streams) != input_dim:
            raise ConfigError(f"{config.source} [model] inputs = {', '.join(streams)}: the streams' widths "
                              f"{stream_dims} do not make the input's {input_dim} values per frame")
        start = 0
        for name in streams:
            columns[name] = slice(start, start + stream_dims[name])
            start += stream_dims[name]
    sources = []
    for k, name in enumerate(readers):
        items = config.architecture(name).inputs
        if not items:  # the default: the stack before, the first every input stream, the outputs the last stack
            sources.append([k - 1] if k else [slice(0, input_dim)])
            continue
        if list(items) == list(streams):
            sources.append([slice(0, input_dim)])
            continue
        if any(item in streams for item in items) and not columns:
            raise ConfigError(f"{config.source} [architecture arch_name={name}] inputs = {', '.join(items)}: which "
                              f"columns of the input hold each stream is not known here (each stream's width is needed)")
        sources.append([columns[item] if item in streams else model.stack.index(item) for item in items])
    if not head:
        sources.append([len(model.stack) - 1])
    return sources


def check_output_sizes(config: Config, num_pdfs: int, num_mono: Optional[int]) -> None:
    """``[model] senone_size`` / ``mono_size`` (a number of classes the config wrote, pytorch-kaldi's ``dnn_lay =
    ...,1880``) against the classes of the labels, known once they are read: for pdfs ``num_pdfs``; for
    per-frame phones (ids from 1, so ``num_mono`` = phones + 1 classes) the number of phones, pytorch-kaldi's
    ``N_out_lab_mono`` (``hmm-info``'s), or ``num_mono``. Raises :class:`ConfigError` naming where the number
    was written (a translated config's own file, section and option: ``config.origins``) and both numbers.
    """
    kinds = {s.lab_name: s.lab_opts for d in config.datasets for s in d.lab}
    for option, label, classes in (("senone_size", config.model.senone_lab, num_pdfs),
                                   ("mono_size", config.model.mono_lab, num_mono)):
        size = getattr(config.model, option)
        if not size or classes is None:
            continue
        try:
            phones = label_kind(kinds.get(label, "ali-to-pdf")) == "phone"
        except ValueError:
            phones = False
        if size == classes or (phones and size == classes - 1):
            continue
        where = config.origins.get(option, f"{config.source} [model] {option}")
        what = (f"{classes - 1} phones (ids 1 to {classes - 1}; our output has {classes} classes): expected "
                f"{classes - 1} or {classes}") if phones else f"{classes} pdfs: expected {classes}"
        raise ConfigError(f"{where}: an output layer of {size} classes for the label stream {label}, whose alignments "
                          f"have {what} (N_out_{label} takes the number from the alignments)")


def has_unused_parameters(model: AcousticModel, device: torch.device) -> bool:
    """Whether some parameter gets no gradient (a unit option that leaves it out): DDP must then look
    for them at every step, which costs a traversal of the graph, so it is only asked to when needed."""
    model.eval()  # no dropout draws, no batch-norm statistics updated
    out = model(torch.zeros(1, 2, model.input_size, device=device), torch.tensor([2], device=device))
    sum(o.sum() for o in out.values()).backward()
    unused = any(p.grad is None for p in model.parameters() if p.requires_grad)
    model.zero_grad(set_to_none=True)
    model.train()
    return unused


def load_trained(config: Config, model_dir: Path, device: torch.device) -> AcousticModel:
    """The model of ``model_dir/final.pt``, built from ``config``'s architectures, in evaluation mode."""
    path = model_dir / "final.pt"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no trained model (run the training first, or give --model EXP_DIR)")
    saved = torch.load(path, map_location="cpu", weights_only=True)
    model, _ = build_model(config, saved["input_dim"], saved["num_pdfs"], saved["num_mono"] or None,
                           stream_dims=saved.get("stream_dims"))
    try:
        model.load_state_dict(saved["model"])
    except RuntimeError as error:
        raise ConfigError(f"{config.source}: the architectures do not match the model in {path}: {error}") from None
    set_epoch_dropout(model, config, config.exp.n_epochs_tr - 1)  # the rates it ended training with
    return model.to(device).eval()

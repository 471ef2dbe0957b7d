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

from pathlib import Path
from typing import Optional

import torch

import models
from bru_kaldi.config import Architecture, Config, ConfigError, raise_problems
from bru_kaldi.kaldi.alignments import label_kind
from bru_kaldi.schedules import scheduled_dropout
from models.acoustic import AcousticModel
from models.norm import MaskedBatchNorm


# fusionrnn's microphones are the architecture's input: only its first layer fuses them (the later layers keep
# the unit's defaults, no fusion), as pytorch-kaldi's fusionRNN_jit
FIRST_LAYER_OPTIONS = ("mics", "fusion_act", "fusion_reduce")
# sru's options (models.sru), passed as they are
SRU_OPTIONS = ("highway", "highway_bias", "skip", "rescale", "projection_size", "state_dropout")


def unit_options(arch: Architecture, layer: int = 0) -> dict:
    """The unit-specific keyword arguments for ``models.build`` that this architecture sets for its layer
    ``layer`` (from 0: ``activation`` may be one per layer).

    Options left at ``none`` (``default`` for ``activation``) keep the unit's own default; an option the unit
    does not take is an error naming the units that do.
    """
    accepted = models.cell_options(arch.unit)
    for name in CONV_OPTIONS:
        if getattr(arch, name) not in (None, []):
            raise ConfigError(f"architecture {arch.arch_name}: unit {arch.unit} takes no {name} option (units that do: "
                              f"{'sincnet' if name in CONV_OPTIONS[2:] else ', '.join(models.CONV_UNITS)})")
    options = {}
    if "backward" in accepted:
        options["backward"] = None if arch.backward == "none" else arch.backward
    elif arch.backward != "none":
        raise ConfigError(f"architecture {arch.arch_name}: unit {arch.unit} has no backward recursion, "
                          f"got backward = {arch.backward}")
    if "form" in accepted:
        options["form"] = arch.form
    activation = arch.activation[layer if len(arch.activation) > 1 else 0]
    if activation != "default":
        if "activation" not in accepted:
            raise ConfigError(f"architecture {arch.arch_name}: unit {arch.unit} takes no activation option")
        options["activation"] = activation
    for name in ("input_gate", "rho0", "tau11", "tau01") + FIRST_LAYER_OPTIONS + SRU_OPTIONS:
        value = getattr(arch, name)
        if name == "state_dropout":  # one per layer or one for all; empty: the unit's default
            value = models.per_layer(name, value, len(arch.sizes))[layer] if value else None
        if value is None:
            continue
        if name not in accepted:
            takes = sorted(u for u in models.UNITS if name in models.cell_options(u))
            raise ConfigError(f"architecture {arch.arch_name}: unit {arch.unit} takes no {name} option "
                              f"(units that do: {', '.join(takes)})")
        if layer == 0 or name not in FIRST_LAYER_OPTIONS:
            options[name] = value
    return options


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
            arch.activation = models.per_layer("activation", arch.activation, n)
            with torch.random.fork_rng(devices=[]):  # the check must not move the seeded initial weights
                _build_stack(arch, _conv_check_size(arch, n) if arch.unit in models.CONV_UNITS
                             else arch.mics or 1, [1] * n)  # fusionrnn: an input of `mics` microphones
        except ValueError as error:  # ConfigError from unit_options too
            problems.append(f"{where}: {error}")
    if len(set(config.model.stack)) != len(config.model.stack):
        problems.append(f"{config.source} [model] stack: an architecture appears twice: {config.model.stack}")
    raise_problems(problems, config.source)


# Units whose cells take pytorch-kaldi's dropout place (models.gated.InnerDropout, and the mlp's output).
INNER_DROPOUT_UNITS = ("lstm", "gru", "ligru", "rnn", "mlp", "qlstm", "fusionrnn")


# The options of the frame-wise convolutional units (models.conv), the last three sincnet's only.
CONV_OPTIONS = ("kernel_sizes", "pool_sizes", "sample_rate", "min_low_hz", "min_band_hz")


def _conv_check_size(arch: Architecture, n: int) -> int:
    """An input width every layer of ``arch`` (a conv unit, ``n`` layers) can read, for the check before any data
    is read: from 2 values at the last layer's output (what a layer norm needs), back through each layer."""
    kernels = models.per_layer("kernel_sizes", arch.kernel_sizes or [1], n)
    pools = models.per_layer("pool_sizes", arch.pool_sizes or [1], n)
    width = 2
    for kernel, pool in zip(reversed(kernels), reversed(pools)):
        width = width * max(pool, 1) + max(kernel, 1)  # one more than needed: an even sinc kernel grows by one
    return width


def _build_conv_stack(arch: Architecture, input_size: int, sizes):
    """``arch``'s ``cnn`` / ``sincnet`` stack (:func:`models.build_conv_stack`): ``dropout_at = inside`` is
    pytorch-kaldi's place, each layer's output after its activation; ``input`` each layer's input."""
    where = f"architecture {arch.arch_name} (unit {arch.unit})"
    if not arch.kernel_sizes:
        raise ConfigError(f"{where}: kernel_sizes is required (the convolution's width, per layer or one for all)")
    if any(arch.bidirectional):
        raise ConfigError(f"{where}: bidirectional = True: a frame-wise convolution has no direction")
    for name in ("backward", "input_gate", "rho0", "tau11", "tau01"):
        if getattr(arch, name) not in (None, "none"):
            raise ConfigError(f"{where} takes no {name} option")
    sinc = {name: getattr(arch, name) for name in CONV_OPTIONS[2:] if getattr(arch, name) is not None}
    if sinc and arch.unit != "sincnet":
        raise ConfigError(f"{where} takes no {', '.join(sinc)} option (units that do: sincnet)")
    try:
        stack = models.build_conv_stack(
            arch.unit, input_size, sizes, kernel_sizes=arch.kernel_sizes, pool_sizes=arch.pool_sizes or 1,
            dropout=arch.dropout, norm=arch.norm, activation=["relu" if a == "default" else a for a in arch.activation],
            dropout_at="output" if arch.dropout_at == "inside" else "input",
            input_norm=None if arch.input_norm == "none" else arch.input_norm, **sinc)
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
    if inside and arch.unit not in INNER_DROPOUT_UNITS and any(arch.dropout):
        raise ConfigError(f"dropout_at = inside: unit {arch.unit} has no candidate state to drop "
                          f"(units that do: {', '.join(INNER_DROPOUT_UNITS)})")
    stack = models.build_stack(arch.unit, input_size, sizes, dropout=0.0 if inside else arch.dropout, norm=arch.norm,
                               bidirectional=arch.bidirectional, options=[unit_options(arch, i) for i in range(len(sizes))],
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
    stacks = []
    for k, name in enumerate(config.model.stack):
        arch = config.architecture(name)
        if sources is None:
            size = stacks[-1].output_size if stacks else input_dim
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
                          input_size=input_dim if sources is not None else None, feature_stack=features)
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

"""pytorch-kaldi's ``[architectureN]`` sections (``arch_class`` and its ``proto/<class>.proto`` options) in
our vocabulary.

Each class maps to one of our units, with pytorch-kaldi's option prefix: ``LSTM`` (``lstm_``) -> ``lstm``,
``GRU`` (``gru_``) -> ``gru``, ``liGRU`` (``ligru_``) -> ``ligru``, ``RNN`` (``rnn_``) -> ``rnn``, ``MLP``
(``dnn_``) -> ``mlp``; our own units take their name as class and prefix (``liBRU``, ``libru_lay``...).
An MLP whose last layer is ``N_out_<label>`` (or a number of classes, ``1880``: checked against the labels
when the run reads them) with ``softmax`` is (or ends in) an output layer: our senone or monophone output,
trained by that architecture's optimiser. ``LSTM_cudnn`` and ``GRU_cudnn`` (``hidden_size``, ``num_layers``...)
map to our ``cudnn_lstm`` and ``cudnn_gru``, which run the same torch modules.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# arch_class -> (our unit, option prefix)
CLASSES = {"lstm": ("lstm", "lstm"), "gru": ("gru", "gru"), "ligru": ("ligru", "ligru"), "rnn": ("rnn", "rnn"),
           "mlp": ("mlp", "dnn"), "libru": ("libru", "libru"), "bru": ("bru", "bru"), "ubru": ("ubru", "ubru"),
           "lbru": ("lbru", "lbru"), "ubru_tpami": ("ubru_tpami", "ubru_tpami"), "mgu": ("mgu", "mgu")}
# pytorch-kaldi's wrappers of torch.nn.LSTM / GRU (proto/LSTM_cudnn.proto: hidden_size, num_layers, bias,
# batch_first, dropout, bidirectional) -> our units that run the same torch modules
VENDOR = {"lstm_cudnn": "cudnn_lstm", "gru_cudnn": "cudnn_gru"}
VENDOR_OPTIONS = ("hidden_size", "num_layers", "bias", "batch_first", "dropout", "bidirectional")
# pytorch-kaldi classes we have no equivalent for (its neural_networks.py), and what else they would need
RAW = "; it reads the raw waveform (a fea_lst of wav-copy archives), which our feature reader does not read either"
NO_EQUIVALENT = {"CNN": "", "SincNet": RAW, "SRU": "", "QRNN": "", "QLSTM": "", "PASE": RAW, "minimalGRU": "",
                 "RNN_cudnn": "", "logMelFb": RAW, "channel_averaging": "", "fusionRNN_jit": "", "liGRU_layer": "",
                 "FusionLinearConv": ""}
# the activation each recurrent unit has (pytorch-kaldi lets *_act choose; ours are fixed)
FIXED_ACT = {"lstm": "tanh", "gru": "tanh", "ligru": "relu"}
# pytorch-kaldi's act_fun (leaky_relu: its slope 0.2), and softplus; "softmax" only on an output layer
ACTS = ("tanh", "relu", "sigmoid", "softplus", "linear", "leaky_relu", "elu")
OPTIMIZER_OPTIONS = {
    "rmsprop": ("opt_momentum", "opt_alpha", "opt_eps", "opt_centered", "opt_weight_decay"),
    "sgd": ("opt_momentum", "opt_weight_decay", "opt_dampening", "opt_nesterov"),
    "adam": ("opt_betas", "opt_eps", "opt_weight_decay", "opt_amsgrad"),
}
COMMON = ("arch_name", "arch_proto", "arch_library", "arch_class", "arch_pretrain_file", "arch_freeze",
          "arch_seq_model", "arch_lr", "arch_halving_factor", "arch_improvement_threshold", "arch_opt")


@dataclass
class Translated:
    """One architecture in our vocabulary: ``options`` (our names -> text), and what its last layer is."""

    name: str
    options: dict
    seq_model: bool
    output_of: str = ""  # "N_out_<label>" or a number of classes ("1880") when the last layer is a softmax output
    output_where: str = ""  # where output_of is written: "<file> [architectureN] dnn_lay"
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def _bool(text: str) -> bool:
    return str(text).strip().lower() in ("true", "yes", "1", "on")


def _per_layer(text: str, count: int, what: str, problems: list) -> list[str]:
    values = [v.strip() for v in str(text).split(",") if v.strip()]
    if len(values) == 1:
        values = values * count
    if len(values) != count:
        problems.append(f"{what}: expected 1 or {count} values (one per layer), got {len(values)}")
        values = (values + values[-1:] * count)[:count] if values else ["0"] * count
    return values


def translate_architecture(options: dict, where: str) -> Translated:
    """Our options for one ``[architectureN]`` (lower-cased option names)."""
    problems, notes = [], []
    name = options.get("arch_name", "")
    klass = options.get("arch_class", "")
    out = {"arch_name": name}
    if klass.lower() in VENDOR:
        return _vendor(options, out, VENDOR[klass.lower()], where)
    unit, prefix = CLASSES.get(klass.lower(), (None, None))
    if unit is None:
        why = "no equivalent here" if klass in NO_EQUIVALENT else "not a class we know"
        problems.append(f"{where} arch_class = {klass}: {why} (supported: LSTM, GRU, liGRU, RNN, MLP, LSTM_cudnn, "
                        f"GRU_cudnn, liBRU, BRU, UBRU, LBRU, UBRU_tpami, MGU){NO_EQUIVALENT.get(klass, '')}")
        return Translated(name, out, True, problems=problems)
    out["unit"] = unit
    own = {k for k in options if k.startswith(prefix + "_")}
    lays = [v.strip() for v in options.get(f"{prefix}_lay", "").split(",") if v.strip()]
    if not lays:
        problems.append(f"{where} {prefix}_lay: required (one size per layer)")
        return Translated(name, out, True, problems=problems)
    n = len(lays)
    drops = _per_layer(options.get(f"{prefix}_drop", "0.0"), n, f"{where} {prefix}_drop", problems)
    if any("*" in d or "|" in d for d in drops):
        problems.append(f"{where} {prefix}_drop = {options[f'{prefix}_drop']}: per-epoch dropout rates (progressive "
                        "values) are not supported; give one rate per layer")
        drops = [d.split("|")[0].split("*")[0] for d in drops]
    bns = [_bool(v) for v in _per_layer(options.get(f"{prefix}_use_batchnorm", "False"), n, f"{where} {prefix}_use_batchnorm", problems)]
    lns = [_bool(v) for v in _per_layer(options.get(f"{prefix}_use_laynorm", "False"), n, f"{where} {prefix}_use_laynorm", problems)]
    acts = _per_layer(options.get(f"{prefix}_act", FIXED_ACT.get(unit, "relu")), n, f"{where} {prefix}_act", problems)
    output_of = ""
    if lays[-1].startswith("N_out_") or acts[-1] == "softmax":
        if unit != "mlp" or not (lays[-1].startswith("N_out_") or lays[-1].isdigit()) or acts[-1] != "softmax":
            problems.append(f"{where}: an output layer must be an MLP layer N_out_<label> (or its number of classes) "
                            f"with softmax (got {prefix}_lay ending {lays[-1]}, {prefix}_act ending {acts[-1]})")
        elif float(drops[-1]) or bns[-1] or lns[-1]:
            problems.append(f"{where}: the output layer {lays[-1]} takes no dropout or norm here (got "
                            f"dnn_drop {drops[-1]}, batchnorm {bns[-1]}, laynorm {lns[-1]})")
        output_of = lays[-1]
        lays, drops, bns, lns, acts = lays[:-1], drops[:-1], bns[:-1], lns[:-1], acts[:-1]
    for size in lays:
        if not size.isdigit():
            problems.append(f"{where} {prefix}_lay: {size!r} is not a layer size (N_out_<label> only as an MLP's last, softmax layer)")
    out["sizes"] = ",".join(lays)
    out["dropout"] = ",".join(drops) if lays else "0.0"
    for bn, ln in zip(bns, lns):
        if bn and ln:
            problems.append(f"{where} {prefix}_use_batchnorm and {prefix}_use_laynorm: both on one layer is not supported")
    out["norm"] = ",".join("batch" if bn else "layer" if ln else "none" for bn, ln in zip(bns, lns)) if lays else "none"
    if any(lns) and unit != "mlp":
        notes.append(f"{where} {prefix}_use_laynorm: our layer norm normalises each gate's projection W x, "
                     "pytorch-kaldi's the hidden state after each step")
    # the norm of the architecture's input: layer norm first when both are on, as pytorch-kaldi's forward does
    input_layer, input_batch = (_bool(options.get(f"{prefix}_use_{kind}_inp", "False")) for kind in ("laynorm", "batchnorm"))
    if (input_layer or input_batch) and not lays:
        problems.append(f"{where} {prefix}_use_laynorm_inp / {prefix}_use_batchnorm_inp = True: an architecture that is "
                        f"an output layer alone ({output_of}) takes no input norm here; put it on the architecture "
                        "that feeds it")
    elif input_layer or input_batch:
        out["input_norm"] = "layer+batch" if input_layer and input_batch else "layer" if input_layer else "batch"
    if lays:
        if unit in FIXED_ACT:
            if any(a != FIXED_ACT[unit] for a in acts):
                problems.append(f"{where} {prefix}_act = {options[f'{prefix}_act']}: our {unit} uses {FIXED_ACT[unit]} only")
        elif unit in ("rnn", "mlp"):
            wrong = [a for a in acts if a not in ACTS]
            if wrong:
                problems.append(f"{where} {prefix}_act = {options[f'{prefix}_act']}: {', '.join(dict.fromkeys(wrong))} is not an "
                                f"activation of a hidden layer (expected one of {', '.join(ACTS)}; softmax only on an MLP's "
                                f"last layer N_out_<label>)")
            else:
                out["activation"] = acts[0] if len(set(acts)) == 1 else ",".join(acts)
        elif f"{prefix}_act" in options:
            problems.append(f"{where} {prefix}_act: unit {unit} has no activation option")
    if f"{prefix}_bidir" in options:
        if unit == "mlp":
            problems.append(f"{where} {prefix}_bidir: an MLP has no direction")
        out["bidirectional"] = str(_bool(options[f"{prefix}_bidir"]))
    if f"{prefix}_orthinit" in options and not _bool(options[f"{prefix}_orthinit"]):
        problems.append(f"{where} {prefix}_orthinit = False: our recurrent matrices are always orthogonally initialised")
    known_own = {f"{prefix}_{o}" for o in ("lay", "drop", "use_batchnorm", "use_laynorm", "use_laynorm_inp",
                                           "use_batchnorm_inp", "act", "bidir", "orthinit")}
    # pytorch-kaldi's own meanings: batch-norm momentum 0.05, dropout on the candidate / the MLP output
    out["norm_momentum"] = "0.05"
    out["dropout_at"] = "inside"
    _common(options, out, where, problems, notes)
    opt = out.get("arch_opt", "rmsprop")
    for option in options:
        if option in COMMON or option in known_own or option in OPTIMIZER_OPTIONS.get(opt, ()):
            continue
        problems.append(f"{where} {option}: not an option of arch_class {klass} with arch_opt {opt} "
                        f"(proto/{klass}.proto, proto/{opt}.proto)")
    return Translated(name, out, _bool(options.get("arch_seq_model", "True" if unit != "mlp" else "False")),
                      output_of, f"{where} {prefix}_lay" if output_of else "", problems, notes)


def _vendor(options: dict, out: dict, unit: str, where: str) -> Translated:
    """``LSTM_cudnn`` / ``GRU_cudnn``: one ``torch.nn.LSTM`` / ``GRU`` of ``num_layers`` layers, our ``cudnn_lstm`` /
    ``cudnn_gru`` layers stacked. torch's ``dropout`` drops the output of every layer but the last, which is
    our dropout on the input of every layer but the first (``dropout_at = input``)."""
    problems, notes = [], []
    klass = options["arch_class"]
    for option in ("hidden_size", "num_layers"):
        if not options.get(option, "").strip().isdigit() or int(options[option]) < 1:
            problems.append(f"{where} {option} = {options.get(option, '')}: expected a positive integer (proto/{klass}.proto)")
    if problems:
        return Translated(out["arch_name"], out, True, problems=problems)
    n = int(options["num_layers"])
    drop = options.get("dropout", "0.0").strip()
    if "*" in drop or "|" in drop:
        problems.append(f"{where} dropout = {drop}: per-epoch dropout rates (progressive values) are not supported")
    out.update(unit=unit, sizes=",".join([options["hidden_size"]] * n), dropout=",".join(["0.0"] + [drop] * (n - 1)),
               norm="none", bidirectional=str(_bool(options.get("bidirectional", "False"))))
    if not _bool(options.get("bias", "True")):
        problems.append(f"{where} bias = False: our {unit} layers always have biases")
    if unit == "cudnn_lstm" and not _bool(options.get("batch_first", "True")):
        problems.append(f"{where} batch_first = False: in pytorch-kaldi's LSTM_cudnn it only turns off the orthogonal "
                        "initialisation of the recurrent matrices (the data is time-major either way); ours are always "
                        "orthogonal")
    _common(options, out, where, problems, notes)
    opt = out.get("arch_opt", "rmsprop")
    for option in options:
        if option not in COMMON + VENDOR_OPTIONS and option not in OPTIMIZER_OPTIONS.get(opt, ()):
            problems.append(f"{where} {option}: not an option of arch_class {klass} with arch_opt {opt} "
                            f"(proto/{klass}.proto, proto/{opt}.proto)")
    return Translated(out["arch_name"], out, _bool(options.get("arch_seq_model", "True")), problems=problems, notes=notes)


def _common(options: dict, out: dict, where: str, problems: list, notes: list) -> None:
    """The options every architecture has, and its optimiser's."""
    library = options.get("arch_library", "neural_networks")
    if library != "neural_networks":
        problems.append(f"{where} arch_library = {library}: only pytorch-kaldi's neural_networks classes map to our units")
    if options.get("arch_pretrain_file", "none").lower() != "none":
        problems.append(f"{where} arch_pretrain_file: loading pytorch-kaldi weights is not supported")
    if _bool(options.get("arch_freeze", "False")):
        problems.append(f"{where} arch_freeze = True: frozen architectures are not supported")
    lr = options.get("arch_lr", "0.08")
    if "|" in lr or "*" in lr:
        out["arch_lr"] = lr.split("|")[0].split("*")[0]
        out["arch_lr_schedule"] = lr
    else:
        out["arch_lr"] = lr
    for option in ("arch_halving_factor", "arch_improvement_threshold"):
        if option in options:
            out[option] = options[option]
    opt = options.get("arch_opt", "sgd")
    if opt not in OPTIMIZER_OPTIONS:
        problems.append(f"{where} arch_opt = {opt}: expected sgd, rmsprop or adam")
        return
    out["arch_opt"] = opt
    for option in ("opt_momentum", "opt_alpha", "opt_eps", "opt_centered", "opt_weight_decay", "opt_nesterov"):
        if option in options and option in OPTIMIZER_OPTIONS[opt]:
            out[option] = options[option]
    if opt == "rmsprop":
        out["opt_bias_correction"] = "False"  # pytorch-kaldi's RMSprop is torch's, uncorrected
    if opt == "adam" and "opt_betas" in options:
        out["opt_betas"] = options["opt_betas"]
    if float(options.get("opt_dampening", "0") or 0):
        problems.append(f"{where} opt_dampening = {options['opt_dampening']}: SGD dampening is not supported")
    if _bool(options.get("opt_amsgrad", "False")):
        problems.append(f"{where} opt_amsgrad = True: AMSGrad is not supported")

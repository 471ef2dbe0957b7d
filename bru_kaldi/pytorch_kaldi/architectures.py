"""pytorch-kaldi's ``[architectureN]`` sections (``arch_class`` and its ``proto/<class>.proto`` options) in
our vocabulary.

Each class maps to one of our units, with pytorch-kaldi's option prefix: ``LSTM`` (``lstm_``) -> ``lstm``,
``GRU`` (``gru_``) -> ``gru``, ``liGRU`` (``ligru_``) -> ``ligru``, ``RNN`` (``rnn_``) -> ``rnn``, ``MLP``
(``dnn_``) -> ``mlp``; our own units take their name as class and prefix (``liBRU``, ``libru_lay``...).
An MLP whose last layer is ``N_out_<label>`` (or a number of classes, ``1880``: checked against the labels
when the run reads them) with ``softmax`` is (or ends in) an output layer: our senone or monophone output,
trained by that architecture's optimiser. ``LSTM_cudnn`` and ``GRU_cudnn`` (``hidden_size``, ``num_layers``...)
map to our ``cudnn_lstm`` and ``cudnn_gru``, which run the same torch modules. ``CNN`` (``cnn_``) and ``SincNet``
(``sinc_``) map to our frame-wise ``cnn`` and ``sincnet`` (``models.conv``). Long because each family of classes
(recurrent and MLP, the torch wrappers, the convolutions) has its own options to translate and check, in one place.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# arch_class -> (our unit, option prefix); qlstm_ is QLSTM read through _qlstm
CLASSES = {"lstm": ("lstm", "lstm"), "gru": ("gru", "gru"), "ligru": ("ligru", "ligru"), "rnn": ("rnn", "rnn"),
           "mlp": ("mlp", "dnn"), "libru": ("libru", "libru"), "bru": ("bru", "bru"), "ubru": ("ubru", "ubru"),
           "lbru": ("lbru", "lbru"), "qlstm_": ("qlstm", "lstm"), "ubru_tpami": ("ubru_tpami", "ubru_tpami"), "mgu": ("mgu", "mgu")}
# pytorch-kaldi's wrappers of torch.nn.LSTM / GRU (proto/LSTM_cudnn.proto: hidden_size, num_layers, bias,
# batch_first, dropout, bidirectional) -> our units that run the same torch modules
VENDOR = {"lstm_cudnn": "cudnn_lstm", "gru_cudnn": "cudnn_gru"}
VENDOR_OPTIONS = ("hidden_size", "num_layers", "bias", "batch_first", "dropout", "bidirectional")
# pytorch-kaldi's frame-wise convolutions (proto/CNN.proto, proto/SincNet.proto) -> (our unit, option prefix)
CONV = {"cnn": ("cnn", "cnn"), "sincnet": ("sincnet", "sinc")}
CONV_OPTIONS = ("n_filt", "len_filt", "max_pool_len", "use_laynorm_inp", "use_batchnorm_inp", "use_laynorm",
                "use_batchnorm", "act", "drop")
SINC_OPTIONS = ("sample_rate", "min_low_hz", "min_band_hz")
# pytorch-kaldi classes we have no equivalent for (its neural_networks.py), and what else they would need
RAW = "; it reads the raw waveform (a fea_lst of wav-copy archives), which our feature reader does not read either"
NO_EQUIVALENT = {"QRNN": "", "PASE": RAW, "minimalGRU": "",
                 "RNN_cudnn": "", "logMelFb": RAW, "channel_averaging": ""}
# fusionRNN_jit (prefix fusionRNN_) -> our fusionrnn (_fusion). Its parts take no (options, inp_dim): not classes
FUSION_OPTIONS = ("lay", "drop", "bidir", "act", "do_fusion", "fusion_act", "fusion_reduce", "fusion_layer_size",
                  "number_of_mic")
FUSION_PARTS = ("liGRU_layer", "FusionLinearConv")
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
    if klass.lower() == "sru":
        return _sru(options, out, where)
    if klass.lower() == "qlstm":
        return _qlstm(options, where)
    if klass.lower() in CONV:
        return _conv(options, out, *CONV[klass.lower()], where)
    if klass.lower() == "fusionrnn_jit":
        return _fusion(options, out, where)
    if klass in FUSION_PARTS:
        return Translated(name, out, True, problems=[
            f"{where} arch_class = {klass}: a part of fusionRNN_jit, which pytorch-kaldi cannot build from a config "
            "section (its constructor takes no options, inp_dim); write arch_class = fusionRNN_jit"])
    unit, prefix = CLASSES.get(klass.lower(), (None, None))
    if unit is None:
        why = "no equivalent here" if klass in NO_EQUIVALENT else "not a class we know"
        problems.append(f"{where} arch_class = {klass}: {why} (supported: LSTM, GRU, liGRU, RNN, MLP, LSTM_cudnn, "
                        f"GRU_cudnn, CNN, SincNet, fusionRNN_jit, SRU, QLSTM, liBRU, BRU, UBRU, LBRU, UBRU_tpami, MGU){NO_EQUIVALENT.get(klass, '')}")
        return Translated(name, out, True, problems=problems)
    out["unit"] = unit
    lays = [v.strip() for v in options.get(f"{prefix}_lay", "").split(",") if v.strip()]
    if not lays:
        problems.append(f"{where} {prefix}_lay: required (one size per layer)")
        return Translated(name, out, True, problems=problems)
    n = len(lays)
    drops = _per_layer(options.get(f"{prefix}_drop", "0.0"), n, f"{where} {prefix}_drop", problems)
    # progressive values, one per layer (pytorch-kaldi expands each for every epoch): our dropout_schedule,
    # with the first epoch's rates as dropout
    schedules = [d.replace(" ", "") for d in drops]
    drops = [d.split("|")[0].split("*")[0] for d in schedules]
    bns = [_bool(v) for v in _per_layer(options.get(f"{prefix}_use_batchnorm", "False"), n, f"{where} {prefix}_use_batchnorm", problems)]
    lns = [_bool(v) for v in _per_layer(options.get(f"{prefix}_use_laynorm", "False"), n, f"{where} {prefix}_use_laynorm", problems)]
    acts = _per_layer(options.get(f"{prefix}_act", FIXED_ACT.get(unit, "relu")), n, f"{where} {prefix}_act", problems)
    output_of = ""
    if lays[-1].startswith("N_out_") or acts[-1] == "softmax":
        if unit != "mlp" or not (lays[-1].startswith("N_out_") or lays[-1].isdigit()) or acts[-1] != "softmax":
            problems.append(f"{where}: an output layer must be an MLP layer N_out_<label> (or its number of classes) "
                            f"with softmax (got {prefix}_lay ending {lays[-1]}, {prefix}_act ending {acts[-1]})")
        elif any(float(v.split("*")[0] or 0) for v in schedules[-1].split("|")) or bns[-1] or lns[-1]:
            problems.append(f"{where}: the output layer {lays[-1]} takes no dropout or norm here (got "
                            f"dnn_drop {drops[-1]}, batchnorm {bns[-1]}, laynorm {lns[-1]})")
        output_of = lays[-1]
        lays, drops, bns, lns, acts, schedules = lays[:-1], drops[:-1], bns[:-1], lns[:-1], acts[:-1], schedules[:-1]
    for size in lays:
        if not size.isdigit():
            problems.append(f"{where} {prefix}_lay: {size!r} is not a layer size (N_out_<label> only as an MLP's last, softmax layer)")
    out["sizes"] = ",".join(lays)
    out["dropout"] = ",".join(drops) if lays else "0.0"
    if any("*" in d or "|" in d for d in schedules):
        out["dropout_schedule"] = ",".join(schedules)
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
        elif unit in ("rnn", "mlp", "qlstm"):
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
    _common(options, out, where, problems, notes, known_own)
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
    _common(options, out, where, problems, notes, VENDOR_OPTIONS)
    return Translated(out["arch_name"], out, _bool(options.get("arch_seq_model", "True")), problems=problems, notes=notes)


def _conv(options: dict, out: dict, unit: str, prefix: str, where: str) -> Translated:
    """``CNN`` (``cnn_``) / ``SincNet`` (``sinc_``): our frame-wise ``cnn`` / ``sincnet`` stacks (``models.conv``),
    ``N_filt`` -> ``sizes``, ``len_filt`` -> ``kernel_sizes``, ``max_pool_len`` -> ``pool_sizes``; the dropout after
    each layer's activation is our ``dropout_at = inside``. Frame-wise only: ``arch_seq_model = True`` is refused."""
    problems, notes = [], []
    klass = options["arch_class"]
    filters = [v.strip() for v in options.get(f"{prefix}_n_filt", "").split(",") if v.strip()]
    if not filters or not all(v.isdigit() and int(v) > 0 for v in filters):
        problems.append(f"{where} {prefix}_N_filt = {options.get(f'{prefix}_n_filt', '')}: expected positive numbers "
                        f"of filters, one per layer (proto/{klass}.proto)")
        return Translated(out["arch_name"], out, False, problems=problems)
    n = len(filters)

    def per_layer(option, default=None):
        if default is None and f"{prefix}_{option}" not in options:
            problems.append(f"{where} {prefix}_{option}: required, one value per layer (proto/{klass}.proto)")
            return [default or "1"] * n
        return _per_layer(options.get(f"{prefix}_{option}", default), n, f"{where} {prefix}_{option}", problems)

    kernels, pools = per_layer("len_filt"), per_layer("max_pool_len")
    for option, values in (("len_filt", kernels), ("max_pool_len", pools)):
        if not all(v.isdigit() and int(v) > 0 for v in values):
            problems.append(f"{where} {prefix}_{option} = {options[f'{prefix}_{option}']}: expected positive integers")
    drops = [d.replace(" ", "") for d in per_layer("drop", "0.0")]
    bns = [_bool(v) for v in per_layer("use_batchnorm", "False")]
    lns = [_bool(v) for v in per_layer("use_laynorm", "False")]
    acts = per_layer("act", "relu")
    out.update(unit=unit, sizes=",".join(filters), kernel_sizes=",".join(kernels), pool_sizes=",".join(pools),
               dropout=",".join(d.split("|")[0].split("*")[0] for d in drops))
    if any("*" in d or "|" in d for d in drops):
        out["dropout_schedule"] = ",".join(drops)
    for bn, ln in zip(bns, lns):
        if bn and ln:
            # pytorch-kaldi's forward would run the layer twice, the second time on the first's output
            problems.append(f"{where} {prefix}_use_batchnorm and {prefix}_use_laynorm: both on one layer is not supported")
    out["norm"] = ",".join("batch" if bn else "layer" if ln else "none" for bn, ln in zip(bns, lns))
    if any(bns):
        notes.append(f"{where} {prefix}_use_batchnorm: our batch norm of a convolution's output has eps 1e-5; "
                     "pytorch-kaldi's passes the pooled length as BatchNorm1d's eps (its second positional argument)")
    wrong = [a for a in acts if a not in ACTS]
    if wrong:
        problems.append(f"{where} {prefix}_act = {options[f'{prefix}_act']}: {', '.join(dict.fromkeys(wrong))} is not an "
                        f"activation of a hidden layer (expected one of {', '.join(ACTS)})")
    else:
        out["activation"] = acts[0] if len(set(acts)) == 1 else ",".join(acts)
    input_layer, input_batch = (_bool(options.get(f"{prefix}_use_{kind}_inp", "False")) for kind in ("laynorm", "batchnorm"))
    if input_layer or input_batch:
        out["input_norm"] = "layer+batch" if input_layer and input_batch else "layer" if input_layer else "batch"
    known = {f"{prefix}_{o}" for o in CONV_OPTIONS + (SINC_OPTIONS if unit == "sincnet" else ())}
    if unit == "sincnet":
        for option in SINC_OPTIONS:
            value = options.get(f"{prefix}_{option}", "").strip()
            if not value.isdigit():
                problems.append(f"{where} {prefix}_{option} = {value}: expected a whole number of Hz (proto/{klass}.proto)")
            else:
                out[option] = value
        if kernels[0].isdigit() and int(kernels[0]) % 2 == 0:
            notes.append(f"{where} {prefix}_len_filt = {kernels[0]}: the sinc filters have {int(kernels[0]) + 1} taps "
                         "(made odd, as pytorch-kaldi's SincConv, which then sizes its layer norm for the even width)")
    if _bool(options.get("arch_seq_model", "False")):
        problems.append(f"{where} arch_seq_model = True: arch_class {klass} is frame-wise (pytorch-kaldi's forward "
                        "reads one vector per frame); expected False")
    out["norm_momentum"] = "0.05"
    out["dropout_at"] = "inside"
    _common(options, out, where, problems, notes, known)
    return Translated(out["arch_name"], out, False, problems=problems, notes=notes)


# proto/SRU.proto -> our sru (models.sru), as pytorch-kaldi's SRU passes them to sru.SRU (sru 2.1)
SRU_PROTO = ("sru_hidden_size", "sru_num_layers", "sru_dropout", "sru_rnn_dropout", "sru_use_tanh", "sru_use_relu",
             "sru_use_selu", "sru_weight_norm", "sru_layer_norm", "sru_bidirectional", "sru_is_input_normalized",
             "sru_has_skip_term", "sru_rescale", "sru_highway_bias", "sru_n_proj")


def _sru(options: dict, out: dict, where: str) -> Translated:
    """``SRU``: ``sru_num_layers`` layers of our ``sru``. ``sru_rnn_dropout`` drops every layer's input (one
    inverted mask per sequence: our ``dropout``, ``dropout_at = input``); ``sru_dropout`` drops ``g(c_t)`` in
    every layer but the last (``state_dropout``); the highway input is sru's (``highway = auto``)."""
    problems, notes = [], []
    for option in ("sru_hidden_size", "sru_num_layers"):
        if not options.get(option, "").strip().isdigit() or int(options[option]) < 1:
            problems.append(f"{where} {option} = {options.get(option, '')}: expected a positive integer (proto/SRU.proto)")
    if problems:
        return Translated(out["arch_name"], out, True, problems=problems)
    n, flag = int(options["sru_num_layers"]), lambda name: _bool(options.get(name, "False"))
    state_drop = options.get("sru_dropout", "0.0").strip()
    acts = [a for a in ("tanh", "relu", "selu") if flag(f"sru_use_{a}")]
    if len(acts) > 1:
        problems.append(f"{where} sru_use_{'/sru_use_'.join(acts)}: more than one activation (sru refuses it too)")
    for option, why in (("sru_weight_norm", "weight normalisation of W"), ("sru_layer_norm", "sru's layer norm of each "
                        "layer's output"), ("sru_is_input_normalized", "sru's smaller initial gate weights")):
        if flag(option):
            problems.append(f"{where} {option} = True: {why} is not offered by our sru")
    out.update(unit="sru", sizes=",".join([options["sru_hidden_size"]] * n), norm="none", dropout_at="input",
               dropout=options.get("sru_rnn_dropout", "0.0").strip(), bidirectional=str(flag("sru_bidirectional")),
               state_dropout=",".join([state_drop] * (n - 1) + ["0.0"]), highway="auto",
               activation=acts[0] if acts else "identity", skip=str(_bool(options.get("sru_has_skip_term", "True"))),
               rescale=str(_bool(options.get("sru_rescale", "True"))),
               highway_bias=options.get("sru_highway_bias", "0").strip(),
               projection_size=options.get("sru_n_proj", "0").strip())
    _common(options, out, where, problems, notes, SRU_PROTO)
    return Translated(out["arch_name"], out, _bool(options.get("arch_seq_model", "True")), problems=problems, notes=notes)


def _qlstm(options: dict, where: str) -> Translated:
    """``QLSTM`` (quaternion_neural_networks, proto/QLSTM.proto): our ``qlstm``, read as an ``LSTM`` section
    (``lstm_lay``, ``lstm_drop`` on the candidate, ``lstm_bidir``, ``lstm_act``). ``quaternion_init`` and
    ``autograd`` change nothing computed: pytorch-kaldi's QLSTM never reads the first (its weights always
    get the quaternion initialisation) and the second picks a backward pass with the same gradients."""
    rest = {k: v for k, v in options.items() if k not in ("quaternion_init", "autograd")}
    if rest.get("arch_library") == "quaternion_neural_networks":  # where pytorch-kaldi keeps QLSTM
        rest["arch_library"] = "neural_networks"
    translated = translate_architecture(dict(rest, arch_class="qlstm_"), where)
    translated.problems = [p.replace("arch_class qlstm_", "arch_class QLSTM").replace("proto/qlstm_.proto",
                                                                                      "proto/QLSTM.proto")
                           for p in translated.problems]
    for size in options.get("lstm_lay", "").split(","):
        if size.strip().isdigit() and int(size) % 4:
            translated.problems.append(f"{where} lstm_lay: {size.strip()} is not a multiple of 4 (a layer is made of "
                                       "quaternions; pytorch-kaldi fails on it at the first batch)")
    return translated


def _common(options: dict, out: dict, where: str, problems: list, notes: list, own=(), defined_in: str = "") -> None:
    """The options every architecture has, and its optimiser's; then any option that is none of those nor
    one of the class's ``own`` is a problem, naming where the class's options are defined (``defined_in``;
    by default its proto file)."""
    _optimizer(options, out, where, problems)
    klass, opt = options.get("arch_class", ""), out.get("arch_opt", "rmsprop")
    for option in options:
        if option not in COMMON and option not in own and option not in OPTIMIZER_OPTIONS.get(opt, ()):
            problems.append(f"{where} {option}: not an option of arch_class {klass} with arch_opt {opt} "
                            f"({defined_in or f'proto/{klass}.proto'}, proto/{opt}.proto)")


def _optimizer(options: dict, out: dict, where: str, problems: list) -> None:
    """The library, pretraining, freezing, rate and optimiser options every architecture has."""
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


def _fusion(options: dict, out: dict, where: str) -> Translated:
    """``fusionRNN_jit`` (neural_networks.py; its ``proto/fusionRNN.proto`` is missing from pytorch-kaldi): our
    ``fusionrnn`` (``models.fusion``), translated as what the class runs. Every layer is a bidirectional
    ``liGRU_layer`` of ``fusionRNN_lay``'s *first* size with ``fusionRNN_drop``'s first rate on its candidate and
    batch norm (momentum 0.05); the first fuses ``fusionRNN_number_of_mic`` microphones into
    ``fusionRNN_fusion_layer_size / number_of_mic`` units. It never reads ``fusionRNN_bidir`` or ``fusionRNN_act``
    (its candidate is ReLU), and ``fusionRNN_do_fusion`` is a ``map`` object, always true: a value that says
    otherwise is translated as what runs, with a note."""
    problems, notes = [], []
    p = "fusionrnn"

    def number(option):
        text = options.get(f"{p}_{option}", "").strip()
        if not text.isdigit() or int(text) < 1:
            problems.append(f"{where} fusionRNN_{option} = {text}: expected a positive integer (fusionRNN_jit)")
            return 1
        return int(text)

    lays = [v.strip() for v in options.get(f"{p}_lay", "").split(",") if v.strip()]
    if not lays or not lays[0].isdigit():
        problems.append(f"{where} fusionRNN_lay = {options.get(f'{p}_lay', '')}: expected layer sizes (one per layer)")
        return Translated(out["arch_name"], out, True, problems=problems)
    mics, total = number("number_of_mic"), number("fusion_layer_size")
    if total < mics:
        problems.append(f"{where} fusionRNN_fusion_layer_size = {total}: fewer units than the {mics} microphones")
    fusion_act = options.get(f"{p}_fusion_act", "").strip().lower()
    if fusion_act not in ("prelu", "relu", "leaky_relu", "tanh"):
        problems.append(f"{where} fusionRNN_fusion_act = {fusion_act}: expected prelu, relu, leaky_relu or tanh "
                        "(FusionLinearConv silently uses tanh for any other value: write tanh for that)")
    reduce = options.get(f"{p}_fusion_reduce", "").strip().lower()
    if reduce not in ("sum", "mean"):
        problems.append(f"{where} fusionRNN_fusion_reduce = {reduce}: expected sum or mean (FusionLinearConv sums "
                        "for any value but mean: write sum for that)")
    first_drop = options.get(f"{p}_drop", "0.0").split(",")[0].replace(" ", "")
    read_only_first = [f"fusionRNN_{o}" for o in ("lay", "drop")
                       if len({v.strip() for v in options.get(f"{p}_{o}", "").split(",") if v.strip()}) > 1]
    if read_only_first:
        notes.append(f"{where} {', '.join(read_only_first)}: fusionRNN_jit reads only the first value, for every layer")
    ignored = [f"fusionRNN_{o} = {options[f'{p}_{o}']}" for o, ran in (("bidir", "true"), ("act", "relu"),
                                                                      ("do_fusion", "true"))
               if f"{p}_{o}" in options and any(v.strip().lower() != ran for v in options[f"{p}_{o}"].split(","))]
    if ignored:
        notes.append(f"{where} {'; '.join(ignored)}: not read by fusionRNN_jit, which is always bidirectional, "
                     "fuses on its first layer and has ReLU candidates; translated as what it runs")
    notes.append(f"{where}: differs from pytorch-kaldi: fusionRNN_jit's two directions share one set of weights "
                 "(and batch-norm statistics), ours have a set each")
    out.update(unit="fusionrnn", sizes=",".join([str(max(total // mics, 1))] + [lays[0]] * (len(lays) - 1)),
               dropout=first_drop.split("|")[0].split("*")[0], bidirectional="True", norm="batch",
               norm_momentum="0.05", dropout_at="inside", mics=str(mics), fusion_act=fusion_act, fusion_reduce=reduce)
    if "*" in first_drop or "|" in first_drop:
        out["dropout_schedule"] = first_drop
    _common(options, out, where, problems, notes, {f"{p}_{o}" for o in FUSION_OPTIONS},
            "fusionRNN_jit in neural_networks.py")
    return Translated(out["arch_name"], out, _bool(options.get("arch_seq_model", "True")), problems=problems, notes=notes)

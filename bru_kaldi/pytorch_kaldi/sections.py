"""pytorch-kaldi's sections other than ``[architectureN]`` and ``[model]`` (its ``proto/global.proto``,
``proto/decoding.proto``) in our vocabulary, and the notes that go with them."""

from __future__ import annotations

import re

# Options that only steer pytorch-kaldi's own machinery: accepted, with what replaces each.
MACHINERY = {
    ("cfg_proto", "cfg_proto"): "[cfg_proto] is not needed: the schema is bru_kaldi/config.py (unknown options are errors)",
    ("cfg_proto", "cfg_proto_chunk"): "[cfg_proto] cfg_proto_chunk: no per-chunk configs are written; the config is parsed once",
    ("exp", "cmd"): "[exp] cmd: every step runs in this process (decoding in parallel jobs: [decoding] num_jobs)",
    ("exp", "run_nn_script"): "[exp] run_nn_script: the training loop is run_exp.py's",
    ("exp", "use_cuda"): "[exp] use_cuda: [exp] device (True: auto, a CUDA device when there is one; False: cpu)",
    ("exp", "multi_gpu"): "[exp] multi_gpu: several GPUs train through torchrun (distributed data parallel)",
    ("exp", "save_gpumem"): "[exp] save_gpumem: the model stays on the device; nothing replaces it",
    ("forward", "save_out_file"): "[forward] save_out_file: forward_<set>/loglikes.ark is always written",
    ("decoding", "decoding_script_folder"): "[decoding] decoding_script_folder, decoding_script, decoding_proto: "
                                            "decoding is bru_kaldi.decoding (Kaldi's latgen-faster-mapped when on PATH, else the Python decoder)",
    ("decoding", "decoding_script"): None, ("decoding", "decoding_proto"): None,
    ("decoding", "scoring_script"): "[decoding] scoring_script: scoring is [decoding] scoring (timit, wsj, ami)",
    ("decoding", "scoring_opts"): "[decoding] scoring_opts --min-lmwt/--max-lmwt: acwt_sweep = 1/lmwt for each LM weight",
    ("decoding", "skip_scoring"): "[decoding] skip_scoring: every decoded set with a reference text is scored",
    ("decoding", "norm_vars"): "[decoding] norm_vars: feature normalisation is each stream's fea_opts",
    ("decoding", "max_arcs"): "[decoding] max_arcs: the lattices are not pruned by arc count",
}
# Where we deliberately differ from pytorch-kaldi: logged once, for the units the config uses ("all": always;
# "cudnn": cudnn_lstm or cudnn_gru; "mse": when the loss has an mse term).
DIFFERENCES = {
    "all": "differs from pytorch-kaldi: decoding chooses the acoustic scale on valid_with (added to forward_with) and "
           "applies it unchanged to the other sets; batch-norm statistics count real frames only (not padding)",
    "lstm": "differs from pytorch-kaldi: bidirectional layers have untied weights (one set per direction); "
            "lstm/gru recurrent matrices carry a bias",
    "gru": "differs from pytorch-kaldi: our gru resets U h (PyTorch's r * (U h + b)), pytorch-kaldi's U (r * h)",
    "ligru": "differs from pytorch-kaldi: bidirectional layers have untied weights (one set per direction); our "
             "Li-GRU update gate is pytorch-kaldi's 1 - z (the same function, see models.gated.LiGRUCell)",
    "rnn": "differs from pytorch-kaldi: bidirectional layers have untied weights (one set per direction)",
    "cudnn": "differs from pytorch-kaldi: LSTM_cudnn / GRU_cudnn dropout draws one mask per sequence (torch's "
             "per frame); biases start from PyTorch's initialisation (pytorch-kaldi's at zero), each gate's "
             "recurrent matrix orthogonal (pytorch-kaldi's whole matrix)",
    "mlp": "differs from pytorch-kaldi: MLP weights start from PyTorch's Linear initialisation, not pytorch-kaldi's "
           "uniform +-sqrt(0.01 / (in + out))",
    "mse": "differs from pytorch-kaldi: mse averages the squared error over real frames only (torch.mean over a "
           "padded sequence batch also counts the padding); res.res reports the senone cross-entropy, not "
           "loss_final with the mse term",
}
EXP = ("cmd", "run_nn_script", "out_folder", "seed", "use_cuda", "multi_gpu", "save_gpumem", "n_epochs_tr", "production",
       "pretrain_file")
BATCHES = ("batch_size_train", "max_seq_length_train", "increase_seq_length_train", "start_seq_len_train",
           "multply_factor_seq_len_train", "batch_size_valid", "max_seq_length_valid")
DECODING = ("min_active", "max_active", "max_mem", "beam", "latbeam", "acwt")
FORWARD = ("forward_out", "normalize_posteriors", "normalize_with_counts_from", "require_decoding")


def _true(text: str) -> bool:
    return str(text).strip().lower() in ("true", "yes", "1", "on")


def _progressive(value: str, option: str, out: dict) -> None:
    """``option`` and, for a progressive value ``"128*12|64"``, ``option_schedule``."""
    if "|" in value or "*" in value:
        out[option] = value.split("|")[0].split("*")[0].strip()
        out[f"{option}_schedule"] = value.strip()
    else:
        out[option] = value.strip()


def simple_sections(sections: dict, source: str, problems: list, notes: list, any_seq_model: bool) -> dict:
    """Our ``[exp]``, ``[datasetN]``, ``[data_use]``, ``[batches]``, ``[forward]``, ``[decoding]``."""
    out: dict[str, dict] = {}
    known = {"cfg_proto", "exp", "data_use", "batches", "model", "forward", "decoding"}
    for name, options in sections.items():
        if name not in known and not re.fullmatch(r"(dataset|architecture)\d+", name):
            problems.append(f"{source}: unknown section [{name}] (pytorch-kaldi's are cfg_proto, exp, datasetN, "
                            "data_use, batches, architectureN, model, forward, decoding)")
        for option in options:
            note = MACHINERY.get((name, option), "")
            if note:
                notes.append(f"pytorch-kaldi {note}")

    exp = sections.get("exp", {})
    out["exp"] = {k: exp[k] for k in ("out_folder", "seed", "n_epochs_tr") if k in exp}
    out["exp"]["device"] = "auto" if _true(exp.get("use_cuda", "False")) else "cpu"
    if _true(exp.get("production", "False")):
        problems.append(f"{source} [exp] production = True: run `python run_exp.py CFG --forward-only --model EXP_DIR` instead")
    problems += [f"{source} [exp] {o}: not an option of pytorch-kaldi's [exp]" for o in exp if o not in EXP]
    # in some of its configs (TIMIT_RNN_*, DIRHA_*) but in no proto and read by no code of pytorch-kaldi: its
    # weights come from each architecture's arch_pretrain_file. A path would be ignored there; here it is an error
    # rather than a model silently not loaded.
    pretrain = exp.get("pretrain_file", "none").strip()
    if pretrain.lower() == "none":
        if "pretrain_file" in exp:
            notes.append("pytorch-kaldi [exp] pretrain_file = none: not read by pytorch-kaldi either; nothing to load")
    else:
        problems.append(f"{source} [exp] pretrain_file = {pretrain}: pytorch-kaldi ignores this option (no code of it reads "
                        "[exp] pretrain_file; its weights come from [architectureN] arch_pretrain_file, which we do not "
                        "load either), and we will not silently skip a model you named: set it to none")

    for name in (s for s in sections if re.fullmatch(r"dataset\d+", s)):
        options = sections[name]
        out[name] = {k: options[k] for k in ("data_name", "fea", "lab", "n_chunks") if k in options}
        problems += [f"{source} [{name}] {o}: not an option of pytorch-kaldi's [datasetN]" for o in options
                     if o not in ("data_name", "fea", "lab", "n_chunks")]

    use = sections.get("data_use", {})
    out["data_use"] = {}
    for option in ("train_with", "valid_with"):
        names = [v.strip() for v in use.get(option, "").split(",") if v.strip()]
        if len(names) != 1:
            problems.append(f"{source} [data_use] {option} = {use.get(option, '')}: exactly one data set is supported")
        out["data_use"][option] = ",".join(names)
    forward_with = [v.strip() for v in use.get("forward_with", "").split(",") if v.strip()]
    if out["data_use"]["valid_with"] and out["data_use"]["valid_with"] not in forward_with:
        forward_with.insert(0, out["data_use"]["valid_with"])  # decoded first: the acoustic scale is chosen on it
    out["data_use"]["forward_with"] = ",".join(forward_with)

    batches = sections.get("batches", {})
    b: dict = {"long_utterances": "cut"}  # pytorch-kaldi cuts long sentences into max_seq_length pieces
    for option in ("batch_size_train", "max_seq_length_train"):
        if option in batches:
            if "," in batches[option]:
                problems.append(f"{source} [batches] {option} = {batches[option]}: per-stream values are not supported")
            else:
                _progressive(batches[option], option, b)
    for option in ("batch_size_valid", "max_seq_length_valid"):
        if option in batches:
            b[option] = batches[option]
    if _true(batches.get("increase_seq_length_train", "False")):
        b["seq_len_start"] = batches.get("start_seq_len_train", "100")
        b["seq_len_factor"] = batches.get("multply_factor_seq_len_train", "2")
    if not any_seq_model:
        b["batch_unit"] = "frames"
        notes.append("pytorch-kaldi: no architecture is a sequence model (arch_seq_model), so batch_size_train "
                     "counts frames: training batches are single frames drawn from the whole chunk")
    out["batches"] = b
    problems += [f"{source} [batches] {o}: not an option of pytorch-kaldi's [batches]" for o in batches if o not in BATCHES]

    forward = sections.get("forward", {})
    out["forward"] = {}
    for option in ("normalize_posteriors", "normalize_with_counts_from", "require_decoding"):
        values = {v.strip() for v in forward.get(option, "").split(",") if v.strip()}
        if len(values) > 1:
            problems.append(f"{source} [forward] {option} = {forward[option]}: one value for every forward set is supported")
        elif values:
            out["forward"][option] = values.pop()
    problems += [f"{source} [forward] {o}: not an option of pytorch-kaldi's [forward]" for o in forward
                 if o not in FORWARD + ("save_out_file",)]

    decoding = sections.get("decoding", {})
    out["decoding"] = {k: decoding[k] for k in DECODING if k in decoding}
    low, high = re.search(r"--min-lmwt\s+(\d+)", decoding.get("scoring_opts", "")), re.search(r"--max-lmwt\s+(\d+)", decoding.get("scoring_opts", ""))
    if low and high and 0 < int(low.group(1)) <= int(high.group(1)):
        out["decoding"]["acwt_sweep"] = ",".join(f"{1 / w:.4g}" for w in range(int(high.group(1)), int(low.group(1)) - 1, -1))
    problems += [f"{source} [decoding] {o}: not an option of pytorch-kaldi's [decoding]" for o in decoding
                 if o not in DECODING and ("decoding", o) not in MACHINERY]
    return out

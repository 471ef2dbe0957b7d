"""pytorch-kaldi's config format as a first-class input: translated into our native config text, which
``bru_kaldi.config`` then reads with its one parser.

A config is pytorch-kaldi's when it has a ``[cfg_proto]`` section, an ``[architectureN]`` with
``arch_class`` or a ``[model]`` with ``model=`` (:func:`is_pytorch_kaldi`). Every option of
pytorch-kaldi's schema (its ``proto/*.proto``) is, in :func:`translate`:

* honoured with pytorch-kaldi's meaning (``[datasetN]`` as it is, hard-wrapped lines joined back by
  :func:`unwrap`; progressive values; the sequence-length curriculum; frame batches when no architecture
  is a sequence model; the network of ``[model] model=``, see :mod:`.model_graph`; the architectures, see
  :mod:`.architectures`, with pytorch-kaldi's batch-norm momentum 0.05 and dropout places);
* accepted with a note saying what replaces it, where it only steers pytorch-kaldi's own machinery
  (``[cfg_proto]``, ``cmd``, ``run_nn_script``, ``use_cuda``, ``multi_gpu``, ``save_gpumem``,
  ``decoding_script_folder``...);
* or refused, every such item in one ValueError, where we have no equivalent.

Option names are case-insensitive, as in pytorch-kaldi (``N_epochs_tr``). The notes, and one line per
place where we deliberately differ, are logged once by ``run_exp.py``;
``python run_exp.py X.cfg --convert`` prints the native text. Reading imports neither torch nor ``models``.
"""

from __future__ import annotations

import configparser
import re
from typing import Sequence

from bru_kaldi.pytorch_kaldi.architectures import translate_architecture
from bru_kaldi.pytorch_kaldi.model_graph import parse_model, resolve
from bru_kaldi.pytorch_kaldi.sections import DIFFERENCES, MACHINERY, simple_sections

__all__ = ["is_pytorch_kaldi", "translate", "convert", "DIFFERENCES", "MACHINERY"]


# what a line of pytorch-kaldi's [datasetN] starts with (proto/global.proto: its options, then the keys of the
# fea= and lab= blocks); a line that starts with none of them is not one of its own
DATASET_KEYS = re.compile(r"\s*((data_name|fea|lab|n_chunks)\s*[=:]|(fea_name|fea_lst|fea_opts|cw_left|cw_right|lab_name|"
                          r"lab_folder|lab_opts|lab_count_file|lab_data_folder|lab_graph)\s*=)", flags=re.I)


def unwrap(text: str) -> tuple[str, list[int]]:
    """``text`` with the hard-wrapped lines of its ``[datasetN]`` sections joined back, and the numbers of
    the lines joined.

    Some of pytorch-kaldi's configs (its DIRHA baselines, ``TIMIT_liGRU_fmllr_lr_schedule``) were saved
    with long ``fea_opts`` lines broken at a fixed width (186 characters in the DIRHA ones). An INI reader
    then sees a new option (``- ark``), no option at all (``:- ark:- |``, ``|``: pytorch-kaldi's own
    configparser refuses those files), or a line of the stream block that is no key (`` --delta-order=0``).
    A line of a ``[datasetN]`` that starts with none of its keys (``data_name``, ``fea``, ``lab``,
    ``N_chunks``, ``fea_name``, ``fea_lst``, ``fea_opts``, ``cw_left``, ``cw_right``, ``lab_*``) continues the
    line before it, joined as it is: the break inserted a newline and nothing else (``add-delt`` / ``as``,
    ``add-deltas`` / `` --delta-order=0``).

    >>> unwrap("[dataset1]\\nfea:fea_name=a\\n    fea_opts=x ark:\\n- ark:- | y\\n --delta-order=0 |\\n    cw_left=0\\n")
    ('[dataset1]\\nfea:fea_name=a\\n    fea_opts=x ark:- ark:- | y --delta-order=0 |\\n    cw_left=0\\n', [4, 5])
    """
    lines, joined, in_dataset = [], [], False
    for number, line in enumerate(text.splitlines(), 1):
        header = re.match(r"\[([^]]*)\]", line)
        if header:
            in_dataset = bool(re.fullmatch(r"dataset\d+", header.group(1).strip()))
        elif (in_dataset and lines and lines[-1].strip() and line.strip() and not line.lstrip().startswith(("#", ";"))
              and not DATASET_KEYS.match(line)):
            lines[-1] += line.rstrip()
            joined.append(number)
            continue
        lines.append(line)
    return "\n".join(lines) + ("\n" if text.endswith(("\n", "\r")) else ""), joined


def _read(text: str, source: str) -> configparser.ConfigParser:
    parser = configparser.ConfigParser(interpolation=None, inline_comment_prefixes=("#", ";"), strict=False)
    parser.optionxform = str.lower  # pytorch-kaldi's option names are case-insensitive
    parser.read_string(text, source=source)
    return parser


def is_pytorch_kaldi(text: str) -> bool:
    """Whether ``text`` is written in pytorch-kaldi's vocabulary rather than ours: it has a ``[cfg_proto]``
    section, an ``arch_class`` option or a ``[model] model=`` program (which ours never has).

    Decided from the lines, not from a parse, so that a file an INI reader cannot read is still
    recognised (and :func:`translate` then says what is wrong with it, as pytorch-kaldi's).

    >>> is_pytorch_kaldi("[cfg_proto]\\ncfg_proto=proto/global.proto\\n|\\n"), is_pytorch_kaldi("[model]\\nstack = a\\n")
    (True, False)
    """
    section = ""
    for line in text.splitlines():
        header = re.match(r"\s*\[([^]]*)\]", line)
        if header:
            section = header.group(1).strip().lower()
            if section == "cfg_proto":
                return True
        elif re.match(r"\s*arch_class\s*[=:]", line, flags=re.I) and re.fullmatch(r"architecture\d+", section):
            return True
        elif section == "model" and re.match(r"model\s*[=:]", line, flags=re.I):
            return True
    return False


def translate(text: str, source: str = "<string>",
              overrides: Sequence[tuple[str, str, str]] = ()) -> tuple[str, list[str], dict[str, str]]:
    """Our native config text for pytorch-kaldi config ``text``, the notes to log, and where options checked
    only at run time come from (``{"senone_size": "X.cfg [architecture2] dnn_lay"}``: ``Config.origins``).

    ``overrides`` are ``(section, option, value)`` in pytorch-kaldi's names, applied before translating.
    Raises ValueError listing every unsupported item at once, each naming the file, section and option.
    """
    text, joined = unwrap(text)
    try:
        parser = _read(text, source)
    except configparser.Error as error:
        raise ValueError(f"{source}: {error}") from None
    for section, option, value in overrides:
        if not parser.has_section(section):
            parser.add_section(section)
        parser.set(section, option.lower(), value)
    sections = {name: dict(parser.items(name)) for name in parser.sections()}
    problems: list[str] = []
    notes: list[str] = []
    if joined:
        notes.append(f"pytorch-kaldi {source}: line(s) {', '.join(map(str, joined))} start with no key of [datasetN]: "
                     "the rest of a hard-wrapped line, joined to the line before (pytorch-kaldi's configparser refuses "
                     "such a file)")
    archs = {}
    for name in sorted((s for s in sections if re.fullmatch(r"architecture\d+", s)), key=lambda s: int(s[12:])):
        translated = translate_architecture(sections[name], f"{source} [{name}]")
        problems += translated.problems
        notes += translated.notes
        archs[translated.name] = translated
    out = simple_sections(sections, source, problems, notes, any_seq_model=any(a.seq_model for a in archs.values()))

    fea_names = {line.split("=", 1)[1].strip() for name, options in sections.items() if name.startswith("dataset")
                 for line in options.get("fea", "").splitlines() if line.strip().startswith("fea_name=")}
    model = sections.get("model", {})
    forward_out = sections.get("forward", {}).get("forward_out", "")
    where = f"{source} [model] model"
    network = None
    try:
        program = parse_model(model.get("model", ""), where)
        network = resolve(program, fea_names, forward_out, where)
        problems += network.problems
    except ValueError as error:
        problems.append(str(error))
    for option in model:
        if option not in ("model", "model_proto"):
            problems.append(f"{source} [model] {option}: not an option of pytorch-kaldi's [model]")
    origins: dict[str, str] = {}
    if network is not None and network.chain:
        _network(network, archs, out, f"{source} [model]", problems, origins)
    if network is not None and network.senone_lab and network.senone_output:
        _counts_file(out, network.senone_lab, source, problems, notes)
    if problems:
        raise ValueError(f"{source}: a pytorch-kaldi config with {len(problems)} unsupported item(s) (all listed; "
                         "`cfg/README.md` maps its options to ours):\n  " + "\n  ".join(problems))
    units = {a.options.get("unit") for a in archs.values()}
    units |= {"cudnn"} if units & {"cudnn_lstm", "cudnn_gru"} else set()
    notes += [line for key, line in DIFFERENCES.items() if key in units or key == "all" or (key == "mse" and network.mse_arch)]
    return _write(out, archs, network), notes, origins


def _output(arch, label: str) -> bool:
    """Whether ``arch`` ends in the softmax output layer of ``label``: ``N_out_<label>`` or a number of classes."""
    return arch.output_of == f"N_out_{label}" or arch.output_of.isdigit()


def _network(network, archs: dict, out: dict, where: str, problems: list, origins: dict) -> None:
    """Our ``[model]`` (and each architecture's ``inputs`` where it does not read the one before it) from the
    resolved program, checking what each architecture's output layer is."""
    for name in network.chain + ([network.mono_arch] if network.mono_arch else []):
        if name not in archs:
            problems.append(f"{where}: compute({name},...) names no [architectureN] arch_name")
            return
    if not network.senone_output:  # an autoencoder: every architecture in the stack, no output layer
        for arch in network.chain:
            if archs[arch].output_of:
                problems.append(f"{where}: {arch} ends in a softmax output ({archs[arch].output_of}), but no cost_nll "
                                f"trains one (loss_final is an mse alone)")
        for k, name in enumerate(network.chain):
            if network.reads[name] != ([network.chain[k - 1]] if k else list(network.inputs)):
                archs[name].options["inputs"] = ",".join(network.reads[name])
        out["model"] = {"stack": ",".join(network.chain), "inputs": ",".join(network.inputs),
                        "senone_lab": network.senone_lab, "senone_output": "False",
                        "features_arch": network.features_arch, "mse_arch": network.mse_arch,
                        "mse_target": network.mse_target, "mse_weight": str(network.mse_weight)}
        return
    head = archs[network.chain[-1]]
    for arch in network.chain[:-1]:
        if archs[arch].output_of:
            problems.append(f"{where}: {arch} ends in a softmax output ({archs[arch].output_of}) but feeds another architecture")
    if not _output(head, network.senone_lab):
        problems.append(f"{where}: the senone output {network.senone_out} = compute({head.name},...) must end in an MLP "
                        f"layer N_out_{network.senone_lab or '<label>'} (or its number of classes) with softmax (its last "
                        f"layer is {head.output_of or 'not one'})")
    stack = network.chain if head.options.get("sizes") else network.chain[:-1]
    if not stack or (head.name not in stack and not set(network.reads.get(head.name, stack)) & set(stack)):
        problems.append(f"{where}: no layers between the features and the senone output")
    # what each reads where it is not the default: the one before it in the stack (the first: every input stream;
    # the output layers: the last of the stack)
    for k, name in enumerate(stack + ([head.name] if head.name not in stack else [])):
        default = [stack[k - 1]] if k else list(network.inputs)
        if network.reads.get(name, default) != default:
            archs[name].options["inputs"] = ",".join(network.reads[name])
    model = {"stack": ",".join(stack), "inputs": ",".join(network.inputs), "senone_lab": network.senone_lab,
             "senone_arch": head.name}
    if head.output_of.isdigit():
        model["senone_size"] = head.output_of
        origins["senone_size"] = head.output_where
    if network.mono_arch:
        mono = archs[network.mono_arch]
        if not _output(mono, network.mono_lab) or mono.options.get("sizes"):
            problems.append(f"{where}: the monophone output compute({mono.name},...) must be one MLP layer "
                            f"N_out_{network.mono_lab} (or its number of classes) with softmax")
        model.update(mono_lab=network.mono_lab, mono_weight=str(network.mono_weight), mono_arch=mono.name)
        if mono.output_of.isdigit():
            model["mono_size"] = mono.output_of
            origins["mono_size"] = mono.output_where
    if network.mse_arch:  # an architecture computed before the senone head: always in the stack
        model.update(mse_arch=network.mse_arch, mse_target=network.mse_target, mse_weight=str(network.mse_weight))
    out["model"] = model


def _counts_file(out: dict, senone_lab: str, source: str, problems: list, notes: list) -> None:
    """``[forward] normalize_with_counts_from`` naming a counts file rather than a label stream (pytorch-kaldi
    takes either): our ``lab_count_file`` of the senone labels in the training set, whose counts give the priors."""
    counts = out["forward"].get("normalize_with_counts_from", "")
    names = {line.split("=", 1)[1].strip() for name, options in out.items() if name.startswith("dataset")
             for line in options.get("lab", "").splitlines() if line.strip().startswith("lab_name=")}
    if not counts or counts in names:
        return
    train = out["data_use"].get("train_with", "")
    section = next((name for name, options in out.items() if name.startswith("dataset") and options.get("data_name") == train), None)
    lines, current, found = [], "", False
    for line in (out[section].get("lab", "") if section else "").splitlines():
        key, _, value = line.strip().partition("=")
        if key == "lab_name":
            current = value.strip()
        if current == senone_lab and key == "lab_count_file":
            continue  # replaced by the file, right after lab_name
        lines.append(line)
        if current == senone_lab and key == "lab_name":
            lines.append(f"lab_count_file={counts}")
            found = True
    if not found:
        problems.append(f"{source} [forward] normalize_with_counts_from = {counts}: neither a label stream "
                        f"({', '.join(sorted(names))}) nor a counts file for the senone labels {senone_lab} of the "
                        f"training set {train or '(none)'}")
        return
    out[section]["lab"] = "\n".join(lines)
    out["forward"]["normalize_with_counts_from"] = senone_lab
    notes.append(f"pytorch-kaldi [forward] normalize_with_counts_from = {counts}: a counts file, our lab_count_file of "
                 f"{senone_lab} in [{section}] (the training set's: its counts give the priors)")


def _write(out: dict, archs: dict, network) -> str:
    """The native INI text: our sections in our order, datasets' blocks as they were."""
    lines = []
    order = ["exp"] + sorted((s for s in out if s.startswith("dataset")), key=lambda s: int(s[7:])) + ["data_use", "batches"]
    for name in order:
        lines.append(f"[{name}]")
        for option, value in out.get(name, {}).items():
            value = "\n".join(f"    {v.strip()}" if i else v.strip() for i, v in enumerate(value.splitlines()) if v.strip())
            lines.append(f"{option} = {value}")
        lines.append("")
    used = set(network.chain) | ({network.mono_arch} if network.mono_arch else set())
    for number, arch in enumerate((a for a in archs.values() if a.name in used), 1):
        lines.append(f"[architecture{number}]")
        lines += [f"{k} = {v}" for k, v in arch.options.items()]
        lines.append("")
    for name in ("model", "forward", "decoding"):
        lines.append(f"[{name}]")
        lines += [f"{k} = {v}" for k, v in out.get(name, {}).items()]
        lines.append("")
    return "\n".join(lines)

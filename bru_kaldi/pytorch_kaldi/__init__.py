"""pytorch-kaldi's config format as a first-class input: translated into our native config text, which
``bru_kaldi.config`` then reads with its one parser.

A config is pytorch-kaldi's when it has a ``[cfg_proto]`` section, an ``[architectureN]`` with
``arch_class`` or a ``[model]`` with ``model=`` (:func:`is_pytorch_kaldi`). Every option of
pytorch-kaldi's schema (its ``proto/*.proto``) is, in :func:`translate`:

* honoured with pytorch-kaldi's meaning (``[datasetN]`` as it is; progressive values; the
  sequence-length curriculum; frame batches when no architecture is a sequence model; the network
  of ``[model] model=``, see :mod:`.model_graph`; the architectures, see :mod:`.architectures`, with
  pytorch-kaldi's batch-norm momentum 0.05 and dropout places);
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


def _read(text: str, source: str) -> configparser.ConfigParser:
    parser = configparser.ConfigParser(interpolation=None, inline_comment_prefixes=("#", ";"), strict=False)
    parser.optionxform = str.lower  # pytorch-kaldi's option names are case-insensitive
    parser.read_string(text, source=source)
    return parser


def is_pytorch_kaldi(text: str) -> bool:
    """Whether ``text`` is written in pytorch-kaldi's vocabulary rather than ours."""
    try:
        parser = _read(text, "<detect>")
    except configparser.Error:
        return False
    if parser.has_section("cfg_proto"):
        return True
    if parser.has_section("model") and parser.has_option("model", "model"):
        return True
    return any(re.fullmatch(r"architecture\d+", s) and parser.has_option(s, "arch_class") for s in parser.sections())


def translate(text: str, source: str = "<string>", overrides: Sequence[tuple[str, str, str]] = ()) -> tuple[str, list[str]]:
    """Our native config text for pytorch-kaldi config ``text``, and the notes to log.

    ``overrides`` are ``(section, option, value)`` in pytorch-kaldi's names, applied before translating.
    Raises ValueError listing every unsupported item at once, each naming the file, section and option.
    """
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
    if network is not None and network.chain:
        _network(network, archs, out, f"{source} [model]", problems)
    if problems:
        raise ValueError(f"{source}: a pytorch-kaldi config with {len(problems)} unsupported item(s) (all listed; "
                         "`cfg/README.md` maps its options to ours):\n  " + "\n  ".join(problems))
    units = {a.options.get("unit") for a in archs.values()}
    notes += [line for key, line in DIFFERENCES.items() if key in units or key == "all" or (key == "mse" and network.mse_arch)]
    return _write(out, archs, network), notes


def _network(network, archs: dict, out: dict, where: str, problems: list) -> None:
    """Our ``[model]`` from the resolved program, checking what each architecture's output layer is."""
    for name in network.chain + ([network.mono_arch] if network.mono_arch else []):
        if name not in archs:
            problems.append(f"{where}: compute({name},...) names no [architectureN] arch_name")
            return
    head = archs[network.chain[-1]]
    for arch in network.chain[:-1]:
        if archs[arch].output_of:
            problems.append(f"{where}: {arch} ends in a softmax output ({archs[arch].output_of}) but feeds another architecture")
    if head.output_of != f"N_out_{network.senone_lab}":
        problems.append(f"{where}: the senone output {network.senone_out} = compute({head.name},...) must end in an MLP "
                        f"layer N_out_{network.senone_lab} with softmax (its last layer is {head.output_of or 'not one'})")
    stack = network.chain if head.options.get("sizes") else network.chain[:-1]
    if not stack:
        problems.append(f"{where}: no layers between the features and the senone output")
    model = {"stack": ",".join(stack), "inputs": ",".join(network.inputs), "senone_lab": network.senone_lab,
             "senone_arch": head.name}
    if network.mono_arch:
        mono = archs[network.mono_arch]
        if mono.output_of != f"N_out_{network.mono_lab}" or mono.options.get("sizes"):
            problems.append(f"{where}: the monophone output compute({mono.name},...) must be one MLP layer "
                            f"N_out_{network.mono_lab} with softmax")
        model.update(mono_lab=network.mono_lab, mono_weight=str(network.mono_weight), mono_arch=mono.name)
    if network.mse_arch:  # an architecture of the chain before the senone head: always in the stack
        model.update(mse_arch=network.mse_arch, mse_target=network.mse_target, mse_weight=str(network.mse_weight))
    out["model"] = model


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

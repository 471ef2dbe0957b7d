"""pytorch-kaldi's ``[model] model=`` expressions: parsed, then resolved into our network's shape.

pytorch-kaldi describes the network as a program, one assignment a line (``utils.model_init`` and
``forward_model`` run it)::

    out_dnn1=compute(LSTM_layers,fmllr)          # an architecture applied to a feature stream
    out_dnn2=compute(MLP_layers,out_dnn1)        # ... or to another output
    out_dnn3=compute(MLP_layers2,out_dnn1)       # a second head on the same layers
    loss_mono=cost_nll(out_dnn3,lab_mono)        # mean NLL of a softmax output against a label stream
    loss_mono_w=mult_constant(loss_mono,1.0)
    loss_cd=cost_nll(out_dnn2,lab_cd)
    loss_final=sum(loss_cd,loss_mono_w)          # what is minimised
    err_final=cost_err(out_dnn2,lab_cd)          # the frame error reported

and ``loss_se=mse(out_dnn_SE,fbankclean)`` (``torch.mean((a - b) ** 2)``) compares an architecture's output
with a feature stream, e.g. summed into ``loss_final`` beside ``cost_nll`` (its joint-training recipes).

``concatenate(a,b)`` joins two feature streams or architectures' outputs per frame, ``a`` first; nested,
it joins three or more (``conc2=concatenate(conc1,fmllr)``).

Our network is a sequence of architectures (``[model] stack``), each reading the concatenation of feature
streams and outputs of architectures before it (``[architectureN] inputs``; by default the architecture
before it, the first all of ``[model] inputs``), ending in a senone softmax, with an optional monophone
softmax on the same layers and an optional ``mse`` of the output of one of those architectures against a
feature stream (``[model] mse_arch``, ``mse_target``, ``mse_weight``); :func:`resolve` maps a program onto
that and reports every construct that does not fit.

>>> g = parse_model("o1=compute(A,fmllr)\\no2=compute(B,o1)\\nloss_final=cost_nll(o2,lab_cd)\\nerr_final=cost_err(o2,lab_cd)", "x")
>>> g["o2"]
('compute', ['B', 'o1'])
>>> g = parse_model("c1=concatenate(mfcc,fbank)\\nc2=concatenate(c1,fmllr)\\no1=compute(A,c2)\\no2=compute(B,mfcc)\\n"
...                 "c3=concatenate(o1,o2)\\no3=compute(C,c3)\\nloss_final=cost_nll(o3,lab_cd)\\nerr_final=cost_err(o3,lab_cd)", "x")
>>> n = resolve(g, {"mfcc", "fbank", "fmllr"}, "o3", "x")
>>> n.chain, n.reads, n.inputs, n.problems
(['A', 'B', 'C'], {'A': ['mfcc', 'fbank', 'fmllr'], 'B': ['mfcc'], 'C': ['A', 'B']}, ['mfcc', 'fbank', 'fmllr'], [])
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

OPERATIONS = ("compute", "concatenate", "cost_nll", "cost_err", "mult", "mult_constant", "sum", "sum_constant",
              "avg", "mse")
_LINE = re.compile(r"^\s*([A-Za-z_][\w]*)\s*=\s*([A-Za-z_]\w*)\s*\((.*)\)\s*$")


def parse_model(text: str, where: str) -> dict[str, tuple[str, list[str]]]:
    """``name -> (operation, arguments)`` for each line of a ``model=`` block, in order.

    Raises ValueError naming the line that is not ``name=operation(arg,arg)``.
    """
    program: dict[str, tuple[str, list[str]]] = {}
    for number, line in enumerate(text.strip().splitlines(), 1):
        if not line.strip():
            continue
        match = _LINE.match(line)
        if not match:
            raise ValueError(f"{where}: line {number} {line.strip()!r}: expected name=operation(argument,argument)")
        name, operation, arguments = match.groups()
        program[name] = (operation, [a.strip() for a in arguments.split(",")])
    return program


@dataclass
class Network:
    """What a program describes, in our terms (see :func:`resolve`)."""

    inputs: list[str]  # the feature streams the network reads, in the order they are first read
    chain: list[str]  # architectures in the order they are computed; the last one ends with the senone softmax
    senone_out: str  # the variable of the senone softmax
    senone_lab: str
    mono_arch: str = ""  # the architecture that is the monophone softmax alone
    mono_lab: str = "none"
    mono_weight: float = 1.0
    mse_arch: str = ""  # the architecture of the chain whose output mse compares with the stream mse_target
    mse_target: str = ""
    mse_weight: float = 1.0
    # False: no senone output (an autoencoder: loss_final an mse alone, err_final cost_err of its output, whose
    # label stream is senone_lab); forward then writes the output of features_arch, forward_out's architecture
    senone_output: bool = True
    features_arch: str = ""
    # what each architecture of chain reads: feature streams and architectures, concatenated per frame in order
    reads: dict[str, list[str]] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)


def resolve(program: dict, fea_names: set[str], forward_out: str, where: str) -> Network:
    """Our network for ``program``: every construct we cannot build is added to ``network.problems``
    (all of them, so that one error can list them).

    ``forward_out`` (``[forward] forward_out``) names the senone output; ``loss_final`` must be its
    ``cost_nll``, alone or summed with one ``cost_nll`` of a monophone head and one ``mse`` of an output on
    the chain against a feature stream (each optionally through ``mult_constant``); ``err_final`` must be
    ``cost_err`` of the senone output.
    """
    problems: list[str] = []
    for name, (operation, _) in program.items():
        if operation not in OPERATIONS:
            problems.append(f"{where} line {name}=: unknown operation {operation!r} (pytorch-kaldi's are {', '.join(OPERATIONS)})")
        elif operation in ("mult", "sum_constant", "avg"):
            problems.append(f"{where} line {name}={operation}(...): not supported (we train cross-entropy on "
                            f"senones, with an optional monophone cost and an optional mse: cost_nll, mse, sum, "
                            f"mult_constant)")
    produced: dict[str, str] = {}  # the variables on the way to the senone output -> the architecture computing each
    chain: list[str] = []
    reads: dict[str, list[str]] = {}

    done: dict[str, list[str]] = {}  # variable -> what it concatenates, once resolved

    def read(variable: str, seen: tuple = ()) -> list[str]:
        """The streams and architectures ``variable`` concatenates; the architectures it needs are computed
        (added to ``chain``, after what they read) on the way."""
        if variable in fea_names:
            return [variable]
        if variable in done:  # read twice (two branches of one output): computed once
            return done[variable]
        operation, args = program.get(variable, ("missing", []))
        items: list[str] = []
        if variable in seen:
            problems.append(f"{where}: {variable} depends on itself")
            return items
        if operation == "compute" and len(args) == 2:
            arch = args[0]
            if arch in reads:
                problems.append(f"{where}: {arch} is computed twice (two compute({arch},...) lines): one architecture "
                                f"applied to two inputs shares its weights in pytorch-kaldi, which we do not support")
            else:
                reads[arch] = read(args[1], seen + (variable,))
                chain.append(arch)
                produced[variable] = arch
            items = [arch]
        elif operation == "concatenate" and len(args) == 2:
            items = read(args[0], seen + (variable,)) + read(args[1], seen + (variable,))
        else:
            problems.append(f"{where}: {variable!r} is neither a feature stream ({', '.join(sorted(fea_names))}) "
                            f"nor compute() / concatenate() of feature streams and architectures' outputs")
        done[variable] = items
        return items

    read(forward_out)
    inputs = list(dict.fromkeys(item for arch in chain for item in reads[arch] if item in fea_names))
    network = Network(inputs=inputs, chain=chain, senone_out=forward_out, senone_lab="", reads=reads, problems=problems)
    if not chain or program.get(forward_out, ("", []))[0] != "compute":
        problems.append(f"{where}: [forward] forward_out = {forward_out} is not the output of an architecture")
        return network
    trunk_out = program[forward_out][1][1]  # what the senone head reads

    terms = _loss_terms(program, "loss_final", 1.0, where, problems)
    for operation, operands, _ in terms:  # an mse of an output off the way to forward_out: a side branch, computed too
        for operand in operands if operation == "mse" else ():
            if operand not in fea_names and operand not in produced and program.get(operand, ("",))[0] == "compute":
                read(operand)
    network.inputs = list(dict.fromkeys(item for arch in chain for item in reads[arch] if item in fea_names))
    for operation, (out, label), weight in terms:
        if operation == "mse":
            _mse_term(network, out, label, weight, produced, fea_names, where, problems)
            continue
        if out == forward_out:
            network.senone_lab = label
            if weight != 1.0:
                problems.append(f"{where} loss_final: the senone cost has weight {weight}; only the monophone cost can be weighted")
            continue
        operation, args = program.get(out, ("missing", []))
        if operation != "compute" or args[1:] != [trunk_out] or network.mono_arch:
            problems.append(f"{where}: cost_nll({out},{label}) is not a second softmax on {trunk_out} (the layers the "
                            f"senone output reads): only a monophone head on the same layers is supported")
            continue
        network.mono_arch, network.mono_lab, network.mono_weight = args[0], label, weight
    error = program.get("err_final")
    if network.senone_lab:  # the senone output last: a side branch of the mse is computed before it
        chain.append(chain.pop(chain.index(produced[forward_out])))
    elif network.mse_arch and all(operation == "mse" for operation, _, _ in terms):
        # an autoencoder: the mse alone trains; forward writes forward_out's architecture's output (its code)
        network.senone_output, network.features_arch = False, produced[forward_out]
        mse_out = next(v for v, arch in produced.items() if arch == network.mse_arch)
        if error is None or error[0] != "cost_err" or len(error[1]) != 2 or error[1][0] != mse_out:
            problems.append(f"{where} err_final: expected cost_err({mse_out},<label>) (with no cost_nll, the frame "
                            f"error of the mse output, the architecture loss_final trains)")
        else:
            network.senone_lab = error[1][1]
    else:
        problems.append(f"{where} loss_final: no cost_nll({forward_out},<label>) of the senone output "
                        f"([forward] forward_out = {forward_out}) and no mse term to train a network without one")
    if network.senone_output and (error is None or error[0] != "cost_err" or error[1][0] != forward_out):
        problems.append(f"{where} err_final: expected cost_err({forward_out},{network.senone_lab or 'lab_cd'})")
    used = {forward_out, "loss_final", "err_final"} | set(_reachable(program, "loss_final"))
    used |= set(_reachable(program, forward_out))
    for name, (operation, _) in program.items():
        if name not in used:
            problems.append(f"{where} line {name}={operation}(...): not used by loss_final or forward_out")
    return network


def _mse_term(network: Network, first: str, second: str, weight: float, produced: dict, fea_names: set,
              where: str, problems: list) -> None:
    """``mse(first, second)`` as our ``mse_arch``, ``mse_target``, ``mse_weight``: one operand a feature
    stream (the target), the other the output of an architecture on the chain, not the senone output."""
    line = f"{where} mse({first},{second})"
    if (first in fea_names) == (second in fea_names):
        problems.append(f"{line}: expected one feature stream (the target: {', '.join(sorted(fea_names))}) and one "
                        f"output of an architecture, got {'two' if first in fea_names else 'no'} feature streams")
        return
    out, target = (second, first) if first in fea_names else (first, second)
    if out not in produced or out == network.senone_out:
        what = "the senone output, a softmax" if out == network.senone_out else (
            "not the output of an architecture on the way from the features to the senone output "
            f"({' -> '.join(network.chain)}): a side branch of layers is not supported")
        before = ", ".join(network.chain[:-1])
        expected = f"the output of one of {before}" if before else "the output of an architecture that feeds the senone output (none does here)"
        problems.append(f"{line}: {out} is {what}; expected {expected}")
        return
    if network.mse_arch:
        problems.append(f"{line}: a second mse term (the first compares {network.mse_arch}); only one is supported")
        return
    network.mse_arch, network.mse_target, network.mse_weight = produced[out], target, weight


def _loss_terms(program: dict, variable: str, weight: float, where: str, problems: list) -> list[tuple[str, list, float]]:
    """``(operation, [a, b], weight)`` of every ``cost_nll(a, b)`` and ``mse(a, b)`` summed into ``variable``."""
    if variable not in program:
        problems.append(f"{where}: no {variable}= line (pytorch-kaldi needs loss_final and err_final)")
        return []
    operation, args = program[variable]
    if operation in ("cost_nll", "mse") and len(args) == 2:
        return [(operation, args, weight)]
    if operation == "sum" and len(args) == 2:
        return _loss_terms(program, args[0], weight, where, problems) + _loss_terms(program, args[1], weight, where, problems)
    if operation == "mult_constant" and len(args) == 2:
        try:
            factor = float(args[1])
        except ValueError:
            problems.append(f"{where} line {variable}=mult_constant(...): {args[1]!r} is not a number")
            return []
        return _loss_terms(program, args[0], weight * factor, where, problems)
    problems.append(f"{where} line {variable}={operation}(...): a loss must be cost_nll, mse, sum or mult_constant of losses")
    return []


def _reachable(program: dict, variable: str) -> list[str]:
    seen, todo = [], [variable]
    while todo:
        name = todo.pop()
        if name in program and name not in seen:
            seen.append(name)
            todo.extend(program[name][1])
    return seen

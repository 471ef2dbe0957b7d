"""Experiment configs: pytorch-kaldi's INI vocabulary, parsed once into typed, validated dataclasses.

A config is read with the standard library's configparser, ``$VARIABLES`` in values are expanded from
the environment, command-line overrides ``--section,option=value`` are applied, and every section is
turned into a dataclass below (lists as lists, bools as bools). Unknown sections and options are
errors with a did-you-mean; bad values name the section, the option and what was expected. The
resolved config is written back as INI with :func:`write_resolved` (the experiment folder keeps it).

Sections: ``[exp]``, ``[datasetN]`` (feature streams ``fea=`` and label streams ``lab=`` as multi-line
blocks, as in pytorch-kaldi), ``[data_use]``, ``[batches]``, ``[architectureN]``, ``[model]``,
``[forward]``, ``[decoding]``.

Reading a config imports neither torch nor ``models``: an ``[architectureN]`` option that is not in the
schema is its unit's, kept as text (``Architecture.unit_options``), and the unit's code declares, reads and
checks it when the model is built (``bru_kaldi.network.check_architectures``, which ``run_exp.py`` calls right
after parsing). Long because it is the whole config format in one place: the schema of every section (each field
with its default, declared once), the parser that fills it, the checks that span sections (one block
after the schema), and the writer of ``config.resolved.cfg``, which is the parser's inverse.

>>> cfg = parse_config_text('''
... [exp]
... out_folder = exp/demo
... [dataset1]
... data_name = train
... fea = fea_name=fbank
...     fea_lst=data/train/feats.scp
... lab = lab_name=lab_cd
...     lab_folder=exp/mono_ali_train
... [data_use]
... train_with = train
... valid_with = train
... forward_with = train
... [architecture1]
... arch_name = rnn
... unit = libru
... sizes = 8,8
... [model]
... stack = rnn
... inputs = fbank
... senone_lab = lab_cd
... ''')
>>> cfg.architectures[0].sizes, cfg.architectures[0].bidirectional, cfg.datasets[0].fea[0].cw_left
([8, 8], [False], 0)
"""

from __future__ import annotations

import configparser
import dataclasses
import difflib
import os
import re
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Sequence

from bru_kaldi import pytorch_kaldi  # pytorch-kaldi's vocabulary, translated into ours before it is read
from bru_kaldi.atomic import write_text_atomically
from bru_kaldi.builtin_corpus import SIZES as BUILTIN_SIZES
from bru_kaldi.builtin_corpus import TASKS as BUILTIN_TASKS
from bru_kaldi.feature_transforms import parse_fea_opts
from bru_kaldi.schedules import dropout_schedule, expand_schedule
from bru_kaldi.scoring import scoring_filter


class ConfigError(ValueError):
    """A config that cannot be used: the message names the file, section and option."""


# The values some options take, each list in one place: the code that implements them imports it.
DEVICES = ("auto", "cpu", "cuda")  # auto: CUDA when available
# utterances over max_seq_length: split into near-equal pieces, cut into pieces of exactly max_seq_length
# frames (the last one shorter, as pytorch-kaldi), or dropped
LONG_UTTERANCES = ("split", "cut", "drop")
BATCH_UNITS = ("utterances", "frames")  # what batch_size_train counts; frames: shuffled single frames
DROPOUT_PLACES = ("input", "inside")  # see Architecture.dropout_at
INPUT_NORMS = ("none", "batch", "layer", "layer+batch")  # see Architecture.input_norm (models.norm.InputNorm)
OPTIMIZERS = ("sgd", "adam", "rmsprop", "adadelta")  # bru_kaldi.training.make_optimizer
OBJECTIVES = ("ce", "lfmmi")  # frame cross-entropy on the alignments; lattice-free MMI (bru_kaldi.chain)
# how the network's output is taken at 1 / frame_subsampling_factor of the frame rate (models.acoustic)
FRAME_SUBSAMPLING = ("output", "splice")
DEV_CRITERIA = ("auto", "frame_error", "loss")  # what the rate halving, patience and the best epoch follow
LFMMI_INITIAL_PROBS = ("kaldi", "unnormalised")  # the denominator's (bru_kaldi.chain.graph.denominator_initial_probs)
DECODERS = ("auto", "kaldi", "python")  # auto: Kaldi when its binaries are on PATH (bru_kaldi.decoding)


def choice(*values, default=None, help=""):
    """A field whose value must be one of ``values``."""
    return field(default=default, metadata={"choices": values, "help": help})


# --------------------------------------------------------------------------- schema
@dataclass
class Exp:
    """``[exp]``: where the run writes, its seed, its epochs and stopping rule, its device, the built-in corpus."""

    out_folder: str = ""  # experiment folder: checkpoints, res.res, posteriors, decodes
    seed: int = 1234
    n_epochs_tr: int = 24  # with patience, the most epochs a run may take (its budget)
    # stop once this many epochs in a row have not lowered the best dev frame error, and keep the weights of
    # the best epoch as final.pt (Kaldi's nnet1 keeps its best model too); 0: train all n_epochs_tr epochs
    patience: int = 0
    # what "dev improves" means for the rate halving ([architectureN] arch_improvement_threshold), patience and
    # the best epoch: the dev frame error, or the dev loss (with [model] objective = lfmmi the LF-MMI objective
    # alone, negated, as Kaldi's chain recipes follow it); auto: the loss for lfmmi, whose output is not
    # trained to classify frames, else the frame error
    dev_criterion: str = choice(*DEV_CRITERIA, default="auto")
    device: str = choice(*DEVICES, default="auto")  # auto: CUDA when available
    mixed_precision: bool = False  # bf16/fp16 autocast, CUDA only
    builtin_corpus: str = choice("none", *BUILTIN_SIZES, default="none")  # build the built-in corpus if missing
    # the default size's folder; every other size lives in a folder of its name inside it (_sized_corpus)
    builtin_corpus_dir: str = "recipes/mini_timit"
    builtin_corpus_task: str = choice(*BUILTIN_TASKS, default="phones")  # phones (TIMIT-like) or words (WSJ-like)


@dataclass
class FeatureStream:
    """One feature stream of a data set; several are concatenated per frame (e.g. fMLLR + MFCC + fbank)."""

    fea_name: str = ""
    fea_lst: str = ""  # feats.scp, or any rspecifier / Kaldi pipeline ("ark:copy-feats scp:a.scp ark:- |")
    fea_opts: str = ""  # CMVN and deltas, as Kaldi commands or key=value: see feature_transforms.parse_fea_opts
    cw_left: int = 0  # frames of left context spliced in
    cw_right: int = 0


@dataclass
class LabelStream:
    """One label stream of a data set, from an alignment directory (``ali.*.gz`` and ``final.mdl``)."""

    lab_name: str = ""
    lab_folder: str = ""  # alignment dir holding ali.*.gz and final.mdl
    # pdf-ids, or per-frame phones (an auxiliary monophone output)
    lab_opts: str = choice("ali-to-pdf", "ali-to-phones --per-frame=true", default="ali-to-pdf")
    lab_count_file: str = "auto"  # "auto" (pdf counts from these alignments), "none", or an analyze-counts file
    lab_data_folder: str = ""  # Kaldi data dir (text, utt2spk, cmvn.scp): decoding reads its references
    lab_graph: str = ""  # graph dir holding HCLG.fst and words.txt: what decoding searches


@dataclass
class Dataset:
    """A data set: its feature streams, its label streams (none for unlabelled test data), its chunks.

    The same object describes a ``[datasetN]`` section and what ``data_io.Corpus`` reads.
    """

    data_name: str = ""
    fea: list[FeatureStream] = field(default_factory=list)
    lab: list[LabelStream] = field(default_factory=list)
    n_chunks: int = 1  # the corpus is read one chunk at a time, re-drawn every epoch


@dataclass
class DataUse:
    """``[data_use]``: which ``data_name`` trains, which validates each epoch, which are forwarded and decoded."""

    train_with: str = ""
    valid_with: str = ""
    forward_with: list[str] = field(default_factory=list)


@dataclass
class Batches:
    """``[batches]``: utterances (or frames, ``batch_unit``) a batch, and where long training utterances are cut."""

    batch_size_train: int = 8
    max_seq_length_train: int = 1000
    batch_size_valid: int = 8
    max_seq_length_valid: int = 0  # 0: no limit
    long_utterances: str = choice(*LONG_UTTERANCES, default="split")
    max_missing_fraction: float = 0.05  # utterances missing from a stream or the labels: skipped up to this
    length_tolerance: int = 0  # frames by which features and alignments may differ (trimmed to the shortest)
    # per-epoch values in pytorch-kaldi's compact form, "128*12|64" (12 epochs of 128, then 64 to the end);
    # empty: batch_size_train / max_seq_length_train every epoch (bru_kaldi.schedules)
    batch_size_train_schedule: str = ""
    max_seq_length_train_schedule: str = ""
    # the sequence-length curriculum: epoch 1 trains on pieces of at most seq_len_start frames, each next
    # epoch on seq_len_factor times the previous length, up to the epoch's max_seq_length_train; 0: off
    seq_len_start: int = 0
    seq_len_factor: int = 2
    # frames: training batches of batch_size_train single frames drawn from the whole chunk (frame-wise
    # models only, as pytorch-kaldi batches non-recurrent models); validation and forward are unchanged
    batch_unit: str = choice(*BATCH_UNITS, default="utterances")


@dataclass
class Architecture:
    """``[architectureN]``: one block of recurrent layers (unit, sizes, directions, norm, dropout) and its optimiser."""

    arch_name: str = ""
    unit: str = "libru"  # a name of models.UNITS or models.CONV_UNITS, checked where the model is built (bru_kaldi.network)
    # what it reads, concatenated per frame in this order: streams of [model] inputs and architectures before it
    # in [model] stack (pytorch-kaldi's concatenate of outputs); empty: the architecture before it in the stack,
    # the first every [model] inputs stream. On senone_arch out of the stack: what the output layers read.
    inputs: list[str] = field(default_factory=list)
    sizes: list[int] = field(default_factory=list)  # one per layer
    # one value for every layer, or one per layer (models.per_layer expands them when the model is built)
    dropout: list[float] = field(default_factory=lambda: [0.0])
    # per-epoch rates, one compact schedule per layer (or one for every layer) joined by commas, each in
    # pytorch-kaldi's form "0.15*12|0.2*12" or a plain rate: the rates of epoch e replace dropout at its start
    # (bru_kaldi.schedules.scheduled_dropout); the last epoch's hold for forward; empty: dropout every epoch
    dropout_schedule: str = ""
    norm: list[str] = field(default_factory=lambda: ["none"])  # none, batch or layer
    # a norm of the architecture's input features before its first layer (pytorch-kaldi's *_use_batchnorm_inp,
    # *_use_laynorm_inp): batch (statistics over real frames, norm_momentum), layer (pytorch-kaldi's formula,
    # (x - mean) / (unbiased std + 1e-6) per frame), or layer+batch (layer first, as pytorch-kaldi)
    input_norm: str = choice(*INPUT_NORMS, default="none")
    bidirectional: list[bool] = field(default_factory=lambda: [False])
    # the options of its unit, any option not above, as the config writes them: the unit's code declares and reads
    # them (models.unit_options: a cell's __init__ signature; cfg/README.md's table), bru_kaldi.network checks them
    unit_options: dict[str, str] = field(default_factory=dict)
    arch_lr: float = 0.0008
    # per-epoch rates in pytorch-kaldi's compact form, "0.0004*10|0.0002*5": replaces arch_lr and turns
    # off the halving on dev plateaus (as pytorch-kaldi); empty: arch_lr with halving
    arch_lr_schedule: str = ""
    norm_momentum: float = 0.1  # batch norm: running statistics move by this fraction per batch
    # input: inverted dropout on each layer's input, one mask per sequence; inside: pytorch-kaldi's place, where
    # the unit has one (models.has_inner_dropout): on the candidate state of lstm/gru/ligru/rnn (one mask per
    # sequence, not rescaled in training, x(1-p) in evaluation), on the output of an mlp layer (per frame, inverted)
    dropout_at: str = choice(*DROPOUT_PLACES, default="input")
    arch_halving_factor: float = 0.5
    arch_improvement_threshold: float = 0.001
    arch_warmup_steps: int = 0  # the rate rises linearly to arch_lr over the run's first optimiser steps
    arch_opt: str = choice(*OPTIMIZERS, default="rmsprop")
    opt_momentum: float = 0.0
    opt_weight_decay: float = 0.0
    opt_alpha: float = 0.95  # rmsprop
    opt_eps: float = 1e-8
    opt_centered: bool = False
    # rmsprop: square average / (1 - alpha^t), so that the first steps are ~lr, not lr / sqrt(1 - alpha);
    # without it some seeds of the MINI configs blew up in their first steps (cfg/README.md)
    opt_bias_correction: bool = True
    opt_betas: list[float] = field(default_factory=lambda: [0.9, 0.999])  # adam
    opt_rho: float = 0.9  # adadelta
    opt_nesterov: bool = False
    clip_grad_norm: float = 0.0  # 0: no clipping


@dataclass
class Model:
    """``[model]``: the architectures stacked in order, the input streams, the outputs and their losses."""

    stack: list[str] = field(default_factory=list)  # arch_name of each architecture, input first
    inputs: list[str] = field(default_factory=list)  # fea_name of the streams concatenated per frame
    senone_lab: str = "lab_cd"
    mono_lab: str = "none"  # an auxiliary monophone output, as pytorch-kaldi's multi-task recipes
    mono_weight: float = 1.0
    # the architecture whose optimiser (and learning rate) trains the senone / monophone output layer;
    # empty: the last of the stack. One not in the stack has no layers of its own (sizes empty).
    senone_arch: str = ""
    mono_arch: str = ""
    # the number of classes the config expects of the senone / monophone output (pytorch-kaldi's dnn_lay = 1880
    # instead of N_out_lab_cd): a run whose labels have another number stops; 0: the labels' number, unchecked
    senone_size: int = 0
    mono_size: int = 0
    # an auxiliary regression term, pytorch-kaldi's mse(out, fea): the output of the stack's architecture
    # mse_arch against the feature stream mse_target (read with the inputs, normalised as they are, not fed to
    # the network unless it is one of them), the squared error averaged over real frames and the stream's
    # values, times mse_weight, added to the loss; empty: none
    mse_arch: str = ""
    mse_target: str = ""
    mse_weight: float = 1.0
    # False: no senone output layer; the model is trained by its mse term alone (pytorch-kaldi's autoencoder,
    # loss_final = mse(dec_out, fea)) and senone_lab only gives the frame error reported, pytorch-kaldi's
    # cost_err of the mse output (the argmax of its values against the labels)
    senone_output: bool = True
    # forward writes the output of this architecture of the stack as it is (pytorch-kaldi's forward_out of an
    # architecture that is no softmax: an autoencoder's code), not log-likelihoods; empty: log-likelihoods
    features_arch: str = ""
    # the training objective of the senone output: ce, or lfmmi (lattice-free MMI, bru_kaldi.chain), whose
    # options follow, with the defaults of Kaldi's chain recipes: the leaky HMM's coefficient, the weight of the
    # cross-entropy of a separate output head (xent_regularize) and that head's factor on its architecture's
    # learning rate (Kaldi's recipes set learning-rate-factor = 0.5 / xent_regularize: 0 here), L2 on the chain
    # output, the phone LM's order
    # (chain-est-phone-lm), the full-rate frames by which the numerator may move a phone's boundaries, and a
    # den.fst to train with instead of the phone LM estimated from the training alignments (Kaldi's
    # chain-make-den-fst's, e.g. of a triphone system, whose pdfs are the senone labels')
    objective: str = choice(*OBJECTIVES, default="ce")
    lfmmi_leaky_hmm: float = 0.1
    lfmmi_xent_regularize: float = 0.1
    lfmmi_xent_lr_factor: float = 0.0
    lfmmi_output_l2: float = 5e-5
    lfmmi_phone_lm_order: int = 4
    lfmmi_tolerance: int = 5
    # the HMM transition probabilities of final.mdl in the denominator and numerator, to this power: 1.0 as
    # Kaldi's chain-make-den-fst and the chain decoding graph (mkgraph.sh --self-loop-scale 1.0), which must
    # agree; 0 weighs every HMM arc 1 (this toolkit's first version, kept for the ablation in RESULTS.md)
    lfmmi_transition_scale: float = 1.0
    # the denominator's initial (leak) probabilities: kaldi (SetInitialProbs: each state's weights normalised
    # first), or unnormalised (the first version's, kept for the ablation in RESULTS.md)
    lfmmi_initial_probs: str = choice(*LFMMI_INITIAL_PROBS, default="kaldi")
    # the network's output at 1 / frame_subsampling_factor of the input frame rate (Kaldi's chain models: 3,
    # with the chain topology, lfmmi only): output, the network runs at the full rate and every f-th output
    # frame is kept; splice, f consecutive frames are one input and the network runs at 1 / f of the rate
    frame_subsampling_factor: int = 1
    frame_subsampling: str = choice(*FRAME_SUBSAMPLING, default="output")
    lfmmi_den_fst: str = ""


@dataclass
class Forward:
    """``[forward]``: how posteriors become the log-likelihoods written for the decoder."""

    normalize_posteriors: bool = True  # log-likelihoods = log posteriors - log priors
    normalize_with_counts_from: str = "lab_cd"  # the label stream whose counts give the priors: the senone one
    require_decoding: bool = True


@dataclass
class Decoding:
    """``[decoding]``: the decoder, its beams, the acoustic scales and insertion penalties tried on dev, the scoring."""

    decoder: str = choice(*DECODERS, default="auto")  # auto: Kaldi when its binaries are found
    # the corpus's scoring filter: plain, a corpus whose recipe keeps one (recipes/<corpus>/scoring_filter.txt:
    # timit, wsj, ami) or a filter file's path (bru_kaldi.scoring)
    scoring: str = "timit"
    min_active: int = 200
    max_active: int = 7000
    max_mem: int = 50000000
    beam: float = 13.0
    latbeam: float = 8.0
    acwt: float = 0.2
    # the Kaldi path: the lattices' acoustic scores times this after decoding (Kaldi's --post-decode-acwt; 10
    # for chain models), and score.sh's LM weights around it, so that they reach acoustic scales near 1
    post_decode_acwt: float = 1.0
    acwt_sweep: list[float] = field(default_factory=list)  # scales tried on dev; empty: acwt alone
    # word insertion penalties tried on dev with each scale (the Python decoder; Kaldi's score.sh has its own grid)
    wip_sweep: list[float] = field(default_factory=lambda: [0.0])
    # when the setting chosen on dev is the first or last of its grid (acwt_sweep, wip_sweep; Kaldi's LM weights
    # and penalties), the grid grows a value beyond that edge and dev is scored there too, at most this many
    # times an edge; a best setting still on an edge is marked in res.res (edge=) and in compare.py's tables
    grid_extensions: int = 4
    num_jobs: int = 0  # 0: one per CPU core


@dataclass
class Config:
    """A whole experiment config, parsed and validated by :func:`parse_config_text`: typed, not strings."""

    exp: Exp
    datasets: list[Dataset]
    data_use: DataUse
    batches: Batches
    architectures: list[Architecture]
    model: Model
    forward: Forward
    decoding: Decoding
    source: str = "<string>"
    # what a translated config (bru_kaldi.pytorch_kaldi) says about options it replaced: logged once per run
    notes: list[str] = field(default_factory=list)
    # for a translated config, where an option of ours comes from: "senone_size" -> "X.cfg [architecture2] dnn_lay",
    # so that an error found at run time names the file, section and option the user wrote
    origins: dict[str, str] = field(default_factory=dict)

    def dataset(self, name: str) -> Dataset:
        for d in self.datasets:
            if d.data_name == name:
                return d
        raise ConfigError(f"{self.source}: no [datasetN] has data_name = {name!r}; known: {[d.data_name for d in self.datasets]}")

    def architecture(self, name: str) -> Architecture:
        for a in self.architectures:
            if a.arch_name == name:
                return a
        raise ConfigError(f"{self.source}: no [architectureN] has arch_name = {name!r}")


# --------------------------------------------------------------------------- value conversion
def parse_scalar(text: str, kind, where: str):
    """``text`` as a ``kind`` (``bool``, ``int``, ``float``, ``str``); a :class:`ConfigError` naming ``where`` if it
    is not one. Used for every value of the schema, and for the units' options (``bru_kaldi.network``)."""
    text = text.strip()
    if kind is bool:
        lowered = text.lower()
        if lowered in ("true", "yes", "1", "on"):
            return True
        if lowered in ("false", "no", "0", "off"):
            return False
        raise ConfigError(f"{where}: expected a boolean (True or False), got {text!r}")
    try:
        return kind(text)
    except ValueError:
        raise ConfigError(f"{where}: expected {'an integer' if kind is int else 'a number' if kind is float else kind.__name__}, got {text!r}") from None


def split_items(text: str) -> list[str]:
    """The items of a list value, between commas or spaces: ``"0.1, 0.2 0.3"`` -> ``["0.1", "0.2", "0.3"]``."""
    return [item for item in re.split(r"[,\s]+", text.strip()) if item]


def _convert(cls, f: dataclasses.Field, text: str, where: str):
    kind = typing.get_type_hints(cls)[f.name]
    if typing.get_origin(kind) is typing.Union:  # Optional[X]: "none" is None
        if text.strip().lower() == "none":
            return None
        (kind,) = (k for k in typing.get_args(kind) if k is not type(None))
    if typing.get_origin(kind) is list:
        (element,) = typing.get_args(kind)
        return [parse_scalar(t, element, f"{where} (item {i + 1})") for i, t in enumerate(split_items(text))]
    value = parse_scalar(text, kind, where)
    choices = f.metadata.get("choices")
    if choices and value not in choices:
        close = difflib.get_close_matches(str(value), [str(c) for c in choices], n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ConfigError(f"{where}: {value!r} is not accepted{hint}; expected one of {', '.join(map(str, choices))}")
    return value


def _unknown(what: str, name: str, known: Sequence[str], where: str) -> ConfigError:
    close = difflib.get_close_matches(name, list(known), n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return ConfigError(f"{where}: unknown {what} {name!r}{hint}; accepted: {', '.join(sorted(known))}")


def _fill(cls, options: dict, where: str, problems: list[str], rest: Optional[dict] = None):
    """``cls`` from its options; every unknown option or bad value goes to ``problems`` (and keeps its default),
    or an unknown option to ``rest`` (as text) where it is given."""
    known = {f.name: f for f in dataclasses.fields(cls)}
    values = {}
    for name, text in options.items():
        try:
            if name not in known and rest is not None:
                rest[name] = text.strip()
                continue
            if name not in known:
                raise _unknown("option", name, known, where)
            values[name] = _convert(cls, known[name], text, f"{where} option {name}")
        except ConfigError as error:
            problems.append(str(error))
    return cls(**values)


def _streams(cls, block: str, key: str, where: str, problems: list[str]) -> list:
    """Split a multi-line ``fea=`` / ``lab=`` block into one dataclass per stream."""
    streams, current = [], None
    for number, line in enumerate(block.strip().splitlines(), 1):
        line = line.strip()
        if not line:
            continue
        if "=" not in line:
            problems.append(f"{where}: line {number} of the block is {line!r}; expected name=value")
            continue
        name, value = (s.strip() for s in line.split("=", 1))
        if name == key:
            current = {}
            streams.append(current)
        elif current is None:
            problems.append(f"{where}: each stream must start with {key}=, got {name}= first")
            continue
        current[name] = value
    return [_fill(cls, s, f"{where} ({key}={s[key]})", problems) for s in streams]


# --------------------------------------------------------------------------- parsing
SINGLE_SECTIONS = {"exp": Exp, "data_use": DataUse, "batches": Batches, "model": Model, "forward": Forward, "decoding": Decoding}
NUMBERED = ("dataset", "architecture")


_VARIABLE = re.compile(r"\$(?:\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}|([A-Za-z_][A-Za-z0-9_]*))")


def _expand(value: str, where: str) -> str:
    """Expand ``$VAR``, ``${VAR}`` and ``${VAR:-default}`` (default when unset or empty, itself expanded:
    ``${VAR:-$OTHER/x}``) from the environment.

    >>> os.environ["BRU_DOCTEST"] = "/corpora/timit"
    >>> _expand("$BRU_DOCTEST/data/train/feats.scp", "x"), _expand("${BRU_UNSET_VAR:-recipes/mini_timit}/data", "x")
    ('/corpora/timit/data/train/feats.scp', 'recipes/mini_timit/data')
    >>> _expand("${BRU_UNSET_VAR:-$BRU_DOCTEST/exp}", "x")
    '/corpora/timit/exp'
    """

    def substitute(match: re.Match) -> str:
        name = match.group(1) or match.group(3)
        default = match.group(2)
        found = os.environ.get(name)
        if found:
            return found
        if default is not None:
            return _expand(default, where)
        state = "is empty" if name in os.environ else "is not set"
        raise ConfigError(f"{where}: environment variable ${name} {state} (used in {value.strip()!r})")

    return _VARIABLE.sub(substitute, value)


def parse_overrides(arguments: Sequence[str]) -> list[tuple[str, str, str]]:
    """``--section,option=value`` arguments as ``(section, option, value)`` triples."""
    triples = []
    for argument in arguments:
        match = re.fullmatch(r"--([^,=]+),([^=]+)=(.*)", argument, flags=re.S)
        if not match:
            raise ConfigError(f"override {argument!r}: expected --section,option=value")
        triples.append(match.groups())
    return triples


def parse_config_text(text: str, overrides: Sequence[tuple[str, str, str]] = (), source: str = "<string>") -> Config:
    """Parse INI text (and overrides) into a validated :class:`Config`.

    Every problem of the config is reported at once: a :class:`ConfigError` lists them all, each naming
    its section and option (only a config the INI reader cannot read at all stops at its first error).
    """
    parser = configparser.ConfigParser(interpolation=None, inline_comment_prefixes=("#", ";"))
    parser.optionxform = str  # option names are case-sensitive, as in pytorch-kaldi
    try:
        parser.read_string(text, source=source)
    except configparser.Error as error:
        raise ConfigError(f"{source}: {error}") from None
    problems: list[str] = []
    for section, option, value in overrides:
        if not parser.has_section(section) and section in SINGLE_SECTIONS:
            parser.add_section(section)  # a section left to its defaults can still be overridden
        if not parser.has_section(section):
            problems.append(str(_unknown("section", section, parser.sections(), f"override --{section},{option}")))
            continue
        parser.set(section, option, value)

    sections = {}
    for section in parser.sections():
        base = re.sub(r"\d+$", "", section)
        if section not in SINGLE_SECTIONS and not (base in NUMBERED and base != section):
            known = list(SINGLE_SECTIONS) + [f"{n}N" for n in NUMBERED]
            problems.append(str(_unknown("section", section, known, source)))
            continue
        sections[section] = {}
        for key, value in parser.items(section):
            try:
                sections[section][key] = _expand(value, f"{source} [{section}] {key}")
            except ConfigError as error:
                problems.append(str(error))
    _sized_corpus(sections)

    def single(name):
        return _fill(SINGLE_SECTIONS[name], sections.get(name, {}), f"{source} [{name}]", problems)

    def numbered(base):
        names = sorted((s for s in sections if re.fullmatch(base + r"\d+", s)), key=lambda s: int(s[len(base):]))
        return [(name, sections[name]) for name in names]

    datasets = []
    for name, options in numbered("dataset"):
        where = f"{source} [{name}]"
        fea = _streams(FeatureStream, options.pop("fea", ""), "fea_name", f"{where} fea", problems)
        lab = _streams(LabelStream, options.pop("lab", ""), "lab_name", f"{where} lab", problems)
        dataset = _fill(Dataset, options, where, problems)
        dataset.fea, dataset.lab = fea, lab
        datasets.append(dataset)
    architectures = []
    for name, options in numbered("architecture"):
        unit_options: dict[str, str] = {}  # checked by the unit, where the model is built (bru_kaldi.network)
        architectures.append(_fill(Architecture, options, f"{source} [{name}]", problems, rest=unit_options))
        architectures[-1].unit_options = unit_options
    config = Config(
        exp=single("exp"), datasets=datasets, data_use=single("data_use"), batches=single("batches"),
        architectures=architectures, model=single("model"), forward=single("forward"),
        decoding=single("decoding"), source=source,
    )
    validate(config, problems)
    raise_problems(problems, source)
    return config


def _sized_corpus(sections: dict) -> None:
    """Point a config at the built-in corpus's folder for the size it asks for, in place.

    Each size has its own folder, so that trying ``--exp,builtin_corpus=tiny`` never touches the default
    corpus: the default size is built in ``builtin_corpus_dir`` (``recipes/mini_timit``) and another size
    in the folder of its name inside it (``recipes/mini_timit/tiny``). For a size other than the default,
    ``builtin_corpus_dir`` and every ``<builtin_corpus_dir>/data/...`` and ``.../exp/...`` path in any
    option (feature lists, labels, graphs, ``fea_opts``) move into that folder, so a config's paths need
    not change with the size. A ``builtin_corpus_dir`` already named for its size is used as it is: the
    resolved config an experiment writes reads back unchanged.

    >>> sections = {"exp": {"builtin_corpus": "tiny", "builtin_corpus_dir": "c/"},
    ...             "dataset1": {"fea": "fea_lst=c/data/train/feats.scp fea_opts=ark:c/data/x ark:cc/data/y"}}
    >>> _sized_corpus(sections); sections["exp"]["builtin_corpus_dir"], sections["dataset1"]["fea"]
    ('c/tiny', 'fea_lst=c/tiny/data/train/feats.scp fea_opts=ark:c/tiny/data/x ark:cc/data/y')
    """
    exp = sections.get("exp", {})
    size = exp.get("builtin_corpus", "none")
    if size in ("none", "default") or size not in BUILTIN_SIZES:
        return  # an unknown size is reported by the schema's check
    root = exp.get("builtin_corpus_dir", Exp.builtin_corpus_dir).rstrip("/") or "/"
    if Path(root).name == size:
        return
    # the root as a whole path component, followed by the corpus's own data/ or exp/ folder
    inside = re.compile(r"(?<![\w./-])" + re.escape(root) + r"/(?=(?:data|exp)(?:/|\s|$))")
    for options in sections.values():
        for key, value in options.items():
            options[key] = inside.sub(f"{root}/{size}/", value)
    exp["builtin_corpus_dir"] = f"{root}/{size}"


def raise_problems(problems: Sequence[str], source: str) -> None:
    """One :class:`ConfigError` for every problem found (nothing when there is none)."""
    if len(problems) == 1:
        raise ConfigError(problems[0])
    if problems:
        raise ConfigError(f"{source}: {len(problems)} problems:\n  " + "\n  ".join(problems))


def parse_config(path, overrides: Sequence[str] = ()) -> Config:
    """Read ``path`` and apply ``--section,option=value`` overrides."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist")
    text = path.read_text()
    if pytorch_kaldi.is_pytorch_kaldi(text):  # pytorch-kaldi's own vocabulary: translated to ours, then read
        try:
            text, notes, origins = pytorch_kaldi.translate(text, str(path), parse_overrides(overrides))
        except ValueError as error:
            raise ConfigError(str(error)) from None
        config = parse_config_text(text, source=str(path))
        config.notes, config.origins = notes, origins
        return config
    return parse_config_text(text, parse_overrides(overrides), source=str(path))


def convert_pytorch_kaldi(path, overrides: Sequence[tuple[str, str, str]] = ()) -> str:
    """The native config text of pytorch-kaldi config file ``path``, its notes as comments on top
    (``run_exp.py --convert``). Raises ConfigError for a missing, native or unsupported config."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist")
    text = path.read_text()
    if not pytorch_kaldi.is_pytorch_kaldi(text):
        raise ConfigError(f"{path}: already in our native vocabulary (no [cfg_proto], arch_class or [model] model=)")
    try:
        native, notes, _ = pytorch_kaldi.translate(text, str(path), overrides)
    except ValueError as error:
        raise ConfigError(str(error)) from None
    header = [f"# {path}, translated from pytorch-kaldi's vocabulary"] + [f"# {note}" for note in dict.fromkeys(notes)]
    return "\n".join(header) + "\n" + native


# --------------------------------------------------------------------------- cross-section checks
def validate(config: Config, problems: Optional[list[str]] = None) -> None:
    """Checks that span options and sections; each problem found goes to ``problems`` (raised at once,
    all of them, when it is None).

    What a unit accepts (its name, its options, per-layer lists of the right length, norm names) is
    checked by the models themselves, where the model is built (``bru_kaldi.network``), so that
    reading a config needs neither torch nor ``models``.
    """
    found: list[str] = [] if problems is None else problems
    add = found.append
    src = config.source
    if not config.exp.out_folder:
        add(f"{src} [exp] out_folder: required (the experiment folder)")
    if config.exp.n_epochs_tr < 1:
        add(f"{src} [exp] n_epochs_tr: expected at least 1 epoch, got {config.exp.n_epochs_tr}")
    if config.exp.patience < 0:
        add(f"{src} [exp] patience: expected epochs >= 0 (0: no early stop), got {config.exp.patience}")
    names = [d.data_name for d in config.datasets]
    if not config.datasets:
        add(f"{src}: at least one [datasetN] section is required")
    for d in config.datasets:
        if not d.data_name or not d.fea:
            add(f"{src}: every [datasetN] needs data_name and at least one fea stream")
        if d.n_chunks < 1:
            add(f"{src} dataset {d.data_name} n_chunks: expected a positive integer, got {d.n_chunks}")
        for stream in d.fea:  # here, not when the chunk is loaded minutes later
            try:
                parse_fea_opts(stream.fea_opts)
            except ValueError as error:
                add(f"{src} dataset {d.data_name} stream {stream.fea_name}: {error}")
    b = config.batches
    for option in ("batch_size_train", "batch_size_valid"):
        if getattr(b, option) < 1:
            add(f"{src} [batches] {option}: expected at least 1, got {getattr(b, option)}")
    for option, kind in (("batch_size_train_schedule", int), ("max_seq_length_train_schedule", int)):
        _check_schedule(getattr(b, option), kind, config.exp.n_epochs_tr, f"{src} [batches] {option}", add)
    if b.seq_len_start < 0 or b.seq_len_factor < 1:
        add(f"{src} [batches] seq_len_start, seq_len_factor: expected frames >= 0 (0: no curriculum) and a factor "
            f">= 1, got {b.seq_len_start} and {b.seq_len_factor}")
    if not 0.0 <= b.max_missing_fraction <= 1.0:
        add(f"{src} [batches] max_missing_fraction: expected a fraction in [0, 1], got {b.max_missing_fraction}")
    if b.length_tolerance < 0:
        add(f"{src} [batches] length_tolerance: expected frames >= 0, got {b.length_tolerance}")
    use = config.data_use
    for option, value in (("train_with", use.train_with), ("valid_with", use.valid_with), *(("forward_with", v) for v in use.forward_with)):
        if value not in names:
            add(str(_unknown(f"dataset for {option}", value, names, f"{src} [data_use]")))
    arch_names = [a.arch_name for a in config.architectures]
    for a in config.architectures:
        where = f"{src} [architecture arch_name={a.arch_name}]"
        head_only = a.arch_name not in config.model.stack and a.arch_name in (config.model.senone_arch, config.model.mono_arch)
        if (not a.sizes and not head_only) or (a.sizes and min(a.sizes) < 1):
            add(f"{where} sizes: expected positive layer sizes, got {a.sizes} (only an architecture named by "
                f"[model] senone_arch / mono_arch and not in the stack may have none)")
        if not a.sizes and a.input_norm != "none":
            add(f"{where} input_norm = {a.input_norm}: an architecture without layers (an output layer alone) has no "
                f"input to normalise; expected none")
        _check_schedule(a.arch_lr_schedule, float, config.exp.n_epochs_tr, f"{where} arch_lr_schedule", add)
        if a.dropout_schedule:
            try:
                dropout_schedule(a.dropout_schedule, max(len(a.sizes), 1), config.exp.n_epochs_tr)
            except ValueError as error:
                add(f"{where} dropout_schedule: {error}")
        if not 0 < a.norm_momentum <= 1:
            add(f"{where} norm_momentum: expected a fraction in (0, 1], got {a.norm_momentum}")
        if not a.arch_lr > 0:
            add(f"{where} arch_lr: expected a positive learning rate, got {a.arch_lr}")
        if a.arch_warmup_steps < 0:
            add(f"{where} arch_warmup_steps: expected steps >= 0, got {a.arch_warmup_steps}")
        if not 0 < a.arch_halving_factor <= 1:
            add(f"{where} arch_halving_factor: expected a factor in (0, 1], got {a.arch_halving_factor}")
    if not config.model.stack:
        add(f"{src} [model] stack: name the architectures to stack, input first (arch_name values)")
    for name in config.model.stack:
        if name not in arch_names:
            add(str(_unknown("architecture in stack", name, arch_names, f"{src} [model]")))
    for option in ("senone_arch", "mono_arch"):
        value = getattr(config.model, option)
        if value and value not in arch_names:
            add(str(_unknown(f"architecture for {option}", value, arch_names, f"{src} [model]")))
    fea_names = {s.fea_name for d in config.datasets for s in d.fea}
    for name in config.model.inputs:
        if name not in fea_names:
            add(str(_unknown("feature stream in inputs", name, fea_names, f"{src} [model]")))
    _check_wiring(config, add)
    for option in ("senone_size", "mono_size"):
        if getattr(config.model, option) < 0:
            add(f"{src} [model] {option}: expected a number of classes (0: the labels'), got {getattr(config.model, option)}")
    _check_mse(config.model, fea_names, src, add)
    _check_features(config, src, add)
    _check_lfmmi(config.model, src, add)
    if config.forward.normalize_posteriors and config.forward.normalize_with_counts_from != config.model.senone_lab:
        add(f"{src} [forward] normalize_with_counts_from: the priors divide the senone posteriors, so it must "
            f"name [model] senone_lab = {config.model.senone_lab!r}, got {config.forward.normalize_with_counts_from!r}")
    try:
        scoring_filter(config.decoding.scoring)
    except (ValueError, OSError) as error:
        add(f"{src} [decoding] scoring: {error}")
    if config.decoding.grid_extensions < 0:
        add(f"{src} [decoding] grid_extensions: expected 0 (never extend the grid) or more, "
            f"got {config.decoding.grid_extensions}")
    lab_names = {s.lab_name for d in config.datasets for s in d.lab}
    for option in ("senone_lab", "mono_lab"):
        value = getattr(config.model, option)
        if option == "mono_lab" and value == "none":
            continue
        if lab_names and value not in lab_names:
            add(str(_unknown(f"label stream for {option}", value, lab_names, f"{src} [model]")))
    if problems is None:
        raise_problems(found, src)


def _check_wiring(config: Config, add) -> None:
    """``[architectureN] inputs``: streams of ``[model] inputs`` and architectures computed before, each once; only
    on an architecture of the stack or on ``senone_arch`` out of it (what the output layers read)."""
    model, src = config.model, config.source
    for arch in config.architectures:
        if not arch.inputs:
            continue
        where = f"{src} [architecture arch_name={arch.arch_name}] inputs"
        if arch.arch_name in model.stack:
            before = model.stack[:model.stack.index(arch.arch_name)]
        elif arch.arch_name == model.senone_arch:
            before = model.stack
        else:
            add(f"{where}: only an architecture of [model] stack, or [model] senone_arch, reads inputs (the monophone "
                f"output reads what the senone output reads)")
            continue
        for item in arch.inputs:
            if item not in model.inputs and item not in before:
                add(f"{where}: {item!r} is neither a stream of [model] inputs ({', '.join(model.inputs) or 'none'}) nor "
                    f"an architecture before it in [model] stack ({', '.join(before) or 'none'})")
        if len(set(arch.inputs)) != len(arch.inputs):
            add(f"{where}: {', '.join(arch.inputs)} names one item twice")
        if arch.arch_name not in model.stack and not set(arch.inputs) & set(model.stack):
            add(f"{where}: the output layers read no architecture of the stack ({', '.join(arch.inputs)})")


def _check_mse(model: Model, fea_names: set, src: str, add) -> None:
    """``[model] mse_arch``, ``mse_target``, ``mse_weight``: both or neither, an architecture of the stack, a
    feature stream, a weight >= 0."""
    if bool(model.mse_arch) != bool(model.mse_target):
        add(f"{src} [model] mse_arch, mse_target: the mse term needs both, the architecture whose output is "
            f"compared and the feature stream it is compared with (got {model.mse_arch!r} and {model.mse_target!r})")
        return
    if not model.mse_arch:
        return
    if model.mse_arch not in model.stack:
        add(str(_unknown("architecture for mse_arch (one of the stack)", model.mse_arch, model.stack, f"{src} [model]")))
    if model.mse_target not in fea_names:
        add(str(_unknown("feature stream for mse_target", model.mse_target, fea_names, f"{src} [model]")))
    if not model.mse_weight >= 0:
        add(f"{src} [model] mse_weight: expected a weight >= 0, got {model.mse_weight}")


def _check_features(config, src: str, add) -> None:
    """``[model] senone_output = False`` and ``features_arch``: what a model without a senone output needs (an mse
    term to train it, nothing that reads senones), and what writing an architecture's output excludes."""
    model, forward = config.model, config.forward
    if not model.senone_output:
        if not model.mse_arch:
            add(f"{src} [model] senone_output = False: the model needs an mse term to train (mse_arch, mse_target)")
        if model.mono_lab != "none" or model.objective != "ce" or model.senone_arch:
            add(f"{src} [model] senone_output = False: expected no mono_lab, senone_arch and objective = ce (got "
                f"{model.mono_lab!r}, {model.senone_arch!r}, {model.objective!r})")
        if not model.features_arch:
            add(f"{src} [model] senone_output = False: forward needs features_arch, the architecture whose output it writes")
    if model.features_arch:
        if model.features_arch not in model.stack:
            add(str(_unknown("architecture for features_arch (one of the stack)", model.features_arch, model.stack,
                             f"{src} [model]")))
        if forward.normalize_posteriors or forward.require_decoding:
            add(f"{src} [model] features_arch = {model.features_arch}: forward writes that architecture's output, not "
                f"log-likelihoods: set [forward] normalize_posteriors = False and require_decoding = False")


def _check_lfmmi(model: Model, src: str, add) -> None:
    """The LF-MMI options: coefficients in their ranges, an order >= 1, a tolerance >= 0; frame subsampling
    for lfmmi only, with a tolerance that leaves no output frame without a phone (Kaldi's rule)."""
    if not 0 <= model.lfmmi_leaky_hmm < 1:
        add(f"{src} [model] lfmmi_leaky_hmm: expected 0 <= coefficient < 1 (Kaldi 0.1), got {model.lfmmi_leaky_hmm}")
    for option in ("lfmmi_xent_regularize", "lfmmi_xent_lr_factor", "lfmmi_output_l2", "lfmmi_transition_scale"):
        if not getattr(model, option) >= 0:
            add(f"{src} [model] {option}: expected a value >= 0, got {getattr(model, option)}")
    if model.lfmmi_phone_lm_order < 1:
        add(f"{src} [model] lfmmi_phone_lm_order: expected an order >= 1 (Kaldi 4), got {model.lfmmi_phone_lm_order}")
    if model.lfmmi_tolerance < 0:
        add(f"{src} [model] lfmmi_tolerance: expected frames >= 0, got {model.lfmmi_tolerance}")
    factor = model.frame_subsampling_factor
    if factor < 1:
        add(f"{src} [model] frame_subsampling_factor: expected a factor >= 1 (Kaldi's chain models 3), got {factor}")
    elif factor > 1 and model.objective != "lfmmi":
        add(f"{src} [model] frame_subsampling_factor = {factor}: only for objective = lfmmi (a chain model's "
            f"one-state topology lasts one output frame; a cross-entropy model's HMMs need the full rate)")
    elif factor > 1 and 2 * model.lfmmi_tolerance + 1 < factor:
        add(f"{src} [model] lfmmi_tolerance = {model.lfmmi_tolerance}: at frame_subsampling_factor = {factor} some "
            f"output frames would allow no phone; Kaldi requires 2 lfmmi_tolerance + 1 >= frame_subsampling_factor")


def _check_schedule(text: str, kind, epochs: int, where: str, add) -> None:
    if not text:
        return
    try:
        values = expand_schedule(text, kind, epochs)
    except ValueError as error:
        add(f"{where}: {error}")
        return
    if min(values) <= 0:
        add(f"{where}: expected positive values, got {text!r}")


# --------------------------------------------------------------------------- writing
RESOLVED_FROM = "# resolved from "
# Options whose default changed: what a resolved config written before they existed meant by leaving
# them out (plain RMSprop), so that resuming such a folder under the new default is seen as a change.
LEGACY_DEFAULTS = {("architecture", "opt_bias_correction"): "False",
                   # the first LF-MMI: no output L2, every HMM arc weight 1, leak probabilities unnormalised
                   ("model", "lfmmi_output_l2"): "0.0", ("model", "lfmmi_transition_scale"): "0.0",
                   ("model", "lfmmi_initial_probs"): "unnormalised", ("model", "lfmmi_xent_lr_factor"): "1.0"}


def option_default(section: str, option: str) -> Optional[str]:
    """What a resolved config that does not list ``[section] option`` meant by it: its default as
    :func:`write_resolved` writes it (``architecture2`` is an ``[architectureN]``), the old default
    of an option whose default changed (:data:`LEGACY_DEFAULTS`), or None for an option the schema
    does not have.

    >>> option_default("architecture2", "arch_warmup_steps"), option_default("exp", "nothing")
    ('0', None)
    >>> option_default("architecture1", "opt_bias_correction")  # plain RMSprop, before it existed
    'False'
    """
    base = re.sub(r"\d+$", "", section)
    if (base, option) in LEGACY_DEFAULTS:
        return LEGACY_DEFAULTS[(base, option)]
    cls = SINGLE_SECTIONS.get(section) or {"architecture": Architecture, "dataset": Dataset}.get(base)
    fields = {f.name: f for f in dataclasses.fields(cls)} if cls else {}
    if option not in fields or option in ("fea", "lab"):
        return None
    f = fields[option]
    if f.name == "unit_options":
        return None
    default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
    return _format(default)


# A resolved config written before the units declared their own options listed every unit's options in every
# [architectureN], those the config left to the unit as none, default or empty, except this one, whose default
# the schema held then (bru's and libru's own now): read as left to the unit, so that such folders resume and
# their runs stay seeds of one system with the runs written since.
LEGACY_UNIT_DEFAULTS = {"form": "log"}


def inert_options(options: dict) -> set:
    """The ``(section, option)`` keys of a resolved config's ``options`` (``(section, option) -> value``) that
    cannot change what it trains: LF-MMI's options (``[model] lfmmi_*`` and ``frame_subsampling``) of a run
    whose ``[model] objective`` is not ``lfmmi``. Comparisons of configs (resuming a folder, the seeds of one
    system) leave them out, so that a cross-entropy run written before they existed, or before their
    defaults changed (:data:`LEGACY_DEFAULTS`), is the same experiment as one written after.

    >>> sorted(inert_options({("model", "objective"): "ce", ("model", "lfmmi_tolerance"): "5",
    ...                       ("model", "stack"): "rnn"}))
    [('model', 'lfmmi_tolerance')]
    """
    if options.get(("model", "objective"), "ce") == "lfmmi":
        return set()
    return {(section, option) for section, option in options
            if section == "model" and (option.startswith("lfmmi_") or option == "frame_subsampling")}


def left_to_the_unit(section: str, option: str, value: str) -> bool:
    """Whether ``[section] option = value`` of a resolved config is a unit's option (of an ``[architectureN]``,
    not in the schema) left at the unit's own default: ``none`` or ``default`` (per layer too), empty, or what
    an older resolved config wrote for it (:data:`LEGACY_UNIT_DEFAULTS`).

    >>> left_to_the_unit("architecture1", "rho0", "None"), left_to_the_unit("architecture2", "activation", "default,default")
    (True, True)
    >>> left_to_the_unit("architecture1", "backward", "kalman"), left_to_the_unit("architecture1", "arch_lr", "none")
    (False, False)
    """
    if re.sub(r"\d+$", "", section) != "architecture" or option in {f.name for f in dataclasses.fields(Architecture)}:
        return False
    return all(v.strip().lower() in ("none", "default", "") for v in value.split(",")) or \
        LEGACY_UNIT_DEFAULTS.get(option) == value.strip()


def _format(value) -> str:
    if isinstance(value, list):
        return ",".join("none" if v is None else str(v) for v in value)
    return str(value)


def write_resolved(config: Config, path) -> None:
    """Write the fully resolved config (every option, defaults included; of a unit's options, those the config
    sets, the rest being the unit's defaults) as INI, atomically.

    The first line is a comment naming the config it was resolved from (``compare.py`` names runs by it).
    """
    lines = [f"{RESOLVED_FROM}{config.source}"]

    def section(name, obj, skip=()):
        lines.append(f"[{name}]")
        for f in dataclasses.fields(obj):
            if f.name == "unit_options":  # an architecture's unit's options, each on a line of its own
                lines.extend(f"{option} = {value}" for option, value in getattr(obj, f.name).items())
            elif f.name not in skip:
                lines.append(f"{f.name} = {_format(getattr(obj, f.name))}")
        lines.append("")

    section("exp", config.exp)
    for i, d in enumerate(config.datasets, 1):
        section(f"dataset{i}", d, skip=("fea", "lab"))
        for key, streams in (("fea", d.fea), ("lab", d.lab)):
            if streams:
                body = "\n".join(f"\t{f.name}={_format(getattr(s, f.name))}" for s in streams for f in dataclasses.fields(s))
                lines.insert(len(lines) - 1, f"{key} =\n{body}")
    section("data_use", config.data_use)
    section("batches", config.batches)
    for i, a in enumerate(config.architectures, 1):
        section(f"architecture{i}", a)
    for name in ("model", "forward", "decoding"):
        section(name, getattr(config, name))
    write_text_atomically(path, "\n".join(lines))

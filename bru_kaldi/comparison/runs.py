"""Experiment folders read back as runs, and runs grouped into systems (one config, several seeds).

A run is what ``run_exp.py`` left in one experiment folder: ``config.resolved.cfg`` (what was trained),
``res.res`` (one line per epoch, then one per decoded set), ``log.txt`` (frames per second), ``final.pt``
(the weights, for the parameter count) and ``decode_<set>/per_utt`` (errors per utterance, for the
tests). Runs whose resolved configs agree on everything but ``[exp] seed`` and ``[exp] out_folder``
are the seeds of one :class:`System`.

:func:`archive_run` copies those files of a finished run, without the weights (the parameter count goes
into ``parameters``), so that a study's runs can be kept in the repository: they read back as the same
runs, and a sweep over them skips them as finished.
"""

from __future__ import annotations

import configparser
import glob
import hashlib
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

from bru_kaldi.config import LEGACY_DEFAULTS, RESOLVED_FROM, inert_options, left_to_the_unit, option_default

# Options that differ between the seeds of one system (or only say where it ran).
PER_RUN = {("exp", "seed"), ("exp", "out_folder"), ("exp", "device"), ("exp", "builtin_corpus_dir")}

_EPOCH = re.compile(r"^epoch=(\d+) .*dev_err=(\S+) .*time=(\S+)s")
_DECODED = re.compile(r"^(\S+): %WER (\S+) \[ (\d+) / (\d+),")
_FRAMES_PER_SECOND = re.compile(r"epoch=\d+ .*\((\d+) frames/s\)")
_MACHINE = re.compile(r"machine: \d{4}-\d\d-\d\d, (.*)$")  # bru_kaldi.machine.run_line
_FIELD = re.compile(r" (\w+)=(\S+)")  # a decoded set's "acwt=0.2 wip=0 decoder=python ... edge=acwt"


@dataclass
class Run:
    """One finished (or unfinished) experiment folder."""

    folder: Path
    source: str  # the config it was resolved from
    seed: int
    key: str  # what the seeds of one system share
    architectures: list[dict]  # unit, sizes, bidirectional of each [architectureN] of the stack
    options: frozenset = frozenset()  # ("[section] option", value) of everything the seeds share
    epochs: list[dict] = field(default_factory=list)  # {"epoch", "dev_err", "seconds"}
    errors: dict[str, float] = field(default_factory=dict)  # set -> error rate (percent), as res.res says
    frames_per_second: Optional[float] = None
    parameters: Optional[int] = None
    machine: Optional[str] = None  # where it trained (CPU, cores, threads, torch, device), if log.txt says
    # the axes of the decoding grid (acwt, wip, lmwt) whose edge the setting chosen on the tuning set is on
    # (tuning_edges): a run that may have been decoded below its best
    edges: list[str] = field(default_factory=list)
    tuned_on: str = ""  # the set the decoding setting was chosen on ([data_use] valid_with), where it was decoded

    @property
    def finished(self) -> bool:
        return bool(self.errors)

    @property
    def training_seconds(self) -> float:
        return sum(e["seconds"] for e in self.epochs)

    def held_out(self, name: str) -> Optional[tuple[float, int, int]]:
        """Set ``name``'s error rate (percent) over its utterances that the tuning set does not hold, with how
        many are kept and how many left out: what a column says when the decoding setting was chosen on part
        of it (``dev_core`` of ``dev``). None where the tuning set shares no utterance with it (or is it), or
        either's counts are missing."""
        if not self.tuned_on or name == self.tuned_on:
            return None
        try:
            counts, tuning = self.per_utterance(name), self.per_utterance(self.tuned_on)
        except FileNotFoundError:
            return None
        kept = [u for u in counts if u not in tuning]
        if len(kept) == len(counts) or not kept:
            return None
        tokens = sum(counts[u][0] for u in kept)
        return 100.0 * sum(counts[u][1] for u in kept) / tokens, len(kept), len(counts) - len(kept)

    def per_utterance(self, name: str) -> dict[str, tuple[int, int]]:
        """``{utterance: (reference length, errors)}`` of decoded set ``name``."""
        path = self.folder / f"decode_{name}" / "per_utt"
        if not path.is_file():
            raise FileNotFoundError(f"{path}: no per-utterance counts (was set {name} decoded with references?)")
        counts = {}
        for line in path.read_text().splitlines():
            if line.startswith("#") or not line.strip():
                continue
            utt, ref_len, errors, *_ = line.split()
            counts[utt] = (int(ref_len), int(errors))
        return counts


def _is_default(section: str, option: str, value: str) -> bool:
    """Whether ``value`` is what the schema means when the option is left out: its default, or a per-layer
    list of nothing but the default (``default,default``). Such options leave a system's key alone, so
    that runs written before an option existed (or before it was written per layer) stay seeds of the
    same system as runs written after; so does a unit's option left at the unit's default
    (``config.left_to_the_unit``). An option whose default changed (``LEGACY_DEFAULTS``) always counts:
    a run that does not list it meant its old default."""
    if (re.sub(r"\d+$", "", section), option) in LEGACY_DEFAULTS:
        return False
    if left_to_the_unit(section, option, value):
        return True
    default = option_default(section, option)
    return default is not None and (value == default or
                                    (default != "" and all(v.strip() == default for v in value.split(","))))


def tuning_edges(setting: dict[str, str], resolved: configparser.ConfigParser) -> list[str]:
    """The axes whose edge the setting chosen on the tuning set is on, from its ``res.res`` fields: ``edge=``
    where the decode recorded its grid (``grid=``, since the grid grows past an edge, ``bru_kaldi.decoding.sets.
    tune``); for a run decoded before that, by the Python decoder, its chosen ``acwt`` and ``wip`` against
    ``[decoding] acwt_sweep`` and ``wip_sweep`` of its resolved config (an edge there may only tie the
    setting inside it, which those runs did not record: such a run is marked all the same).

    >>> resolved = configparser.ConfigParser()
    >>> resolved.read_string("[decoding]\\nacwt_sweep = 0.07,0.1,0.15,0.2\\nwip_sweep = 0.0,0.5,1.0\\n")
    >>> tuning_edges({"acwt": "0.2", "wip": "0.5", "decoder": "python"}, resolved)
    ['acwt']
    >>> tuning_edges({"acwt": "0.3", "wip": "0", "grid": "acwt:0.1,0.2,0.3,0.4;wip:0,0.5,1"}, resolved)
    []
    """
    if "grid" in setting:
        return setting["edge"].split(",") if setting.get("edge") else []
    if setting.get("decoder", "python") != "python" or "acwt" not in setting:
        return []
    edges = []
    for axis, option, default in (("acwt", "acwt_sweep", ""), ("wip", "wip_sweep", "0.0")):
        grid = [float(v) for v in resolved.get("decoding", option, fallback=default).split(",") if v.strip()]
        if len(grid) > 1 and float(setting.get(axis, "0")) in (min(grid), max(grid)):
            edges.append(axis)
    return edges


def read_run(folder) -> Run:
    """Read one experiment folder (see the module docstring); raises if it holds no resolved config."""
    folder = Path(folder)
    resolved = folder / "config.resolved.cfg"
    if not resolved.is_file():
        raise FileNotFoundError(f"{folder}: not an experiment folder (no config.resolved.cfg)")
    text = resolved.read_text()
    first = text.splitlines()[0] if text else ""
    parser = configparser.ConfigParser(interpolation=None)
    parser.optionxform = str
    parser.read_string(text)
    # The built-in corpus's folder (in its data paths too) says where the run was, not what was trained:
    # runs on clones in other folders are seeds of one system.
    corpus = parser.get("exp", "builtin_corpus_dir", fallback="")
    written = {(s, o): v for s in parser.sections() for o, v in parser.items(s)}
    inert = inert_options(written)  # LF-MMI's options of a cross-entropy run say nothing about it
    options = {(f"[{s}] {o}", v.replace(corpus, "$builtin_corpus_dir") if corpus else v)
               for (s, o), v in written.items() if (s, o) not in PER_RUN | inert and not _is_default(s, o, v)}
    shared = [f"{name} = {value}" for name, value in sorted(options)]
    source = first[len(RESOLVED_FROM):] if first.startswith(RESOLVED_FROM) else re.sub(r"_?seed\d+$", "", folder.name)
    stack = [v.strip() for v in parser.get("model", "stack", fallback="").split(",") if v.strip()]
    archs = {parser.get(s, "arch_name"): s for s in parser.sections() if s.startswith("architecture")}
    architectures = [{"name": name, "unit": parser.get(archs[name], "unit"),
                      "sizes": [int(v) for v in parser.get(archs[name], "sizes").split(",")],
                      "bidirectional": [v.strip() == "True" for v in parser.get(archs[name], "bidirectional").split(",")]}
                     for name in stack if name in archs]
    run = Run(folder, source, parser.getint("exp", "seed"), hashlib.sha1("\n".join(shared).encode()).hexdigest()[:12],
              architectures, frozenset(options))
    res = folder / "res.res"
    settings = {}
    for line in res.read_text().splitlines() if res.is_file() else []:
        if m := _EPOCH.match(line):
            run.epochs.append({"epoch": int(m[1]), "dev_err": float(m[2]), "seconds": float(m[3])})
        elif m := _DECODED.match(line):
            run.errors[m[1]] = float(m[2])
            settings[m[1]] = dict(_FIELD.findall(line))
    tuned_on = parser.get("data_use", "valid_with", fallback="")
    if tuned_on in settings:
        run.edges = tuning_edges(settings[tuned_on], parser)
        run.tuned_on = tuned_on
    log = folder / "log.txt"
    lines = log.read_text().splitlines() if log.is_file() else []
    speeds = [float(m[1]) for m in map(_FRAMES_PER_SECOND.search, lines) if m]
    run.frames_per_second = float(np.mean(speeds)) if speeds else None
    machines = [m[1] for m in map(_MACHINE.search, lines) if m]
    run.machine = machines[-1] if machines else None  # a resumed run: where it finished
    final, archived = folder / "final.pt", folder / "parameters"
    if final.is_file():
        import torch  # only here: reading results needs no torch otherwise

        run.parameters = sum(t.numel() for t in torch.load(final, map_location="cpu", weights_only=True)["model"].values())
    elif archived.is_file():
        run.parameters = int(archived.read_text())
    return run


# What archive_run keeps of a run (besides decode_<set>/per_utt): what read_run reads, and the stage
# markers (.done/) by which a sweep knows the run is finished. (Not sweep.log: log.txt holds its lines.)
ARCHIVED = ("config.resolved.cfg", "res.res", "log.txt")


def archive_run(run: Run, destination) -> Path:
    """Copy the files of finished ``run`` that tables and figures read into ``destination`` (made, or
    replaced file by file), with its parameter count in ``parameters`` instead of its weights."""
    if not run.finished:
        raise ValueError(f"{run.folder}: not finished (res.res has no decoded set), so there is nothing to archive")
    destination = Path(destination)
    destination.mkdir(parents=True, exist_ok=True)
    for name in ARCHIVED:
        if (run.folder / name).is_file():
            shutil.copy2(run.folder / name, destination / name)
    for source in [*run.folder.glob("decode_*/per_utt"), *run.folder.glob(".done/*")]:
        (destination / source.parent.name).mkdir(exist_ok=True)
        shutil.copy2(source, destination / source.parent.name / source.name)
    if run.parameters is not None:
        (destination / "parameters").write_text(f"{run.parameters}\n")
    return destination


def find_runs(patterns: Sequence[str]) -> list[Run]:
    """Every experiment folder matching ``patterns`` (folders or globs), or below them: in the patterns'
    order (each pattern's folders sorted), each folder once. The order says which of two systems of one
    config keeps the config's plain name (``group``): the one given first."""
    folders: dict[Path, None] = {}
    for pattern in patterns:
        matches = [Path(p) for p in glob.glob(str(pattern))] or [Path(pattern)]
        found = set()
        for path in matches:
            if (path / "config.resolved.cfg").is_file():
                found.add(path.resolve())
            elif path.is_dir():
                found.update(p.parent.resolve() for p in path.rglob("config.resolved.cfg"))
        folders.update(dict.fromkeys(sorted(found)))
    if not folders:
        raise FileNotFoundError(f"no experiment folder (with a config.resolved.cfg) in {' '.join(map(str, patterns))}")
    return [read_run(folder) for folder in folders]


@dataclass
class System:
    """The runs of one config that differ only in their seed."""

    name: str
    runs: list[Run]

    @property
    def seeds(self) -> list[int]:
        return [r.seed for r in self.runs]

    def describe(self) -> str:
        """``libru 2x256 uni + ubru 1x256 uni``."""
        return " + ".join(f"{a['unit']} {len(a['sizes'])}x{a['sizes'][0] if len(set(a['sizes'])) == 1 else a['sizes']} "
                          f"{'bi' if all(a['bidirectional']) else 'uni' if not any(a['bidirectional']) else 'mixed'}"
                          for a in self.runs[0].architectures)

    def errors(self, name: str) -> tuple[np.ndarray, np.ndarray, list[str]]:
        """``(errors (S, N), lengths (N,), utterances)`` on set ``name``, over the utterances every seed scored."""
        counts = [run.per_utterance(name) for run in self.runs]
        utterances = sorted(set.intersection(*(set(c) for c in counts)))
        if not utterances:
            raise ValueError(f"{self.name}: its runs share no scored utterance of set {name}")
        lengths = np.array([counts[0][u][0] for u in utterances], dtype=np.float64)
        errors = np.array([[c[u][1] for u in utterances] for c in counts], dtype=np.float64)
        return errors, lengths, utterances


def group(runs: Sequence[Run]) -> list[System]:
    """Systems by config name, each name's runs by seed. Two configs with the same name but different
    contents (a sweep with overrides beside one without) are told apart by what differs: the one whose run
    comes first in ``runs`` (``find_runs``: the first pattern given) keeps the name, and comes first; each
    other is named ``NAME(option=value, ...)`` with the values it changes, an option it leaves at the
    default by that default (``NAME#<hash>`` past three)."""
    first_of: dict[str, Run] = {}  # the first run of each config name
    for run in runs:
        first_of.setdefault(Path(run.source).stem, run)
    systems: dict[str, System] = {}
    for run in sorted(runs, key=lambda r: (Path(r.source).stem, r.key != first_of[Path(r.source).stem].key, r.seed)):
        if run.key not in systems:
            base = Path(run.source).stem
            first = first_of[base]
            set_here = {option for option, _ in run.options}
            left_at_default = {(option, option_default(*option[1:].split("] ")) or "default")
                               for option, _ in first.options - run.options if option not in set_here}
            # a set: the same override in two sections (each architecture's optimiser) names the system once
            differs = sorted({f"{option.split('] ')[-1]}={value}"
                              for option, value in (run.options - first.options) | left_at_default})
            name = base if run.key == first.key else (f"{base}({', '.join(differs)})" if 0 < len(differs) <= 3
                                                      else f"{base}#{run.key[:6]}")
            systems[run.key] = System(name, [])
        systems[run.key].runs.append(run)
    return list(systems.values())

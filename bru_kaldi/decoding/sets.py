"""Whole data sets: the jobs to decode, the checks of their inputs, and the reports of their results.

A :class:`DecodeJob` names one set's log-likelihoods, graph, model, references and output folder.
Before anything is decoded, :func:`prepare` checks every input of every job (files present, the graph
built for the model, every utterance's dimension) and reads what the decoders share. Both decoders
(``python_decoder``, ``kaldi_scripts``) turn a set into :class:`Pass` es, one per setting tried;
``grid.tune`` picks the setting on the tuning set and :func:`finish` writes the chosen hypotheses,
per-utterance counts, the log and the summary, and returns the :class:`SetResult` of ``res.res``.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional, Sequence

import kaldi_hmm_gmm  # noqa: F401  (before kaldifst: see decoding.utterance)
import kaldifst
import numpy as np

from bru_kaldi import scoring
from bru_kaldi.atomic import write_text_atomically
from bru_kaldi.decoding.ctm import ctm_lines, read_word_boundary
from bru_kaldi.decoding.utterance import GraphReadError, load_graph
from bru_kaldi.kaldi.tables import KaldiIOError, ScpTable
from bru_kaldi.kaldi.transition_model import read_transition_model


class DecodeInputError(ValueError):
    """Inputs that cannot be decoded together; the message names the files (and utterance) involved."""


class GraphMismatchError(DecodeInputError):
    """A decoding graph built for another model (or another words.txt)."""


class MissingInputError(FileNotFoundError):
    """A file a decode needs does not exist; the message names it and the set it belongs to."""


class KaldiNotFoundError(MissingInputError):
    """``[decoding] decoder = kaldi`` without Kaldi's binaries on PATH."""


class KaldiDecodeError(RuntimeError):
    """A Kaldi script or pipeline failed; the message names its log."""




FRAME_SHIFT = 0.01  # seconds per frame (Kaldi's default 10 ms shift), for the real-time factor


@dataclass(frozen=True)
class DecodeJob:
    """One data set to decode (``str`` paths are accepted and turned into ``Path``).

    ``loglikes_scp``: written by ``data_io.LoglikeWriter`` (log posteriors - log priors), each entry
    (frames, num_pdfs); ``graph_dir``: HCLG.fst and words.txt; ``model``: final.mdl, whose
    TransitionModel maps transition-ids to pdfs; ``ref_text``: Kaldi text of references, or None to
    decode without scoring; ``out_dir``: hypotheses, logs, per-utterance counts and the summary;
    ``frame_shift``: seconds per row of the log-likelihoods (Kaldi's 10 ms, times a chain model's frame
    subsampling factor), for word timings and the real-time factor.
    """

    name: str
    loglikes_scp: Path
    graph_dir: Path
    model: Path
    ref_text: Optional[Path]
    out_dir: Path
    frame_shift: float = FRAME_SHIFT

    def __post_init__(self):
        for name in ("loglikes_scp", "graph_dir", "model", "out_dir"):
            object.__setattr__(self, name, Path(getattr(self, name)))
        if self.ref_text is not None:
            object.__setattr__(self, "ref_text", Path(self.ref_text))


@dataclass
class SetResult:
    """What :func:`decode_sets` reports for one set, at the setting chosen on the tuning set.

    ``seconds`` is the wall time of decoding the set (all its ``passes``: the tuning set is decoded
    once per acoustic scale tried); ``rtf`` is per pass: ``seconds / passes / audio_seconds``.
    ``failed``: utterances with no path (scored as all deletions); ``partial``: utterances whose
    best path ends in a non-final state (kept, as Kaldi's ``--allow-partial=true`` does);
    ``missing``: references with no log-likelihoods in the scp (scored as all deletions too);
    ``acoustic_scale`` and ``word_penalty``: the chosen setting as numbers (Kaldi's: ``post_decode_acwt / LMWT``).

    >>> r = SetResult("dev", "acwt=0.15", None, seconds=2.0, audio_seconds=40.0, rtf=0.05, failed=["u3"])
    >>> r.res_line()
    'dev: no reference (0 utterances decoded) acwt=0.15 decoder=python rtf=0.050 failed=1'
    >>> SetResult("dev", "acwt=0.3", None, 1.0, 40.0, 0.025, [], grid="acwt:0.1,0.2,0.3 wip:0", edges=["acwt"]).res_line()
    'dev: no reference (0 utterances decoded) acwt=0.3 decoder=python rtf=0.025 grid=acwt:0.1,0.2,0.3;wip:0 edge=acwt'
    """

    name: str
    setting: str
    score: Optional[scoring.Score]
    seconds: float
    audio_seconds: float
    rtf: float
    failed: list[str]
    decoder: str = "python"
    partial: list[str] = field(default_factory=list)
    num_utterances: int = 0
    passes: int = 1
    missing: list[str] = field(default_factory=list)
    acoustic_scale: float = 0.0
    word_penalty: float = 0.0
    grid: str = ""  # the tuning set's final grid, "acwt:0.1,0.2,0.3 wip:0,0.5" (grid.Grid.describe); "" elsewhere
    edges: list[str] = field(default_factory=list)  # axes whose chosen value is still the grid's first or last

    def res_line(self) -> str:
        """One line for ``res.res``: ``dev: %WER 21.30 [ 1234 / 5793, 100 ins, 300 del, 834 sub ] acwt=0.15 ...``."""
        what = (self.score.total.kaldi_line() if self.score is not None
                else f"no reference ({self.num_utterances} utterances decoded)")
        line = f"{self.name}: {what} {self.setting} decoder={self.decoder} rtf={self.rtf:.3f}"
        if self.failed:
            line += f" failed={len(self.failed)}"
        if self.partial:
            line += f" partial={len(self.partial)}"
        if self.missing:
            line += f" missing={len(self.missing)}"
        if self.grid:
            line += f" grid={self.grid.replace(' ', ';')}"
        if self.edges:
            line += f" edge={','.join(self.edges)}"
        return line



# --------------------------------------------------------------------------- input checks
def read_words(path: Path) -> dict[int, str]:
    """``words.txt`` (``symbol id`` per line) as ``{id: symbol}``."""
    words = {}
    for number, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        parts = line.split()
        if not parts:
            continue
        if len(parts) != 2 or not parts[1].isdigit() or int(parts[1]) in words:
            raise DecodeInputError(f"{path}:{number}: expected 'symbol id' with a new integer id, got {line!r}")
        words[int(parts[1])] = parts[0]
    return words


def check_graph(graph: kaldifst.StdVectorFst, num_transition_ids: int, words: dict[int, str], hclg: Path,
                model: Path, words_path: Path) -> None:
    """Every input label of HCLG must be a transition-id of the model, every output label in words.txt.

    One pass over the arcs (a few microseconds each). A graph built for another model would make
    the decoder read scores past the end of its matrix, so this is an error, not a warning.
    """
    max_in = 0
    for state in range(graph.num_states):
        for arc in kaldifst.ArcIterator(graph, state):
            max_in = max(max_in, arc.ilabel)
            if arc.olabel and arc.olabel not in words:
                raise GraphMismatchError(f"{hclg} has output label {arc.olabel}, which {words_path} does not list: "
                                         "that words.txt is not the one the graph was built with")
    if max_in > num_transition_ids:
        raise GraphMismatchError(f"{hclg} has input label (transition-id) {max_in}, but {model} has only "
                                 f"{num_transition_ids} transition-ids: the graph was built for another model "
                                 "(rebuild it, or decode with the model it was built from)")


def _require(path: Optional[Path], what: str, job: DecodeJob) -> None:
    if path is not None and not path.is_file():
        raise MissingInputError(f"decoding set {job.name!r}: no such {what} {path}")


@dataclass
class Prepared:
    """A job with its inputs read and checked (everything but the log-likelihoods themselves)."""

    job: DecodeJob
    graph_key: tuple[str, str]  # (HCLG.fst, final.mdl): what a worker needs loaded
    words: dict[int, str]
    locations: dict[str, str]  # utterance -> its scp location ("file.ark:offset")
    frames: dict[str, int]
    refs: Optional[dict[str, list[str]]]

    @property
    def audio_seconds(self) -> float:
        return sum(self.frames.values()) * self.job.frame_shift


# Per process: graph_key (HCLG.fst, final.mdl) -> (graph, tid2pdf, num_pdfs); graph_key + (penalty,) ->
# the same with a word insertion penalty on the graph. Filled by the parent before the worker pool forks
# (the children inherit it), or by python_decoder.init_worker where processes are spawned.
GRAPHS: dict[tuple, tuple[Optional[kaldifst.StdVectorFst], np.ndarray, int]] = {}


def _load_model_and_graph(job: DecodeJob, words: dict[int, str], with_graph: bool) -> tuple[str, str]:
    key = (str(job.graph_dir / "HCLG.fst"), str(job.model))
    if key in GRAPHS and (GRAPHS[key][0] is not None or not with_graph):
        return key
    try:
        tm = read_transition_model(job.model)
    except KaldiIOError as error:
        raise DecodeInputError(f"decoding set {job.name!r}: {error}") from None
    num_pdfs_file = job.graph_dir / "num_pdfs"  # written by mkgraph.sh (and our make_graph)
    if num_pdfs_file.is_file() and num_pdfs_file.read_text().strip() != str(tm.num_pdfs):
        raise GraphMismatchError(f"{num_pdfs_file} says {num_pdfs_file.read_text().strip()} pdfs, but {job.model} "
                                 f"has {tm.num_pdfs}: the graph was built for another model")
    graph = None
    if with_graph:
        try:
            graph = load_graph(key[0])
        except GraphReadError as error:
            raise DecodeInputError(f"decoding set {job.name!r}: {error}") from None
        check_graph(graph, tm.num_transition_ids, words, job.graph_dir / "HCLG.fst", job.model,
                    job.graph_dir / "words.txt")
    GRAPHS[key] = (graph, tm.tid2pdf, tm.num_pdfs)
    return key


def prepare(job: DecodeJob, with_graph: bool) -> Prepared:
    """Check one job's inputs before anything is decoded: files, graph against model, every utterance's shape."""
    for path, what in ((job.graph_dir / "HCLG.fst", "decoding graph"), (job.graph_dir / "words.txt", "word list"),
                       (job.model, "model"), (job.loglikes_scp, "log-likelihood scp"),
                       (job.ref_text, "reference text")):
        _require(path, what, job)
    words = read_words(job.graph_dir / "words.txt")
    key = _load_model_and_graph(job, words, with_graph)
    num_pdfs = GRAPHS[key][2]
    try:
        table = ScpTable(job.loglikes_scp)
        shapes = table.shapes()  # headers only: the matrices are read by the workers
    except KaldiIOError as error:
        raise DecodeInputError(f"decoding set {job.name!r}: {error}") from None
    for utt, (_, dim) in shapes.items():
        if dim != num_pdfs:
            raise DecodeInputError(f"{job.loglikes_scp}: utterance {utt} has log-likelihoods of dimension {dim}, "
                                   f"but {job.model} has {num_pdfs} pdfs: were they computed for another model?")
    refs = scoring.read_text(job.ref_text) if job.ref_text is not None else None
    return Prepared(job, key, words, dict(table.locations), {u: s[0] for u, s in shapes.items()}, refs)


def clear_outputs(out_dir: Path) -> None:
    """Remove what an earlier decode wrote here, so that a crash now cannot leave old results looking new."""
    shutil.rmtree(out_dir / "scoring", ignore_errors=True)
    # old lattices too: score.sh reads every lat.*.gz, and an earlier run may have had more jobs
    for path in [out_dir / "text", out_dir / "per_utt", out_dir / "num_jobs", out_dir / "best_wer", out_dir / "ctm",
                 *out_dir.glob("wer_*"), *out_dir.glob("lat.*.gz")]:
        path.unlink(missing_ok=True)



@dataclass
class Pass:
    """One set decoded at one setting."""

    setting: str
    hyps: dict[str, list[str]]
    failed: dict[str, str]  # utterance -> why
    partial: list[str]
    score: Optional[scoring.Score]
    value: object = None  # the setting itself: (scale, penalty), or (LMWT, WIP)
    order: tuple = ()  # ties on errors go to the smallest (see decode_sets)
    alignments: dict[str, list[int]] = field(default_factory=dict)  # utterance -> its best path's transition-ids




def pass_line(name: str, run: Pass) -> str:
    what = run.score.total.kaldi_line() if run.score is not None else f"{len(run.hyps)} hypotheses"
    return f"{name} {run.setting}: {what} failed={len(run.failed)} partial={len(run.partial)}"


def setting_stem(run: Pass) -> str:
    return run.setting.replace("=", "_").replace(" ", "_")  # acwt=0.15 wip=0.5 -> acwt_0.15_wip_0.5


def write_ctm(p: Prepared, chosen: Pass, say: Callable[[str], None]) -> None:
    """``ctm``: word timings of the chosen setting's best paths, where the graph has word boundaries."""
    boundary = read_word_boundary(p.job.graph_dir)
    if boundary is None:
        return
    model = read_transition_model(p.job.model)
    lines, skipped = [], []
    for utt in sorted(chosen.alignments):
        try:
            lines += ctm_lines(utt, chosen.alignments[utt], chosen.hyps[utt], model, boundary, p.job.frame_shift)
        except ValueError as error:
            skipped.append(f"{utt} ({error})")
    if skipped:
        say(f"{p.job.name}: no word timings for {len(skipped)} utterance(s): {', '.join(skipped[:3])}")
    write_text_atomically(p.job.out_dir / "ctm", "".join(f"{line}\n" for line in lines))


def write_pass(out_dir: Path, run: Pass) -> None:
    stem = setting_stem(run)
    scoring.write_text(run.hyps, out_dir / "scoring" / f"{stem}.txt")
    if run.score is not None:
        scoring.write_per_utterance(run.score, out_dir / "scoring" / f"{stem}.per_utt")


def finish(p: Prepared, chosen: Pass, passes: Sequence[Pass], seconds: float, decode_passes: int, decoder: str,
            note: str, lines: list[str], log: Callable[[str], None], scale: tuple[float, float],
            grid: str = "", edges: Sequence[str] = ()) -> SetResult:
    """Write the chosen hypotheses, counts, log and summary of one set (the summary last); report failures.

    ``passes``: the settings tried (for the summary); ``decode_passes``: how often the set was decoded;
    ``scale``: the chosen setting as (acoustic scale, word insertion penalty); ``grid``, ``edges``: the tuning
    set's final grid (``grid.Grid.describe``, "" for the other sets) and the axes whose edge the choice is on,
    recorded in ``res.res``.
    """
    job, out_dir = p.job, p.job.out_dir

    def say(line: str) -> None:
        lines.append(line)
        log(line)

    if chosen.failed:
        shown = ", ".join(f"{u} ({why})" for u, why in list(chosen.failed.items())[:10])
        say(f"{job.name} {chosen.setting}: {len(chosen.failed)} utterance(s) failed, scored as all deletions: "
            f"{shown}{' ...' if len(chosen.failed) > 10 else ''}")
    if chosen.partial:
        say(f"{job.name} {chosen.setting}: {len(chosen.partial)} utterance(s) reached no final state, their best "
            f"partial paths are kept: {' '.join(chosen.partial[:10])}{' ...' if len(chosen.partial) > 10 else ''}")
    missing = sorted(set(p.refs) - set(p.frames)) if p.refs is not None else []
    if missing:
        say(f"{job.name}: {len(missing)} utterance(s) of {job.ref_text} have no log-likelihoods in "
            f"{job.loglikes_scp}, scored as all deletions: {' '.join(missing[:10])}")
    extra = sorted(set(p.frames) - set(p.refs)) if p.refs is not None else []
    if extra:
        say(f"{job.name}: {len(extra)} decoded utterance(s) have no reference in {job.ref_text}, not scored: "
            f"{' '.join(extra[:10])}")
    audio = p.audio_seconds
    result = SetResult(job.name, chosen.setting, chosen.score, seconds=seconds, audio_seconds=audio,
                       rtf=seconds / decode_passes / audio if audio else 0.0, failed=sorted(chosen.failed),
                       decoder=decoder, partial=chosen.partial, num_utterances=len(p.frames), passes=decode_passes,
                       missing=missing, acoustic_scale=scale[0], word_penalty=scale[1],
                       grid=grid, edges=list(edges))
    if result.edges:
        say(f"{job.name}: the chosen {chosen.setting} is still on the edge of the grid ({', '.join(result.edges)}) "
            f"after [decoding] grid_extensions growths; a wider grid may find a better setting")
    scoring.write_text(chosen.hyps, out_dir / "text")
    if chosen.score is not None:
        scoring.write_per_utterance(chosen.score, out_dir / "per_utt")
        # Kaldi's scoring leaves the best line where scripts look for it (score_kaldi_wer.sh, check_res_dec.sh)
        write_text_atomically(out_dir / "best_wer", f"{chosen.score.total.kaldi_line()} "
                                                    f"scoring/{setting_stem(chosen)}.txt\n")
    if chosen.alignments:
        write_ctm(p, chosen, say)
    say(f"{result.res_line()} ({len(p.frames)} utterances, {audio:.1f} s of audio, {seconds:.1f} s for "
        f"{decode_passes} pass(es); {note})")
    write_text_atomically(out_dir / "log" / "decode.log", "".join(f"{line}\n" for line in lines))
    summary = [pass_line(job.name, r) for r in passes] + [f"chosen: {chosen.setting} ({note})", result.res_line()]
    write_text_atomically(out_dir / "scoring" / "summary.txt", "".join(f"{line}\n" for line in summary))
    return result

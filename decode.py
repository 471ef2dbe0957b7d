"""Decoding: per-pdf log-likelihoods to word (or phone) strings, one utterance or whole data sets.

**One utterance** (:func:`decode`), without Kaldi: the best path through HCLG.fst, as
``latgen-faster-mapped`` finds it for a hybrid system, with kaldi-hmm-gmm's ``FasterDecoder``
(Kaldi's faster-decoder.cc, a beam-pruned Viterbi search): the acoustic model gives one score per
frame and *pdf*; the graph's input labels are *transition-ids*; the transition model maps each
transition-id to its pdf (``tid2pdf``, index 0 unused, from ``transition_model.read_transition_model``).

kaldi-hmm-gmm's ``DecodableCtc`` serves ``loglike(frame, i) = M[frame, i - 1]`` for index ``i``
(it was written for CTC, whose index 0 is the blank). With transition-ids as indices that is
exactly the layout we need: column ``tid - 1`` of ``M`` holds ``acoustic_scale * loglikes[:, tid2pdf[tid]]``.

**Data sets** (:func:`decode_sets`, what ``run_exp.py`` calls): every set of a :class:`DecodeJob`
list, with Kaldi's binaries where they are installed (``kaldi_decoding_scripts/``) and with the
decoder above otherwise, in parallel over utterances. The setting (the acoustic scale, or Kaldi's
LM weight and insertion penalty) is chosen on one set (dev) and applied unchanged to the others;
results come back as :class:`SetResult` and are written under each job's ``out_dir``.

Import order: kaldi_hmm_gmm before kaldifst (some orders of these packages hang; field notes).

>>> import numpy as np
>>> graph = linear_loop_graph(num_transition_ids=2)   # any word, any number of times
>>> tid2pdf = np.array([0, 0, 1])                       # tid 1 -> pdf 0, tid 2 -> pdf 1
>>> loglikes = np.log(np.array([[.9, .1]] * 3 + [[.2, .8]] * 2, dtype=np.float32))  # (T=5, num_pdfs=2)
>>> result = decode(loglikes, graph, tid2pdf, DecoderOptions(acoustic_scale=1.0))
>>> result.words, result.alignment, result.reached_final
([1, 1, 1, 2, 2], [1, 1, 1, 2, 2], True)
"""

from __future__ import annotations

import multiprocessing
import os
import shlex
import shutil
import subprocess
import time
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterable, Iterator, Optional, Sequence

import kaldi_hmm_gmm as khg  # before kaldifst: see the module docstring
import kaldifst
import kaldiio
import numpy as np

import scoring
from kaldi_tables import KaldiIOError, ScpTable
from transition_model import read_transition_model

if TYPE_CHECKING:  # config imports torch (through models); decoding workers need neither
    import config


class DecodeInputError(ValueError):
    """Inputs that cannot be decoded together; the message names the files (and utterance) involved."""


class GraphMismatchError(DecodeInputError):
    """A decoding graph built for another model (or another words.txt)."""


class MissingInputError(FileNotFoundError):
    """A file a decode needs does not exist; the message names it and the set it belongs to."""


class KaldiNotFoundError(MissingInputError):
    """``[decoding] decoder = kaldi`` without Kaldi's binaries on PATH."""


class NoPathError(RuntimeError):
    """No path survived the beam search (:func:`decode`); a set-level decode counts it as failed."""


class KaldiDecodeError(RuntimeError):
    """A Kaldi script or pipeline failed; the message names its log."""


@dataclass(frozen=True)
class DecoderOptions:
    """Search settings, with the defaults of Kaldi's ``latgen-faster-mapped`` for hybrid models."""

    beam: float = 13.0  # prune paths scoring more than this below the best one
    max_active: int = 7000  # at most this many active states per frame
    min_active: int = 200
    acoustic_scale: float = 0.1  # scale on the log-likelihoods against the graph's LM/transition costs


@dataclass(frozen=True)
class DecodeResult:
    """The best path: ``words`` (output labels: word-ids, phone-ids for a phone recogniser),
    ``alignment`` (one transition-id per frame), ``cost`` (graph + scaled acoustic cost, lower is
    better) and whether it ended in a final state of the graph (else it is the best partial path)."""

    words: list[int]
    alignment: list[int]
    cost: float
    reached_final: bool


def load_graph(path: str | Path) -> kaldifst.StdVectorFst:
    """Read a decoding graph (HCLG.fst) written by Kaldi, kaldifst or kaldi-hmm-gmm."""
    if not Path(path).is_file():
        raise FileNotFoundError(f"no such decoding graph {path}")
    return kaldifst.StdVectorFst.read(str(path))


def transition_loglikes(loglikes: np.ndarray, tid2pdf: np.ndarray, acoustic_scale: float) -> np.ndarray:
    """Per-pdf log-likelihoods (T, num_pdfs) -> scaled per-transition-id scores (T, num_tids) float32.

    Column ``tid - 1`` holds the score of transition-id ``tid`` (see the module docstring).
    """
    loglikes = np.asarray(loglikes)
    tid2pdf = np.asarray(tid2pdf)
    if loglikes.ndim != 2:
        raise ValueError(f"log-likelihoods must be (frames, pdfs), got shape {loglikes.shape}")
    if tid2pdf.ndim != 1 or len(tid2pdf) < 2:
        raise ValueError(f"tid2pdf must be (num_transition_ids + 1,) with index 0 unused, got shape {tid2pdf.shape}")
    if tid2pdf[1:].max() >= loglikes.shape[1]:
        raise ValueError(f"the transition model has {tid2pdf[1:].max() + 1} pdfs, the log-likelihoods {loglikes.shape[1]}")
    return np.ascontiguousarray(acoustic_scale * loglikes[:, tid2pdf[1:]], dtype=np.float32)


def decode(loglikes: np.ndarray, graph: kaldifst.StdVectorFst, tid2pdf: np.ndarray,
           options: DecoderOptions = DecoderOptions()) -> DecodeResult:
    """Best path through ``graph`` for one utterance's log-likelihoods (T, num_pdfs).

    Raises ``ValueError`` on mismatched shapes and ``RuntimeError`` when no path survives the
    beam (widen ``beam`` or ``max_active``).
    """
    scores = transition_loglikes(loglikes, tid2pdf, options.acoustic_scale)
    if len(scores) == 0:
        raise ValueError("cannot decode an utterance with no frames")
    decoder = khg.FasterDecoder(graph, khg.FasterDecoderOptions(beam=options.beam, max_active=options.max_active,
                                                                min_active=options.min_active))
    decoder.decode(khg.DecodableCtc(scores))
    reached_final = decoder.reached_final()
    ok, path = decoder.get_best_path(use_final_probs=reached_final)
    if not ok:
        raise NoPathError(f"no path survived the search over {len(scores)} frames (beam {options.beam})")
    ok, alignment, words, weight = kaldifst.get_linear_symbol_sequence(path)
    if not ok:
        raise RuntimeError("the decoder's best path is not linear")
    return DecodeResult(words=list(words), alignment=list(alignment), cost=weight.value1 + weight.value2,
                        reached_final=reached_final)


def linear_loop_graph(num_transition_ids: int) -> kaldifst.StdVectorFst:
    """A one-state graph accepting any sequence of transition-ids, each emitting word = its id.

    Not a real HCLG: a stand-in for examples and tests of the decoder itself.
    """
    fst = kaldifst.StdVectorFst()
    state = fst.add_state()
    fst.start = state
    fst.set_final(state=state, weight=0.0)
    for tid in range(1, num_transition_ids + 1):
        fst.add_arc(state=state, arc=kaldifst.StdArc(tid, tid, 0.0, state))
    return fst


# =========================================================================== data sets
FRAME_SHIFT = 0.01  # seconds per frame (Kaldi's default 10 ms shift), for the real-time factor
KALDI_BINARIES = ("latgen-faster-mapped", "lattice-scale", "lattice-add-penalty", "lattice-best-path", "compute-wer")
KALDI_SCRIPTS = Path(__file__).resolve().parent / "kaldi_decoding_scripts"
KALDI_LMWTS = tuple(range(1, 11))  # score.sh's grid: LM weights 1..10 (acoustic scale 1 / LMWT) ...
KALDI_WIPS = ("0.0", "0.5", "1.0")  # ... and word insertion penalties


@dataclass(frozen=True)
class DecodeJob:
    """One data set to decode (``str`` paths are accepted and turned into ``Path``).

    ``loglikes_scp``: written by ``data_io.LoglikeWriter`` (log posteriors - log priors), each entry
    (frames, num_pdfs); ``graph_dir``: HCLG.fst and words.txt; ``model``: final.mdl, whose
    TransitionModel maps transition-ids to pdfs; ``ref_text``: Kaldi text of references, or None to
    decode without scoring; ``out_dir``: hypotheses, logs, per-utterance counts and the summary.
    """

    name: str
    loglikes_scp: Path
    graph_dir: Path
    model: Path
    ref_text: Optional[Path]
    out_dir: Path

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
    ``missing``: references with no log-likelihoods in the scp (scored as all deletions too).

    >>> r = SetResult("dev", "acwt=0.15", None, seconds=2.0, audio_seconds=40.0, rtf=0.05, failed=["u3"])
    >>> r.res_line()
    'dev: no reference (0 utterances decoded) acwt=0.15 decoder=python rtf=0.050 failed=1'
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
class _Prepared:
    """A job with its inputs read and checked (everything but the log-likelihoods themselves)."""

    job: DecodeJob
    graph_key: tuple[str, str]  # (HCLG.fst, final.mdl): what a worker needs loaded
    words: dict[int, str]
    locations: dict[str, str]  # utterance -> its scp location ("file.ark:offset")
    frames: dict[str, int]
    refs: Optional[dict[str, list[str]]]

    @property
    def audio_seconds(self) -> float:
        return sum(self.frames.values()) * FRAME_SHIFT


# Per process: graph_key -> (graph, tid2pdf, num_pdfs). Filled by the parent before the worker
# pool forks (the children inherit it), or by _init_worker where processes are spawned.
_GRAPHS: dict[tuple[str, str], tuple[Optional[kaldifst.StdVectorFst], np.ndarray, int]] = {}


def _load_model_and_graph(job: DecodeJob, words: dict[int, str], with_graph: bool) -> tuple[str, str]:
    key = (str(job.graph_dir / "HCLG.fst"), str(job.model))
    if key in _GRAPHS and (_GRAPHS[key][0] is not None or not with_graph):
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
        graph = load_graph(key[0])
        check_graph(graph, tm.num_transition_ids, words, job.graph_dir / "HCLG.fst", job.model,
                    job.graph_dir / "words.txt")
    _GRAPHS[key] = (graph, tm.tid2pdf, tm.num_pdfs)
    return key


def _prepare(job: DecodeJob, with_graph: bool) -> _Prepared:
    """Check one job's inputs before anything is decoded: files, graph against model, every utterance's shape."""
    for path, what in ((job.graph_dir / "HCLG.fst", "decoding graph"), (job.graph_dir / "words.txt", "word list"),
                       (job.model, "model"), (job.loglikes_scp, "log-likelihood scp"),
                       (job.ref_text, "reference text")):
        _require(path, what, job)
    words = read_words(job.graph_dir / "words.txt")
    key = _load_model_and_graph(job, words, with_graph)
    num_pdfs = _GRAPHS[key][2]
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
    return _Prepared(job, key, words, dict(table.locations), {u: s[0] for u, s in shapes.items()}, refs)


def _write_atomically(path: Path, text: str) -> None:
    """Write ``text`` through a temporary file and ``os.replace``: a crash never leaves half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def _clear_outputs(out_dir: Path) -> None:
    """Remove what an earlier decode wrote here, so that a crash now cannot leave old results looking new."""
    shutil.rmtree(out_dir / "scoring", ignore_errors=True)
    # old lattices too: score.sh reads every lat.*.gz, and an earlier run may have had more jobs
    for path in [out_dir / "text", out_dir / "per_utt", out_dir / "num_jobs", *out_dir.glob("wer_*"),
                 *out_dir.glob("lat.*.gz")]:
        path.unlink(missing_ok=True)


# --------------------------------------------------------------------------- workers
def _init_worker(graph_keys: Sequence[tuple[str, str]]) -> None:
    """Load each graph and model once per worker (nothing to do when the pool forked: inherited)."""
    for key in graph_keys:
        if key not in _GRAPHS:
            tm = read_transition_model(key[1])
            _GRAPHS[key] = (load_graph(key[0]), tm.tid2pdf, tm.num_pdfs)


def _decode_task(task: tuple) -> tuple[str, list[tuple[Optional[list[int]], bool, str]]]:
    """Decode one utterance with each of its options: ``(utt, [(word ids or None, reached_final, why failed)])``."""
    graph_key, scp, utt, location, settings = task
    graph, tid2pdf, num_pdfs = _GRAPHS[graph_key]
    loglikes = np.asarray(kaldiio.load_mat(location), dtype=np.float32)  # (T, num_pdfs)
    if loglikes.ndim != 2 or loglikes.shape[1] != num_pdfs:  # checked from the header; the data must agree
        raise DecodeInputError(f"{scp}: utterance {utt} has log-likelihoods of shape {loglikes.shape}, "
                               f"expected (frames, {num_pdfs}) for {graph_key[1]}")
    nan = np.isnan(loglikes).any(axis=1)
    if nan.any():  # a diverged network: nothing to search, and the reason is worth naming
        return utt, [(None, False, f"NaN log-likelihoods (first at frame {int(nan.argmax())})")] * len(settings)
    out = []
    for options in settings:
        try:
            result = decode(loglikes, graph, tid2pdf, options)
            out.append((result.words, result.reached_final, ""))
        except NoPathError as error:
            out.append((None, False, str(error)))
    return utt, out


@contextmanager
def _workers(num_jobs: int, graph_keys: Sequence[tuple[str, str]]) -> Iterator[Callable[[list], Iterable]]:
    """A function that maps :func:`_decode_task` over tasks: in this process for one job, else in a pool.

    A ProcessPoolExecutor rather than multiprocessing.Pool: a worker killed by the kernel (memory)
    or by a crash in the decoder breaks the pool with an error, where Pool would wait for ever.
    """
    if num_jobs <= 1:
        yield lambda tasks: map(_decode_task, tasks)
        return
    # fork where there is one: the workers inherit the loaded graphs and never re-import the
    # trainer (torch); they touch neither torch nor CUDA nor logging, which fork would upset.
    method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
    pool = ProcessPoolExecutor(num_jobs, multiprocessing.get_context(method), _init_worker, (list(graph_keys),))
    try:
        yield lambda tasks: pool.map(_decode_task, tasks)
    finally:
        pool.shutdown(wait=True, cancel_futures=True)  # after an error: no new utterances started


# --------------------------------------------------------------------------- Python decoder
@dataclass
class _Pass:
    """One set decoded at one setting."""

    setting: str
    hyps: dict[str, list[str]]
    failed: dict[str, str]  # utterance -> why
    partial: list[str]
    score: Optional[scoring.Score]
    value: object = None  # the setting itself: a scale, or (LMWT, WIP)
    order: tuple = ()  # ties on errors go to the smallest (see decode_sets)


def _decode_python_set(p: _Prepared, scales: Sequence[float], decoding, run) -> tuple[list[_Pass], float]:
    """Decode every utterance of ``p`` at every scale; returns one pass per scale and the wall time."""
    # longest first, one utterance per task: the pool stays busy to the end
    order = sorted(p.frames, key=lambda u: (-p.frames[u], u))
    settings = [DecoderOptions(beam=decoding.beam, max_active=decoding.max_active, min_active=decoding.min_active,
                               acoustic_scale=scale) for scale in scales]
    tasks = [(p.graph_key, str(p.job.loglikes_scp), utt, p.locations[utt], settings) for utt in order]
    start = time.perf_counter()
    try:
        outcomes = dict(run(tasks))
    except BrokenProcessPool:
        raise RuntimeError(f"decoding set {p.job.name!r}: a decoding worker died (killed for memory, or a crash in "
                           "the decoder); fewer workers ([decoding] num_jobs) need less memory") from None
    seconds = time.perf_counter() - start
    passes = []
    for i, scale in enumerate(scales):
        hyps, failed, partial = {}, {}, []
        for utt in sorted(outcomes):
            ids, reached_final, why = outcomes[utt][i]
            if ids is None:
                failed[utt] = why
                continue
            hyps[utt] = [p.words[w] for w in ids]  # check_graph made sure every output label is a word
            if not reached_final:
                partial.append(utt)
        score = scoring.score(p.refs, hyps, decoding.scoring) if p.refs is not None else None
        passes.append(_Pass(f"acwt={scale:g}", hyps, failed, partial, score, value=scale, order=(scale,)))
    return passes, seconds


def _pass_line(name: str, run: _Pass) -> str:
    what = run.score.total.kaldi_line() if run.score is not None else f"{len(run.hyps)} hypotheses"
    return f"{name} {run.setting}: {what} failed={len(run.failed)} partial={len(run.partial)}"


def _write_pass(out_dir: Path, run: _Pass) -> None:
    stem = run.setting.replace("=", "_").replace(" ", "_")  # acwt=0.15 -> scoring/acwt_0.15.txt
    scoring.write_text(run.hyps, _mkdir(out_dir / "scoring") / f"{stem}.txt")
    if run.score is not None:
        scoring.write_per_utterance(run.score, out_dir / "scoring" / f"{stem}.per_utt")


def _mkdir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


def _choose(passes: Sequence[_Pass]) -> _Pass:
    """The pass with the fewest errors on the tuning set; ties go to the smallest ``order`` (see decode_sets)."""
    return min(passes, key=lambda r: (r.score.total.errors, r.order))


def _finish(p: _Prepared, chosen: _Pass, passes: Sequence[_Pass], seconds: float, decode_passes: int, decoder: str,
            note: str, lines: list[str], log: Callable[[str], None]) -> SetResult:
    """Write the chosen hypotheses, counts, log and summary of one set (the summary last); report failures.

    ``passes``: the settings tried (for the summary); ``decode_passes``: how often the set was decoded.
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
                       missing=missing)
    scoring.write_text(chosen.hyps, _mkdir(out_dir) / "text")
    if chosen.score is not None:
        scoring.write_per_utterance(chosen.score, out_dir / "per_utt")
    say(f"{result.res_line()} ({len(p.frames)} utterances, {audio:.1f} s of audio, {seconds:.1f} s for "
        f"{decode_passes} pass(es); {note})")
    _write_atomically(out_dir / "log" / "decode.log", "".join(f"{line}\n" for line in lines))
    summary = [_pass_line(job.name, r) for r in passes] + [f"chosen: {chosen.setting} ({note})", result.res_line()]
    _write_atomically(out_dir / "scoring" / "summary.txt", "".join(f"{line}\n" for line in summary))
    return result


def _decode_python(prepared: Sequence[_Prepared], decoding, tune_on: Optional[str],
                   log: Callable[[str], None]) -> dict[str, SetResult]:
    sweep = sorted(set(decoding.acwt_sweep)) or [decoding.acwt]
    num_jobs = min(decoding.num_jobs or os.cpu_count() or 1, max(len(p.frames) for p in prepared))
    log(f"decoding with the Python decoder (kaldi-hmm-gmm FasterDecoder), {num_jobs} job(s), beam {decoding.beam}, "
        f"max-active {decoding.max_active}, min-active {decoding.min_active}"
        + (f"; acoustic scale tuned on {tune_on} over {' '.join(f'{s:g}' for s in sweep)}" if tune_on
           else f"; acoustic scale {decoding.acwt:g}, not tuned"))
    chosen_scale, note = decoding.acwt, "[decoding] acwt, not tuned"
    results = {}
    with _workers(num_jobs, sorted({p.graph_key for p in prepared})) as run:
        for p in sorted(prepared, key=lambda p: p.job.name != tune_on):  # the tuning set first
            lines: list[str] = []
            if p.job.name == tune_on:
                passes, seconds = _decode_python_set(p, sweep, decoding, run)
                for r in passes:
                    lines.append(_pass_line(p.job.name, r))
                    log(lines[-1])
                    _write_pass(p.job.out_dir, r)
                chosen = _choose(passes)
                chosen_scale = chosen.value
                note = f"tuned on {tune_on}: fewest errors, ties to the smaller scale"
            else:
                passes, seconds = _decode_python_set(p, [chosen_scale], decoding, run)
                chosen = passes[0]
                _write_pass(p.job.out_dir, chosen)
            results[p.job.name] = _finish(p, chosen, passes, seconds, len(passes), "python", note, lines, log)
    return results


# --------------------------------------------------------------------------- Kaldi
def choose_decoder(decoder: str) -> str:
    """``"kaldi"`` or ``"python"`` for ``[decoding] decoder`` (auto: Kaldi when all its binaries are on PATH).

    >>> choose_decoder("python")
    'python'
    """
    if decoder not in ("auto", "kaldi", "python"):
        raise DecodeInputError(f"[decoding] decoder must be auto, kaldi or python, got {decoder!r}")
    if decoder == "python":
        return "python"
    missing = [b for b in KALDI_BINARIES if shutil.which(b) is None]
    if decoder == "kaldi" and missing:
        raise KaldiNotFoundError(f"[decoding] decoder = kaldi, but these Kaldi binaries are not on PATH: "
                                 f"{' '.join(missing)} (source Kaldi's path.sh, or set decoder = python or auto)")
    return "python" if missing else "kaldi"


def _run_script(script: str, args: Sequence, log_path: Path, name: str) -> None:
    """Run one of ``kaldi_decoding_scripts/``; its output goes to ``log_path``; failure names that log."""
    command = ["bash", str(KALDI_SCRIPTS / script), *map(str, args)]
    result = subprocess.run(command, capture_output=True, text=True)
    _write_atomically(log_path, f"# {shlex.join(command)}\n{result.stdout}{result.stderr}")
    if result.returncode != 0:
        tail = "\n".join(result.stderr.strip().splitlines()[-5:])
        raise KaldiDecodeError(f"decoding set {name!r}: {script} failed with exit code {result.returncode}, "
                               f"log in {log_path}:\n{tail}")


def _kaldi_decode(p: _Prepared, decoding, num_jobs: int) -> float:
    """Lattices with decode_dnn.sh, the scp split into ``num_jobs`` parts of similar length; returns seconds."""
    n = max(1, min(num_jobs, len(p.frames)))
    parts: list[list[str]] = [[] for _ in range(n)]
    load = [0] * n
    for utt in sorted(p.frames, key=lambda u: (-p.frames[u], u)):  # longest first into the lightest part
        i = load.index(min(load))
        parts[i].append(utt)
        load[i] += p.frames[utt]
    scps = []
    for i, part in enumerate(parts, 1):
        scps.append(p.job.out_dir / f"split{n}" / f"loglikes.{i}.scp")
        _write_atomically(scps[-1], "".join(f"{u} {p.locations[u]}\n" for u in sorted(part)))
    start = time.perf_counter()
    _run_script("decode_dnn.sh", ["--min-active", decoding.min_active, "--max-active", decoding.max_active,
                                  "--max-mem", decoding.max_mem, "--beam", decoding.beam, "--latbeam", decoding.latbeam,
                                  "--acwt", decoding.acwt, "--max-jobs", n, p.job.graph_dir, p.job.model,
                                  p.job.out_dir, *scps], p.job.out_dir / "log" / "decode_dnn.log", p.job.name)
    return time.perf_counter() - start


def _kaldi_score(p: _Prepared, decoding, lmwts: Sequence[int], wips: Sequence[str]) -> list[_Pass]:
    """score.sh over the LMWT x WIP grid; each hypothesis file is scored again here (see decode_sets)."""
    job = p.job
    # score.sh takes a data dir: the references are copied into one of our own
    _write_atomically(job.out_dir / "ref" / "text", job.ref_text.read_text(encoding="utf-8"))
    _run_script("score.sh", ["--scoring", decoding.scoring, "--min-lmwt", min(lmwts), "--max-lmwt", max(lmwts),
                             "--wip", " ".join(wips), job.out_dir / "ref", job.graph_dir, job.out_dir],
                job.out_dir / "log" / "score.log", job.name)
    passes = []
    for lmwt in lmwts:
        for wip in wips:
            hyps = scoring.read_text(job.out_dir / "scoring" / f"{lmwt}_{wip}.txt")
            failed = {u: "no lattice, see log/decode.*.log" for u in sorted(p.frames) if u not in hyps}
            # ties: the larger LM weight (the smaller acoustic scale, as in Python), then the smaller penalty
            score = scoring.score(p.refs, hyps, decoding.scoring)
            passes.append(_Pass(f"lmwt={lmwt} wip={wip}", hyps, failed, [], score, value=(lmwt, wip),
                                order=(-lmwt, float(wip))))
    return passes


def _kaldi_best_path(p: _Prepared, lmwt: int, wip: str) -> _Pass:
    """Hypotheses of a set without references: the best path of each lattice at ``lmwt``, ``wip``."""
    lattices = " ".join(shlex.quote(str(f)) for f in sorted(p.job.out_dir.glob("lat.*.gz")))
    words = shlex.quote(str(p.job.graph_dir / "words.txt"))
    rspecifier = shlex.quote(f"ark:gunzip -c {lattices} |")
    command = (f"set -o pipefail; lattice-scale --inv-acoustic-scale={lmwt} {rspecifier} ark:- | "
               f"lattice-add-penalty --word-ins-penalty={wip} ark:- ark:- | "
               f"lattice-best-path --word-symbol-table={words} ark:- ark,t:-")
    result = subprocess.run(["bash", "-c", command], capture_output=True, text=True)
    log_path = p.job.out_dir / "log" / "best_path.log"
    _write_atomically(log_path, f"# {command}\n{result.stderr}")
    if result.returncode != 0:
        raise KaldiDecodeError(f"decoding set {p.job.name!r}: the best-path pipeline failed, log in {log_path}")
    hyps = {}
    for line in result.stdout.splitlines():
        utt, *ids = line.split()
        unknown = [i for i in ids if int(i) not in p.words]
        if unknown:
            raise GraphMismatchError(f"{p.job.graph_dir / 'words.txt'} has no word {unknown[0]} (utterance {utt})")
        hyps[utt] = [p.words[int(i)] for i in ids]
    failed = {u: "no lattice, see log/decode.*.log" for u in sorted(p.frames) if u not in hyps}
    return _Pass(f"lmwt={lmwt} wip={wip}", hyps, failed, [], None)


def _decode_kaldi(prepared: Sequence[_Prepared], decoding, tune_on: Optional[str],
                  log: Callable[[str], None]) -> dict[str, SetResult]:
    num_jobs = decoding.num_jobs or os.cpu_count() or 1
    # untuned: the LM weight that undoes the acoustic scale the lattices were made with
    lmwt, wip = max(1, round(1 / decoding.acwt)), KALDI_WIPS[0]
    note = "LM weight round(1 / [decoding] acwt), not tuned"
    log(f"decoding with Kaldi (kaldi_decoding_scripts/decode_dnn.sh, score.sh), {num_jobs} job(s), "
        f"acwt {decoding.acwt:g}" + (f"; LM weight and insertion penalty tuned on {tune_on}" if tune_on
                                     else f"; lmwt={lmwt} wip={wip}, not tuned"))
    results = {}
    for p in sorted(prepared, key=lambda p: p.job.name != tune_on):
        lines: list[str] = []
        seconds = _kaldi_decode(p, decoding, num_jobs)
        if p.job.name == tune_on:  # lattices are rescored for each setting, not decoded again
            passes = _kaldi_score(p, decoding, KALDI_LMWTS, KALDI_WIPS)
            for r in passes:
                lines.append(_pass_line(p.job.name, r))
                log(lines[-1])
            chosen = _choose(passes)
            lmwt, wip = chosen.value
            note = f"tuned on {tune_on}: fewest errors, ties to the larger LM weight, then the smaller penalty"
        elif p.refs is not None:
            passes = _kaldi_score(p, decoding, [lmwt], [wip])
            chosen = passes[0]
        else:
            passes = [_kaldi_best_path(p, lmwt, wip)]
            chosen = passes[0]
        results[p.job.name] = _finish(p, chosen, passes, seconds, 1, "kaldi", note, lines, log)
    return results


# --------------------------------------------------------------------------- the entry point
def decode_sets(jobs: Sequence[DecodeJob], decoding: "config.Decoding", tune_on: Optional[str],
                log: Callable[[str], None] = print) -> dict[str, SetResult]:
    """Decode and score data sets, the setting chosen on ``tune_on`` and applied unchanged to the rest.

    Args:
        jobs: the sets (names unique); every input of every set is checked before any is decoded.
        decoding: ``[decoding]`` of the config: ``decoder`` (auto: Kaldi when all of
            :data:`KALDI_BINARIES` are on PATH), ``scoring``, beams, ``acwt``, ``acwt_sweep``, ``num_jobs``
            (0: one per CPU core). ``latbeam`` and ``max_mem`` only matter to Kaldi (no lattices here).
        tune_on: the set (with references) the setting is chosen on, or None to use ``acwt`` as it is.

    Python decoder: ``tune_on`` is decoded at every scale of ``acwt_sweep`` (``[acwt]`` when empty),
    each scale scored; the one with the fewest errors wins, ties going to the smaller scale (the
    one leaning more on the graph). Every other set is decoded at that scale only. Kaldi:
    ``decode_dnn.sh`` at ``acwt``, then ``score.sh`` over LMWT 1..10 x WIP 0.0/0.5/1.0 on ``tune_on``,
    ties going to the larger LM weight (the same rule), then the smaller penalty; untuned, LMWT is
    round(1 / acwt). Each hypothesis file of score.sh is scored again with :func:`scoring.score`,
    so that utterances Kaldi failed on count as deletions (``compute-wer --mode=present`` drops them).
    HCLG.fst is scanned against the model for the Python decoder only (Kaldi checks transition-ids
    itself, and its graphs can be too large for a scan in Python); ``graph_dir/num_pdfs`` always.

    Writes under each ``out_dir``: ``scoring/acwt_<s>.txt`` (``scoring/<lmwt>_<wip>.txt`` for Kaldi)
    and ``.per_utt`` for each setting tried, ``text`` and ``per_utt`` at the chosen one,
    ``log/decode.log``, and last ``scoring/summary.txt`` (one line per setting, the choice, the
    ``res.res`` line): a decode that crashed has no summary. Every file is written atomically.

    Returns ``{name: SetResult}`` in the order of ``jobs``. Raises :class:`MissingInputError`
    (graph, words.txt, model, scp or reference text missing), :class:`KaldiNotFoundError`,
    :class:`DecodeInputError` (log-likelihood dimension != the model's pdfs; bad ``tune_on``) and
    :class:`GraphMismatchError` (HCLG input labels beyond the model's transition-ids). Utterances
    with no surviving path are not errors: they are listed in ``SetResult.failed`` and in the log.

    >>> job = DecodeJob("dev", "exp/X/forward_dev/loglikes.scp", "exp/mono/graph", "exp/mono/final.mdl",
    ...                 "data/dev/text", "exp/X/decode_dev")
    >>> results = decode_sets([job], config.Decoding(acwt_sweep=[0.1, 0.2]), tune_on="dev")  # doctest: +SKIP
    >>> results["dev"].res_line()  # doctest: +SKIP
    'dev: %WER 21.30 [ 1234 / 5793, 100 ins, 300 del, 834 sub ] acwt=0.1 decoder=python rtf=0.050'
    """
    jobs = list(jobs)
    names = [j.name for j in jobs]
    if len(set(names)) != len(names):
        raise DecodeInputError(f"decoding sets must have different names, got {names}")
    if tune_on is not None:
        if tune_on not in names:
            raise DecodeInputError(f"tune_on={tune_on!r} is not one of the sets to decode: {names}")
        if next(j for j in jobs if j.name == tune_on).ref_text is None:
            raise DecodeInputError(f"tune_on={tune_on!r} has no reference text (ref_text is None): the setting cannot "
                                   "be chosen on it (tune_on=None decodes every set at [decoding] acwt)")
    scales = list(decoding.acwt_sweep) + [decoding.acwt]
    if any(not s > 0 for s in scales):
        raise DecodeInputError(f"[decoding] acwt and acwt_sweep must be positive, got acwt={decoding.acwt} "
                               f"acwt_sweep={decoding.acwt_sweep}")
    if not jobs:
        return {}
    decoder = choose_decoder(decoding.decoder)
    try:
        prepared = [_prepare(j, with_graph=decoder == "python") for j in jobs]
        for p in prepared:  # all of them before anything is decoded: a crash leaves no old result looking new
            _clear_outputs(p.job.out_dir)
        results = (_decode_python if decoder == "python" else _decode_kaldi)(prepared, decoding, tune_on, log)
    finally:
        _GRAPHS.clear()  # graphs can be large; the trainer has no further use for them
    return {name: results[name] for name in names}

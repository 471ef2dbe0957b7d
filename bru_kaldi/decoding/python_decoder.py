"""The Python decoder over whole sets: every utterance at every setting, in parallel processes.

Utterances are decoded one per task, longest first, by a pool of worker processes that each hold the
graphs (:func:`decoding.utterance.decode` per utterance). A setting is an acoustic scale and a word
insertion penalty: the tuning set is decoded at every pair of ``[decoding] acwt_sweep`` x
``wip_sweep`` (a penalty is put on a copy of the graph's word arcs, built once before the workers
start), and every other set at the pair chosen on it, as Kaldi's scoring chooses its LM weight and
penalty on dev. Where the best pair is on the edge of that grid the grid grows past it and only the
new pairs are decoded (``grid.tune``, ``[decoding] grid_extensions``).
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import time
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager
from typing import Callable, Iterable, Iterator, Optional, Sequence

import kaldiio
import numpy as np

from bru_kaldi import scoring
from bru_kaldi.decoding.grid import ARITHMETIC, GEOMETRIC, Grid, tune
from bru_kaldi.decoding.sets import (GRAPHS, DecodeInputError, Pass, Prepared, SetResult, finish, pass_line,
                                     write_pass)
from bru_kaldi.decoding.utterance import DecoderOptions, NoPathError, decode, load_graph, with_word_penalty
from bru_kaldi.kaldi.transition_model import read_transition_model


# --------------------------------------------------------------------------- workers
def load_graphs(graph_keys: Sequence[tuple[str, str]], penalties: Sequence[float]) -> None:
    """Each graph and model, once, and each graph's copy with every non-zero word insertion penalty."""
    for key in graph_keys:
        if key not in GRAPHS or GRAPHS[key][0] is None:
            tm = read_transition_model(key[1])
            GRAPHS[key] = (load_graph(key[0]), tm.tid2pdf, tm.num_pdfs)
        graph, tid2pdf, num_pdfs = GRAPHS[key]
        for penalty in penalties:
            if penalty and key + (penalty,) not in GRAPHS:
                GRAPHS[key + (penalty,)] = (with_word_penalty(graph, penalty), tid2pdf, num_pdfs)


def graph_with_penalty(graph_key: tuple[str, str], penalty: float):
    """The graph of ``graph_key`` with word insertion ``penalty``: built here the first time, where a grid
    grown on the tuning set (grid.tune) reaches a penalty the workers were not started with."""
    if penalty and graph_key + (penalty,) not in GRAPHS:
        load_graphs([graph_key], [penalty])
    return GRAPHS[graph_key + (penalty,) if penalty else graph_key][0]


def init_worker(graph_keys: Sequence[tuple[str, str]], penalties: Sequence[float]) -> None:
    """Load the graphs once per worker (nothing to do when the pool forked: inherited).

    A worker leaves SIGINT and SIGTERM to the run that owns it: it could only act on them after the
    utterance in hand (seconds, in C++), and the parent stops the pool at once itself.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    load_graphs(graph_keys, penalties)


def decode_task(task: tuple) -> tuple[str, list[tuple[Optional[list[int]], bool, str, list[int]]]]:
    """Decode one utterance at each of its ``(options, penalty)`` settings:
    ``(utt, [(word ids or None, reached_final, why failed, alignment)])``."""
    graph_key, scp, utt, location, settings = task
    _, tid2pdf, num_pdfs = GRAPHS[graph_key]
    loglikes = np.asarray(kaldiio.load_mat(location), dtype=np.float32)  # (T, num_pdfs)
    if loglikes.ndim != 2 or loglikes.shape[1] != num_pdfs:  # checked from the header; the data must agree
        raise DecodeInputError(f"{scp}: utterance {utt} has log-likelihoods of shape {loglikes.shape}, "
                               f"expected (frames, {num_pdfs}) for {graph_key[1]}")
    nan = np.isnan(loglikes).any(axis=1)
    if nan.any():  # a diverged network: nothing to search, and the reason is worth naming
        return utt, [(None, False, f"NaN log-likelihoods (first at frame {int(nan.argmax())})", [])] * len(settings)
    out = []
    for options, penalty in settings:
        graph = graph_with_penalty(graph_key, penalty)
        try:
            result = decode(loglikes, graph, tid2pdf, options)
            out.append((result.words, result.reached_final, "", result.alignment))
        except NoPathError as error:
            out.append((None, False, str(error), []))
    return utt, out


@contextmanager
def workers(num_jobs: int, graph_keys: Sequence[tuple[str, str]],
            penalties: Sequence[float] = ()) -> Iterator[Callable[[list], Iterable]]:
    """A function that maps :func:`decode_task` over tasks: in this process for one job, else in a pool.

    A ProcessPoolExecutor rather than multiprocessing.Pool: a worker killed by the kernel (memory)
    or by a crash in the decoder breaks the pool with an error, where Pool would wait for ever.
    """
    if num_jobs <= 1:
        yield lambda tasks: map(decode_task, tasks)
        return
    # fork where there is one: the workers inherit the loaded graphs and never re-import the
    # trainer (torch); they touch neither torch nor CUDA nor logging, which fork would upset.
    method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
    pool = ProcessPoolExecutor(num_jobs, multiprocessing.get_context(method), init_worker,
                               (list(graph_keys), list(penalties)))
    try:
        yield lambda tasks: pool.map(decode_task, tasks)
    except KeyboardInterrupt:  # SIGINT, SIGTERM: stop now, not after every worker's utterance in hand
        for process in list(getattr(pool, "_processes", {}).values()):
            process.kill()
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)  # after an error: no new utterances started



def decode_python_set(p: Prepared, pairs: Sequence[tuple[float, float]], decoding, run) -> tuple[list[Pass], float]:
    """Decode every utterance of ``p`` at every ``(scale, penalty)``; returns one pass per pair and the
    wall time. A penalty shows in a pass's setting only where ``[decoding] wip_sweep`` tries others."""
    # longest first, one utterance per task: the pool stays busy to the end
    order = sorted(p.frames, key=lambda u: (-p.frames[u], u))
    settings = [(DecoderOptions(beam=decoding.beam, max_active=decoding.max_active, min_active=decoding.min_active,
                                acoustic_scale=scale), penalty) for scale, penalty in pairs]
    show_penalty = set(decoding.wip_sweep or [0.0]) != {0.0} or any(penalty for _, penalty in pairs)
    tasks = [(p.graph_key, str(p.job.loglikes_scp), utt, p.locations[utt], settings) for utt in order]
    start = time.perf_counter()
    try:
        outcomes = dict(run(tasks))
    except BrokenProcessPool:
        raise RuntimeError(f"decoding set {p.job.name!r}: a decoding worker died (killed for memory, or a crash in "
                           "the decoder); fewer workers ([decoding] num_jobs) need less memory") from None
    seconds = time.perf_counter() - start
    passes = []
    for i, (scale, penalty) in enumerate(pairs):
        hyps, failed, partial, alignments = {}, {}, [], {}
        for utt in sorted(outcomes):
            ids, reached_final, why, alignment = outcomes[utt][i]
            if ids is None:
                failed[utt] = why
                continue
            hyps[utt] = [p.words[w] for w in ids]  # check_graph made sure every output label is a word
            alignments[utt] = alignment
            if not reached_final:
                partial.append(utt)
        score = scoring.score(p.refs, hyps, decoding.scoring) if p.refs is not None else None
        setting = f"acwt={scale:g}" + (f" wip={penalty:g}" if show_penalty else "")
        passes.append(Pass(setting, hyps, failed, partial, score, value=(scale, penalty), order=(scale, penalty),
                           alignments=alignments))
    return passes, seconds




def decode_python(prepared: Sequence[Prepared], decoding, tune_on: Optional[str],
                   log: Callable[[str], None]) -> dict[str, SetResult]:
    scales = sorted(set(decoding.acwt_sweep)) or [decoding.acwt]
    penalties = sorted(set(decoding.wip_sweep)) or [0.0]
    num_jobs = min(decoding.num_jobs or os.cpu_count() or 1, max(len(p.frames) for p in prepared))
    log(f"decoding with the Python decoder (kaldi-hmm-gmm FasterDecoder), {num_jobs} job(s), beam {decoding.beam}, "
        f"max-active {decoding.max_active}, min-active {decoding.min_active}"
        + (f"; acoustic scale tuned on {tune_on} over {' '.join(f'{s:g}' for s in scales)}"
           + (f", word insertion penalty over {' '.join(f'{w:g}' for w in penalties)}" if penalties != [0.0] else "")
           if tune_on else f"; acoustic scale {decoding.acwt:g}, not tuned"))
    chosen_pair, note = (decoding.acwt, penalties[0]), "[decoding] acwt, not tuned"
    keys = sorted({p.graph_key for p in prepared})
    started = time.perf_counter()
    load_graphs(keys, penalties if tune_on else [chosen_pair[1]])
    if penalties != [0.0]:
        log(f"graphs with word insertion penalties ready in {time.perf_counter() - started:.1f} s")
    results = {}
    with workers(num_jobs, keys, penalties) as run:
        for p in sorted(prepared, key=lambda p: p.job.name != tune_on):  # the tuning set first
            lines: list[str] = []
            grid = None
            if p.job.name == tune_on:
                # the tuning set is decoded again at each setting: a lattice made once and rescored, as Kaldi
                # tunes, would need a lattice decoder whose lattice Python can read, and kaldi-decoder's
                # LatticeSimpleDecoder (no max-active) took 9-30 times FasterDecoder's time for one pass of the
                # word task, with raw lattices of up to 87k arcs an utterance: no cheaper than decoding again at
                # every point of the grid (bench/search_errors.py --lattice; RESULTS.md)
                grid = Grid({"acwt": scales, "wip": penalties}, {"acwt": GEOMETRIC, "wip": ARITHMETIC})
                seconds = 0.0

                def evaluate(settings, p=p, lines=lines):
                    nonlocal seconds
                    passes, spent = decode_python_set(p, settings, decoding, run)
                    seconds += spent
                    for r in passes:
                        lines.append(pass_line(p.job.name, r))
                        log(lines[-1])
                        write_pass(p.job.out_dir, r)
                    return passes

                def say(line, lines=lines):
                    lines.append(f"{p.job.name}: {line}")
                    log(lines[-1])

                passes, chosen = tune(grid, evaluate, decoding.grid_extensions, say)
                chosen_pair = chosen.value
                note = f"tuned on {tune_on}: fewest errors, ties to the smaller scale, then the smaller penalty"
            else:
                passes, seconds = decode_python_set(p, [chosen_pair], decoding, run)
                chosen = passes[0]
                write_pass(p.job.out_dir, chosen)
            record = (grid.describe(), grid.edges) if grid else ()  # the tuning set's final grid, in res.res
            results[p.job.name] = finish(p, chosen, passes, seconds, len(passes), "python", note, lines, log,
                                         chosen.value, *record)
    return results

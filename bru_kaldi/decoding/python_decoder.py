"""The Python decoder over whole sets: every utterance at every acoustic scale, in parallel processes.

Utterances are decoded one per task, longest first, by a pool of worker processes that each hold the
graphs (:func:`decoding.utterance.decode` per utterance); the tuning set is decoded at every scale
of ``[decoding] acwt_sweep`` and every other set at the scale chosen on it.
"""

from __future__ import annotations

import multiprocessing
import os
import time
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager
from typing import Callable, Iterable, Iterator, Optional, Sequence

import kaldiio
import numpy as np

from bru_kaldi import scoring
from bru_kaldi.decoding.sets import (GRAPHS, DecodeInputError, Pass, Prepared, SetResult, choose, finish, pass_line,
                                     write_pass)
from bru_kaldi.decoding.utterance import DecoderOptions, NoPathError, decode, load_graph
from bru_kaldi.kaldi.transition_model import read_transition_model


# --------------------------------------------------------------------------- workers
def init_worker(graph_keys: Sequence[tuple[str, str]]) -> None:
    """Load each graph and model once per worker (nothing to do when the pool forked: inherited)."""
    for key in graph_keys:
        if key not in GRAPHS:
            tm = read_transition_model(key[1])
            GRAPHS[key] = (load_graph(key[0]), tm.tid2pdf, tm.num_pdfs)


def decode_task(task: tuple) -> tuple[str, list[tuple[Optional[list[int]], bool, str]]]:
    """Decode one utterance with each of its options: ``(utt, [(word ids or None, reached_final, why failed)])``."""
    graph_key, scp, utt, location, settings = task
    graph, tid2pdf, num_pdfs = GRAPHS[graph_key]
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
def workers(num_jobs: int, graph_keys: Sequence[tuple[str, str]]) -> Iterator[Callable[[list], Iterable]]:
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
    pool = ProcessPoolExecutor(num_jobs, multiprocessing.get_context(method), init_worker, (list(graph_keys),))
    try:
        yield lambda tasks: pool.map(decode_task, tasks)
    finally:
        pool.shutdown(wait=True, cancel_futures=True)  # after an error: no new utterances started



def decode_python_set(p: Prepared, scales: Sequence[float], decoding, run) -> tuple[list[Pass], float]:
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
        passes.append(Pass(f"acwt={scale:g}", hyps, failed, partial, score, value=scale, order=(scale,)))
    return passes, seconds




def decode_python(prepared: Sequence[Prepared], decoding, tune_on: Optional[str],
                   log: Callable[[str], None]) -> dict[str, SetResult]:
    sweep = sorted(set(decoding.acwt_sweep)) or [decoding.acwt]
    num_jobs = min(decoding.num_jobs or os.cpu_count() or 1, max(len(p.frames) for p in prepared))
    log(f"decoding with the Python decoder (kaldi-hmm-gmm FasterDecoder), {num_jobs} job(s), beam {decoding.beam}, "
        f"max-active {decoding.max_active}, min-active {decoding.min_active}"
        + (f"; acoustic scale tuned on {tune_on} over {' '.join(f'{s:g}' for s in sweep)}" if tune_on
           else f"; acoustic scale {decoding.acwt:g}, not tuned"))
    chosen_scale, note = decoding.acwt, "[decoding] acwt, not tuned"
    results = {}
    with workers(num_jobs, sorted({p.graph_key for p in prepared})) as run:
        for p in sorted(prepared, key=lambda p: p.job.name != tune_on):  # the tuning set first
            lines: list[str] = []
            if p.job.name == tune_on:
                passes, seconds = decode_python_set(p, sweep, decoding, run)
                for r in passes:
                    lines.append(pass_line(p.job.name, r))
                    log(lines[-1])
                    write_pass(p.job.out_dir, r)
                chosen = choose(passes)
                chosen_scale = chosen.value
                note = f"tuned on {tune_on}: fewest errors, ties to the smaller scale"
            else:
                passes, seconds = decode_python_set(p, [chosen_scale], decoding, run)
                chosen = passes[0]
                write_pass(p.job.out_dir, chosen)
            results[p.job.name] = finish(p, chosen, passes, seconds, len(passes), "python", note, lines, log)
    return results

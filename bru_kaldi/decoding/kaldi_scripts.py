"""Decoding through a Kaldi installation: ``kaldi_decoding_scripts/decode_dnn.sh`` and ``score.sh``.

Lattices come from ``latgen-faster-mapped``, split into jobs of similar length; ``score.sh`` scores
them over Kaldi's LM weight x word insertion penalty grid on the tuning set, and the sets without
references get the best path at the chosen setting.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Optional, Sequence

from bru_kaldi import scoring
from bru_kaldi.config import DECODERS
from bru_kaldi.decoding.ctm import read_word_boundary
from bru_kaldi.atomic import write_text_atomically
from bru_kaldi.decoding.grid import ARITHMETIC, LM_WEIGHT, Grid, tune
from bru_kaldi.decoding.sets import (DecodeInputError, GraphMismatchError, KaldiDecodeError, KaldiNotFoundError, Pass,
                                     Prepared, SetResult, finish, pass_line)

KALDI_BINARIES = ("latgen-faster-mapped", "lattice-scale", "lattice-add-penalty", "lattice-best-path", "compute-wer")
KALDI_SCRIPTS = Path(__file__).resolve().parents[2] / "kaldi_decoding_scripts"
KALDI_LMWTS = tuple(range(1, 11))  # score.sh's grid: LM weights 1..10 (acoustic scale 1 / LMWT) ...
KALDI_WIPS = ("0.0", "0.5", "1.0")  # ... and word insertion penalties (both grown past an edge: grid.tune)


def choose_decoder(decoder: str) -> str:
    """``"kaldi"`` or ``"python"`` for ``[decoding] decoder`` (auto: Kaldi when all its binaries are on PATH).

    >>> choose_decoder("python")
    'python'
    """
    if decoder not in DECODERS:
        raise DecodeInputError(f"[decoding] decoder must be one of {', '.join(DECODERS)}, got {decoder!r}")
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
    # the scripts' Python steps run on this interpreter, not on whatever `python` is first on PATH
    result = subprocess.run(command, capture_output=True, text=True, env=dict(os.environ, PYTHON=sys.executable))
    write_text_atomically(log_path, f"# {shlex.join(command)}\n{result.stdout}{result.stderr}")
    if result.returncode != 0:
        tail = "\n".join(result.stderr.strip().splitlines()[-5:])
        raise KaldiDecodeError(f"decoding set {name!r}: {script} failed with exit code {result.returncode}, "
                               f"log in {log_path}:\n{tail}")


def _kaldi_decode(p: Prepared, decoding, num_jobs: int) -> float:
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
        write_text_atomically(scps[-1], "".join(f"{u} {p.locations[u]}\n" for u in sorted(part)))
    start = time.perf_counter()
    _run_script("decode_dnn.sh", ["--min-active", decoding.min_active, "--max-active", decoding.max_active,
                                  "--max-mem", decoding.max_mem, "--beam", decoding.beam, "--latbeam", decoding.latbeam,
                                  "--acwt", decoding.acwt, "--post-decode-acwt", decoding.post_decode_acwt,
                                  "--max-jobs", n, p.job.graph_dir, p.job.model,
                                  p.job.out_dir, *scps], p.job.out_dir / "log" / "decode_dnn.log", p.job.name)
    return time.perf_counter() - start


def wip_text(penalty: float) -> str:
    """A penalty as score.sh names its files: ``0.0``, ``0.5``, ``-0.5``.

    >>> wip_text(0), wip_text(1.5), wip_text(-0.5)
    ('0.0', '1.5', '-0.5')
    """
    return f"{float(penalty):.1f}" if float(penalty) * 10 == round(float(penalty) * 10) else f"{float(penalty):g}"


def _kaldi_score(p: Prepared, decoding, settings: Sequence[tuple[int, str]]) -> list[Pass]:
    """score.sh over the LM weights and penalties of ``settings`` (LMWT, WIP); each hypothesis file is scored
    again here (see decode_sets). score.sh scores the whole rectangle of LM weights min..max by penalties,
    so a grid grown at one edge rescores a little more than it needs; only ``settings`` are returned."""
    job = p.job
    if not settings:
        return []
    lmwts, wips = sorted({lmwt for lmwt, _ in settings}), [wip_text(w) for w in sorted({float(w) for _, w in settings})]
    # score.sh takes a data dir: the references are copied into one of our own
    write_text_atomically(job.out_dir / "ref" / "text", job.ref_text.read_text(encoding="utf-8"))
    _run_script("score.sh", ["--scoring", decoding.scoring, "--min-lmwt", min(lmwts), "--max-lmwt", max(lmwts),
                             "--wip", " ".join(wips), job.out_dir / "ref", job.graph_dir, job.out_dir],
                job.out_dir / "log" / "score.log", job.name)
    passes = []
    for lmwt, penalty in settings:
        wip = wip_text(penalty)
        hyps = scoring.read_text(job.out_dir / "scoring" / f"{lmwt}_{wip}.txt")
        failed = {u: "no lattice, see log/decode.*.log" for u in sorted(p.frames) if u not in hyps}
        # ties: the larger LM weight (the smaller acoustic scale, as in Python), then the smaller penalty
        score = scoring.score(p.refs, hyps, decoding.scoring)
        passes.append(Pass(f"lmwt={lmwt} wip={wip}", hyps, failed, [], score, value=(lmwt, float(penalty)),
                           order=(-lmwt, float(penalty))))
    return passes


def _kaldi_best_path(p: Prepared, lmwt: int, penalty: float) -> Pass:
    """Hypotheses of a set without references: the best path of each lattice at ``lmwt``, ``penalty``."""
    wip = wip_text(penalty)
    lattices = " ".join(shlex.quote(str(f)) for f in sorted(p.job.out_dir.glob("lat.*.gz")))
    words = shlex.quote(str(p.job.graph_dir / "words.txt"))
    rspecifier = shlex.quote(f"ark:gunzip -c {lattices} |")
    ali_file = p.job.out_dir / "log" / "best_path.ali"  # transition-ids of each best path (for the CTM)
    ali_file.parent.mkdir(parents=True, exist_ok=True)
    command = (f"set -o pipefail; lattice-scale --inv-acoustic-scale={lmwt} {rspecifier} ark:- | "
               f"lattice-add-penalty --word-ins-penalty={wip} ark:- ark:- | "
               f"lattice-best-path --word-symbol-table={words} ark:- ark,t:- ark,t:{shlex.quote(str(ali_file))}")
    result = subprocess.run(["bash", "-c", command], capture_output=True, text=True)
    log_path = p.job.out_dir / "log" / "best_path.log"
    write_text_atomically(log_path, f"# {command}\n{result.stderr}")
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
    alignments = {}
    for line in ali_file.read_text().splitlines() if ali_file.is_file() else []:
        utt, *tids = line.split()
        alignments[utt] = [int(t) for t in tids]
    return Pass(f"lmwt={lmwt} wip={wip}", hyps, failed, [], None, value=(lmwt, float(penalty)), alignments=alignments)


def lm_weights(post_decode_acwt: float) -> tuple[int, ...]:
    """score.sh's LM weights for lattices whose acoustic scores were multiplied by ``post_decode_acwt``: 1..10
    (acoustic scales 1 to 0.1), or from half to twice that factor (10 for chain models: scales 2 to 0.5).

    >>> lm_weights(1.0), lm_weights(10.0)[0], lm_weights(10.0)[-1]
    ((1, 2, 3, 4, 5, 6, 7, 8, 9, 10), 5, 20)
    """
    if post_decode_acwt == 1.0:
        return KALDI_LMWTS
    return tuple(range(max(1, round(post_decode_acwt / 2)), round(post_decode_acwt * 2) + 1))


def decode_kaldi(prepared: Sequence[Prepared], decoding, tune_on: Optional[str],
                  log: Callable[[str], None]) -> dict[str, SetResult]:
    num_jobs = decoding.num_jobs or os.cpu_count() or 1
    # untuned: the LM weight that undoes the acoustic scale the lattices were made with, and the smallest
    # penalty of wip_sweep (as the Python decoder's)
    lmwt = max(1, round(decoding.post_decode_acwt / decoding.acwt))
    wip = float(min(decoding.wip_sweep, default=0))
    note = "LM weight round([decoding] post_decode_acwt / acwt), not tuned"
    log(f"decoding with Kaldi (kaldi_decoding_scripts/decode_dnn.sh, score.sh), {num_jobs} job(s), "
        f"acwt {decoding.acwt:g}" + (f"; LM weight and insertion penalty tuned on {tune_on}" if tune_on
                                     else f"; lmwt={lmwt} wip={wip_text(wip)}, not tuned"))
    results = {}
    for p in sorted(prepared, key=lambda p: p.job.name != tune_on):
        lines: list[str] = []
        seconds = _kaldi_decode(p, decoding, num_jobs)
        grid = None
        if p.job.name == tune_on:  # lattices are rescored for each setting, not decoded again
            grid = Grid({"lmwt": list(lm_weights(decoding.post_decode_acwt)), "wip": [float(w) for w in KALDI_WIPS]},
                        {"lmwt": LM_WEIGHT, "wip": ARITHMETIC})

            def evaluate(settings, p=p, lines=lines):
                passes = _kaldi_score(p, decoding, settings)
                for r in passes:
                    lines.append(pass_line(p.job.name, r))
                    log(lines[-1])
                return passes

            def say(line, lines=lines, name=p.job.name):
                lines.append(f"{name}: {line}")
                log(lines[-1])

            passes, chosen = tune(grid, evaluate, decoding.grid_extensions, say)
            lmwt, wip = chosen.value
            note = f"tuned on {tune_on}: fewest errors, ties to the larger LM weight, then the smaller penalty"
        elif p.refs is not None:
            passes = _kaldi_score(p, decoding, [(lmwt, wip)])
            chosen = passes[0]
        else:
            passes = [_kaldi_best_path(p, lmwt, wip)]
            chosen = passes[0]
        if not chosen.alignments and read_word_boundary(p.job.graph_dir) is not None:  # the CTM needs them
            chosen.alignments = _kaldi_best_path(p, *chosen.value).alignments
        record = (grid.describe(), grid.edges) if grid else ()  # the tuning set's final grid, in res.res
        results[p.job.name] = finish(p, chosen, passes, seconds, 1, "kaldi", note, lines, log,
                                     (decoding.post_decode_acwt / lmwt, wip), *record)
    return results

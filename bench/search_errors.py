"""Search errors of the Python decoder: what a wider search (beam, max-active states) changes, on trained runs.

For each experiment folder (trained, forwarded, decoded: ``run_exp.py`` or ``compare.py sweep``), the set's
log-likelihoods are decoded again at the acoustic scale and insertion penalty its decode chose on dev
(``decoding.json``), at each search setting ``BEAM:MAX_ACTIVE``. The network and the setting stay fixed,
so what changes is the search alone: an utterance whose best path under a wider search costs less than
under the narrowest one is a search error of the narrowest (a path the decoder pruned was better by its
own scores). Per run and setting: WER, errors against the narrowest setting, search errors, the
decoding time (one process: the time is the decoder's own, comparable between settings run in turn) and
the real-time factor. The table ends with, per setting, the WER change over all runs and the
utterance-level matched-pairs p of it: the network is the same, so the utterances are the whole of the
variation (no seed enters), and that test is the right one here.

Usage: python bench/search_errors.py RUN_DIR... [--set test] [--settings 13:2000 15:7000 17:15000] [--jobs N]
                                    [--lattice N] [--markdown RESULTS.md --section search-errors]

``--lattice N`` also times, on each run's first N utterances, what tuning on lattices would take instead
(kaldi-decoder's LatticeSimpleDecoder against FasterDecoder at the narrowest setting).
  e.g. python bench/search_errors.py results/study_runs/.../MINIW_liGRU/seed1 --settings 13:2000 15:7000
"""

from __future__ import annotations

import argparse
import math
import multiprocessing
import os
import shlex
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import kaldi_hmm_gmm  # noqa: E402,F401  (before kaldifst: see bru_kaldi.decoding.utterance)
import kaldiio  # noqa: E402
import numpy as np  # noqa: E402

from bru_kaldi import scoring  # noqa: E402
from bru_kaldi.comparison import report, statistics  # noqa: E402
from bru_kaldi.config import parse_config  # noqa: E402
from bru_kaldi.decoding.sets import read_words  # noqa: E402
from bru_kaldi.decoding.utterance import (DecoderOptions, NoPathError, decode, load_graph,  # noqa: E402
                                          transition_loglikes, with_word_penalty)
from bru_kaldi.kaldi.transition_model import read_transition_model  # noqa: E402
from bru_kaldi.machine import cpu_model, load_average  # noqa: E402
from bru_kaldi.records import read_decoding  # noqa: E402

FRAME_SHIFT = 0.01  # seconds per input frame


@dataclass
class Decoded:
    """One run's set decoded at one search setting."""

    hyps: dict[str, list[str]]
    costs: dict[str, float]  # utterance -> best path's cost (inf where none survived)
    seconds: float
    score: scoring.Score


def parse_setting(text: str) -> tuple[float, int]:
    """``"13:2000"`` -> ``(13.0, 2000)``."""
    try:
        beam, active = text.split(":")
        return float(beam), int(active)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected BEAM:MAX_ACTIVE (13:2000), got {text!r}") from None


def reference_text(run: Path, name: str) -> Path:
    """The reference ``text`` of set ``name`` as the run's config names it (its label stream's data folder)."""
    config = parse_config(run / "config.resolved.cfg")
    lab = next(s for s in config.dataset(name).lab if s.lab_name == config.model.senone_lab)
    return Path(lab.lab_data_folder) / "text"


def decode_run(loglikes: dict[str, np.ndarray], beam: float, max_active: int, graph, tid2pdf, words, refs,
               choice, scoring_filter: str) -> Decoded:
    """Every utterance of ``loglikes`` (read once, outside the timing) at one search setting."""
    options = DecoderOptions(beam=beam, max_active=max_active, acoustic_scale=choice.acoustic_scale)
    hyps, costs = {}, {}
    started = time.process_time()
    for utt, matrix in loglikes.items():
        try:
            result = decode(matrix, graph, tid2pdf, options)
        except NoPathError:
            costs[utt] = math.inf
            continue
        hyps[utt] = [words[w] for w in result.words]
        costs[utt] = result.cost
    seconds = time.process_time() - started
    return Decoded(hyps, costs, seconds, scoring.score(refs, hyps, scoring_filter))


def measure(run: Path, name: str, settings, log) -> tuple[list[Decoded], float, str]:
    """The run's set decoded at each setting, the seconds of audio, and the run's label for the table."""
    choice = read_decoding(run)
    config = parse_config(run / "config.resolved.cfg")
    model = read_transition_model(run / "final.mdl")
    graph = load_graph(Path(choice.graph) / "HCLG.fst")
    if choice.word_penalty:
        graph = with_word_penalty(graph, choice.word_penalty)
    words = read_words(Path(choice.graph) / "words.txt")
    refs = scoring.read_text(reference_text(run, name))
    loglikes = {utt: np.asarray(m, dtype=np.float32)
                for utt, m in kaldiio.load_scp(str(run / f"forward_{name}" / "loglikes.scp")).items()}
    audio = sum(len(m) for m in loglikes.values()) * FRAME_SHIFT * config.model.frame_subsampling_factor
    out = []
    for beam, active in settings:
        out.append(decode_run(loglikes, beam, active, graph, model.tid2pdf, words, refs, choice,
                              config.decoding.scoring))
        log(f"{run} beam {beam:g} max-active {active}: {out[-1].score.total.kaldi_line()} in {out[-1].seconds:.1f} s")
    label = f"{run.parent.name} seed {config.exp.seed} ({choice.setting})"
    return out, audio, label


def lattice_cost(run: Path, name: str, utterances: int, beam: float, max_active: int) -> str:
    """What tuning on lattices would cost the Python decoder: kaldi-decoder's LatticeSimpleDecoder (the one
    decoder of the pinned packages whose lattice Python can read; kaldi-hmm-gmm's LatticeFasterDecoder
    returns its best path alone) against FasterDecoder, CPU seconds on the set's first ``utterances``."""
    import kaldi_decoder

    choice = read_decoding(run)
    model = read_transition_model(run / "final.mdl")
    graph = load_graph(Path(choice.graph) / "HCLG.fst")
    items = list(kaldiio.load_scp(str(run / f"forward_{name}" / "loglikes.scp")).items())[:utterances]
    seconds, arcs = [0.0, 0.0], 0
    for utt, loglikes in items:
        loglikes = np.asarray(loglikes, dtype=np.float32)
        started = time.process_time()
        decode(loglikes, graph, model.tid2pdf, DecoderOptions(beam=beam, max_active=max_active,
                                                              acoustic_scale=choice.acoustic_scale))
        seconds[0] += time.process_time() - started
        started = time.process_time()
        scores = transition_loglikes(loglikes, model.tid2pdf, choice.acoustic_scale)
        decoder = kaldi_decoder.LatticeSimpleDecoder(graph, kaldi_decoder.LatticeSimpleDecoderConfig(beam=beam,
                                                                                                    lattice_beam=8.0))
        decoder.decode(kaldi_decoder.DecodableCtc(scores))
        _, lattice = decoder.get_raw_lattice(True)
        seconds[1] += time.process_time() - started
        arcs += sum(lattice.num_arcs(state) for state in range(lattice.num_states))
    return (f"{run} ({len(items)} utterances of {name}): FasterDecoder (beam {beam:g}, max-active {max_active}) "
            f"{seconds[0]:.1f} CPU s, LatticeSimpleDecoder (beam {beam:g}, lattice beam 8) {seconds[1]:.1f} CPU s, "
            f"{seconds[1] / seconds[0]:.0f} times as long, {arcs / len(items):.0f} raw lattice arcs an utterance")


def measure_quietly(work) -> tuple[str, list[Decoded], float]:
    run, name, settings = work
    decoded, audio, label = measure(run, name, settings, lambda line: print(line, flush=True))
    return label, decoded, audio


def table(runs, settings, name: str) -> str:
    """Markdown: a row per run and setting, then a row per setting over all runs."""
    lines = [f"| run (setting chosen on dev) | beam | max-active | {name} WER | errors | against the narrowest | "
             "search errors of the narrowest | CPU seconds | real-time factor | time against the narrowest |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for label, decoded, audio in runs:
        base = decoded[0]
        for (beam, active), d in zip(settings, decoded):
            better = sum(d.costs[u] < base.costs[u] - 1e-3 for u in base.costs)
            lines.append(f"| {label} | {beam:g} | {active} | {d.score.total.rate:.2f} | {d.score.total.errors} | "
                         f"{d.score.total.errors - base.score.total.errors:+d} | {better} | {d.seconds:.1f} | "
                         f"{d.seconds / audio:.3f} | {d.seconds / base.seconds:.2f} |")
    for i, (beam, active) in enumerate(settings[1:], 1):
        narrow = np.concatenate([[d[0].score.per_utterance[u].errors for u in sorted(d[0].score.per_utterance)]
                                 for _, d, _ in runs])
        wide = np.concatenate([[d[i].score.per_utterance[u].errors for u in sorted(d[i].score.per_utterance)]
                               for _, d, _ in runs])
        test = statistics.matched_pairs(narrow[None, :], wide[None, :])
        tokens = sum(d[0].score.total.ref_len for _, d, _ in runs)
        lines.append(f"| all runs: {beam:g}:{active} against {settings[0][0]:g}:{settings[0][1]} | | | "
                     f"{100 * (wide.sum() - narrow.sum()) / tokens:+.2f} points | {int(wide.sum() - narrow.sum()):+d} | "
                     f"matched-pairs p {test.p_value:.3g} | | | | |")
    return "\n".join(lines)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", type=Path)
    parser.add_argument("--set", default="test", dest="name")
    parser.add_argument("--settings", nargs="+", type=parse_setting, default=[(13.0, 2000), (15.0, 7000), (17.0, 15000)])
    parser.add_argument("--jobs", type=int, default=1, help="runs decoded at once, one process each")
    parser.add_argument("--lattice", type=int, default=0, metavar="N",
                        help="also time a lattice decoder against FasterDecoder on the first N utterances of each run")
    parser.add_argument("--markdown", type=Path)
    parser.add_argument("--section", default="search-errors")
    args = parser.parse_args(argv)
    for run in args.runs:
        for needed in ("decoding.json", "final.mdl", f"forward_{args.name}/loglikes.scp", "config.resolved.cfg"):
            if not (run / needed).is_file():
                sys.exit(f"{run}: no {needed} (a trained, forwarded and decoded experiment folder is needed)")
    work = [(run, args.name, args.settings) for run in args.runs]
    if args.jobs > 1:  # a run a process: the times are each process's CPU seconds, unchanged by the others
        with multiprocessing.get_context("fork").Pool(args.jobs) as pool:
            results = pool.map(measure_quietly, work)
    else:
        results = [measure_quietly(w) for w in work]
    text = table(results, args.settings, args.name)
    if args.lattice:
        lines = [lattice_cost(run, args.name, args.lattice, *args.settings[0]) for run in args.runs]
        text += "\n\nTuning on lattices instead of decoding again:\n\n" + "\n".join(f"- {line}" for line in lines)
    print(text)
    if args.markdown:
        command = "python bench/search_errors.py " + shlex.join(sys.argv[1:])
        block = (f"Measured {time.strftime('%Y-%m-%d')} by `{command}` on {cpu_model()} ({os.cpu_count()} cores, "
                 f"load {load_average()}), one process: CPU seconds of the decoder alone.\n\n{text}")
        args.markdown.write_text(report.splice(args.markdown.read_text(), args.section, block, "search_errors.py"))


if __name__ == "__main__":
    main()

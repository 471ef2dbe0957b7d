#!/usr/bin/env python3
"""Compare unit types: run configs over seeds, then one table with intervals, significance and figures.

Usage: python compare.py sweep CFG... [--seeds 1,2,3] [--out DIR] [--baseline NAME] [--jobs N] [--section,option=value ...]
       python compare.py table EXP_DIR_OR_GLOB... [--baseline NAME] [--set test] [--csv F] [--markdown F]
                               [--plots DIR] [--pairs A:B,...] [--target POINTS] [--claims F [--claims-only]]
                               [--pending-ok] [--section NAME]
       python compare.py archive EXP_DIR DEST
 e.g.: python compare.py sweep cfg/MINI_liBRU.cfg cfg/MINI_liGRU.cfg --seeds 1,2,3 --baseline MINI_liGRU
       python compare.py table exp/compare --baseline MINI_liGRU --markdown RESULTS.table.md --plots exp/compare/plots

sweep  runs every (config, seed) through run_exp.py into OUT/<config>/seed<N> (default OUT: exp/compare),
       skipping finished runs and resuming unfinished ones, going on after a failure (listed at the
       end, exit status 1), with progress and an ETA; overrides go to every run. It ends with the table.
       --jobs N runs N at a time, each with cores / N threads (more runs an hour for small models).
table  groups experiment folders by config (everything but [exp] seed and out_folder; of two configs with one
       name, the one given first keeps it and the other is NAME(option=value, ...), by what it changes), and
       prints per config: units, parameters, epochs, training time, frames/s, dev and test error per seed and
       as mean ± sd, a 95 % bootstrap interval over utterances and seeds (Kaldi's compute-wer-bootci with the
       seeds drawn too), and against --baseline the run-level test (the training run as the unit: the seeds'
       variance and the test set's) with P(better) read off it, and the utterance-only tests (MAPSSWE matched
       pairs, sign test), which cannot see how much another training run would differ
       (bru_kaldi/comparison/statistics.py says exactly how).
       --pairs A:B,C:D tests chosen pairs in a second table (A against B...): the difference (the
       test's own, from the per-utterance counts) and a verdict from the run-level test alone: better,
       worse, or not resolved with the seeds run (one seed: never resolved; fewer than three: an
       approximate test, and the verdict says so), the difference the design resolves with 80 % power,
       the seeds per system that would resolve the observed one, and what unlimited seeds would
       resolve (the test set's floor);
       --target POINTS adds the seeds per system that would resolve a difference of POINTS (a study's
       plan: how many seeds to run);
       --claims F (tab-separated: claim, the paper's numbers, expects better / not worse / worse /
       not better, SYSTEM:AGAINST) adds each claim's pair and a third table
       whose verdict, agrees / disagrees / not resolved, is the run-level reading of that pair
       (--claims-only: the --markdown file gets that table alone, as README.md's); --section NAME puts
       the tables into the marked section of the --markdown file, with the date, machine and command.
archive  copies what `table` reads of each finished run under EXP_DIR (config, res.res, logs, errors per
       utterance, the parameter count; no weights: about 17 kB a run) to DEST/<path below EXP_DIR>, so
       that a study's runs can be committed: `table DEST` gives the same table, and a sweep whose --out
       holds a copy of them skips them as finished.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Optional

from bru_kaldi.atomic import write_text_atomically
from bru_kaldi.comparison import report
from bru_kaldi.comparison.runs import archive_run, find_runs, group
from bru_kaldi.comparison.statistics import REPLICATIONS
from bru_kaldi.comparison.sweep import run_sweep
from bru_kaldi.config import ConfigError
from bru_kaldi.machine import cpu_model


def parse_seeds(text: str) -> list[int]:
    """``"1,2,3"``, ``"1-5"`` or both (``"1-3,7"``)."""
    seeds = set()
    for part in text.split(","):
        low, _, high = part.strip().partition("-")
        if not low.isdigit() or (high and not high.isdigit()):
            raise ConfigError(f"--seeds {text!r}: expected numbers like 1,2,3 or 1-5")
        seeds.update(range(int(low), int(high or low) + 1))
    return sorted(seeds)


def parse_pairs(text: str) -> list[tuple[str, str]]:
    """``"A:B,C:D"``: system A against B, C against D."""
    pairs = [tuple(part.strip().split(":")) for part in text.split(",") if part.strip()]
    bad = [":".join(p) for p in pairs if len(p) != 2 or not all(p)]
    if bad:
        raise ConfigError(f"--pairs {text!r}: expected SYSTEM:AGAINST pairs separated by commas, got {bad}")
    return pairs


def cost_machine(systems) -> Optional[str]:
    """The machine whose runs the cost columns average when the finished runs trained on several: the one
    most of them trained on (the first seen among equals; "" for runs whose log does not say); None when
    they all trained on one."""
    machines = Counter(r.machine or "" for s in systems for r in s.runs if r.finished)
    return machines.most_common(1)[0][0] if len(machines) > 1 else None


def provenance(systems, command: str) -> str:
    """When, where and how a table was made, what its runs cost and where they trained (runs and hours of
    training per machine): the line above a generated table (its runs may come from several sittings and
    machines)."""
    runs = [r for s in systems for r in s.runs if r.finished]
    hours = sum(r.training_seconds for r in runs) / 3600
    where = [r.machine or "a machine not recorded" for r in runs]
    machines = Counter(where)
    seconds = Counter()  # per machine: what the study cost where
    for machine, r in zip(where, runs):
        seconds[machine] += r.training_seconds
    trained = "; ".join(f"{machine} ({n} run{'s' if n != 1 else ''}, {seconds[machine] / 3600:.1f} h)"
                        for machine, n in machines.most_common())
    costed = cost_machine(systems)
    return (f"Generated {time.strftime('%Y-%m-%d')} by `{command}` on {cpu_model()} "
            f"({os.cpu_count()} cores): {len(systems)} systems, {len(runs)} finished runs, "
            f"{hours:.1f} h of training in all" + (f"; trained on {trained}." if runs else ".")
            + (f" The training time and frames/s are those of the runs on {costed or 'a machine not recorded'} "
               "alone." if costed is not None else ""))


def table(patterns, baseline=None, test_set="test", csv=None, markdown=None, plots=None,
          replications=REPLICATIONS, pairs=(), section=None, command="compare.py table", missing_ok=False,
          claims=(), claims_only=False, target=None) -> str:
    """The comparison table of the experiment folders matching ``patterns``; writes the files asked for.

    ``pairs``: ``(system, against)`` names, tested pair by pair in a second table. ``claims``
    (``report.Claim``): a third table, each claim's pair (added to ``pairs``) and verdict; with
    ``claims_only`` that table alone goes into ``markdown``. ``target`` (points): the pairs table gives
    the seeds per system that would resolve that difference. ``section``: with
    ``markdown``, the tables replace the block between ``<!-- compare.py SECTION -->`` and
    ``<!-- /compare.py SECTION -->`` of that file, under a line saying when, where and how they were made.
    """
    systems = group(find_runs(patterns))
    sets = ["dev", test_set] if test_set != "dev" else ["dev"]
    rows = report.rows(systems, sets, baseline, test_set, replications, cost_machine(systems))
    pairs = list(dict.fromkeys(list(pairs) + [(c.system, c.against) for c in claims]))
    named = report.pairs(systems, pairs, test_set, replications, missing_ok, target) if pairs else []
    tested = ("\n\n" + report.pairs_markdown(named, test_set, target) if named else "") + (
        "\n\n" + report.claims_markdown(claims, named) if claims else "")
    if csv:
        write_text_atomically(csv, report.csv_text(rows, test_set, sets))
    if markdown:
        body = report.claims_markdown(claims, named) if claims_only else report.markdown(rows, test_set, sets) + tested
        if section:
            body = report.splice(Path(markdown).read_text(), section, provenance(systems, command) + "\n\n" + body)
        write_text_atomically(markdown, body + ("" if section else "\n"))
    if plots:
        from bru_kaldi.comparison.figures import plot

        plot(systems, rows, test_set, plots)
    return report.text(rows, test_set, sets) + tested


def archive(source, destination) -> list[Path]:
    """Archive every finished run below ``source`` into the same place below ``destination``."""
    source = Path(source).resolve()
    return [archive_run(run, Path(destination) / run.folder.relative_to(source))
            for run in find_runs([str(source)]) if run.finished]


def parse_arguments(argv):
    usage = __doc__.split("\n\n")[1].replace("Usage: ", "", 1)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], usage=usage,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    verbs = parser.add_subparsers(dest="verb", required=True)
    sweep = verbs.add_parser("sweep", help="run configs over seeds, then print the table")
    sweep.add_argument("configs", nargs="+", type=Path)
    sweep.add_argument("--seeds", default="1,2,3")
    sweep.add_argument("--out", type=Path, default=Path("exp/compare"))
    sweep.add_argument("--baseline", help="the system the others are tested against (a config name)")
    sweep.add_argument("--set", default="test", dest="test_set")
    sweep.add_argument("--jobs", type=int, default=1, help="runs at a time, each with cores / jobs threads")
    shown = verbs.add_parser("table", help="the table of finished experiment folders")
    shown.add_argument("folders", nargs="+", help="experiment folders, folders above them, or globs")
    shown.add_argument("--baseline")
    shown.add_argument("--set", default="test", dest="test_set")
    shown.add_argument("--csv", type=Path)
    shown.add_argument("--markdown", type=Path)
    shown.add_argument("--plots", type=Path)
    shown.add_argument("--replications", type=int, default=REPLICATIONS)
    shown.add_argument("--pairs", default="", help="SYSTEM:AGAINST,...: each pair tested in a second table")
    shown.add_argument("--target", type=float, help="POINTS: the pairs table gives the seeds per system that "
                                                    "would resolve a difference of POINTS (error rate points)")
    shown.add_argument("--claims", type=Path, help="a file of claims (claim, paper, expects, SYSTEM:AGAINST, "
                                                    "tab-separated): their pairs and verdicts in a third table")
    shown.add_argument("--claims-only", action="store_true", help="with --claims and --markdown F: F gets the claims' "
                                                                   "table alone")
    shown.add_argument("--pending-ok", action="store_true", help="a pair naming a system with no runs yet is "
                                                                  "shown as pending (a study under way), not an error")
    shown.add_argument("--section", help="with --markdown F: replace that section of F (between "
                                         "<!-- compare.py SECTION --> and <!-- /compare.py SECTION -->)")
    kept = verbs.add_parser("archive", help="copy the finished runs' results, without weights, to a folder")
    kept.add_argument("source", type=Path, help="a folder of experiment folders (a sweep's --out)")
    kept.add_argument("destination", type=Path)
    args, overrides = parser.parse_known_args(argv)
    if overrides and args.verb != "sweep":
        parser.error(f"unrecognised arguments: {' '.join(overrides)}")
    bad = [o for o in overrides if not o.startswith("--") or "," not in o]
    if bad:
        parser.error(f"unrecognised arguments: {' '.join(bad)} (overrides are --section,option=value)")
    return args, overrides


def main(argv=None) -> int:
    args, overrides = parse_arguments(argv)
    try:
        if args.verb == "table":
            if args.section and not args.markdown:
                raise ConfigError("--section needs --markdown FILE (the file whose section is replaced)")
            if args.target is not None and (not (args.pairs or args.claims) or not args.target > 0):
                raise ConfigError(f"--target {args.target:g}: expected a difference in points above 0, with --pairs "
                                  "or --claims (it adds a column to the pairs table)")
            if args.claims_only and not (args.claims and args.markdown):
                raise ConfigError("--claims-only needs --claims FILE and --markdown FILE (it says what goes into the latter)")
            print(table(args.folders, args.baseline, args.test_set, args.csv, args.markdown, args.plots,
                        args.replications, parse_pairs(args.pairs), args.section,
                        "python compare.py " + shlex.join(sys.argv[1:] if argv is None else argv), args.pending_ok,
                        report.read_claims(args.claims) if args.claims else (), args.claims_only, args.target))
            return 0
        if args.verb == "archive":
            copied = archive(args.source, args.destination)
            print(f"compare.py: {len(copied)} finished runs of {args.source} archived in {args.destination}")
            return 0
        outcomes = run_sweep(args.configs, parse_seeds(args.seeds), args.out, overrides, jobs=args.jobs)
        print(table([str(args.out)], args.baseline, args.test_set))
        failed = [o for o in outcomes if o.status == "failed"]
        for o in failed:
            print(f"compare.py: {o.config.stem} seed {o.seed} failed ({o.folder}): {o.message}", file=sys.stderr)
        return 1 if failed else 0
    except (ConfigError, FileNotFoundError, ValueError) as error:
        print(f"compare.py: error: {error}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())

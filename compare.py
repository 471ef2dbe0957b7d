#!/usr/bin/env python3
"""Compare unit types: run configs over seeds, then one table with intervals, significance and figures.

Usage: python compare.py sweep CFG... [--seeds 1,2,3] [--out DIR] [--baseline NAME] [--section,option=value ...]
       python compare.py table EXP_DIR_OR_GLOB... [--baseline NAME] [--set test] [--csv F] [--markdown F]
                               [--plots DIR]
 e.g.: python compare.py sweep cfg/MINI_liBRU.cfg cfg/MINI_liGRU.cfg --seeds 1,2,3 --baseline MINI_liGRU
       python compare.py table exp/compare --baseline MINI_liGRU --markdown RESULTS.table.md --plots exp/compare/plots

sweep  runs every (config, seed) through run_exp.py into OUT/<config>/seed<N> (default OUT: exp/compare),
       skipping finished runs and resuming unfinished ones, going on after a failure (listed at the
       end, exit status 1), with progress and an ETA; overrides go to every run. It ends with the table.
table  groups experiment folders by config (everything but [exp] seed and out_folder), and prints per
       config: units, parameters, epochs, training time, frames/s, dev and test error per seed and as
       mean ± sd, a 95 % interval over utterances and seeds, and against --baseline the probability of
       improvement (paired bootstrap, as Kaldi's compute-wer-bootci), the matched-pairs test (MAPSSWE
       over utterances) and the sign test (bru_kaldi/comparison/statistics.py says exactly how).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from bru_kaldi.atomic import write_text_atomically
from bru_kaldi.comparison import report
from bru_kaldi.comparison.runs import find_runs, group
from bru_kaldi.comparison.statistics import REPLICATIONS
from bru_kaldi.comparison.sweep import run_sweep
from bru_kaldi.config import ConfigError


def parse_seeds(text: str) -> list[int]:
    """``"1,2,3"``, ``"1-5"`` or both (``"1-3,7"``)."""
    seeds = set()
    for part in text.split(","):
        low, _, high = part.strip().partition("-")
        if not low.isdigit() or (high and not high.isdigit()):
            raise ConfigError(f"--seeds {text!r}: expected numbers like 1,2,3 or 1-5")
        seeds.update(range(int(low), int(high or low) + 1))
    return sorted(seeds)


def table(patterns, baseline=None, test_set="test", csv=None, markdown=None, plots=None,
          replications=REPLICATIONS) -> str:
    """The comparison table of the experiment folders matching ``patterns``; writes the files asked for."""
    systems = group(find_runs(patterns))
    sets = ["dev", test_set] if test_set != "dev" else ["dev"]
    rows = report.rows(systems, sets, baseline, test_set, replications)
    if csv:
        write_text_atomically(csv, report.csv_text(rows, test_set, sets))
    if markdown:
        write_text_atomically(markdown, report.markdown(rows, test_set, sets) + "\n")
    if plots:
        from bru_kaldi.comparison.figures import plot

        plot(systems, rows, test_set, plots)
    return report.text(rows, test_set, sets)


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
    shown = verbs.add_parser("table", help="the table of finished experiment folders")
    shown.add_argument("folders", nargs="+", help="experiment folders, folders above them, or globs")
    shown.add_argument("--baseline")
    shown.add_argument("--set", default="test", dest="test_set")
    shown.add_argument("--csv", type=Path)
    shown.add_argument("--markdown", type=Path)
    shown.add_argument("--plots", type=Path)
    shown.add_argument("--replications", type=int, default=REPLICATIONS)
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
            print(table(args.folders, args.baseline, args.test_set, args.csv, args.markdown, args.plots,
                        args.replications))
            return 0
        outcomes = run_sweep(args.configs, parse_seeds(args.seeds), args.out, overrides)
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

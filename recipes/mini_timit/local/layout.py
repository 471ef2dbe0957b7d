"""Where the recipe's outputs live, how big each size is, and how a stage marks itself complete.

A stage is complete when its marker ``data/.done/<N>.<name>`` exists and records the same size and
seed as asked for. The marker is written last, after every output is in place, so a crash never
leaves a stage looking complete; a stage that runs first removes its own marker and those of all
later stages, whose inputs it is about to replace. Every file is written under a temporary name and
moved into place with ``os.replace``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterator

from bru_kaldi.atomic import write_text_atomically as atomic_write_text

SPLITS = ("train", "dev", "test")
STAGES = ("prepare_text", "synthesize", "make_features", "prepare_lang", "make_mono", "make_graph", "check")


@dataclass(frozen=True)
class Size:
    """How many speakers each split has and how many sentences each speaker reads."""

    speakers: tuple[int, int, int]  # train, dev, test
    utts_per_speaker: int
    num_jobs: int  # synthesis jobs and alignment archives; fixed so the output does not depend on the CPU count


# TIMIT: 462 / 50 / 24 speakers (train / dev / core test) with 8 sentences each, 3.1 hours of
# training speech. "default" keeps those proportions at about one hour; "tiny" is for the tests.
SIZES = {
    "default": Size(speakers=(126, 14, 7), utts_per_speaker=8, num_jobs=4),
    "tiny": Size(speakers=(4, 2, 2), utts_per_speaker=3, num_jobs=2),
}


def stage_marker(root: Path, stage: int) -> Path:
    """The completion marker of stage ``stage`` (an index into :data:`STAGES`)."""
    return Path(root) / "data" / ".done" / f"{stage}.{STAGES[stage]}"


def stage_is_complete(root: Path, stage: int, size: str, seed: int) -> bool:
    """True when the stage's marker exists; raises if it was built with another size or seed."""
    marker = stage_marker(root, stage)
    if not marker.is_file():
        return False
    built = json.loads(marker.read_text())
    if (built["size"], built["seed"]) != (size, seed):
        raise RuntimeError(
            f"{root} holds a corpus built with size={built['size']} seed={built['seed']} ({marker}), "
            f"not size={size} seed={seed}: remove {Path(root) / 'data'} and {Path(root) / 'exp'} to rebuild"
        )
    return True


def first_incomplete(root: Path, size: str, seed: int) -> int:
    """The first stage that is not complete (``len(STAGES)`` when all are); raises on another size or seed."""
    for stage in range(len(STAGES)):
        if not stage_is_complete(root, stage, size, seed):
            return stage
    return len(STAGES)


def write_table(path: Path, rows: dict[str, str]) -> None:
    """A Kaldi table (``key value``), sorted in the C locale as Kaldi requires."""
    atomic_write_text(path, "".join(f"{k} {rows[k]}\n" for k in sorted(rows, key=lambda s: s.encode())))


def read_table(path: Path) -> dict[str, str]:
    """Read a Kaldi table (``key value...``) into a dict, naming the file on a malformed line."""
    rows = {}
    for n, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        key, _, value = line.partition(" ")
        if not key or key in rows:
            raise ValueError(f"{path}:{n}: empty or duplicate key in {line!r}")
        rows[key] = value.strip()
    return rows


def stage_args(stage: int, description: str) -> argparse.Namespace:
    """Parse the command line every stage shares: ``[--size S] [--seed N] <root>``."""
    parser = argparse.ArgumentParser(
        prog=f"python -m recipes.mini_timit.local.{STAGES[stage]}",
        description=description,
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        epilog=f"e.g.: python -m recipes.mini_timit.local.{STAGES[stage]} --size tiny --seed 1 recipes/mini_timit",
    )
    parser.add_argument("--size", choices=sorted(SIZES), default="default", help="corpus size")
    parser.add_argument("--seed", type=int, default=1, help="seed of every random choice")
    parser.add_argument("root", type=Path, help="recipe folder holding data/ and exp/")
    return parser.parse_args()


@contextmanager
def run_stage(root: Path, stage: int, size: str, seed: int, inputs: tuple[int, ...] = ()) -> Iterator[bool]:
    """Run a stage unless complete: yields False to skip, True to run; writes the marker on success.

    ``inputs`` are the stages whose outputs this one reads: each must be complete first.
    """
    root = Path(root)
    if stage_is_complete(root, stage, size, seed):
        print(f"{STAGES[stage]}: complete, skipping ({stage_marker(root, stage)})", file=sys.stderr)
        yield False
        return
    for needed in inputs:
        if not stage_is_complete(root, needed, size, seed):
            raise RuntimeError(f"stage {STAGES[stage]} needs stage {needed} ({STAGES[needed]}) to be complete in {root}")
    for later in range(stage, len(STAGES)):  # their inputs are about to change
        stage_marker(root, later).unlink(missing_ok=True)
    start = time.time()
    yield True
    marker = stage_marker(root, stage)
    atomic_write_text(marker, json.dumps({"size": size, "seed": seed, **asdict(SIZES[size])}) + "\n")
    print(f"{STAGES[stage]}: done in {time.time() - start:.1f} s", file=sys.stderr)


if __name__ == "__main__":  # run.sh asks which stage to start from: prints its number (7 when all are complete)
    arguments = argparse.ArgumentParser(description="the first incomplete stage of a built-in corpus")
    arguments.add_argument("--size", choices=sorted(SIZES), default="default")
    arguments.add_argument("--seed", type=int, default=1)
    arguments.add_argument("root", type=Path)
    args = arguments.parse_args()
    try:
        print(first_incomplete(args.root, args.size, args.seed))
    except RuntimeError as error:  # built with another size or seed
        sys.exit(f"{error}")

"""Where the recipe's outputs live, how big each size is, and how a stage marks itself complete.

A stage is complete when its marker ``data/.done/<N>.<name>`` exists and records the same size and
seed as asked for. The marker is written last, after every output is in place, so a crash never
leaves a stage looking complete; a stage that runs first removes its own marker and those of all
later stages, whose inputs it is about to replace. Every file is written under a temporary name and
moved into place with ``os.replace``.

Two tasks share one corpus (:data:`TASKS`): ``phones`` (TIMIT-like) and ``words`` (WSJ-like). Stages
0-2 (text, speech, features) are shared; stages 3-8 of the word task have their own modules and
markers (``data/.done/3w.prepare_lang_words`` ...), so both tasks live side by side in one root. A
shared stage that runs removes the later markers of both tasks.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterator

from bru_kaldi.atomic import write_text_atomically as atomic_write_text

SPLITS = ("train", "dev", "test")
STAGES = ("prepare_text", "synthesize", "make_features", "prepare_lang", "make_mono", "make_graph", "check",
          "make_graph_chain", "make_chain")
SHARED = 3  # stages 0-2 make the audio and the features that both tasks use
TASKS = {
    "phones": STAGES,
    "words": STAGES[:SHARED] + ("prepare_lang_words", "make_mono_words", "make_graph_words", "check_words",
                                "make_graph_chain_words", "make_chain_words"),
}
_MARKER_SUFFIX = {"phones": "", "words": "w"}  # 3w.prepare_lang_words: the word task's own stage 3
LMS = ("tg", "tgpr")  # the word task's LMs, named as WSJ's: a trigram and its pruned version


@dataclass(frozen=True)
class Size:
    """How many speakers each split has and how many sentences each speaker reads.

    ``core``: the speakers drawn first, as the corpus's first layout drew all of them (train, dev, test);
    the rest of dev and test are drawn after them, from their own random stream, so that enlarging the
    test sets left the training set as it was. The core dev speakers are also ``data/dev_core``
    (:data:`CORE`), the fixed subset of dev that training validates on each epoch.
    """

    speakers: tuple[int, int, int]  # train, dev, test
    utts_per_speaker: int
    num_jobs: int  # synthesis jobs and alignment archives; fixed so the output does not depend on the CPU count
    core: tuple[int, int, int]


# TIMIT: 462 / 50 / 24 speakers (train / dev / core test) with 8 sentences each, 3.1 hours of
# training speech. "default" has TIMIT's dev and core test sets (400 and 192 utterances, speakers of
# their own) and a third of its training set, about one hour; "tiny" is for the tests.
SIZES = {
    "default": Size(speakers=(126, 50, 24), utts_per_speaker=8, num_jobs=4, core=(126, 14, 7)),
    "tiny": Size(speakers=(4, 2, 2), utts_per_speaker=3, num_jobs=2, core=(4, 2, 2)),
}
CORE = "dev_core"  # data/dev_core: the core dev speakers' utterances (data/dev_core_words: the word task's)


def check_task(task: str) -> tuple[str, ...]:
    """The stage names of ``task``; raises ValueError for an unknown task."""
    if task not in TASKS:
        raise ValueError(f"task must be one of {sorted(TASKS)}, got {task!r}")
    return TASKS[task]


def stage_marker(root: Path, stage: int, task: str = "phones") -> Path:
    """The completion marker of stage ``stage`` (an index into ``TASKS[task]``); shared stages have one."""
    suffix = _MARKER_SUFFIX[task] if stage >= SHARED else ""
    return Path(root) / "data" / ".done" / f"{stage}{suffix}.{check_task(task)[stage]}"


def stage_is_complete(root: Path, stage: int, size: str, seed: int, task: str = "phones") -> bool:
    """True when the stage's marker exists; raises if it was built with another size or seed."""
    marker = stage_marker(root, stage, task)
    if not marker.is_file():
        return False
    built = json.loads(marker.read_text())
    if (built["size"], built["seed"]) != (size, seed):
        raise RuntimeError(
            f"{root} holds a corpus built with size={built['size']} seed={built['seed']} ({marker}), "
            f"not size={size} seed={seed}: remove {Path(root) / 'data'} and {Path(root) / 'exp'} to rebuild"
        )
    layout = json.loads(json.dumps(asdict(SIZES[size])))  # tuples as the marker's lists
    if {key: built.get(key) for key in layout} != layout:
        raise RuntimeError(
            f"{root} holds a corpus of an earlier layout of size={size} ({marker}: speakers "
            f"{built.get('speakers')}, now {layout['speakers']}): remove {Path(root) / 'data'} and "
            f"{Path(root) / 'exp'} to rebuild"
        )
    return True


def first_incomplete(root: Path, size: str, seed: int, task: str = "phones") -> int:
    """The first stage of ``task`` that is not complete (9 when all are); raises on another size or seed."""
    for stage in range(len(check_task(task))):
        if not stage_is_complete(root, stage, size, seed, task):
            return stage
    return len(TASKS[task])


def write_table(path: Path, rows: dict[str, str]) -> None:
    """A Kaldi table (``key value``), sorted in the C locale as Kaldi requires."""
    atomic_write_text(path, "".join(f"{k} {rows[k]}\n" for k in sorted(rows, key=lambda s: s.encode())))


def subset_data_dir(source: Path, target: Path, speakers) -> None:
    """``target``: the Kaldi data dir ``source`` restricted to ``speakers`` and their utterances. Every
    table of ``source`` (``key value`` lines: feats.scp, cmvn.scp, text, utt2spk, spk2utt, ...) keeps the
    rows whose key is one of them or of their utterances; the archives the scp files point at are
    shared (the paths in them do not depend on the data dir), and so is ``conf/``, their options."""
    source, target = Path(source), Path(target)
    speakers = set(speakers)
    keep = speakers | {u for u, s in read_table(source / "utt2spk").items() if s in speakers}
    target.mkdir(parents=True, exist_ok=True)
    for table in sorted(p for p in source.iterdir() if p.is_file()):
        write_table(target / table.name, {k: v for k, v in read_table(table).items() if k in keep})
    copy_conf(source, target)


def copy_conf(source: Path, target: Path) -> None:
    """``source/conf/*.conf`` (the options its features were computed with) into ``target/conf``: a data
    dir that shares another's features shares their description."""
    for conf in sorted((Path(source) / "conf").glob("*.conf")):
        atomic_write_text(Path(target) / "conf" / conf.name, conf.read_text())


def core_speakers(data_dir: Path, count: int) -> list[str]:
    """The first ``count`` speakers of a data dir in the order they were drawn (ids are a gender letter
    and the speaker's number: ``f126``), the core speakers of dev (:class:`Size`)."""
    return sorted(read_table(Path(data_dir) / "spk2utt"), key=lambda s: int(s[1:]))[:count]


def copy_folder(source: Path, target: Path) -> None:
    """Replace the folder ``target`` with a copy of ``source``, swapped in whole (a killed copy leaves
    ``target`` as it was, and the next run clears the half-made one)."""
    tmp, old = target.with_name(f".{target.name}.tmp"), target.with_name(f".{target.name}.old")
    for stale in (tmp, old):
        if stale.exists():
            shutil.rmtree(stale)
    shutil.copytree(source, tmp)
    if target.exists():
        target.rename(old)
    tmp.rename(target)
    if old.exists():
        shutil.rmtree(old)


def read_table(path: Path) -> dict[str, str]:
    """Read a Kaldi table (``key value...``) into a dict, naming the file on a malformed line."""
    rows = {}
    for n, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        key, _, value = line.partition(" ")
        if not key or key in rows:
            raise ValueError(f"{path}:{n}: empty or duplicate key in {line!r}")
        rows[key] = value.strip()
    return rows


def stage_args(stage: int, description: str, task: str = "phones") -> argparse.Namespace:
    """Parse the command line every stage shares: ``[--size S] [--seed N] <root>``."""
    name = check_task(task)[stage]
    parser = argparse.ArgumentParser(
        prog=f"python -m recipes.mini_timit.local.{name}",
        description=description,
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        epilog=f"e.g.: python -m recipes.mini_timit.local.{name} --size tiny --seed 1 recipes/mini_timit",
    )
    parser.add_argument("--size", choices=sorted(SIZES), default="default", help="corpus size")
    parser.add_argument("--seed", type=int, default=1, help="seed of every random choice")
    parser.add_argument("root", type=Path, help="recipe folder holding data/ and exp/")
    return parser.parse_args()


@contextmanager
def run_stage(root: Path, stage: int, size: str, seed: int, inputs: tuple[int, ...] = (),
              task: str = "phones") -> Iterator[bool]:
    """Run a stage unless complete: yields False to skip, True to run; writes the marker on success.

    ``inputs`` are the stages (of ``task``) whose outputs this one reads: each must be complete first.
    """
    root = Path(root)
    names = check_task(task)
    if stage_is_complete(root, stage, size, seed, task):
        print(f"{names[stage]}: complete, skipping ({stage_marker(root, stage, task)})", file=sys.stderr)
        yield False
        return
    for needed in inputs:
        if not stage_is_complete(root, needed, size, seed, task):
            raise RuntimeError(f"stage {names[stage]} needs stage {needed} ({names[needed]}) to be complete in {root}")
    # the later stages' inputs are about to change: of this task, and of every task for a shared stage
    for other in (TASKS if stage < SHARED else (task,)):
        for later in range(stage, len(TASKS[other])):
            stage_marker(root, later, other).unlink(missing_ok=True)
    start = time.time()
    yield True
    marker = stage_marker(root, stage, task)
    atomic_write_text(marker, json.dumps({"size": size, "seed": seed, **asdict(SIZES[size])}) + "\n")
    print(f"{names[stage]}: done in {time.time() - start:.1f} s", file=sys.stderr)


if __name__ == "__main__":  # run.sh asks which stage to start from: prints its number (9 when all are complete)
    arguments = argparse.ArgumentParser(description="the first incomplete stage of a built-in corpus",
                                        epilog="e.g.: python -m recipes.mini_timit.local.layout --task words "
                                               "--size tiny --seed 1 /tmp/mini_timit")
    arguments.add_argument("--task", choices=sorted(TASKS), default="phones")
    arguments.add_argument("--size", choices=sorted(SIZES), default="default")
    arguments.add_argument("--seed", type=int, default=1)
    arguments.add_argument("root", type=Path)
    args = arguments.parse_args()
    try:
        print(first_incomplete(args.root, args.size, args.seed, args.task))
    except RuntimeError as error:  # built with another size or seed
        sys.exit(f"{error}")

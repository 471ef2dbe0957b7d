"""The hook to the built-in corpus: its recipe is run as a command, never imported by the library.

``[exp] builtin_corpus = default`` (or ``tiny``) asks ``run_exp.py`` to make sure the built-in corpus
exists in ``[exp] builtin_corpus_dir`` before anything reads it. The library knows the recipe only by
this contract, which is also what a user types by hand::

    bash recipes/mini_timit/run.sh [--task words] --size SIZE --seed SEED ROOT

``run.sh`` builds the stages that are missing into ``ROOT/data`` and ``ROOT/exp``, returns at once when
all are complete, refuses a ``ROOT`` built with another size, seed or layout (or with ``--replace true``
clears it and builds anew), and exits non-zero on any failure. Its output goes to the experiment's log line by line. To make another corpus built-in, give
its recipe a ``run.sh`` with the same options and point :data:`RECIPE` at it (``recipes/README.md``).
"""

from __future__ import annotations

import fcntl
import re
import subprocess
from pathlib import Path
from typing import Callable

RECIPE = Path(__file__).resolve().parents[1] / "recipes" / "mini_timit"
SIZES = ("default", "tiny")
TASKS = ("phones", "words")  # a TIMIT-like phone task, and a WSJ-like word task on the same audio
_STAGE_START = re.compile(r"\) Stage (?P<number>\d+): (?P<name>\w+)$")


class BuiltinCorpusError(RuntimeError):
    """The recipe failed; the message gives its command, exit status and the end of its output."""


def ensure_builtin_corpus(root, size: str = "default", seed: int = 1, log: Callable[[str], None] = print,
                          recipe: Path = RECIPE, task: str = "phones", replace: bool = False) -> Path:
    """Build what is missing of the built-in corpus under ``root`` with ``recipe/run.sh``; returns ``root``.

    ``task`` is ``phones`` (the default) or ``words`` (``run.sh --task words``: the word task's stages,
    after the shared ones). Every line the recipe prints reaches ``log`` as it comes (a first build
    takes about a minute, the word task about 90 s more). ``replace``: a corpus of another size, seed or
    layout in ``root`` is removed and this one built (``run.sh --replace true``), instead of an error.
    """
    if size not in SIZES:
        raise ValueError(f"the built-in corpus has sizes {', '.join(SIZES)}, got {size!r}")
    if task not in TASKS:
        raise ValueError(f"the built-in corpus has tasks {', '.join(TASKS)}, got {task!r}")
    root = Path(root)
    command = ["bash", str(recipe / "run.sh"), *(["--task", task] if task != "phones" else []), "--size", size,
               "--seed", str(seed), *(["--replace", "true"] if replace else []), str(root)]
    lines: list[str] = []
    root.mkdir(parents=True, exist_ok=True)
    # runs started together (compare.py sweep --jobs) build it once: the others wait, then find it complete
    with open(root / ".build.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        with process.stdout:
            for line in process.stdout:
                line = line.rstrip()
                if line and not line.startswith(("/project/", "[I] ")):  # kaldilm's progress chatter
                    lines.append(line)
                    log(f"  {line}")
        process.wait()
    if process.returncode != 0:
        # run.sh logs "Stage N: name" as each stage starts: the last one is the stage that failed
        started = [m for m in map(_STAGE_START.search, lines) if m]
        where = f"stage {started[-1]['number']} ({started[-1]['name']}) failed: " if started else ""
        tail = "\n".join(lines[-15:])
        raise BuiltinCorpusError(f"the built-in corpus could not be built: {where}`{' '.join(command)}` exited with "
                                 f"status {process.returncode}; its output ends with:\n{tail}")
    return root

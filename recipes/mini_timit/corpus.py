"""The built-in corpus from Python: :func:`ensure_corpus` builds what is missing and says where it is.

This runs the same stage modules as ``run.sh`` (``recipes/mini_timit/local/``), each in its own
Python process: the synthesis stage needs fresh processes for reproducible audio, and the graph
stage imports packages whose import order matters. Complete stages are skipped, so a call on a
built corpus only checks the stage markers.

>>> import tempfile
>>> corpus = ensure_corpus(tempfile.mkdtemp(), size="tiny", seed=1, log=lambda line: None)  # doctest: +SKIP
>>> corpus.feats("train")  # doctest: +SKIP
PosixPath('.../data/train/feats.scp')
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from recipes.mini_timit.local.layout import SIZES, SPLITS, STAGES, stage_is_complete

RECIPE_DIR = Path(__file__).resolve().parent
REPO_ROOT = RECIPE_DIR.parents[1]


@dataclass(frozen=True)
class Corpus:
    """Paths of a built corpus, in the layout of a Kaldi TIMIT experiment."""

    root: Path

    def data(self, split: str) -> Path:
        """``data/<split>``: wav.scp, text, utt2spk, spk2utt, feats.scp, cmvn.scp, ..."""
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
        return self.root / "data" / split

    def feats(self, split: str, kind: str = "fbank") -> Path:
        """feats.scp of ``split``: 40-dim ``fbank`` (``feats.scp``) or 13-dim ``mfcc`` (``feats_mfcc.scp``)."""
        return self.data(split) / {"fbank": "feats.scp", "mfcc": "feats_mfcc.scp"}[kind]

    def cmvn(self, split: str, kind: str = "fbank") -> Path:
        """Per-speaker CMVN statistics of ``split`` for the given feature type."""
        return self.data(split) / {"fbank": "cmvn.scp", "mfcc": "cmvn_mfcc.scp"}[kind]

    def ali(self, split: str) -> Path:
        """``exp/mono_ali_<split>``: ali.N.gz (transition-ids), num_jobs, final.mdl, tree."""
        self.data(split)
        return self.root / "exp" / f"mono_ali_{split}"

    @property
    def lang(self) -> Path:
        return self.root / "data" / "lang"

    @property
    def model(self) -> Path:
        """``exp/mono/final.mdl`` (Kaldi binary TransitionModel)."""
        return self.root / "exp" / "mono" / "final.mdl"

    @property
    def graph(self) -> Path:
        """``exp/mono/graph``: HCLG.fst, words.txt, phones.txt, phones/."""
        return self.root / "exp" / "mono" / "graph"


def run_stage_process(root: Path, stage: int, size: str, seed: int, log: Callable[[str], None]) -> float:
    """Run one stage module in a fresh Python process; returns its wall time in seconds."""
    command = [sys.executable, "-m", f"recipes.mini_timit.local.{STAGES[stage]}", "--size", size, "--seed", str(seed), str(root)]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    start = time.time()
    result = subprocess.run(command, cwd=REPO_ROOT, env=env, capture_output=True, text=True)
    for line in (result.stdout + result.stderr).splitlines():
        if line.strip() and not line.startswith(("/project/", "[I] ")):  # kaldilm's progress chatter
            log(f"  {line}")
    if result.returncode != 0:
        tail = "\n".join(result.stderr.strip().splitlines()[-15:])
        raise RuntimeError(f"mini_timit stage {stage} ({STAGES[stage]}) failed with exit code {result.returncode}: "
                           f"{' '.join(command)}\n{tail}")
    return time.time() - start


def ensure_corpus(root: str | Path = RECIPE_DIR, size: str = "default", seed: int = 1,
                  log: Callable[[str], None] = print) -> Corpus:
    """Build the built-in corpus under ``root`` unless it is complete; return its paths.

    ``size`` is ``"default"`` (about an hour of training speech) or ``"tiny"`` (for tests);
    ``seed`` fixes every random choice (the same seed gives byte-identical archives). A corpus
    built with another size or seed is an error, never silently reused. ``log`` receives one
    line per stage with its time.
    """
    if size not in SIZES:
        raise ValueError(f"size must be one of {sorted(SIZES)}, got {size!r}")
    root = Path(root).resolve()
    missing = [s for s in range(len(STAGES)) if not stage_is_complete(root, s, size, seed)]
    if missing:
        log(f"built-in corpus (mini_timit, size={size}, seed={seed}) missing or incomplete in {root}: "
            f"building stages {missing[0]}-{len(STAGES) - 1}")
        start = time.time()
        for stage in range(missing[0], len(STAGES)):
            seconds = run_stage_process(root, stage, size, seed, log)
            log(f"stage {stage} ({STAGES[stage]}): {seconds:.1f} s")
        log(f"built-in corpus ready in {time.time() - start:.1f} s: {root}")
    return Corpus(root)

"""The built-in corpus from Python: :func:`ensure_corpus` builds what is missing and says where it is.

This runs ``run.sh``, whose stage modules (``recipes/mini_timit/local/``) each run in their own
Python process: the synthesis stage needs fresh processes for reproducible audio, and the graph
stage imports packages whose import order matters. Complete stages are skipped, so a call on a
built corpus only checks the stage markers (about 0.2 s).

>>> import tempfile
>>> corpus = ensure_corpus(tempfile.mkdtemp(), size="tiny", seed=1, log=lambda line: None)  # doctest: +SKIP
>>> corpus.feats("train")  # doctest: +SKIP
PosixPath('.../data/train/feats.scp')
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from bru_kaldi.builtin_corpus import ensure_builtin_corpus
from recipes.mini_timit.local.layout import LMS, SIZES, SPLITS, TASKS

RECIPE_DIR = Path(__file__).resolve().parent


@dataclass(frozen=True)
class Corpus:
    """Paths of a built corpus: a Kaldi TIMIT experiment (task ``phones``) or a WSJ-like one (``words``).

    Both tasks share the audio and the features; ``task`` picks the data dirs, lang, model,
    alignments and graph: ``data/<split>`` or ``data/<split>_words``, ``exp/mono`` or
    ``exp/mono_words``, ``exp/mono/graph`` or ``exp/mono_words/graph_tg``.
    """

    root: Path
    task: str = "phones"

    def __post_init__(self):
        if self.task not in TASKS:
            raise ValueError(f"task must be one of {sorted(TASKS)}, got {self.task!r}")

    @property
    def _suffix(self) -> str:
        return "" if self.task == "phones" else "_words"

    def data(self, split: str) -> Path:
        """``data/<split>`` (``data/<split>_words``): wav.scp, text, utt2spk, spk2utt, feats.scp, cmvn.scp, ..."""
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
        return self.root / "data" / f"{split}{self._suffix}"

    def feats(self, split: str, kind: str = "fbank") -> Path:
        """feats.scp of ``split``: 40-dim ``fbank`` (``feats.scp``) or 13-dim ``mfcc`` (``feats_mfcc.scp``)."""
        return self.data(split) / {"fbank": "feats.scp", "mfcc": "feats_mfcc.scp"}[kind]

    def cmvn(self, split: str, kind: str = "fbank") -> Path:
        """Per-speaker CMVN statistics of ``split`` for the given feature type."""
        return self.data(split) / {"fbank": "cmvn.scp", "mfcc": "cmvn_mfcc.scp"}[kind]

    def ali(self, split: str) -> Path:
        """``exp/mono_ali_<split>`` (``exp/mono_words_ali_<split>``): ali.N.gz, num_jobs, final.mdl, tree."""
        self.data(split)
        return self.root / "exp" / f"mono{self._suffix}_ali_{split}"

    @property
    def lang(self) -> Path:
        """``data/lang`` (``data/lang_words``: no G.fst; see :meth:`lang_test`)."""
        return self.root / "data" / f"lang{self._suffix}"

    def lang_test(self, lm: str = "tg") -> Path:
        """Word task: ``data/lang_words_test_<lm>``, the lang dir with the LM's G.fst (``lm``: tg or tgpr)."""
        if self.task != "words" or lm not in LMS:
            raise ValueError(f"lang_test is the word task's, with lm one of {LMS}; got task {self.task!r}, lm {lm!r}")
        return self.root / "data" / f"lang_words_test_{lm}"

    @property
    def model(self) -> Path:
        """``exp/mono/final.mdl`` (``exp/mono_words/final.mdl``): Kaldi binary TransitionModel."""
        return self.root / "exp" / f"mono{self._suffix}" / "final.mdl"

    @property
    def graph(self) -> Path:
        """``exp/mono/graph`` (``exp/mono_words/graph_tg``): HCLG.fst, words.txt, phones.txt, phones/."""
        return self.root / "exp" / "mono" / "graph" if self.task == "phones" else self.lm_graph("tg")

    def lm_graph(self, lm: str) -> Path:
        """Word task: ``exp/mono_words/graph_<lm>`` (``lm``: tg or tgpr)."""
        self.lang_test(lm)
        return self.root / "exp" / "mono_words" / f"graph_{lm}"

    def chain_ali(self, split: str) -> Path:
        """The chain model's alignments (stage 8), ``exp/chain_ali_<split>`` (``exp/chain_words_ali_<split>``)."""
        self.data(split)
        return self.root / "exp" / f"chain{self._suffix}_ali_{split}"

    @property
    def chain_graph(self) -> Path:
        """The chain model's graph (stage 8): ``exp/chain/graph`` (``exp/chain_words/graph_tg``)."""
        return self.root / "exp" / "chain" / "graph" if self.task == "phones" else \
            self.root / "exp" / "chain_words" / "graph_tg"


def ensure_corpus(root: str | Path = RECIPE_DIR, size: str = "default", seed: int = 1,
                  log: Callable[[str], None] = print, task: str = "phones") -> Corpus:
    """Build the built-in corpus under ``root`` unless it is complete; return its paths.

    ``size`` is ``"default"`` (about an hour of training speech) or ``"tiny"`` (for tests);
    ``seed`` fixes every random choice (the same seed gives byte-identical archives). A corpus
    built with another size or seed is an error, never silently reused. This is ``run.sh``, run
    through the library's hook (``bru_kaldi.builtin_corpus``), as ``run_exp.py`` runs it; ``log``
    receives its output line by line. ``task="words"`` builds the word task (``run.sh --task
    words``): the shared stages first where they are missing.
    """
    if size not in SIZES:
        raise ValueError(f"size must be one of {sorted(SIZES)}, got {size!r}")
    if task not in TASKS:
        raise ValueError(f"task must be one of {sorted(TASKS)}, got {task!r}")
    root = Path(root).resolve()
    ensure_builtin_corpus(root, size, seed, log, recipe=RECIPE_DIR, task=task)
    return Corpus(root, task)

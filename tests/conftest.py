"""Shared fixtures: a real Kaldi experiment (the built-in corpus, tiny size) built once per session."""

import pytest

TINY_SEED = 1


@pytest.fixture(scope="session")
def tiny_corpus(tmp_path_factory):
    """The built-in mini_timit corpus at its tiny size (24 utterances, ~8 s to build), seed 1.

    Returns a ``recipes.mini_timit.corpus.Corpus``: ``.data(split)``, ``.feats(split, kind)``,
    ``.cmvn(split, kind)``, ``.ali(split)``, ``.lang``, ``.model``, ``.graph``, ``.root``.
    Treat it as read-only: it is shared by every test of the session.
    """
    from recipes.mini_timit.corpus import ensure_corpus

    return ensure_corpus(tmp_path_factory.mktemp("mini_timit"), size="tiny", seed=TINY_SEED, log=lambda line: None)


@pytest.fixture(scope="session")
def tiny_words(tmp_path_factory):
    """The built-in corpus at its tiny size with its word task (``run.sh --task words``), seed 1: a
    ``Corpus`` whose paths are the word task's (``.data(split)`` is ``data/<split>_words`` ...)."""
    from recipes.mini_timit.corpus import ensure_corpus

    return ensure_corpus(tmp_path_factory.mktemp("mini_timit_words"), size="tiny", seed=TINY_SEED, task="words",
                         log=lambda line: None)

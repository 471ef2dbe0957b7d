"""Shared fixtures: a real Kaldi experiment (the built-in corpus, tiny size) built once per session, and
a check after every test that it left torch's process-wide settings and the environment as it found them."""

import os

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


@pytest.fixture(scope="session")
def tiny_word_model(tiny_words, tmp_path_factory):
    """A word model trained and decoded by ``run_exp.py`` on the tiny corpus's word task: cfg/MINIW_liBRU.cfg
    with 2x64 units for 24 epochs (15 s), enough to decode words (most of them wrong: 12
    training utterances), the Python decoder. Its experiment folder; read-only, as ``tiny_words``."""
    import logging
    from pathlib import Path

    import run_exp
    from bru_kaldi.torch_state import run_settings

    folder = tmp_path_factory.mktemp("tiny_word_model") / "exp"
    # one thread: batches of four short utterances, whose products two threads only slow down (ten times, on a
    # machine whose cores are busy)
    with pytest.MonkeyPatch.context() as patch, run_settings(threads=1):
        patch.setenv("MINI_TIMIT", str(tiny_words.root))
        code = run_exp.main([str(Path(__file__).resolve().parents[1] / "cfg" / "MINIW_liBRU.cfg"),
                             f"--exp,out_folder={folder}", "--exp,builtin_corpus=none", "--exp,device=cpu",
                             "--exp,n_epochs_tr=24", "--architecture1,sizes=64,64", "--architecture1,arch_lr=0.004",
                             "--batches,batch_size_train=4", "--dataset1,n_chunks=1", "--decoding,decoder=python",
                             "--decoding,num_jobs=2", "--decoding,acwt_sweep=0.1,0.2", "--decoding,wip_sweep=0.0"])
    logging.shutdown()
    assert code == 0, (folder / "log.txt").read_text()[-3000:]
    return folder


@pytest.fixture(scope="session")
def tiny_extra_streams(tiny_corpus, tmp_path_factory):
    """A copy of ``tiny_corpus`` with its opt-in streams (``local/extra_streams.py --raw --mics 6``, ~5 s,
    117 MB): ``data/<split>/feats_raw.scp`` and ``feats_mfcc_mic{1..6}.scp`` + ``cmvn_mfcc_mic{1..6}.scp``.
    A ``Corpus``; read-only, as ``tiny_corpus`` (its wav.scp and feats.scp still point into that one)."""
    import shutil

    from recipes.mini_timit.corpus import Corpus
    from recipes.mini_timit.local import extra_streams

    root = tmp_path_factory.mktemp("mini_timit_extra")
    for part in ("data", "exp"):
        shutil.copytree(tiny_corpus.root / part, root / part)
    extra_streams.main(["--raw", "--mics", "6", str(root)])
    return Corpus(root)


# Variables that are not a test's doing: pytest's own, and those torch sets once per process, whichever
# test comes first: on the first import of its compiler (which its optimisers import), and on a GPU
# when CUDA starts.
_NOT_THE_TESTS = {"PYTEST_CURRENT_TEST", "TORCHINDUCTOR_CACHE_DIR", "CUDA_MODULE_LOADING"}


def _process_state() -> dict:
    from bru_kaldi.torch_state import torch_settings

    return {**torch_settings(), "environment": {k: v for k, v in os.environ.items() if k not in _NOT_THE_TESTS}}


@pytest.fixture(autouse=True)
def leaves_the_process_as_it_found_it():
    """Fails a test that changes torch's threads or denormal flushing, or the environment, without putting
    them back: the tests after it would run under other numerics or settings than they do alone (a
    monkeypatched variable is put back before this looks)."""
    before = _process_state()
    yield
    after = _process_state()
    changed = {key: (before[key], after[key]) for key in before if key != "environment" and before[key] != after[key]}
    variables = sorted(set(before["environment"].items()) ^ set(after["environment"].items()))
    if variables:
        changed["environment"] = sorted({name for name, _ in variables})
    assert not changed, f"the test left the process changed (before, after): {changed}"


@pytest.fixture
def one_thread():
    """torch on one thread for a test (as a run with a config's device = cpu and few cores), put back after it."""
    from bru_kaldi.torch_state import run_settings

    with run_settings(threads=1):
        yield


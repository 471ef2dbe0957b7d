"""A chain model at a third of the frame rate, decoded by Kaldi's ``latgen-faster-mapped`` (the Kaldi scripts'
path) and by the Python decoder: the shipped cfg/MINI_liGRU_lfmmi.cfg, small, on the tests' tiny corpus.

Kaldi makes its lattices at acoustic scale 1.0 and scales them by 10 after (``--post-decode-acwt 10``, as its
chain recipes), so ``score.sh``'s LM weight 10 is the Python decoder's acoustic scale 1.0: the two give the
same dev errors there, on log-likelihoods of a row per three frames. Skipped, saying so, without KALDI_ROOT.
"""

import os
import re
from pathlib import Path

import pytest

from tests.test_chain_training import run_shipped_chain

KALDI_ROOT = os.environ.get("KALDI_ROOT", "")
pytestmark = pytest.mark.skipif(not KALDI_ROOT or not Path(KALDI_ROOT, "src", "latbin").is_dir(),
                                reason="KALDI_ROOT is not set to a Kaldi build: the tests against real Kaldi are skipped "
                                       "(README, 'Testing against Kaldi')")


def test_both_decoders_agree_on_a_chain_model_at_a_third_of_the_frame_rate(tiny_corpus, tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", os.pathsep.join([*(str(Path(KALDI_ROOT, "src", d)) for d in ("bin", "latbin", "fstbin")),
                                                os.environ["PATH"]]))
    exp = tmp_path / "chain"
    logs = {}
    for decoder in ("kaldi", "python"):
        again = ("--stage", "decode") if logs else ()  # the same model and log-likelihoods, decoded again
        run_shipped_chain(tiny_corpus, exp, f"--decoding,decoder={decoder}", *again)
        logs[decoder] = (exp / "log.txt").read_text()
        assert re.search(rf"^test: %WER [\d.]+ \[.* decoder={decoder}", (exp / "res.res").read_text(), re.M)
    assert tuning_errors(logs["kaldi"], r"lmwt=10 wip=0\.0") == tuning_errors(logs["python"], r"acwt=1(?:\.0)?(?: wip=0(?:\.0)?)?")


def tuning_errors(log: str, setting: str) -> tuple[int, int]:
    """(errors, words) of the tuning set's pass at ``setting`` (the config tunes on dev_core) in a run's log."""
    match = re.search(rf"dev_core {setting}: %WER \S+ \[ (\d+) / (\d+),", log)
    assert match, f"no dev_core pass '{setting}' in the log"
    return int(match.group(1)), int(match.group(2))

"""LF-MMI's phone LM against Kaldi's ``chain-est-phone-lm``.

Kaldi's ``src/chainbin`` is not among the binaries a CPU-only Kaldi subset usually builds (it links the
CUDA-matrix library, which builds without CUDA); ``tests/kaldi/build_chain_bins.sh KALDI_ROOT`` builds
``chain-est-phone-lm`` and ``chain-make-den-fst``. Without them this test is skipped, saying so; without
``KALDI_ROOT`` all of tests/kaldi is.

On the tests' tiny built-in corpus, from the phone sequences of its training alignments, our phone
n-gram and Kaldi's (order 4, Kaldi's defaults) have the same states and arcs, and give every training
utterance's phone sequence (and its end) the same probability. The corpus is too small for either to
prune a history: where they prune (the default size), they keep different histories (cfg/README.md).
"""

import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

KALDI_ROOT = os.environ.get("KALDI_ROOT", "")
CHAINBIN = Path(KALDI_ROOT, "src", "chainbin")
pytestmark = [
    pytest.mark.skipif(not KALDI_ROOT or not Path(KALDI_ROOT, "src", "bin").is_dir(),
                       reason="KALDI_ROOT is not set to a Kaldi build: the tests against real Kaldi are skipped "
                              "(README, 'Testing against Kaldi')"),
    pytest.mark.skipif(not (CHAINBIN / "chain-make-den-fst").is_file(),
                       reason="Kaldi's chain-est-phone-lm and chain-make-den-fst are not built: run "
                              "tests/kaldi/build_chain_bins.sh $KALDI_ROOT"),
]


def kaldi_chain(*command: str) -> None:
    path = os.pathsep.join([str(CHAINBIN), str(Path(KALDI_ROOT, "src", "bin")), os.environ["PATH"]])
    result = subprocess.run(["bash", "-o", "pipefail", "-c", " ".join(command)], capture_output=True, text=True,
                            env=dict(os.environ, PATH=path, LC_ALL="C"))
    assert result.returncode == 0, f"{' '.join(command)}\n{result.stderr[-3000:]}"


@pytest.fixture(scope="module")
def kaldi_lm(tiny_corpus, tmp_path_factory):
    """Kaldi's phone LM (an FST) of the tiny corpus's training alignments, and their phone sequences."""
    import kaldifst

    from bru_kaldi.kaldi.alignments import read_alignments
    from bru_kaldi.kaldi.transition_model import read_transition_model

    out = tmp_path_factory.mktemp("kaldi_chain")
    ali, model = tiny_corpus.ali("train"), tiny_corpus.ali("train") / "final.mdl"
    kaldi_chain("chain-est-phone-lm", f"'ark:gunzip -c {ali}/ali.*.gz | ali-to-phones {model} ark:- ark:- |'",
                str(out / "phone_lm.fst"))
    tm = read_transition_model(model)
    return kaldifst.StdVectorFst.read(str(out / "phone_lm.fst")), [tm.ali_to_phones(a) for _, a in read_alignments(str(ali))]


def fst_probability(fst, labels) -> float:
    """The probability of ``labels`` (then the end) in a deterministic acceptor without epsilons:
    ``exp(-(arc weights + final weight))`` along its one path; 0 where it has none."""
    import kaldifst

    state, cost = fst.start, 0.0
    for label in labels:
        arcs = [a for a in kaldifst.ArcIterator(fst, state) if a.ilabel == label]
        assert len(arcs) <= 1, f"state {state} has {len(arcs)} arcs labelled {label}: not deterministic"
        if not arcs:
            return 0.0
        state, cost = arcs[0].nextstate, cost + arcs[0].weight.value
    return float(np.exp(-(cost + fst.final(state).value)))


def test_our_phone_lm_is_kaldis(kaldi_lm):
    from bru_kaldi.chain.phone_lm import estimate_phone_lm

    theirs, sequences = kaldi_lm
    lm = estimate_phone_lm(sequences)  # Kaldi's defaults: order 4, trigrams kept, 1000 extra histories
    arcs = sum(1 for state in range(theirs.num_states) for _ in kaldifst_arcs(theirs, state))
    assert (lm.num_states, len(lm.arcs)) == (theirs.num_states, arcs)
    by_source = {(source, phone): (destination, p) for source, phone, destination, p in lm.arcs}

    def ours(sequence):
        state, probability = 0, 1.0
        for phone in sequence:
            if (state, phone) not in by_source:
                return 0.0
            state, p = by_source[state, phone]
            probability *= p
        return probability * lm.final[state]

    assert len(sequences) > 10
    for sequence in sequences:
        assert ours(sequence) > 0
        assert ours(sequence) == pytest.approx(fst_probability(theirs, sequence), rel=1e-5), sequence


def kaldifst_arcs(fst, state):
    import kaldifst

    return kaldifst.ArcIterator(fst, state)

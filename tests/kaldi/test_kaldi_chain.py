"""LF-MMI's phone LM and denominator graph against Kaldi's ``chain-est-phone-lm`` and ``chain-make-den-fst``.

Kaldi's ``src/chainbin`` is not among the binaries a CPU-only Kaldi subset usually builds (it links the
CUDA-matrix library, which builds without CUDA); ``tests/kaldi/build_chain_bins.sh KALDI_ROOT`` builds
``chain-est-phone-lm`` and ``chain-make-den-fst``. Without them this test is skipped, saying so; without
``KALDI_ROOT`` all of tests/kaldi is.

On the tests' tiny built-in corpus, from the phone sequences of its training alignments, our phone
n-gram and Kaldi's (order 4, Kaldi's defaults) have the same states and arcs, and give every training
utterance's phone sequence (and its end) the same probability. The corpus is too small for either to
prune a history: where they prune (the default size), they keep different histories (cfg/README.md). Our
denominator graph of the chain model and Kaldi's den.fst weigh every training utterance alike, but for
Kaldi's weight pushing.
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


def log_weight(fst, labels) -> float:
    """log of the total weight of every path of ``fst`` that reads ``labels`` from its start to a final state
    (the arcs' and the final weight): the forward algorithm in the log semiring, over its arcs."""
    import kaldifst

    arcs = [[(a.ilabel, a.nextstate, -a.weight.value) for a in kaldifst.ArcIterator(fst, s)] for s in range(fst.num_states)]
    alpha = {fst.start: 0.0}
    for label in labels:
        following = {}
        for state, value in alpha.items():
            for ilabel, nextstate, weight in arcs[state]:
                if ilabel == label:
                    following[nextstate] = np.logaddexp(following.get(nextstate, -np.inf), value + weight)
        alpha = following
    finals = [value - fst.final(state).value for state, value in alpha.items() if np.isfinite(fst.final(state).value)]
    return float(np.logaddexp.reduce(finals)) if finals else -np.inf


def test_our_den_fst_is_kaldis_chain_make_den_fst_up_to_its_weight_pushing(tiny_corpus, tmp_path):
    """Our denominator of the chain model (stage 8) and Kaldi's chain-make-den-fst of the same tree, model and
    phone LM (a bigram) accept the same pdf sequences with the same weights, but for what Kaldi's minimisation
    (``DenGraphMinimizeWrapper``) does to them. Its weight pushing (``PushSpecial``: every state's weights
    scaled to one total, the rest spread evenly over the arcs) multiplies a whole utterance's weight by a
    constant per frame: the log-ratio is an affine function of its length. Its quantisation (each arc's
    weight rounded to a multiple of 10 x ``kDelta``, about 0.01, before each of six minimisations) adds noise
    that grows with the length: 0.05 at most on the tiny corpus's utterances of 270-500 frames. The faults
    this test is for leave residuals of nats: the forward arcs without the ``1 / (1 - self-loop)`` of the
    reordered self-loops 5.6, a unigram in place of the bigram 27. (Every transition of the chain topology has
    probability 0.5, so that weights all 1 only change the constant per frame, here and in the objective.)
    Ours are not pushed, so that their arcs are the chain decoding graph's."""
    import kaldifst

    from bru_kaldi.chain.den_graph import write_den_fst
    from bru_kaldi.chain.phone_lm import estimate_phone_lm
    from bru_kaldi.chain.den_graph import denominator_graph
    from bru_kaldi.kaldi.alignments import read_alignments
    from bru_kaldi.kaldi.transition_model import read_transition_model

    ali, chain = tiny_corpus.chain_ali("train"), tiny_corpus.root / "exp" / "chain"
    # (--no-prune-ngram-order is 3 by default and may not exceed the order)
    kaldi_chain("chain-est-phone-lm --ngram-order=2 --no-prune-ngram-order=2",
                f"'ark:gunzip -c {ali}/ali.*.gz | ali-to-phones {chain}/final.mdl ark:- ark:- |'",
                str(tmp_path / "phone_lm.fst"))
    kaldi_chain("chain-make-den-fst", str(chain / "tree"), str(chain / "final.mdl"), str(tmp_path / "phone_lm.fst"),
                str(tmp_path / "kaldi_den.fst"), str(tmp_path / "normalization.fst"))
    tm = read_transition_model(chain / "final.mdl")
    alignments = list(read_alignments(str(ali)))
    ours = denominator_graph(estimate_phone_lm([tm.ali_to_phones(a) for _, a in alignments], order=2), tm)
    write_den_fst(ours, tmp_path / "den.fst")
    theirs, mine = (kaldifst.StdVectorFst.read(str(tmp_path / name)) for name in ("kaldi_den.fst", "den.fst"))
    lengths, ratios = [], []
    for _, a in alignments:
        labels = (tm.tid2pdf[a] + 1).tolist()
        lengths.append(len(labels))
        ratios.append(log_weight(mine, labels) - log_weight(theirs, labels))
    assert np.isfinite(ratios).all() and len(set(lengths)) > 3
    slope, intercept = np.polyfit(lengths, ratios, 1)
    np.testing.assert_allclose(ratios, intercept + slope * np.array(lengths), atol=0.1)  # (the quantisation)
    # and a sequence neither accepts: an utterance that begins with a self-loop pdf (a phone's first frame emits
    # its forward pdf)
    loop = int(tm.tid2pdf[alignments[0][1][1]]) + 1  # the first phone's second frame: a self-loop
    assert tm.tid_is_self_loop[alignments[0][1][1]]
    assert log_weight(theirs, [loop]) == log_weight(mine, [loop]) == -np.inf

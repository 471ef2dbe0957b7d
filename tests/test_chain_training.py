"""LF-MMI end to end on the tests' tiny built-in corpus: ``[model] objective = lfmmi`` trains, forwards the
chain output as it is, decodes, scores; and the denominator graph of real alignments.

The objective's arithmetic is held to brute force in tests/test_chain.py, the graphs in
tests/test_chain_graphs.py; the Kaldi decoding path's post-decode scaling in tests/test_decode_sets.py.
"""

import re

import kaldiio
import numpy as np
import pytest
import torch

import run_exp
from bru_kaldi.chain.den_graph import read_den_fst, write_den_fst
from bru_kaldi.chain.supervision import denominator_from_alignments, estimate_denominator
from bru_kaldi.config import parse_config
from bru_kaldi.corpus import Corpus, dataset_for, loader_options
from bru_kaldi.feature_transforms import GlobalNorm
from tests.test_run_exp import CFG, run

pytestmark = pytest.mark.slow  # trains and decodes a model

LFMMI = ("--model,objective=lfmmi", "--exp,n_epochs_tr=1", "--decoding,decoder=python", "--decoding,acwt=1.0",
         "--decoding,acwt_sweep=0.5,1.0")


def test_an_lfmmi_config_trains_forwards_the_chain_output_decodes_and_scores(tiny_corpus, tmp_path, monkeypatch):
    exp_dir = tmp_path / "lfmmi"
    result = run(tiny_corpus, exp_dir, *LFMMI)
    log = (exp_dir / "log.txt").read_text()
    assert "LF-MMI denominator" in log
    res = (exp_dir / "res.res").read_text()
    assert re.search(r"^epoch=001 train_loss=[\d.]+ ", res, re.M), res
    for split in ("dev", "test"):
        assert re.search(rf"^{split}: %WER [\d.]+ \[ \d+ / \d+,", res, re.M), result.stdout[-2000:]
    weights = torch.load(exp_dir / "final.pt", weights_only=True)["model"]
    assert "xent.weight" in weights  # the cross-entropy regularisation's own head
    # the denominator it trained with, as den.fst: the estimated graph, one start state more
    den = read_den_fst(exp_dir / "den.fst")
    estimated = estimate_denominator(tiny_corpus.root / "exp" / "mono_ali_train", order=4)  # the default order
    assert den.num_states == estimated.num_states + 1
    assert sorted(den.pdf[den.src > 0].tolist()) == sorted(estimated.pdf.tolist())
    # given back as [model] lfmmi_den_fst, it is what a run reads: one whose pdfs the labels lack is refused
    den.pdf[0] = 999
    write_den_fst(den, tmp_path / "wrong.fst")
    refused = run(tiny_corpus, tmp_path / "refused", *LFMMI, f"--model,lfmmi_den_fst={tmp_path / 'wrong.fst'}", expect=1)
    assert f"{tmp_path / 'wrong.fst'}: the denominator uses pdf 999, the senone labels have" in refused.stderr
    # forward wrote the chain head's output itself: no softmax, no priors
    monkeypatch.setenv("MINI_TIMIT", str(tiny_corpus.root))
    monkeypatch.setenv("BRU_TEST_EXP", str(exp_dir))
    config = parse_config(CFG, list(LFMMI))
    model = run_exp.load_trained(config, exp_dir, torch.device("cpu"))
    norm = GlobalNorm.load(exp_dir / "feature_norm.npz")
    corpus = Corpus(dataset_for(config, "test", with_labels=False), loader_options(config, "forward"),
                    GlobalNorm(norm.mean[:model.input_size], norm.std[:model.input_size]))
    written = kaldiio.load_scp(str(exp_dir / "forward_test" / "loglikes.scp"))
    batch = next(iter(corpus.batches()))
    with torch.no_grad():
        output = model(batch.x, batch.lengths)["senone"]
    for row, key in enumerate(batch.keys):
        np.testing.assert_allclose(written[key], output[row, :int(batch.lengths[row])].numpy(), rtol=1e-5, atol=1e-5)


def test_the_denominator_of_real_alignments_is_a_distribution_over_their_phone_sequences(tiny_corpus):
    """From the tiny corpus's monophone alignments: every state is reachable and the leak's initial
    probabilities sum to one; every training utterance's pdf sequence has a path in the graph."""
    graph = denominator_from_alignments(tiny_corpus.root / "exp" / "mono_ali_train", order=3)
    assert float(graph.initial.sum()) == pytest.approx(1.0)
    assert set(graph.src.tolist()) == set(range(graph.num_states))  # no dead ends
    from bru_kaldi.chain.objective import denominator_forward_backward
    from bru_kaldi.kaldi.alignments import read_alignments
    from bru_kaldi.kaldi.transition_model import read_transition_model

    model = read_transition_model(tiny_corpus.root / "exp" / "mono_ali_train" / "final.mdl")
    for _, ali in list(read_alignments(str(tiny_corpus.root / "exp" / "mono_ali_train")))[:3]:
        pdfs = torch.as_tensor(model.tid2pdf[ali])
        # outputs that allow only the aligned pdf at each frame: finite only if the graph has that path
        scores = torch.full((1, len(pdfs), model.num_pdfs), -1e4, dtype=torch.float64)
        scores[0, torch.arange(len(pdfs)), pdfs] = 0.0
        logprob, _ = denominator_forward_backward(scores, torch.tensor([len(pdfs)]), graph, 0.0)
        assert float(logprob) > -1e3, "an utterance of the training alignments has no path in the denominator"

"""LF-MMI end to end on the tests' tiny built-in corpus: ``[model] objective = lfmmi`` trains, forwards the
chain output as it is, decodes, scores, on the 3-state model and on the chain model at a third of the frame
rate; every LF-MMI option of the config reaches the objective; and the denominator graph of real alignments.

The objective's arithmetic is held to brute force in tests/test_chain.py, the graphs in
tests/test_chain_graphs.py, tests/test_chain_numerator.py and tests/test_chain_weights.py; the Kaldi decoding
path's post-decode scaling in tests/test_decode_sets.py (and against Kaldi's binaries in tests/kaldi).
"""

import dataclasses
import re
from pathlib import Path

import kaldiio
import numpy as np
import pytest
import torch

import run_exp
from bru_kaldi.chain.den_graph import read_den_fst, write_den_fst
from bru_kaldi.chain.numerator import NumeratorCompiler
from bru_kaldi.chain.objective import lfmmi_loss
from bru_kaldi.chain.supervision import denominator_from_alignments, estimate_denominator
from bru_kaldi.config import parse_config
from bru_kaldi.corpus import Corpus, dataset_for, loader_options, transition_ids_of
from bru_kaldi.distributed import Distributed
from bru_kaldi.experiment import Experiment
from bru_kaldi.feature_transforms import GlobalNorm
from bru_kaldi.kaldi.transition_model import read_transition_model
from bru_kaldi.training import batch_loss
from tests.test_run_exp import CFG, ROOT, run

CHAIN_CFG = ROOT / "tests" / "data" / "tiny_chain.cfg"
LFMMI = ("--model,objective=lfmmi", "--exp,n_epochs_tr=1", "--decoding,decoder=python", "--decoding,acwt=1.0",
         "--decoding,acwt_sweep=0.5,1.0")


@pytest.mark.slow  # trains and decodes a model
def test_an_lfmmi_config_trains_forwards_the_chain_output_decodes_and_scores(tiny_corpus, tmp_path, monkeypatch):
    exp_dir = tmp_path / "lfmmi"
    result = run(tiny_corpus, exp_dir, *LFMMI)
    log = (exp_dir / "log.txt").read_text()
    assert "LF-MMI denominator" in log
    res = (exp_dir / "res.res").read_text()
    assert re.search(r"^epoch=001 train_loss=-?[\d.]+ ", res, re.M), res
    for split in ("dev", "test"):
        assert re.search(rf"^{split}: %WER [\d.]+ \[ \d+ / \d+,", res, re.M), result.stdout[-2000:]
    weights = torch.load(exp_dir / "final.pt", weights_only=True)["model"]
    assert "xent.weight" in weights  # the cross-entropy regularisation's own head
    # the denominator it trained with, as den.fst: the estimated graph, state for state
    den = read_den_fst(exp_dir / "den.fst")
    estimated = estimate_denominator(tiny_corpus.root / "exp" / "mono_ali_train", order=4)  # the default order
    assert den.num_states == estimated.num_states and den.start == estimated.start
    assert sorted(den.pdf.tolist()) == sorted(estimated.pdf.tolist())
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


# a shipped chain config, small: the tests' tiny corpus (not the default one it would build), a smaller network
SHIPPED_CHAIN = ROOT / "cfg" / "MINI_liGRU_lfmmi.cfg"
SMALL_CHAIN = ("--exp,builtin_corpus=none", "--exp,n_epochs_tr=1", "--architecture1,sizes=32,32",
               "--dataset1,n_chunks=2", "--decoding,num_jobs=2", "--decoding,acwt_sweep=0.7,1.0",
               "--decoding,wip_sweep=0.0", "--decoding,beam=10", "--decoding,max_active=1000", "--decoding,latbeam=4")


def run_shipped_chain(corpus, exp_dir, *arguments):
    """cfg/MINI_liGRU_lfmmi.cfg on ``corpus``, small (SMALL_CHAIN), into ``exp_dir``."""
    return run(corpus, exp_dir, f"--exp,out_folder={exp_dir}", *SMALL_CHAIN, *arguments, config=SHIPPED_CHAIN)


@pytest.mark.slow  # trains and decodes a model
def test_a_shipped_chain_config_trains_at_a_third_of_the_frame_rate_and_decodes(tiny_corpus, tmp_path):
    """cfg/MINI_liGRU_lfmmi.cfg (the chain model, frame_subsampling_factor = 3): one epoch, log-likelihoods of
    ceil(T / 3) rows per utterance, a decode and a score on the chain graph with the Python decoder (Kaldi's:
    tests/kaldi/test_kaldi_chain.py)."""
    exp_dir = tmp_path / "chain"
    run_shipped_chain(tiny_corpus, exp_dir, "--decoding,decoder=python")
    res = (exp_dir / "res.res").read_text()
    for split in ("dev", "test"):
        assert re.search(rf"^{split}: %WER [\d.]+ \[ \d+ / \d+,.* decoder=python", res, re.M), res
    frames = {line.split()[0]: int(line.split()[1])
              for line in (tiny_corpus.data("test") / "utt2num_frames").read_text().splitlines()}
    written = kaldiio.load_scp(str(exp_dir / "forward_test" / "loglikes.scp"))
    assert {key: len(matrix) for key, matrix in written.items()} == {key: -(-n // 3) for key, n in frames.items()}
    den = read_den_fst(exp_dir / "den.fst")  # the chain model's: its forward and self-loop pdfs
    tm = read_transition_model(tiny_corpus.chain_ali("train") / "final.mdl")
    assert set(den.pdf.tolist()) == set(range(tm.num_pdfs)) and tm.num_pdfs == 2 * len(tm.topology.phones)
    assert float(re.search(r"rtf=([\d.]+)", res.splitlines()[-1]).group(1)) > 0
    # the decode counts the audio at 30 ms a row, the input's length (10 ms a frame) give or take a row's rounding
    audio = float(re.search(r"^.*test: %WER .*\(\d+ utterances, ([\d.]+) s of audio", (exp_dir / "log.txt").read_text(),
                            re.M).group(1))
    assert sum(frames.values()) * 0.01 <= audio + 0.05 <= sum(frames.values()) * 0.01 + 0.03 * len(frames) + 0.1


# --------------------------------------------------------------------------- the options reach the objective
OPTIONS = {  # option: a value other than the default, and the other options of both runs
    "lfmmi_tolerance": (2, []),
    "lfmmi_leaky_hmm": (0.3, []),
    "lfmmi_xent_regularize": (0.5, []),
    "lfmmi_output_l2": (0.01, []),
    "lfmmi_transition_scale": (0.5, []),
    # (the chain model's graph is stochastic, or with unit weights has the same total out of every state, and
    # Kaldi's normalisation changes nothing there: the 3-state model with unit weights is where it matters)
    "lfmmi_initial_probs": ("unnormalised", ["--model,lfmmi_transition_scale=0", "3-state"]),
    "frame_subsampling_factor": (3, []),
}


def first_batch_loss(tiny_corpus, tmp_path, monkeypatch, overrides):
    """The training loss of the first batch of tiny_chain.cfg with ``overrides``, as run_exp computes it, and
    what a direct call of lfmmi_loss with the config's values gives on the same network outputs."""
    monkeypatch.setenv("MINI_TIMIT", str(tiny_corpus.root))
    monkeypatch.setenv("BRU_TEST_EXP", str(tmp_path))
    if "3-state" in overrides:  # tiny_liBRU.cfg's 3-state monophone model, trained with LF-MMI
        config = parse_config(CFG, ["--model,objective=lfmmi", *(o for o in overrides if o != "3-state")])
    else:
        config = parse_config(CHAIN_CFG, ["--model,frame_subsampling=output", "--model,frame_subsampling_factor=1",
                                          *overrides])
    run = run_exp.load_training_data(config, Experiment(tmp_path), torch.device("cpu"), Distributed())
    run_exp.build_network(run)
    run.model.eval()  # no dropout draws: the same outputs for both computations
    batch = next(iter(run.train_set.batches(0)))
    with torch.no_grad():
        out = run.model(batch.x[..., :run.input_dim], batch.lengths)
    frames = run.model.output_lengths(batch.lengths)
    loss, _ = batch_loss(out, batch.labels, config.model, int(frames.sum()), 1, None, run.chain)

    m = config.model
    lab_folder = Path(config.dataset("train").lab[0].lab_folder)
    compiler = NumeratorCompiler(read_transition_model(lab_folder / "final.mdl"), tolerance=m.lfmmi_tolerance,
                                 frame_subsampling_factor=m.frame_subsampling_factor,
                                 transition_scale=m.lfmmi_transition_scale)
    tids = batch.labels[transition_ids_of("lab_cd")]
    numerators = [compiler.graph(row[:n].numpy()) for row, n in zip(tids, batch.lengths.tolist())]
    den = estimate_denominator(lab_folder, m.lfmmi_phone_lm_order, m.lfmmi_transition_scale).chain_graph(
        m.lfmmi_initial_probs, dtype=torch.float32)
    direct = lfmmi_loss(out["senone"], frames, numerators, den, m.lfmmi_leaky_hmm, out["xent"],
                        m.lfmmi_xent_regularize, m.lfmmi_output_l2).loss
    return float(loss), float(direct)


@pytest.mark.parametrize("option", OPTIONS)
def test_every_lfmmi_option_reaches_the_training_objective(option, tiny_corpus, tmp_path, monkeypatch):
    """A value other than the default changes the loss of a training batch exactly as a direct call of the loss
    with that value does (and the change is not nothing)."""
    value, others = OPTIONS[option]
    default = first_batch_loss(tiny_corpus, tmp_path / "default", monkeypatch, others)
    changed = first_batch_loss(tiny_corpus, tmp_path / "changed", monkeypatch, [*others, f"--model,{option}={value}"])
    assert default[0] == pytest.approx(default[1], rel=1e-5)
    assert changed[0] == pytest.approx(changed[1], rel=1e-5)
    assert abs(changed[0] - default[0]) > 1e-4 * abs(default[0]), (option, default, changed)


def test_the_denominator_of_real_alignments_is_a_distribution_over_their_phone_sequences(tiny_corpus):
    """From the tiny corpus's alignments (the 3-state and the chain model): every state is reachable and the
    leak's initial probabilities sum to one; every training utterance's pdf sequence has a path in the graph."""
    from bru_kaldi.chain.objective import denominator_forward_backward
    from bru_kaldi.kaldi.alignments import read_alignments

    for folder in (tiny_corpus.ali("train"), tiny_corpus.chain_ali("train")):
        graph = denominator_from_alignments(folder, order=3)
        assert float(graph.initial.sum()) == pytest.approx(1.0)
        assert set(graph.src.tolist()) == set(range(graph.num_states))  # no dead ends
        model = read_transition_model(folder / "final.mdl")
        for _, ali in list(read_alignments(str(folder)))[:3]:
            pdfs = torch.as_tensor(model.tid2pdf[ali])
            # outputs that allow only the aligned pdf at each frame: finite only if the graph has that path
            scores = torch.full((1, len(pdfs), model.num_pdfs), -1e4, dtype=torch.float64)
            scores[0, torch.arange(len(pdfs)), pdfs] = 0.0
            logprob, _ = denominator_forward_backward(scores, torch.tensor([len(pdfs)]), graph, 0.0)
            assert float(logprob) > -1e3, f"{folder}: a training utterance has no path in the denominator"

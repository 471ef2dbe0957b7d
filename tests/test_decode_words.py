"""Word decoding as WSJ scores it, on the tiny corpus's word task: the acoustic scale and the word
insertion penalty chosen on dev and applied to test, best_wer in Kaldi's form, word timings (CTM)."""

import re
from pathlib import Path

import numpy as np
import pytest

from bru_kaldi import decoding
from bru_kaldi.config import Decoding
from bru_kaldi.decoding.ctm import read_word_boundary, word_spans
from bru_kaldi.kaldi.transition_model import read_transition_model
from data_io import LoglikeWriter
from recipes.mini_timit.local.check import read_alignments

ROOT = Path(__file__).resolve().parents[1]
OFF_PATH = -20.0  # the log-likelihood of every pdf but the aligned one


def oracle_jobs(corpus, tmp_path):
    """Log-likelihoods that put each frame on its aligned pdf, for dev and test."""
    tm = read_transition_model(corpus.model)
    jobs = []
    for split in ("dev", "test"):
        out = tmp_path / f"forward_{split}"
        out.mkdir()
        with LoglikeWriter(str(out / "loglikes.ark"), str(out / "loglikes.scp")) as writer:
            for utt, ali in sorted(read_alignments(corpus.ali(split)).items()):
                loglikes = np.full((len(ali), tm.num_pdfs), OFF_PATH, dtype=np.float32)
                loglikes[np.arange(len(ali)), tm.tid2pdf[ali]] = 0.0
                writer.write(utt, loglikes)
        jobs.append(decoding.DecodeJob(split, out / "loglikes.scp", corpus.lm_graph("tgpr"), corpus.model,
                                       corpus.data(split) / "text", tmp_path / f"decode_{split}"))
    return jobs


def test_scale_and_insertion_penalty_are_chosen_on_dev_and_applied_to_test(tiny_words, tmp_path):
    jobs = oracle_jobs(tiny_words, tmp_path)
    results = decoding.decode_sets(jobs, Decoding(decoder="python", scoring="wsj", acwt_sweep=[0.1, 1.0],
                                                  wip_sweep=[0.0, 0.5], num_jobs=2), tune_on="dev", log=lambda s: None)
    dev, test = results["dev"], results["test"]
    tried = (tmp_path / "decode_dev" / "scoring" / "summary.txt").read_text()
    assert len(re.findall(r"^dev acwt=\S+ wip=\S+:", tried, flags=re.M)) == 4  # every pair on dev
    assert dev.setting == test.setting and re.fullmatch(r"acwt=\S+ wip=\S+", dev.setting)
    assert test.score.total.rate < 5.0  # oracle posteriors through the pruned trigram
    best = (tmp_path / "decode_test" / "best_wer").read_text()
    assert best.startswith(test.score.total.kaldi_line()) and "scoring/" in best


def test_word_timings_follow_the_best_path(tiny_words, tmp_path):
    jobs = oracle_jobs(tiny_words, tmp_path)[1:]
    decoding.decode_sets(jobs, Decoding(decoder="python", scoring="wsj", acwt=1.0, num_jobs=1), tune_on=None,
                         log=lambda s: None)
    hyps = {line.split()[0]: line.split()[1:] for line in (tmp_path / "decode_test" / "text").read_text().splitlines()}
    ctm = [line.split() for line in (tmp_path / "decode_test" / "ctm").read_text().splitlines()]
    assert ctm and all(channel == "1" for _, channel, *_ in ctm)
    for utt, words in hyps.items():
        mine = [row for row in ctm if row[0] == utt]
        assert [row[4] for row in mine] == words
        starts = [float(row[2]) for row in mine]
        ends = [float(row[2]) + float(row[3]) for row in mine]
        assert starts == sorted(starts) and all(e <= s + 1e-9 for e, s in zip(ends, starts[1:]))
        assert all(float(row[3]) > 0 for row in mine)
    # the oracle path's words sit where the alignment put them: compare with the alignment's own spans
    tm = read_transition_model(tiny_words.model)
    boundary = read_word_boundary(tiny_words.lm_graph("tgpr"))
    utt, ali = sorted(read_alignments(tiny_words.ali("test")).items())[0]
    phones, frame = [], 0
    for piece in tm.split_to_phones(ali):
        phones.append((int(tm.tid2phone[piece[0]]), frame, frame + len(piece)))
        frame += len(piece)
    spans = word_spans(phones, boundary)
    mine = [row for row in ctm if row[0] == utt]
    if len(mine) == len(spans):  # the oracle found the aligned words
        assert [round(float(r[2]) * 100) for r in mine] == [first for first, _ in spans]


def test_a_chain_models_frame_shift_reaches_the_word_timings_and_the_real_time_factor(tiny_words, tmp_path):
    """A chain model writes a row every third input frame (DecodeJob.frame_shift 0.03, as run_exp.decode_jobs sets
    it from [model] frame_subsampling_factor): the same rows decoded at 0.03 s a row have word timings and audio
    three times those at 0.01 s, and a real-time factor a third (tests/test_chain_training.py: run_exp's side)."""
    (tmp_path / "rows_10ms").mkdir()
    tens = oracle_jobs(tiny_words, tmp_path / "rows_10ms")[1]
    thirties = decoding.DecodeJob(tens.name, tens.loglikes_scp, tens.graph_dir, tens.model, tens.ref_text,
                                  tmp_path / "rows_30ms", frame_shift=0.03)
    options = Decoding(decoder="python", scoring="wsj", acwt=1.0, num_jobs=1)
    results = [decoding.decode_sets([job], options, tune_on=None, log=lambda s: None)["test"] for job in (tens, thirties)]
    assert results[1].audio_seconds == pytest.approx(3 * results[0].audio_seconds)
    assert results[1].rtf == pytest.approx(results[1].seconds / results[1].audio_seconds)
    ctms = [[line.split() for line in (job.out_dir / "ctm").read_text().splitlines()] for job in (tens, thirties)]
    assert ctms[0] and [row[4] for row in ctms[0]] == [row[4] for row in ctms[1]]
    for ten, thirty in zip(*ctms):
        assert float(thirty[2]) == pytest.approx(3 * float(ten[2])) and float(thirty[3]) == pytest.approx(3 * float(ten[3]))


def test_a_word_boundary_table_that_does_not_fit_the_path_is_an_error():
    boundary = {1: "nonword", 2: "begin", 3: "end"}
    with pytest.raises(ValueError, match="ends inside a word"):
        word_spans([(2, 0, 3)], boundary)
    with pytest.raises(ValueError, match="end phone"):
        word_spans([(3, 0, 3)], boundary)


def test_a_word_insertion_penalty_costs_every_word():
    loglikes = np.log(np.array([[.9, .1]] * 3 + [[.2, .8]] * 2, dtype=np.float32))
    graph = decoding.linear_loop_graph(num_transition_ids=2)  # every arc emits a word
    tid2pdf = np.array([0, 0, 1])
    plain = decoding.decode(loglikes, graph, tid2pdf, decoding.DecoderOptions(acoustic_scale=1.0))
    penalised = decoding.decode(loglikes, decoding.with_word_penalty(graph, 0.75), tid2pdf,
                                decoding.DecoderOptions(acoustic_scale=1.0))
    assert penalised.words == plain.words
    assert penalised.cost == pytest.approx(plain.cost + 0.75 * len(plain.words), abs=1e-4)


@pytest.mark.parametrize("cfg", ["WSJ_liBRU", "AMI_liBRU"])
def test_the_wsj_and_ami_configs_run_on_the_word_task(cfg, tiny_words, tmp_path, monkeypatch):
    """A WSJ or AMI user's first run: the Kaldi names linked to the word task, sizes and epochs overridden."""
    import logging

    import run_exp
    from recipes.mini_timit.local.kaldi_view import make_view

    for variable, folder in make_view(tmp_path / "view", tiny_words.root, "words").items():
        monkeypatch.setenv(variable, str(folder))
    exp_dir = tmp_path / "exp"
    code = run_exp.main([str(ROOT / "cfg" / f"{cfg}.cfg"), f"--exp,out_folder={exp_dir}", "--exp,n_epochs_tr=1",
                         "--architecture1,sizes=24", "--batches,batch_size_train=4", "--dataset1,n_chunks=2",
                         "--decoding,num_jobs=2", "--decoding,acwt_sweep=0.1,0.5", "--decoding,wip_sweep=0.0,1.0"])
    logging.shutdown()
    assert code == 0, (exp_dir / "log.txt").read_text()[-3000:]
    res = (exp_dir / "res.res").read_text()
    assert re.search(r"^test: %WER \d+\.\d\d \[ \d+ / \d+, .* acwt=\S+ wip=\S+ decoder=python", res, flags=re.M), res
    assert (exp_dir / "decode_test" / "ctm").is_file() and (exp_dir / "decode_test" / "best_wer").is_file()

"""decode.py: the pdf -> transition-id mapping, the search on a real graph, and bad inputs."""

import gzip

import kaldiio
import numpy as np
import pytest

from bru_kaldi import decoding as decode
from recipes.mini_timit.local.layout import read_table
from bru_kaldi.kaldi.transition_model import read_transition_model


def test_transition_loglikes_puts_tid_scores_in_column_tid_minus_one():
    loglikes = np.array([[-1.0, -2.0, -3.0]], dtype=np.float32)  # (T=1, num_pdfs=3)
    tid2pdf = np.array([0, 2, 2, 0, 1])  # index 0 unused
    scores = decode.transition_loglikes(loglikes, tid2pdf, acoustic_scale=0.5)
    assert scores.shape == (1, 4) and scores.dtype == np.float32
    np.testing.assert_allclose(scores[0], [-1.5, -1.5, -0.5, -1.0])


@pytest.mark.parametrize("loglikes, tid2pdf, message", [
    (np.zeros(5), np.array([0, 0, 1]), "must be \\(frames, pdfs\\)"),
    (np.zeros((5, 2)), np.array([0]), "index 0 unused"),
    (np.zeros((5, 2)), np.array([0, 0, 2]), "3 pdfs, the log-likelihoods 2"),
])
def test_bad_shapes_are_named(loglikes, tid2pdf, message):
    with pytest.raises(ValueError, match=message):
        decode.decode(loglikes, decode.linear_loop_graph(2), tid2pdf)


def test_no_frames_and_missing_graph_are_errors(tmp_path):
    with pytest.raises(ValueError, match="no frames"):
        decode.decode(np.zeros((0, 2), np.float32), decode.linear_loop_graph(2), np.array([0, 0, 1]))
    with pytest.raises(FileNotFoundError, match="no such decoding graph"):
        decode.load_graph(tmp_path / "HCLG.fst")


def test_the_best_path_follows_the_evidence_through_hclg(tiny_corpus):
    # a phone sequence given as noisy but peaked log-likelihoods comes back through the real graph,
    # and its alignment maps to the same pdfs frame by frame
    tm = read_transition_model(tiny_corpus.model)
    graph = decode.load_graph(tiny_corpus.graph / "HCLG.fst")
    words = {int(i): w for w, i in read_table(tiny_corpus.graph / "words.txt").items()}
    with gzip.open(tiny_corpus.ali("dev") / "ali.1.gz") as f:
        utt, ali = next(iter(kaldiio.load_ark(f)))
    rng = np.random.default_rng(0)
    loglikes = rng.normal(-8.0, 1.0, (len(ali), tm.num_pdfs)).astype(np.float32)
    loglikes[np.arange(len(ali)), tm.tid2pdf[ali]] = -0.5
    result = decode.decode(loglikes, graph, tm.tid2pdf, decode.DecoderOptions(acoustic_scale=0.5))
    assert result.reached_final and len(result.alignment) == len(ali)
    assert [words[w] for w in result.words] == read_table(tiny_corpus.data("dev") / "text")[utt].split()
    np.testing.assert_array_equal(tm.tid2pdf[np.array(result.alignment)], tm.tid2pdf[ali])

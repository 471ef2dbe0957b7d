"""Scoring: Kaldi's counts on hand-computed cases, corpus filters, missing hypotheses, text files."""

import pytest

from bru_kaldi.scoring import ErrorCounts, filter_tokens, read_text, score, write_per_utterance, write_text


def test_hand_computed_alignment():
    # a b c d e -> a x c e f: b->x substituted, d deleted, f inserted
    result = score({"u": "a b c d e".split()}, {"u": "a x c e f".split()})
    assert (result.total.ins, result.total.dels, result.total.subs, result.total.ref_len) == (1, 1, 1, 5)
    assert result.total.kaldi_line() == "%WER 60.00 [ 3 / 5, 1 ins, 1 del, 1 sub ]"


def test_per_utterance_counts_add_up_to_the_total():
    refs = {"a": "x y z".split(), "b": "p q".split(), "c": "r".split()}
    hyps = {"a": "x z".split(), "b": "p q q".split(), "c": "s".split()}
    result = score(refs, hyps)
    summed = sum(result.per_utterance.values(), ErrorCounts())
    assert summed == result.total == ErrorCounts(ins=1, dels=1, subs=1, ref_len=6)


def test_timit_folding_merges_the_nine_classes():
    folded = filter_tokens("ao ax el en ix zh cl vcl epi aa sil".split(), "timit")
    assert folded == "aa ah l n ih sh sil sil sil aa sil".split()
    # ao and aa are the same class after folding, so this is no error
    assert score({"u": ["ao"]}, {"u": ["aa"]}, "timit").total.errors == 0
    assert score({"u": ["ao"]}, {"u": ["aa"]}, "plain").total.errors == 1


@pytest.mark.parametrize("scoring, noise", [("wsj", "<NOISE>"), ("wsj", "<SPOKEN_NOISE>"), ("ami", "%HESITATION"), ("ami", "[laughter]")])
def test_corpus_filters_remove_noise_tokens(scoring, noise):
    result = score({"u": ["HELLO", noise, "WORLD"]}, {"u": [noise, "HELLO", "WORLD"]}, scoring)
    assert result.total == ErrorCounts(0, 0, 0, 2)


def test_missing_hypothesis_counts_as_deletions_and_is_reported():
    result = score({"u1": "a b".split(), "u2": "c d e".split()}, {"u1": "a b".split(), "zz": ["q"]})
    assert result.missing == ["u2"] and result.extra == ["zz"]
    assert result.total == ErrorCounts(0, 3, 0, 5)


def test_unknown_scoring_is_an_error():
    with pytest.raises(ValueError, match="scoring must be one of"):
        score({"u": ["a"]}, {"u": ["a"]}, "librispeech")


def test_text_files_round_trip(tmp_path):
    table = {"b_utt": ["x", "y"], "a_utt": ["z"], "c_utt": []}
    write_text(table, tmp_path / "text")
    assert (tmp_path / "text").read_text().splitlines()[0] == "a_utt z"
    assert read_text(tmp_path / "text") == table
    result = score(table, table)
    write_per_utterance(result, tmp_path / "per_utt")
    assert (tmp_path / "per_utt").read_text().splitlines()[1] == "a_utt 1 0 0 0 0"


def test_reading_a_bad_text_file_names_the_problem(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        read_text(tmp_path / "nope")
    (tmp_path / "text").write_text("u1 a\nu1 b\n")
    with pytest.raises(ValueError, match=r"text:2: utterance u1 appears twice"):
        read_text(tmp_path / "text")


def test_a_second_hypothesis_is_compared_utterance_by_utterance(tmp_path, capsys):
    """``score REF HYP --against HYP2``: HYP2 makes one more error on two of three utterances, so the
    per-utterance differences are 1, 1, 0: z = (2/3) / (sd 0.577 / sqrt 3) = 2.0, p = erfc(2 / sqrt 2) = 0.046;
    HYP2 is never better in any bootstrap replicate."""
    from bru_kaldi.scoring import main

    write_text({"u1": "a b".split(), "u2": "c d".split(), "u3": "e f".split()}, tmp_path / "ref")
    write_text({"u1": "a b".split(), "u2": "c d".split(), "u3": "e x".split()}, tmp_path / "hyp")
    write_text({"u1": "a x".split(), "u2": "x d".split(), "u3": "e x".split()}, tmp_path / "hyp2")
    main(["score", str(tmp_path / "ref"), str(tmp_path / "hyp"), "--against", str(tmp_path / "hyp2")])
    lines = capsys.readouterr().out.splitlines()
    assert lines == ["%WER 16.67 [ 1 / 6, 0 ins, 0 del, 1 sub ]",
                     f"{tmp_path / 'hyp2'}: %WER 50.00 [ 3 / 6, 0 ins, 0 del, 3 sub ], +33.33 points; matched pairs "
                     "p = 0.046; probability of improvement 0.000"]

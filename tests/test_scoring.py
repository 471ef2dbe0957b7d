"""Scoring: Kaldi's counts on hand-computed cases, corpus filters, missing hypotheses, text files."""

from pathlib import Path

import pytest

from bru_kaldi.scoring import (ErrorCounts, filter_path, filter_tokens, read_filter, read_text, score, scoring_filter,
                               write_per_utterance, write_text)

ROOT = Path(__file__).resolve().parents[1]


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
    with pytest.raises(ValueError, match=r"scoring 'timt' \(did you mean 'timit'\?\) is neither plain, a corpus whose "
                                         r"recipe keeps a scoring filter \(ami, timit, wsj: "):
        score({"u": ["a"]}, {"u": ["a"]}, "timt")


def test_the_corpus_filters_are_their_recipes_data_not_the_librarys():
    """Each named filter is a file of its corpus's recipe folder; the library's code holds none of their
    tokens, and a filter file given by its path works as a named one."""
    assert filter_path("timit") == ROOT / "recipes" / "timit" / "scoring_filter.txt" and filter_path("plain") is None
    code = (ROOT / "bru_kaldi" / "scoring.py").read_text()
    assert not any(f"{token!r}" in code or f'"{token}"' in code
                   for name in ("timit", "wsj", "ami") for token in [*scoring_filter(name).fold, *scoring_filter(name).drop])
    assert scoring_filter("timit").fold["epi"] == "sil" and "<SPOKEN_NOISE>" in scoring_filter("wsj").drop


def test_a_filter_file_of_ones_own(tmp_path):
    own = tmp_path / "filter.txt"
    own.write_text("# fold, then drop\nuh ah  # as the corpus's guide says\n\n[cough]\n")
    assert filter_tokens("uh [cough] ah b".split(), str(own)) == ["ah", "ah", "b"]
    assert score({"u": "uh [cough] b".split()}, {"u": "ah b".split()}, str(own)).total.errors == 0
    for text, message in (("a b c\n", r"filter.txt:1: expected 'token' or 'token replacement', got 'a b c'"),
                          ("a b\n# c\na\n", r"filter.txt:3: a has a rule on line 1, got 'a'")):
        own.write_text(text)
        with pytest.raises(ValueError, match=message):
            read_filter(own)


def test_the_command_line_filter_names_a_bad_scoring(capsys):
    from bru_kaldi.scoring import main

    with pytest.raises(SystemExit) as stop:
        main(["filter", "nope"])
    assert stop.value.code == 2 and "scoring 'nope' is neither plain" in capsys.readouterr().err


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

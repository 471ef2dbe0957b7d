"""The built-in corpus (recipes/mini_timit): layout, consistency, oracle decode, determinism, stages.

Everything runs on the tiny size built once per session (``tiny_corpus`` in conftest.py); one
more tiny build checks that a seed gives byte-identical archives and how a failed stage is left.
"""

import dataclasses
import doctest
import gzip
import json
import shutil
import subprocess
import sys
from pathlib import Path

import kaldiio
import numpy as np
import pytest

from bru_kaldi import decoding as decode
from recipes.mini_timit.corpus import RECIPE_DIR, ensure_corpus
from recipes.mini_timit.local import espeak, layout, phoneset, prepare_text
from recipes.mini_timit.local.layout import SPLITS, STAGES, read_table, stage_marker
from recipes.mini_timit.local.make_mono import phone_frames
from recipes.mini_timit.local.prepare_lang import bigram_arpa
from recipes.mini_timit.local.synthesize import phone_segments
from bru_kaldi.scoring import score
from bru_kaldi.kaldi.transition_model import read_transition_model

from .conftest import TINY_SEED

DATA_FILES = ("wav.scp", "text", "utt2spk", "spk2utt", "spk2gender", "feats.scp", "cmvn.scp", "feats_mfcc.scp",
              "cmvn_mfcc.scp", "utt2num_frames", "utt2dur")


def alignments(corpus, split):
    num_jobs = int((corpus.ali(split) / "num_jobs").read_text())
    out = {}
    for job in range(1, num_jobs + 1):
        out.update(kaldiio.ReadHelper(f"ark:gunzip -c {corpus.ali(split)}/ali.{job}.gz |"))
    return out


def archives(root: Path) -> dict[str, bytes]:
    """Every archive, wav, FST and model file of a corpus, by path relative to its root."""
    patterns = ("data/*/data/*.ark", "data/wav/*/*.wav", "exp/*/ali.*.gz", "exp/mono/final.mdl", "exp/mono/tree",
                "exp/mono/graph/HCLG.fst", "data/lang/*.fst", "data/*/text")
    return {str(p.relative_to(root)): p.read_bytes() for pattern in patterns for p in sorted(root.glob(pattern))}


def test_layout_is_a_kaldi_timit_experiment(tiny_corpus):
    for split in SPLITS:
        for name in DATA_FILES:
            assert (tiny_corpus.data(split) / name).is_file(), f"data/{split}/{name}"
        assert {p.name for p in tiny_corpus.ali(split).iterdir()} >= {"ali.1.gz", "num_jobs", "final.mdl", "tree"}
    for name in ("phones.txt", "words.txt", "topo", "L.fst", "L_disambig.fst", "G.fst", "phones/disambig.int"):
        assert (tiny_corpus.lang / name).is_file(), f"data/lang/{name}"
    for name in ("HCLG.fst", "words.txt", "phones.txt", "phones/silence.csl"):
        assert (tiny_corpus.graph / name).is_file(), f"exp/mono/graph/{name}"
    assert tiny_corpus.model.read_bytes()[:2] == b"\0B", "final.mdl is Kaldi binary"
    assert (tiny_corpus.model.parent / "tree").read_bytes()[:2] == b"\0B"


def test_every_utterance_has_features_transcript_speaker_and_a_fitting_alignment(tiny_corpus):
    tm = read_transition_model(tiny_corpus.model)
    # 39 phones: 38 x 3 states + a 5-state silence
    assert (tm.num_phones, tm.num_pdfs) == (39, 38 * 3 + 5)
    phone_ids = {p: int(i) for p, i in read_table(tiny_corpus.lang / "phones.txt").items()}
    speakers = {}
    for split in SPLITS:
        data = tiny_corpus.data(split)
        utt2spk, text = read_table(data / "utt2spk"), read_table(data / "text")
        fbank, mfcc = kaldiio.load_scp(str(tiny_corpus.feats(split))), kaldiio.load_scp(str(tiny_corpus.feats(split, "mfcc")))
        cmvn = kaldiio.load_scp(str(tiny_corpus.cmvn(split)))
        ali = alignments(tiny_corpus, split)
        assert set(utt2spk) == set(text) == set(fbank) == set(mfcc) == set(ali) and utt2spk
        for utt, spk in utt2spk.items():
            assert utt.startswith(spk + "_")
            assert fbank[utt].shape[1] == 40 and mfcc[utt].shape[1] == 13 and fbank[utt].dtype == np.float32
            assert len(ali[utt]) == len(fbank[utt]) == len(mfcc[utt]), utt
            assert ali[utt].min() >= 1 and ali[utt].max() <= tm.num_transition_ids, utt
            assert tm.tid2pdf[ali[utt]].max() < tm.num_pdfs
            words = text[utt].split()
            assert set(words) <= set(phone_ids) and words[0] == words[-1] == phoneset.SIL
            # the alignment spells the transcript: one phone per run of its transition-ids
            assert tm.ali_to_phones(ali[utt]) == [phone_ids[w] for w in words]
        for spk in set(utt2spk.values()):
            assert cmvn[spk].shape == (2, 41)
            assert spk not in speakers, f"speaker {spk} in {speakers.get(spk)} and {split}"
            speakers[spk] = split
        rate, wav = kaldiio.load_mat(read_table(data / "wav.scp")[next(iter(utt2spk))])
        assert rate == 16000 and wav.dtype == np.int16


def test_cmvn_stats_are_kaldis(tiny_corpus):
    data = tiny_corpus.data("train")
    spk, utts = next(iter(read_table(data / "spk2utt").items()))
    feats = kaldiio.load_scp(str(tiny_corpus.feats("train")))
    x = np.concatenate([feats[u] for u in utts.split()]).astype(np.float64)
    stats = kaldiio.load_scp(str(tiny_corpus.cmvn("train")))[spk]
    np.testing.assert_allclose(stats[0, :-1], x.sum(0), rtol=1e-6)
    np.testing.assert_allclose(stats[1, :-1], (x ** 2).sum(0), rtol=1e-6)
    assert stats[0, -1] == len(x) and stats.dtype == np.float64


def oracle_per(corpus, split, tid2pdf, num_pdfs):
    graph = decode.load_graph(corpus.graph / "HCLG.fst")
    words = {int(i): w for w, i in read_table(corpus.graph / "words.txt").items()}
    refs = {u: t.split() for u, t in read_table(corpus.data(split) / "text").items()}
    hyps = {}
    for utt, ali in alignments(corpus, split).items():
        loglikes = np.full((len(ali), num_pdfs), np.log(1e-30), dtype=np.float32)
        loglikes[np.arange(len(ali)), tid2pdf[ali]] = 0.0
        hyps[utt] = [words[w] for w in decode.decode(loglikes, graph, tid2pdf).words]
    return score(refs, hyps, "plain").total.rate


def test_oracle_decode_of_the_aligned_pdfs_is_below_one_percent(tiny_corpus):
    tm = read_transition_model(tiny_corpus.model)
    assert oracle_per(tiny_corpus, "test", tm.tid2pdf, tm.num_pdfs) < 1.0
    assert "%PER 0" in (tiny_corpus.root / "exp/mono/decode_oracle_test/per.txt").read_text()


def test_oracle_decode_notices_a_wrong_pdf_map(tiny_corpus):
    # the same check with pdfs scrambled must fail: the oracle is not vacuous
    tm = read_transition_model(tiny_corpus.model)
    scrambled = tm.tid2pdf.copy()
    scrambled[1:] = np.random.default_rng(0).permutation(tm.num_pdfs)[tm.tid2pdf[1:]]
    graph = decode.load_graph(tiny_corpus.graph / "HCLG.fst")
    words = {int(i): w for w, i in read_table(tiny_corpus.graph / "words.txt").items()}
    utt, ali = next(iter(alignments(tiny_corpus, "test").items()))
    loglikes = np.full((len(ali), tm.num_pdfs), np.log(1e-30), dtype=np.float32)
    loglikes[np.arange(len(ali)), tm.tid2pdf[ali]] = 0.0
    hyp = [words[w] for w in decode.decode(loglikes, graph, scrambled).words]
    ref = read_table(tiny_corpus.data("test") / "text")[utt].split()
    assert score({utt: ref}, {utt: hyp}, "plain").total.rate > 30


def test_the_phone_bigram_is_a_distribution():
    arpa = bigram_arpa([["sil", "aa", "b", "sil"], ["sil", "b", "aa", "aa", "sil"]], list(phoneset.PHONES))
    uni, bi, bow = {}, {}, {}
    section = None
    for line in arpa.splitlines():
        if line.startswith("\\"):
            section = line
            continue
        fields = line.split("\t")
        if section == "\\1-grams:" and len(fields) >= 2:
            uni[fields[1]] = 10 ** float(fields[0])
            if len(fields) == 3:
                bow[fields[1]] = 10 ** float(fields[2])
        elif section == "\\2-grams:" and len(fields) == 2:
            bi[tuple(fields[1].split())] = 10 ** float(fields[0])
    targets = [*phoneset.PHONES, "</s>"]
    assert sum(uni[w] for w in targets) == pytest.approx(1.0, abs=1e-5)
    for h in ("<s>", "sil", "aa", "b"):
        total = sum(bi.get((h, w), bow[h] * uni[w]) for w in targets)
        assert total == pytest.approx(1.0, abs=1e-5), h


def test_phone_segments_from_espeak_events():
    # marks without a segment (";"), stress marks, short and long pauses
    events = [("D", 200), ("'@2", 900), (";", 1200), ("_", 1400), ("k", 1600), ("_:", 3000), ("s", 6000), ("_:", 7000)]
    segs = phone_segments(events, 9000)
    assert [s[0] for s in segs] == ["sil", "dh", "ah", "k", "sil", "s", "sil"]
    assert segs[2][1:] == [900, 1600]  # ";" and the 200-sample pause joined "ah"
    assert all(a[2] == b[1] for a, b in zip(segs, segs[1:])) and segs[0][1] == 0 and segs[-1][2] == 9000
    with pytest.raises(phoneset.UnknownPhoneme, match="'Q~'"):
        phone_segments([("Q~", 10)], 100)


def test_short_phones_borrow_frames_from_neighbours():
    # a 1-frame phone between two long ones gets its 3 frames; totals are preserved
    segs = [("sil", 0, 4000), ("t", 4000, 4160), ("sil", 4160, 8000)]
    counts = phone_frames(segs, 48, {"sil": 5, "t": 3}, "u")
    assert counts[1] == 3 and sum(counts) == 48 and min(counts) >= 3
    with pytest.raises(ValueError, match="utterance u"):
        phone_frames(segs, 10, {"sil": 5, "t": 3}, "u")


def test_same_seed_same_bytes_and_a_failed_stage_is_not_complete(tiny_corpus, tmp_path):
    again = ensure_corpus(tmp_path / "again", size="tiny", seed=TINY_SEED, log=lambda line: None)
    reference = archives(tiny_corpus.root)
    assert len(reference) > 50 and archives(again.root) == reference

    # make stage 2 (features) fail half-way: one wav is missing
    wav = Path(sorted(read_table(again.data("test") / "wav.scp").values())[-1])
    stage_marker(again.root, 2).unlink()
    shutil.move(wav, tmp_path / "kept.wav")
    with pytest.raises(RuntimeError, match="stage 2 \\(make_features\\) failed"):
        ensure_corpus(again.root, size="tiny", seed=TINY_SEED, log=lambda line: None)
    for stage in range(2, len(STAGES)):
        assert not stage_marker(again.root, stage).exists(), f"stage {stage} looks complete after the failure"
    shutil.move(tmp_path / "kept.wav", wav)
    lines = []
    ensure_corpus(again.root, size="tiny", seed=TINY_SEED, log=lines.append)
    assert any(line.endswith("starting at stage 2") for line in lines), lines
    assert archives(again.root) == reference


def test_a_built_corpus_is_reused_and_a_different_seed_refused(tiny_corpus):
    lines = []
    assert ensure_corpus(tiny_corpus.root, size="tiny", seed=TINY_SEED, log=lines.append).root == tiny_corpus.root
    assert any(line.endswith("nothing to do") for line in lines), lines  # nothing rebuilt
    assert not any(") Stage " in line for line in lines), lines
    with pytest.raises(RuntimeError, match="built with size=tiny seed=1"):
        ensure_corpus(tiny_corpus.root, size="tiny", seed=TINY_SEED + 1)
    with pytest.raises(ValueError, match="size must be one of"):
        ensure_corpus(tiny_corpus.root, size="huge")


def test_a_corpus_of_an_earlier_layout_is_refused(tmp_path):
    """A marker of the same size and seed but other speaker counts (the default size before its dev and
    test sets grew) is not taken for a complete stage."""
    marker = stage_marker(tmp_path, 0)
    marker.parent.mkdir(parents=True)
    marker.write_text(json.dumps({"size": "tiny", "seed": 1, "speakers": [4, 2, 1], "utts_per_speaker": 3,
                                  "num_jobs": 2}) + "\n")
    with pytest.raises(RuntimeError, match=r"an earlier layout of size=tiny .*speakers \[4, 2, 1\], now \[4, 2, 2\]"):
        layout.stage_is_complete(tmp_path, 0, "tiny", 1)
    marker.write_text(json.dumps({"size": "tiny", "seed": 1, **dataclasses.asdict(layout.SIZES["tiny"])}) + "\n")
    assert layout.stage_is_complete(tmp_path, 0, "tiny", 1)


def test_larger_test_sets_leave_the_training_set_as_it_was(tmp_path, monkeypatch):
    """Stage 0 with the tiny size's speakers as the core and one more dev and test speaker: the same training
    speakers and sentences, the core dev and test speakers first with their sentences, the added ones after."""
    def prompts(root, size):
        monkeypatch.setitem(layout.SIZES, "tiny", size)
        monkeypatch.setattr(sys, "argv", ["prepare_text", "--size", "tiny", "--seed", "3", str(root)])
        prepare_text.main()
        return {split: read_table(root / "data" / "local" / split / "prompts.txt") for split in SPLITS}, \
            read_table(root / "data" / "local" / "speakers.txt")

    tiny = layout.SIZES["tiny"]
    before, speakers_before = prompts(tmp_path / "a", tiny)
    after, speakers_after = prompts(tmp_path / "b", dataclasses.replace(tiny, speakers=(4, 3, 3)))
    assert after["train"] == before["train"]
    assert {s: v for s, v in speakers_after.items() if v.startswith("train")} == \
        {s: v for s, v in speakers_before.items() if v.startswith("train")}
    assert (len(after["dev"]), len(after["test"])) == (9, 9)
    assert all(u in after["dev"] and after["dev"][u] == text for u, text in before["dev"].items())  # core first
    dev_speakers = sorted({u.split("_")[0] for u in after["dev"]}, key=lambda s: int(s[1:]))
    assert dev_speakers[:2] == sorted({u.split("_")[0] for u in before["dev"]}, key=lambda s: int(s[1:]))
    assert len(set(speakers_after.values())) == len(speakers_after)  # the added voices are new ones


def test_the_core_of_dev_is_a_data_dir_of_its_first_speakers(tmp_path, tiny_corpus):
    source = tmp_path / "dev"
    source.mkdir()
    (source / "utt2spk").write_text("f2_s0 f2\nm10_s0 m10\nm10_s1 m10\nm3_s0 m3\n")
    (source / "spk2utt").write_text("f2 f2_s0\nm10 m10_s0 m10_s1\nm3 m3_s0\n")
    (source / "feats.scp").write_text("f2_s0 a.ark:1\nm10_s0 a.ark:2\nm10_s1 a.ark:3\nm3_s0 a.ark:4\n")
    (source / "cmvn.scp").write_text("f2 c.ark:1\nm10 c.ark:2\nm3 c.ark:3\n")
    assert layout.core_speakers(source, 2) == ["f2", "m3"]  # by number, not by the gender letter
    layout.subset_data_dir(source, tmp_path / "core", ["f2", "m3"])
    assert (tmp_path / "core" / "feats.scp").read_text() == "f2_s0 a.ark:1\nm3_s0 a.ark:4\n"
    assert (tmp_path / "core" / "cmvn.scp").read_text() == "f2 c.ark:1\nm3 c.ark:3\n"
    assert (tmp_path / "core" / "spk2utt").read_text() == "f2 f2_s0\nm3 m3_s0\n"
    # the tiny size's core is all of dev, aligned on its own as the configs' per-epoch dev set
    assert read_table(tiny_corpus.root / "data" / layout.CORE / "feats.scp") == read_table(tiny_corpus.feats("dev"))
    assert (tiny_corpus.root / "exp" / f"mono_ali_{layout.CORE}" / "ali.1.gz").is_file()


@pytest.mark.slow
def test_run_exp_replaces_a_corpus_of_another_seed_where_the_recipe_alone_refuses(tmp_path):
    """``run_exp.py``'s hook passes ``--replace true``: trying the tiny size, or another seed, in the folder of
    the main command's corpus must not leave the user a folder to delete by hand."""
    from bru_kaldi.builtin_corpus import BuiltinCorpusError, ensure_builtin_corpus

    root = tmp_path / "mini_timit"
    ensure_builtin_corpus(root, size="tiny", seed=1, log=lambda line: None)
    with pytest.raises(BuiltinCorpusError, match="built with size=tiny seed=1"):
        ensure_builtin_corpus(root, size="tiny", seed=2, log=lambda line: None)
    lines = []
    ensure_builtin_corpus(root, size="tiny", seed=2, log=lines.append, replace=True)
    assert any("--replace true: removing" in line for line in lines), lines
    assert layout.stage_is_complete(root, 6, "tiny", 2)


def test_run_sh_usage_shellcheck_and_skipping(tiny_corpus):
    run_sh = RECIPE_DIR / "run.sh"
    result = subprocess.run(["bash", str(run_sh), "--no-such-option"], capture_output=True, text=True)
    assert result.returncode == 1 and "Usage:" in result.stderr and " e.g.:" in result.stderr
    result = subprocess.run(["bash", str(run_sh), "--size", "huge"], capture_output=True, text=True)
    assert result.returncode == 1 and "--size is default or tiny" in result.stderr
    shellcheck = shutil.which("shellcheck")
    if shellcheck:
        assert subprocess.run([shellcheck, str(run_sh)], capture_output=True).returncode == 0
    result = subprocess.run(["bash", str(run_sh), "--size", "tiny", "--seed", str(TINY_SEED), "--stage", "5",
                             str(tiny_corpus.root)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "Stages 5-8 are complete" in result.stdout and "nothing to do" in result.stdout
    assert ") Stage 5: make_graph" not in result.stdout  # not even started
    with gzip.open(tiny_corpus.ali("test") / "ali.1.gz") as f:
        assert f.read(1)  # untouched


def self_loops_and_others(hclg_path: Path) -> tuple[list, list]:
    """HCLG's arcs as ``(state, ilabel, olabel, nextstate, weight)``: the self-loops, and the rest."""
    import kaldifst

    fst = kaldifst.StdVectorFst.read(str(hclg_path))
    arcs = [(state, a.ilabel, a.olabel, a.nextstate, a.weight.value)
            for state in range(fst.num_states) for a in kaldifst.ArcIterator(fst, state)]
    return [a for a in arcs if a[0] == a[3]], [a for a in arcs if a[0] != a[3]]


def test_the_chain_graph_has_the_self_loops_at_scale_one(tiny_corpus):
    """Stage 7's graph_chain is stage 5's graph with mkgraph.sh's self-loop scale 1.0 instead of 0.1: the
    same arcs, each self-loop's cost ten times the cross-entropy graph's and equal to -log of the
    model's self-loop probability."""
    ce_loops, ce_rest = self_loops_and_others(tiny_corpus.root / "exp" / "mono" / "graph" / "HCLG.fst")
    chain_loops, chain_rest = self_loops_and_others(tiny_corpus.root / "exp" / "mono" / "graph_chain" / "HCLG.fst")
    assert [a[:4] for a in chain_loops] == [a[:4] for a in ce_loops] and len(chain_loops) > 10
    assert [a[:4] for a in chain_rest] == [a[:4] for a in ce_rest]
    tm = read_transition_model(tiny_corpus.model)
    for ce, chain in zip(ce_loops, chain_loops):
        assert chain[4] == pytest.approx(10 * ce[4], rel=1e-5, abs=1e-6)
        assert chain[4] == pytest.approx(-float(tm.log_probs[chain[1]]), rel=1e-5, abs=1e-6)  # ilabel: a transition-id
    assert any(chain[4] > 0.05 for chain in chain_loops)


def test_the_chain_model_is_kaldis_chain_topology_with_reordered_alignments(tiny_corpus):
    """Stage 8: one emitting state per phone with a forward and a self-loop pdf (two pdfs a phone); its
    alignments have stage 4's phone sequences (their boundaries differ where the 3-state model borrowed frames
    for a phone shorter than 3), each phone's first frame leaving its state (its forward pdf) and the others
    its self-loops (reordered, as chain graphs are built)."""
    from bru_kaldi.kaldi.alignments import read_alignments

    chain = read_transition_model(tiny_corpus.chain_ali("train") / "final.mdl")
    mono = read_transition_model(tiny_corpus.model)
    assert not chain.topology.is_hmm and chain.num_pdfs == 2 * len(chain.topology.phones)
    assert all(len(entry) == 2 for entry in chain.topology.entries)  # one emitting state and the final one
    three_state = dict(read_alignments(str(tiny_corpus.ali("train"))))
    checked = 0
    for utt, ali in read_alignments(str(tiny_corpus.chain_ali("train"))):
        assert chain.ali_to_phones(ali) == mono.ali_to_phones(three_state[utt])
        for part in chain.split_to_phones(ali):
            assert not chain.tid_is_self_loop[part[0]] and chain.tid_is_self_loop[part[1:]].all()
            checked += 1
    assert checked > 100


@pytest.mark.parametrize("module", [phoneset, espeak])
def test_recipe_doctests(module):
    assert doctest.testmod(module).failed == 0

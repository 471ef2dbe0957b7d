"""The built-in corpus's word task (``run.sh --task words``): data dirs, lexicon, lang, LMs, graphs, oracle.

The word task is built once, into a copy of the session's tiny corpus (``tiny_corpus`` in
conftest.py, whose shared stages 0-2 it reuses), by ``run.sh --task words``; the last test rebuilds
it there and checks that every output comes back byte for byte.
"""

import dataclasses
import gzip
import hashlib
import json
import math
import os
import random
import shutil
import subprocess
from pathlib import Path

import kaldiio
import numpy as np
import pytest

from recipes.mini_timit.corpus import RECIPE_DIR, Corpus, ensure_corpus
from recipes.mini_timit.local import layout, ngram_lm
from recipes.mini_timit.local.check import read_alignments
from recipes.mini_timit.local.check_words import words_of_alignment
from recipes.mini_timit.local.lang_words import add_disambig
from recipes.mini_timit.local.layout import LMS, SPLITS, read_table, stage_marker
from recipes.mini_timit.local.lexicon import segment
from recipes.mini_timit.local.word_text import SHARED_TABLES, normalise

from .conftest import TINY_SEED

RUN_SH = RECIPE_DIR / "run.sh"


def run_sh(*args, check=True) -> subprocess.CompletedProcess:
    result = subprocess.run(["bash", str(RUN_SH), *map(str, args)], capture_output=True, text=True, timeout=300)
    if check:
        assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    return result


def copy_corpus(source: Path, target: Path) -> None:
    """A self-contained copy of a built corpus: the paths inside its scp files moved to the copy."""
    shutil.copytree(source, target, symlinks=True)
    for scp in target.glob("data/*/*.scp"):
        scp.write_text(scp.read_text().replace(f"{source}/", f"{target}/"))


def digests(root: Path, files=None) -> dict[str, str]:
    files = files if files is not None else [p for p in root.rglob("*") if p.is_file()]
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(files)}


@pytest.fixture(scope="module")
def words(tiny_corpus, tmp_path_factory):
    """The tiny corpus with its word task built by run.sh; the phone task's file digests from before."""
    root = tmp_path_factory.mktemp("mini_timit_words") / "corpus"
    copy_corpus(tiny_corpus.root, root)
    before = digests(root)
    result = run_sh("--task", "words", "--size", "tiny", "--seed", TINY_SEED, root)
    return Corpus(root, "words"), before, result.stdout


def lexicon_of(corpus) -> dict[str, set[tuple[str, ...]]]:
    out: dict[str, set] = {}
    for line in (corpus.root / "data/local/dict_words/lexicon.txt").read_text().splitlines():
        word, *pron = line.split()
        out.setdefault(word, set()).add(tuple(pron))
    return out


def symbol_table(path: Path) -> dict[str, int]:
    return {s: int(i) for s, i in read_table(path).items()}


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines()


# ------------------------------------------------------------------------------ layout


def test_the_word_task_starts_after_the_shared_stages_and_leaves_the_phone_task_alone(words):
    corpus, before, stdout = words
    assert "starting at stage 3" in stdout and ") Stage 3: prepare_lang_words" in stdout
    assert ") Stage 2:" not in stdout  # features reused, not rebuilt
    after = digests(corpus.root, [corpus.root / name for name in before])
    assert after == before, [k for k in before if before[k] != after[k]]
    for stage in range(len(layout.TASKS["words"])):
        assert stage_marker(corpus.root, stage, "words").is_file()
    assert stage_marker(corpus.root, 3, "words").name == "3w.prepare_lang_words"


def test_word_data_dirs_have_the_same_features_and_wsj_transcripts(words):
    corpus = words[0]
    phones = Corpus(corpus.root)
    for split in SPLITS:
        for name in SHARED_TABLES:
            assert (corpus.data(split) / name).read_bytes() == (phones.data(split) / name).read_bytes(), name
        text = read_table(corpus.data(split) / "text")
        keys = [k.encode() for k in text]
        assert keys == sorted(keys) and len(set(keys)) == len(keys)
        prompts = read_table(corpus.root / "data/local" / split / "prompts.txt")
        assert set(text) == set(prompts)
        for utt, transcript in text.items():
            assert transcript.split() == normalise(prompts[utt])
            assert transcript == transcript.upper() and not set(transcript) & set(".,?")
    feats = kaldiio.load_scp(str(corpus.feats("test")))
    utt = next(iter(feats))
    np.testing.assert_array_equal(feats[utt], kaldiio.load_scp(str(phones.feats("test")))[utt])


# ------------------------------------------------------------------------------ lexicon and lang


def test_lexicon_covers_every_word_and_its_pronunciations_fit_every_utterance(words):
    corpus = words[0]
    lexicon = lexicon_of(corpus)
    assert {"<UNK>", "<SPOKEN_NOISE>", "!SIL"} <= set(lexicon)
    report = (corpus.root / "data/local/dict_words/pronunciations.txt").read_text()
    assert "utterances that needed an observed variant" in report
    for split in SPLITS:
        text = read_table(corpus.data(split) / "text")
        phone_segments = read_table(corpus.root / "data/local" / split / "phone_segments.txt")
        word_segments = read_table(corpus.root / "data/local" / split / "word_phone_segments.txt")
        for utt, transcript in text.items():
            spoken = phone_segments[utt].split()[::3]
            assert set(transcript.split()) <= set(lexicon), utt
            # an exact DP over the lexicon's variants lays the words on the synthesiser's phones
            variants = {w: {p: "" for p in lexicon[w]} for w in transcript.split()}
            assert segment(variants, transcript.split(), spoken) is not None, utt
            positioned = word_segments[utt].split()
            assert positioned[1::3] == phone_segments[utt].split()[1::3]  # same times
            assert [p.split("_")[0] for p in positioned[::3]] == spoken
            cut = words_of_alignment(positioned[::3], utt)
            assert len(cut) == len(transcript.split()), utt
            for word, pron in zip(transcript.split(), cut):
                assert tuple(p.rsplit("_", 1)[0] for p in pron) in lexicon[word], (utt, word)


def test_lang_dir_is_kaldis_with_word_position_dependent_phones(words):
    lang = words[0].lang
    phones = symbol_table(lang / "phones.txt")
    names = list(phones)
    assert names[0] == "<eps>" and list(phones.values()) == list(range(len(phones)))
    silence, nonsilence = lines(lang / "phones/silence.txt"), lines(lang / "phones/nonsilence.txt")
    disambig = lines(lang / "phones/disambig.txt")
    assert names[1:] == silence + nonsilence + disambig  # prepare_lang.sh's order
    assert silence[:5] == ["sil", "sil_B", "sil_E", "sil_I", "sil_S"] and "spn_S" in silence
    assert all(p[-2:] in ("_B", "_E", "_I", "_S") for p in nonsilence) and len(nonsilence) % 4 == 0
    assert disambig == [f"#{n}" for n in range(len(disambig))] and len(disambig) >= 2
    assert lines(lang / "phones/optional_silence.txt") == ["sil"]
    assert lines(lang / "phones/context_indep.txt") == silence
    for name in ("silence", "nonsilence", "optional_silence", "disambig", "context_indep"):
        listed = lines(lang / f"phones/{name}.txt")
        assert lines(lang / f"phones/{name}.int") == [str(phones[p]) for p in listed], name
        assert lines(lang / f"phones/{name}.csl") == [":".join(str(phones[p]) for p in listed)], name
    kinds = {"_B": "begin", "_E": "end", "_I": "internal", "_S": "singleton"}
    boundary = [line.split() for line in lines(lang / "phones/word_boundary.txt")]
    assert [p for p, _ in boundary] == silence + nonsilence
    assert all(kind == kinds.get(p[-2:], "nonword") for p, kind in boundary)
    assert lines(lang / "phones/word_boundary.int") == [f"{phones[p]} {k}" for p, k in boundary]
    for name, prefix in (("sets", ""), ("roots", "shared split ")):
        rows = lines(lang / f"phones/{name}.txt")
        assert sorted(p for r in rows for p in r[len(prefix):].split()) == sorted(silence + nonsilence)
        assert all(r.startswith(prefix) for r in rows)
        assert lines(lang / f"phones/{name}.int") == [
            prefix + " ".join(str(phones[p]) for p in r[len(prefix):].split()) for r in rows]
    words_txt = symbol_table(lang / "words.txt")
    order = list(words_txt)
    assert order[0] == "<eps>" and order[-3:] == ["#0", "<s>", "</s>"]
    assert order[1:-3] == sorted(order[1:-3], key=str.encode) and list(words_txt.values()) == list(range(len(order)))
    assert lines(lang / "oov.txt") == ["<UNK>"] and lines(lang / "oov.int") == [str(words_txt["<UNK>"])]
    assert lines(lang / "phones/wdisambig.txt") == ["#0"]
    assert lines(lang / "phones/wdisambig_phones.int") == [str(phones["#0"])]
    assert lines(lang / "phones/wdisambig_words.int") == [str(words_txt["#0"])]
    topo = {int(p) for line in (lang / "topo").read_text().split("<ForPhones>")[1:]
            for p in line.split("</ForPhones>")[0].split()}
    assert topo == {phones[p] for p in silence + nonsilence}


def test_align_lexicon_is_the_lexicon_with_positions(words):
    corpus = words[0]
    lang = corpus.lang
    align = lines(lang / "phones/align_lexicon.txt")
    assert align == sorted(set(align), key=str.encode) and "<eps> <eps> sil" in align
    expected = {"<eps> <eps> sil"}
    for word, prons in lexicon_of(corpus).items():
        for pron in prons:
            marks = ["_S"] if len(pron) == 1 else ["_B", *["_I"] * (len(pron) - 2), "_E"]
            expected.add(" ".join([word, word, *(p + m for p, m in zip(pron, marks))]))
    assert set(align) == expected
    phones, words_txt = symbol_table(lang / "phones.txt"), symbol_table(lang / "words.txt")
    assert lines(lang / "phones/align_lexicon.int") == [
        " ".join([str(words_txt[f[0]]), str(words_txt[f[1]]), *(str(phones[p]) for p in f[2:])])
        for f in map(str.split, align)]


def test_disambiguation_symbols_as_add_lex_disambig():
    prons = [["a", "b"], ["a", "b"], ["a"], ["a", "b", "c"], ["d"]]
    out, largest = add_disambig(prons)
    # homophones get #1 #2; a prefix of another pronunciation gets #1; a unique non-prefix nothing
    assert out == [["a", "b", "#1"], ["a", "b", "#2"], ["a", "#1"], ["a", "b", "c"], ["d"]] and largest == 2


def test_lexicon_fsts_spell_random_word_sequences_with_word_boundaries(words):
    """validate_lang.pl's check: phones of random word sequences through L reconstruct the words."""
    import kaldi_hmm_gmm  # noqa: F401  (before kaldifst)
    import kaldifst

    lang = words[0].lang
    phone_names = {i: p for p, i in symbol_table(lang / "phones.txt").items()}
    word_names = {i: w for w, i in symbol_table(lang / "words.txt").items()}
    prons: dict[str, set] = {}
    for f in map(str.split, lines(lang / "phones/align_lexicon.txt")):
        prons.setdefault(f[0], set()).add(tuple(f[2:]))
    vocab = [i for i, w in word_names.items() if not (w.startswith("#") or w in ("<eps>", "<s>", "</s>"))]
    rng = random.Random(0)
    for name in ("L.fst", "L_disambig.fst"):
        lexicon_fst = kaldifst.StdVectorFst.read(str(lang / name))
        assert lexicon_fst.is_olabel_sorted
        for _ in range(5):
            sequence = [rng.choice(vocab) for _ in range(rng.randint(1, 12))]
            acceptor = kaldifst.StdVectorFst()
            state = acceptor.add_state()
            acceptor.start = state
            for word in sequence:
                nxt = acceptor.add_state()
                acceptor.add_arc(state=state, arc=kaldifst.StdArc(word, word, 0.0, nxt))
                state = nxt
            acceptor.set_final(state=state, weight=0.0)
            path = kaldifst.shortest_path(kaldifst.compose(lexicon_fst, acceptor))
            ok, ilabels, olabels, _ = kaldifst.get_linear_symbol_sequence(path)
            assert ok and [w for w in olabels if w] == sequence
            spelled = [phone_names[p] for p in ilabels if not phone_names[p].startswith("#")]
            cut = words_of_alignment(spelled, name)  # raises on a broken word boundary
            assert [p in prons[word_names[w]] for w, p in zip(sequence, cut)] == [True] * len(sequence)


def test_validate_lang_pl(words):
    """Kaldi's own validator on the word lang dirs; it needs a Kaldi installation (KALDI_ROOT)."""
    kaldi_root = os.environ.get("KALDI_ROOT")
    if not kaldi_root:
        pytest.skip("KALDI_ROOT is not set: Kaldi's utils/validate_lang.pl and the OpenFst programs it runs "
                    "are not installed here")
    wsj = Path(kaldi_root) / "egs" / "wsj" / "s5"
    corpus = words[0]
    for lang in [corpus.lang] + [corpus.lang_test(lm) for lm in LMS]:
        result = subprocess.run(["perl", "utils/validate_lang.pl", str(lang)], cwd=wsj, capture_output=True,
                                text=True, timeout=600)
        assert result.returncode == 0 and "SUCCESS" in result.stdout, result.stdout[-3000:]


# ------------------------------------------------------------------------------ LM


def test_lm_text_excludes_dev_and_test_and_the_report_gives_perplexity_and_oov(words):
    corpus = words[0]
    lm_dir = corpus.root / "data/local/lm_words"
    text = {tuple(line.split()) for line in lines(lm_dir / "text.txt")}
    for split in ("dev", "test"):
        for transcript in read_table(corpus.data(split) / "text").values():
            assert tuple(transcript.split()) not in text, transcript
    assert {tuple(t.split()) for t in read_table(corpus.data("train") / "text").values()} <= text
    models = {lm: ngram_lm.read_arpa((lm_dir / f"lm_{lm}.arpa").read_text()) for lm in LMS}
    assert models["tgpr"].counts()[2] < models["tg"].counts()[2]  # pruned
    assert models["tgpr"].counts()[0] == models["tg"].counts()[0]  # same vocabulary
    report = (lm_dir / "report.txt").read_text()
    test_text = [t.split() for t in read_table(corpus.data("test") / "text").values()]
    for lm, model in models.items():
        result = ngram_lm.perplexity(model, test_text)
        assert result.perplexity > 1 and result.oov_rate == 0.0  # the vocabulary is closed
        assert f"test {lm}: perplexity {result.perplexity:.1f}  OOV rate {result.oov_rate:.2f} %" in report
        for history in [("<s>",), *sorted({g[:-1] for g in model.logprob if len(g) == 3})[:20]]:
            total = sum(math.exp(model.prob(w, history)) for w in model.vocab)
            assert total == pytest.approx(1.0, abs=1e-4), (lm, history)


def test_kneser_ney_and_pruning_are_distributions():
    rng = random.Random(1)
    vocab = [f"W{i}" for i in range(25)]
    text = [[rng.choice(vocab[:18]) for _ in range(rng.randint(1, 8))] for _ in range(300)]
    full = ngram_lm.kneser_ney(text, vocab)
    pruned = ngram_lm.prune(full, 1e-4)
    assert pruned.counts()[2] < full.counts()[2] and pruned.counts()[0] == full.counts()[0] == 27
    for model in (full, pruned, ngram_lm.read_arpa(ngram_lm.arpa_text(pruned))):
        histories = [(), ("<s>",), ("W1",), ("W20",), ("W1", "W2"), ("<s>", "W3")]
        histories += sorted({g[:-1] for g in model.logprob if len(g) == 3})[:30]
        for history in histories:
            assert sum(math.exp(model.prob(w, history)) for w in model.vocab) == pytest.approx(1.0, abs=1e-5)
    assert math.exp(full.prob("W24", ())) > 0  # an unseen vocabulary word keeps some probability
    seen = ngram_lm.perplexity(full, text[:50]).perplexity
    shuffled = ngram_lm.perplexity(full, [[rng.choice(vocab) for _ in s] for s in text[:50]]).perplexity
    assert seen < shuffled
    with pytest.raises(ValueError, match="outside the vocabulary"):
        ngram_lm.kneser_ney([["W1", "NOPE"]], vocab)


# ------------------------------------------------------------------------------ model, graphs, oracle


def test_model_alignments_and_graph_dirs(words):
    from bru_kaldi.kaldi.transition_model import read_transition_model

    corpus = words[0]
    tm = read_transition_model(corpus.model)
    lang = corpus.lang
    sets = lines(lang / "phones/sets.txt")
    silence = set(lines(lang / "phones/silence.txt"))
    # the word positions of a phone share pdfs (gmm-init-mono --shared-phones=sets.int)
    assert tm.num_pdfs == sum(5 if s.split()[0] in silence else 3 for s in sets)
    assert int((corpus.root / "exp/mono_words/num_pdfs").read_text()) == tm.num_pdfs
    phone_names = {i: p for p, i in symbol_table(lang / "phones.txt").items()}
    align = {}
    for f in map(str.split, lines(lang / "phones/align_lexicon.txt")):
        align.setdefault(f[0], set()).add(tuple(f[2:]))
    for split in SPLITS:
        alignments = read_alignments(corpus.ali(split))
        frames = read_table(corpus.data(split) / "utt2num_frames")
        text = read_table(corpus.data(split) / "text")
        assert set(alignments) == set(frames) == set(text)
        for utt, ali in alignments.items():
            assert len(ali) == int(frames[utt]) and tm.tid2pdf[ali].max() < tm.num_pdfs
            spoken = words_of_alignment([phone_names[p] for p in tm.ali_to_phones(ali)], utt)
            assert [p in align[w] for w, p in zip(text[utt].split(), spoken)] == [True] * len(text[utt].split())
        assert (corpus.ali(split) / "final.mdl").read_bytes() == corpus.model.read_bytes()
    for lm in LMS:
        graph = corpus.lm_graph(lm)
        for name in ("HCLG.fst", "words.txt", "phones.txt", "num_pdfs", "disambig_tid.int",
                     "phones/word_boundary.int", "phones/align_lexicon.int", "phones/silence.csl"):
            assert (graph / name).is_file(), f"graph_{lm}/{name}"
        assert (graph / "words.txt").read_bytes() == (lang / "words.txt").read_bytes()
        assert (corpus.lang_test(lm) / "G.fst").is_file()
        tids = [int(t) for t in lines(graph / "disambig_tid.int")]
        assert min(tids) > tm.num_transition_ids  # the disambiguation transition-ids come after the real ones
    assert corpus.graph == corpus.lm_graph("tg")


def oracle(corpus, tm, decode_map=None):
    """WER of the test set decoded from one-hot log-likelihoods of the aligned pdfs (``decode_map``: the
    transition-id to pdf map the decoder is given, the model's by default)."""
    from bru_kaldi import decoding
    from bru_kaldi.scoring import score

    graph = decoding.load_graph(corpus.graph / "HCLG.fst")
    words_txt = decoding.read_words(corpus.graph / "words.txt")
    refs = {u: t.split() for u, t in read_table(corpus.data("test") / "text").items()}
    hyps = {}
    for utt, ali in read_alignments(corpus.ali("test")).items():
        loglikes = np.full((len(ali), tm.num_pdfs), np.log(1e-30), dtype=np.float32)
        loglikes[np.arange(len(ali)), tm.tid2pdf[ali]] = 0.0
        hyp = decoding.decode(loglikes, graph, tm.tid2pdf if decode_map is None else decode_map).words
        hyps[utt] = [words_txt[w] for w in hyp]
    return score(refs, hyps, "wsj").total


def test_oracle_word_decode_is_below_two_percent_and_not_vacuous(words):
    from bru_kaldi.kaldi.transition_model import read_transition_model

    corpus = words[0]
    tm = read_transition_model(corpus.model)
    result = oracle(corpus, tm)
    assert result.ref_len > 0 and result.rate < 2.0
    assert (corpus.root / "exp/mono_words/decode_oracle_test/wer.txt").read_text().strip() == result.kaldi_line()
    scrambled = tm.tid2pdf.copy()
    scrambled[1:] = np.random.default_rng(0).permutation(tm.num_pdfs)[tm.tid2pdf[1:]]
    assert oracle(corpus, tm, decode_map=scrambled).rate > 30


# ------------------------------------------------------------------------------ run.sh, layout, corpus.py


def test_run_sh_task_option_usage_shellcheck_and_fast_path(words, tmp_path):
    corpus = words[0]
    result = run_sh("--task", "sentences", check=False)
    assert result.returncode == 1 and "--task is phones or words" in result.stderr and "--task T" in result.stderr
    shellcheck = shutil.which("shellcheck")
    if shellcheck:
        assert subprocess.run([shellcheck, str(RUN_SH)], capture_output=True).returncode == 0
    result = run_sh("--task", "words", "--size", "tiny", "--seed", TINY_SEED, corpus.root)
    assert "Stages 0-8 are complete" in result.stdout and "(task words" in result.stdout
    assert ") Stage " not in result.stdout and "oracle WER" in result.stdout
    with pytest.raises(RuntimeError, match="built with size=tiny"):
        layout.first_incomplete(corpus.root, "default", TINY_SEED, "words")
    assert layout.first_incomplete(tmp_path, "tiny", TINY_SEED, "words") == 0
    result = run_sh("--task", "words", "--size", "tiny", "--stop-stage", 0, tmp_path / "empty")
    assert ") Stage 0: prepare_text" in result.stdout  # a root without the shared stages builds them first
    assert stage_marker(tmp_path / "empty", 0, "words") == stage_marker(tmp_path / "empty", 0, "phones")


def test_a_shared_stage_invalidates_both_tasks_a_word_stage_only_its_own(tmp_path):
    for task, names in layout.TASKS.items():
        for stage in range(len(names)):
            layout.atomic_write_text(stage_marker(tmp_path, stage, task), json.dumps(
                {"size": "tiny", "seed": 1, **dataclasses.asdict(layout.SIZES["tiny"])}) + "\n")
    with layout.run_stage(tmp_path, 4, "tiny", 1, task="words") as run:
        assert run is False  # complete: skipped
    stage_marker(tmp_path, 4, "words").unlink()
    with layout.run_stage(tmp_path, 4, "tiny", 1, inputs=(2, 3), task="words") as run:
        assert run and not any(stage_marker(tmp_path, s, "words").exists() for s in (5, 6, 7, 8))
        assert all(stage_marker(tmp_path, s, "phones").exists() for s in range(9))
    stage_marker(tmp_path, 2, "phones").unlink()
    with layout.run_stage(tmp_path, 2, "tiny", 1) as run:
        assert run
        assert not any(stage_marker(tmp_path, s, t).exists() for t in layout.TASKS for s in range(2, 9))
    assert layout.first_incomplete(tmp_path, "tiny", 1, "words") == 3


def test_corpus_paths_and_ensure_corpus(words):
    corpus = words[0]
    with pytest.raises(ValueError, match="task must be one of"):
        Corpus(corpus.root, "sentences")
    with pytest.raises(ValueError, match="lang_test"):
        Corpus(corpus.root).lang_test("tg")
    lines_seen = []
    again = ensure_corpus(corpus.root, size="tiny", seed=TINY_SEED, log=lines_seen.append, task="words")
    assert again == corpus and any("nothing to do" in line for line in lines_seen)


@pytest.mark.parametrize("lm", ["tg", "tgpr"])
def test_the_chain_graphs_have_the_self_loops_at_scale_one(words, lm):
    """Stage 7: graph_chain_<lm> is graph_<lm> with the self-loops at scale 1.0 (as the phone task's)."""
    from tests.test_corpus import self_loops_and_others

    corpus = words[0]
    ce_loops, ce_rest = self_loops_and_others(corpus.lm_graph(lm) / "HCLG.fst")
    chain_loops, chain_rest = self_loops_and_others(corpus.root / "exp" / "mono_words" / f"graph_chain_{lm}" / "HCLG.fst")
    assert [a[:4] for a in chain_loops] == [a[:4] for a in ce_loops] and len(chain_loops) > 10
    assert [a[:4] for a in chain_rest] == [a[:4] for a in ce_rest]
    assert all(chain[4] == pytest.approx(10 * ce[4], rel=1e-5, abs=1e-6) for ce, chain in zip(ce_loops, chain_loops))
    assert any(chain[4] > 0.05 for chain in chain_loops)


# ------------------------------------------------------------------------------ determinism (last: rebuilds)


def test_a_rebuild_of_the_word_task_is_byte_identical(words):
    corpus = words[0]
    root = corpus.root
    word_outputs = [p for p in root.rglob("*") if p.is_file() and ("_words" in str(p.relative_to(root))
                    or "dict_words" in str(p) or "lm_words" in str(p) or p.name == "word_phone_segments.txt")]
    assert len(word_outputs) > 100
    before = digests(root, word_outputs)
    stage_marker(root, 3, "words").unlink()
    result = run_sh("--task", "words", "--size", "tiny", "--seed", TINY_SEED, root)
    assert ") Stage 3: prepare_lang_words" in result.stdout and ") Stage 8: make_chain_words" in result.stdout
    assert digests(root, word_outputs) == before
    with gzip.open(corpus.ali("test") / "ali.1.gz") as f:
        assert f.read(1)

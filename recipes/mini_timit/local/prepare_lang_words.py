"""Stage 3 of the word task: word data dirs, lexicon, ``data/lang_words``, trigram LMs and their ``G.fst``.

As WSJ's data, dictionary and LM preparation (``wsj_data_prep.sh``, ``wsj_prepare_dict.sh``,
``prepare_lang.sh``, ``wsj_format_data.sh``), on the shared audio and features of stages 0-2:

* ``data/<split>_words/``: ``data/<split>/`` with word transcripts (``word_text.py``);
* the LM training text ``data/local/lm_words/text.txt``: sentences drawn from the prompts'
  templates and word lists (none is a dev or test prompt) plus the training prompts;
* the vocabulary: every word of that text and of the train, dev and test transcripts, a closed
  vocabulary as WSJ's 5k task has (its test OOV rate is 0 by construction; the report also gives
  the share of test words the LM text never saw, which only the smoothing predicts);
* ``data/local/dict_words/``: the lexicon (``lexicon.py``: espeak-ng's pronunciations, checked on
  every utterance's phone segments; ``pronunciations.txt`` reports how) with ``!SIL sil``,
  ``<SPOKEN_NOISE> spn`` and ``<UNK> spn`` as WSJ's; ``data/local/<split>/word_phone_segments.txt``:
  the synthesiser's phone segments with word-position-dependent phones, for the alignments;
* ``data/lang_words/`` (``lang_words.py``, as ``prepare_lang.sh``, OOV word ``<UNK>``);
* ``data/local/lm_words/lm_{tg,tgpr}.arpa``: an interpolated Kneser-Ney trigram and its pruned
  version (``ngram_lm.py``), perplexity and OOV rate in ``report.txt``;
* ``data/lang_words_test_{tg,tgpr}/``: ``data/lang_words`` plus ``G.fst`` (kaldilm's ``arpa2fst
  --disambig-symbol=#0``), as WSJ's ``data/lang_test_{tg,tgpr}``.
"""

from __future__ import annotations

import time
from pathlib import Path

from bru_kaldi.atomic import write_atomically
from recipes.mini_timit.local import lexicon as lex
from recipes.mini_timit.local import ngram_lm
from recipes.mini_timit.local.lang_words import prepare_lang
from recipes.mini_timit.local.layout import (CORE, LMS, SIZES, SPLITS, atomic_write_text, copy_folder, core_speakers,
                                             read_table, run_stage, stage_args, subset_data_dir, write_table)
from recipes.mini_timit.local.phoneset import PHONES, SIL
from recipes.mini_timit.local.prepare_text import ACCENTS
from recipes.mini_timit.local.word_text import drawn_sentences, normalise, read_prompts, write_word_data_dir

SPOKEN_NOISE = "spn"  # WSJ's SPN: the phone of <SPOKEN_NOISE> and <UNK>
SPECIAL_WORDS = {"!SIL": SIL, "<SPOKEN_NOISE>": SPOKEN_NOISE, "<UNK>": SPOKEN_NOISE}
OOV_WORD = "<UNK>"
# relative perplexity increase below which an n-gram is pruned (tgpr): chosen to keep about 30 % of
# the trigrams of the default size, as WSJ's tgpr is a much smaller model than its tg
PRUNE_THRESHOLD = 2e-7


def segments_of(root: Path, split: str) -> dict[str, list[tuple[str, int, int]]]:
    """The synthesiser's phone segments of a split (``utt -> [(phone, start, end)]``)."""
    out = {}
    for utt, row in read_table(root / "data" / "local" / split / "phone_segments.txt").items():
        f = row.split()
        out[utt] = [(f[i], int(f[i + 1]), int(f[i + 2])) for i in range(0, len(f), 3)]
    return out


def build_lexicon(root: Path, prompts, transcripts, drawn: list[str], vocab: list[str]):
    """The lexicon (module doc of ``lexicon.py``) and its report; writes each split's ``word_phone_segments.txt``."""
    from recipes.mini_timit.local.espeak import Espeak

    tts = Espeak.shared()
    accent = {spk: row.split()[2].split("+")[0] for spk, row in read_table(root / "data/local/speakers.txt").items()}
    start = time.time()
    lexicon = lex.isolation_lexicon(tts, vocab, ACCENTS)
    contexts = [(normalise(p), p, ACCENTS[i % len(ACCENTS)]) for i, p in enumerate(drawn)]
    contexts += [(transcripts["train"][u], p, accent[u.split("_")[0]]) for u, p in sorted(prompts["train"].items())]
    added = {"context": lex.add_context(lexicon, tts, contexts)}
    added["deletion"] = lex.add_deletions(lexicon)
    segments = {split: segments_of(root, split) for split in SPLITS}
    utterances = []
    for split in SPLITS:
        if set(segments[split]) != set(transcripts[split]):
            raise ValueError(f"data/local/{split}/phone_segments.txt and prompts.txt list different utterances")
        utterances += [(split, u, transcripts[split][u], [p for p, _, _ in segments[split][u]])
                       for u in sorted(transcripts[split], key=str.encode)]
    fits = {}  # how many utterances fit with the first n sources only
    for n in (1, 2, 3):
        partial = lex.restricted(lexicon, lex.SOURCES[:n])
        fits[lex.SOURCES[n - 1]] = {
            s: sum(lex.segment(partial, w, p) is not None for sp, _, w, p in utterances if sp == s) for s in SPLITS}
    spans, observed = lex.fit_utterances(lexicon, utterances)
    for split in SPLITS:
        write_table(root / "data" / "local" / split / "word_phone_segments.txt", {
            u: " ".join(f"{p} {s} {e}" for p, s, e in lex.position_dependent(segments[split][u], spans[u]))
            for u in transcripts[split]})
    print(f"lexicon: {time.time() - start:.1f} s")
    return lexicon, pronunciation_report(lexicon, utterances, fits, observed, added)


def pronunciation_report(lexicon, utterances, fits, observed, added) -> str:
    """What ``data/local/dict_words/pronunciations.txt`` says: sources, fits per split, observed variants."""
    entries = [(w, s) for w, variants in lexicon.items() for s in variants.values()]
    totals = {s: sum(1 for u in utterances if u[0] == s) for s in SPLITS}
    by_source = {s: sum(1 for _, src in entries if src == s) for s in lex.SOURCES}
    lines = ["# pronunciations of the word task (recipes/mini_timit/local/lexicon.py)",
             f"words {len(lexicon)}  entries {len(entries)}  ({len(entries) / len(lexicon):.2f} per word)",
             "entries by source: " + "  ".join(f"{s} {by_source[s]}" for s in lex.SOURCES),
             f"new from context {added['context']}, from deletion {added['deletion']}", "",
             "utterances whose phone segments fit the words, by the sources allowed:",
             "  split   utts  isolation  +context  +deletion  +observed"]
    for split in SPLITS:
        row = [fits[s][split] for s in ("isolation", "context", "deletion")]
        lines.append(f"  {split:<6} {totals[split]:>5}  " + "  ".join(f"{n:>9}" for n in row) + f"  {totals[split]:>9}")
    needing = {s: len({u for sp, u, *_ in observed if sp == s}) for s in SPLITS}
    lines += ["", "utterances that needed an observed variant: " + "  ".join(f"{s} {needing[s]}" for s in SPLITS),
              "# split utt word observed | closest variant before"]
    lines += [f"{sp} {u} {w} {' '.join(o)} | {' '.join(n)}" for sp, u, w, o, n in observed]
    return "\n".join(lines) + "\n"


def write_dict(dict_dir: Path, lexicon: lex.Lexicon) -> None:
    """The dictionary directory prepare_lang reads (WSJ's ``data/local/dict``)."""
    rows = [f"{w} {' '.join(p)}" for w, variants in lexicon.items() for p in variants]
    rows += [f"{w} {p}" for w, p in SPECIAL_WORDS.items()]
    atomic_write_text(dict_dir / "lexicon.txt", "".join(f"{r}\n" for r in sorted(set(rows), key=str.encode)))
    atomic_write_text(dict_dir / "silence_phones.txt", f"{SIL}\n{SPOKEN_NOISE}\n")
    atomic_write_text(dict_dir / "optional_silence.txt", f"{SIL}\n")
    atomic_write_text(dict_dir / "nonsilence_phones.txt", "".join(f"{p}\n" for p in PHONES if p != SIL))
    atomic_write_text(dict_dir / "extra_questions.txt", "")


def lm_report(models: dict[str, ngram_lm.BackoffLM], text: list[list[str]], transcripts, dropped: int) -> str:
    """Sizes, perplexity and OOV rate on dev and test of each model (``data/local/lm_words/report.txt``)."""
    seen = {w for s in text for w in s}
    lines = [f"# word LMs (recipes/mini_timit/local/ngram_lm.py): interpolated Kneser-Ney trigram, "
             f"pruned at {PRUNE_THRESHOLD:g} for tgpr",
             f"training text: {len(text)} sentences, {sum(map(len, text))} words "
             f"({dropped} drawn sentences dropped: equal to a dev or test prompt)",
             f"vocabulary: {len(models['tg'].vocab) - 1} words (closed: the LM text's and every transcript's)"]
    for name, lm in models.items():
        lines.append(f"{name}: n-grams " + " ".join(f"{n}-gram={c}" for n, c in enumerate(lm.counts(), 1)))
    for split in ("dev", "test"):
        sentences = list(transcripts[split].values())
        words = [w for s in sentences for w in s]
        unseen = sum(w not in seen for w in words)
        for name, lm in models.items():
            result = ngram_lm.perplexity(lm, sentences)
            lines.append(f"{split} {name}: perplexity {result.perplexity:.1f}  OOV rate {result.oov_rate:.2f} % "
                         f"({result.oovs} of {result.words} words, {result.sentences} sentences)")
        lines.append(f"{split}: words never seen in the LM text {100 * unseen / len(words):.2f} % "
                     f"({unseen} of {len(words)})")
    return "\n".join(lines) + "\n"


def main() -> None:
    args = stage_args(3, __doc__.splitlines()[0], task="words")
    root = args.root.resolve()
    with run_stage(root, 3, args.size, args.seed, inputs=(1, 2), task="words") as run:
        if not run:
            return
        prompts = read_prompts(root)
        transcripts = {split: write_word_data_dir(root, split, prompts[split]) for split in SPLITS}
        dev = root / "data" / "dev_words"
        subset_data_dir(dev, root / "data" / f"{CORE}_words", core_speakers(dev, SIZES[args.size].core[1]))
        drawn, dropped = drawn_sentences(prompts, args.size, args.seed)
        train = [transcripts["train"][u] for u in sorted(transcripts["train"], key=str.encode)]
        text = [normalise(s) for s in drawn] + train
        vocab = sorted({w for s in text for w in s} | {w for t in transcripts.values() for s in t.values() for w in s},
                       key=str.encode)
        lm_dir, dict_dir = root / "data" / "local" / "lm_words", root / "data" / "local" / "dict_words"
        atomic_write_text(lm_dir / "text.txt", "".join(" ".join(s) + "\n" for s in text))
        lexicon, report = build_lexicon(root, prompts, transcripts, drawn, vocab)
        write_dict(dict_dir, lexicon)
        atomic_write_text(dict_dir / "pronunciations.txt", report)
        lang = root / "data" / "lang_words"
        prepare_lang(dict_dir, OOV_WORD, lang)

        models = {"tg": ngram_lm.kneser_ney(text, vocab, order=3)}
        models["tgpr"] = ngram_lm.prune(models["tg"], PRUNE_THRESHOLD)
        for name, lm in models.items():
            atomic_write_text(lm_dir / f"lm_{name}.arpa", ngram_lm.arpa_text(lm))
        atomic_write_text(lm_dir / "report.txt", lm_report(models, text, transcripts, dropped))
        import kaldilm  # last: `import kaldilm, kaldifst` (that order) hangs for ever

        for name in LMS:
            test_lang = root / "data" / f"lang_words_test_{name}"
            copy_folder(lang, test_lang)
            write_atomically(test_lang / "G.fst", lambda tmp: kaldilm.arpa2fst(
                input_arpa=str(lm_dir / f"lm_{name}.arpa"), output_fst=str(tmp), disambig_symbol="#0",
                read_symbol_table=str(test_lang / "words.txt")))
        print(report.split("\n\n")[0])
        print((lm_dir / "report.txt").read_text(), end="")


if __name__ == "__main__":
    main()

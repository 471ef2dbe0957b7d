"""Stage 3: the dictionary, ``data/lang`` and a phone bigram ``G.fst``, as Kaldi's TIMIT recipe has them.

As TIMIT's ``timit_prepare_dict.sh`` and ``prepare_lang.sh --sil-prob 0.0
--position-dependent-phones false``: every phone is a word that is its own pronunciation, ``sil``
is the only silence phone and appears in the transcripts (no optional silence in L). The topology
is Kaldi's default (``utils/gen_topo.pl 3 5``, via ``transition_model.standard_topology_text``):
3-state left-to-right phones, a 5-state silence whose inner states are fully connected.

The LM is a phone bigram estimated on the training transcripts (``data/train/text``): interpolated
absolute discounting (D = 0.5) backing off to an add-one unigram, written as ARPA
(``data/local/lm/phone_bigram.arpa``, as TIMIT's ``lm_phone_bg.arpa``) and turned into ``G.fst``
with kaldilm's ``arpa2fst --disambig-symbol=#0``, as Kaldi's ``format_lm.sh``.
"""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path

from bru_kaldi.atomic import write_atomically
from recipes.mini_timit.local.layout import atomic_write_text, read_table, run_stage, stage_args
from recipes.mini_timit.local.phoneset import PHONES, SIL
from bru_kaldi.kaldi.transition_model import standard_topology_text

DISCOUNT = 0.5
DISAMBIG = ("#0", "#1")  # prepare_lang.sh: #0 for the LM backoff, one more for the optional silence


def bigram_arpa(sentences: list[list[str]], vocab: list[str]) -> str:
    """ARPA text of an interpolated absolute-discounting bigram over ``vocab`` (+ <s>, </s>)."""
    targets = vocab + ["</s>"]
    uni, bi, ctx = Counter(), Counter(), Counter()
    for words in sentences:
        seq = ["<s>"] + words + ["</s>"]
        uni.update(seq[1:])
        for h, w in zip(seq[:-1], seq[1:]):
            bi[h, w] += 1
            ctx[h] += 1
    total = sum(uni.values())
    p_uni = {w: (uni[w] + 1) / (total + len(targets)) for w in targets}  # add-one: every phone stays possible
    followers = Counter(h for h, _ in bi)
    bow = {h: DISCOUNT * followers[h] / ctx[h] for h in ctx}  # the mass the discount frees, = backoff weight
    lines = ["\\data\\", f"ngram 1={len(targets) + 1}", f"ngram 2={len(bi)}", "", "\\1-grams:"]
    for w in ["<s>"] + targets:
        prob = -99.0 if w == "<s>" else math.log10(p_uni[w])
        backoff = f"\t{math.log10(bow[w]):.6f}" if w in bow else ""
        lines.append(f"{prob:.6f}\t{w}{backoff}")
    lines += ["", "\\2-grams:"]
    for (h, w), c in sorted(bi.items()):
        p = (c - DISCOUNT) / ctx[h] + bow[h] * p_uni[w]
        lines.append(f"{math.log10(p):.6f}\t{h} {w}")
    lines += ["", "\\end\\"]
    return "\n".join(lines) + "\n"


def write_lexicon_fst(path: Path, phone_ids: dict[str, int], word_ids: dict[str, int], disambig: bool) -> None:
    """L.fst (or L_disambig.fst with the #0:#0 self-loop): one state, one arc per word = phone."""
    import kaldi_hmm_gmm  # noqa: F401  (kaldi_hmm_gmm before kaldifst: some import orders of the kaldi packages hang)
    import kaldifst

    fst = kaldifst.StdVectorFst()
    state = fst.add_state()
    fst.start = state
    fst.set_final(state=state, weight=0.0)
    for phone in PHONES:
        fst.add_arc(state=state, arc=kaldifst.StdArc(phone_ids[phone], word_ids[phone], 0.0, state))
    if disambig:  # fstaddselfloops: lets G's #0 backoff arcs through L
        fst.add_arc(state=state, arc=kaldifst.StdArc(phone_ids["#0"], word_ids["#0"], 0.0, state))
    kaldifst.arcsort(fst, sort_type="olabel")
    write_atomically(path, lambda tmp: fst.write(str(tmp)))


def write_phone_lists(lang: Path, phone_ids: dict[str, int]) -> None:
    """data/lang/phones/: the phone sets prepare_lang.sh writes, as .txt, .int and .csl."""
    nonsil = [p for p in PHONES if p != SIL]
    sets = {
        "silence": [SIL], "nonsilence": nonsil, "optional_silence": [SIL], "context_indep": [SIL],
        "disambig": list(DISAMBIG), "wdisambig": ["#0"],
    }
    for name, phones in sets.items():
        atomic_write_text(lang / "phones" / f"{name}.txt", "".join(f"{p}\n" for p in phones))
        atomic_write_text(lang / "phones" / f"{name}.int", "".join(f"{phone_ids[p]}\n" for p in phones))
        atomic_write_text(lang / "phones" / f"{name}.csl", ":".join(str(phone_ids[p]) for p in phones) + "\n")
    atomic_write_text(lang / "phones" / "wdisambig_phones.int", f"{phone_ids['#0']}\n")
    atomic_write_text(lang / "phones" / "wdisambig_words.int", f"{len(PHONES) + 1}\n")
    atomic_write_text(lang / "phones" / "sets.txt", "".join(f"{p}\n" for p in PHONES))
    atomic_write_text(lang / "phones" / "sets.int", "".join(f"{phone_ids[p]}\n" for p in PHONES))
    atomic_write_text(lang / "phones" / "roots.txt", "".join(f"shared split {p}\n" for p in PHONES))
    atomic_write_text(lang / "phones" / "roots.int", "".join(f"shared split {phone_ids[p]}\n" for p in PHONES))
    atomic_write_text(lang / "phones" / "extra_questions.txt", "")
    atomic_write_text(lang / "phones" / "extra_questions.int", "")
    atomic_write_text(lang / "phones" / "align_lexicon.txt", "".join(f"{p} {p} {p}\n" for p in PHONES))
    atomic_write_text(lang / "phones" / "align_lexicon.int",
                      "".join(f"{phone_ids[p]} {phone_ids[p]} {phone_ids[p]}\n" for p in PHONES))


def main() -> None:
    args = stage_args(3, __doc__.splitlines()[0])
    root = args.root.resolve()
    with run_stage(root, 3, args.size, args.seed, inputs=(1,)) as run:
        if not run:
            return
        local, lang = root / "data" / "local", root / "data" / "lang"
        nonsil = [p for p in PHONES if p != SIL]
        atomic_write_text(local / "dict" / "lexicon.txt", "".join(f"{p} {p}\n" for p in PHONES))
        atomic_write_text(local / "dict" / "nonsilence_phones.txt", "".join(f"{p}\n" for p in nonsil))
        atomic_write_text(local / "dict" / "silence_phones.txt", f"{SIL}\n")
        atomic_write_text(local / "dict" / "optional_silence.txt", f"{SIL}\n")
        atomic_write_text(local / "dict" / "extra_questions.txt", "")

        phone_ids = {p: i for i, p in enumerate(["<eps>", *PHONES, *DISAMBIG])}
        word_ids = {w: i for i, w in enumerate(["<eps>", *PHONES, "#0", "<s>", "</s>"])}
        atomic_write_text(lang / "phones.txt", "".join(f"{p} {i}\n" for p, i in phone_ids.items()))
        atomic_write_text(lang / "words.txt", "".join(f"{w} {i}\n" for w, i in word_ids.items()))
        atomic_write_text(lang / "oov.txt", f"{SIL}\n")  # every word is known; Kaldi wants an oov entry
        atomic_write_text(lang / "oov.int", f"{word_ids[SIL]}\n")
        atomic_write_text(lang / "topo", standard_topology_text([phone_ids[p] for p in nonsil], [phone_ids[SIL]]))
        write_phone_lists(lang, phone_ids)
        write_lexicon_fst(lang / "L.fst", phone_ids, word_ids, disambig=False)
        write_lexicon_fst(lang / "L_disambig.fst", phone_ids, word_ids, disambig=True)

        sentences = [t.split() for t in read_table(root / "data" / "train" / "text").values()]
        unknown = {p for s in sentences for p in s} - set(PHONES)
        if unknown:
            raise ValueError(f"{root / 'data/train/text'}: phones not in the phone set: {sorted(unknown)}")
        arpa = local / "lm" / "phone_bigram.arpa"
        atomic_write_text(arpa, bigram_arpa(sentences, list(PHONES)))
        import kaldilm  # last: `import kaldilm, kaldifst` (that order) hangs for ever

        write_atomically(lang / "G.fst", lambda tmp: kaldilm.arpa2fst(
            input_arpa=str(arpa), output_fst=str(tmp), disambig_symbol="#0", read_symbol_table=str(lang / "words.txt")))
        print(f"lang: {len(PHONES)} phones; bigram on {len(sentences)} transcripts")


if __name__ == "__main__":
    main()

"""Stage 6 of the word task: check it as a whole, then an oracle word decode of the test set.

Checks (every failure raises, naming the file and the utterance):

* ``data/<split>_words``: every table reads back, sorted in the C locale with unique keys; the
  features, CMVN, wav and speaker tables are those of ``data/<split>`` (the same features); every
  transcript word is in ``words.txt``; fbank and MFCC features have the expected dimensions and as
  many frames as the alignment; every speaker has CMVN statistics; no speaker is in two splits;
* ``exp/mono_words_ali_<split>``: every transition-id exists and maps to a pdf below ``num_pdfs``;
  the alignment's phones, cut into words at their word-position marks, spell the transcript: each
  word's phones are one of its pronunciations in ``phones/align_lexicon.txt``, with only optional
  silence between words;
* ``L.fst``, ``L_disambig.fst``, each ``G.fst`` and ``HCLG.fst`` read back.

Oracle decode: log-likelihoods that put all the mass on the aligned pdf of every frame, decoded with
``exp/mono_words/graph_tg/HCLG.fst`` (``bru_kaldi.decoding``), scored against ``data/test_words/text``
(``scoring.score(..., "wsj")``), must give a WER below 2 %. The pdfs are shared by the word
positions of a phone, so the decoder has to find the word boundaries itself (the lexicon and the LM
decide between word sequences with the same phones). Writes ``exp/mono_words/decode_oracle_test/{text,wer.txt}``.
"""

from __future__ import annotations

from pathlib import Path

from recipes.mini_timit.local.check import (DIMS, check_disjoint_speakers, check_sorted, oracle_decode, read_alignments,
                                            report_oracle)
from recipes.mini_timit.local.layout import LMS, SPLITS, read_table, run_stage, stage_args
from recipes.mini_timit.local.word_text import SHARED_TABLES

ORACLE_MAX_WER = 2.0  # percent


def symbols(path: Path) -> dict[str, int]:
    """A Kaldi symbol table (``symbol id``)."""
    return {s: int(i) for s, i in read_table(path).items()}


def words_of_alignment(phones: list[str], utt: str) -> list[tuple[str, ...]]:
    """Cut an alignment's phone sequence into words at the word-position marks (``sil`` between them)."""
    words, current = [], []
    for phone in phones:
        mark = phone[-2:] if "_" in phone else ""
        if mark == "":
            if current:
                raise ValueError(f"utterance {utt}: {phone} inside the word {' '.join(current)}")
            continue
        if mark in ("_B", "_S") and current:
            raise ValueError(f"utterance {utt}: word {' '.join(current)} has no end")
        if mark in ("_I", "_E") and not current:
            raise ValueError(f"utterance {utt}: {phone} starts no word")
        current.append(phone)
        if mark in ("_E", "_S"):
            words.append(tuple(current))
            current = []
    if current:
        raise ValueError(f"utterance {utt}: the last word {' '.join(current)} has no end")
    return words


def check_split(root: Path, split: str, tm, words: dict[str, int], phone_names: dict[int, str],
                prons: dict[str, set[tuple[str, ...]]]) -> set[str]:
    """All the checks of one split (module docstring); returns its speakers."""
    import kaldiio

    data, source = root / "data" / f"{split}_words", root / "data" / split
    tables = {name: check_sorted(data / name) for name in ("text", *SHARED_TABLES)}
    for name in SHARED_TABLES:
        if tables[name] != read_table(source / name):
            raise ValueError(f"{data / name} differs from {source / name}")
    utts = set(tables["utt2spk"])
    if set(tables["text"]) != utts:
        raise ValueError(f"{data / 'text'} and {data / 'utt2spk'} list different utterances")
    alignments = read_alignments(root / "exp" / f"mono_words_ali_{split}")
    if set(alignments) != utts:
        raise ValueError(f"exp/mono_words_ali_{split} aligns different utterances than {data / 'utt2spk'}")
    for utt, text in tables["text"].items():
        unknown = [w for w in text.split() if w not in words]
        if unknown:
            raise ValueError(f"{data / 'text'}: utterance {utt} has words not in words.txt: {unknown}")
        if not Path(tables["wav.scp"][utt]).is_file():
            raise FileNotFoundError(f"{data / 'wav.scp'}: utterance {utt}: no such file {tables['wav.scp'][utt]}")
        ali = alignments[utt]
        if ali.min() < 1 or ali.max() >= len(tm.tid2pdf) or tm.tid2pdf[ali].max() >= tm.num_pdfs:
            raise ValueError(f"exp/mono_words_ali_{split}: utterance {utt} has transition-ids outside the model")
        spoken = words_of_alignment([phone_names[p] for p in tm.ali_to_phones(ali)], utt)
        if len(spoken) != len(text.split()) or any(p not in prons.get(w, ()) for w, p in zip(text.split(), spoken)):
            raise ValueError(f"exp/mono_words_ali_{split}: utterance {utt}: the aligned phones "
                             f"{' | '.join(' '.join(p) for p in spoken)} do not spell {text!r} (align_lexicon.txt)")
    for scp, dim in DIMS.items():
        feats = kaldiio.load_scp(str(data / scp))
        for utt in sorted(utts):
            shape = feats[utt].shape
            if shape[1] != dim or shape[0] != int(tables["utt2num_frames"][utt]) or shape[0] != len(alignments[utt]):
                raise ValueError(f"{data / scp}: utterance {utt} has features {shape}, expected "
                                 f"({tables['utt2num_frames'][utt]}, {dim}) and {len(alignments[utt])} aligned frames")
        cmvn_scp = data / scp.replace("feats", "cmvn")
        cmvn = kaldiio.load_scp(str(cmvn_scp))
        for spk in tables["spk2utt"]:
            if spk not in cmvn or cmvn[spk].shape != (2, dim + 1):
                raise ValueError(f"{cmvn_scp}: speaker {spk} has no (2, {dim + 1}) CMVN statistics")
    return set(tables["spk2utt"])


def main() -> None:
    args = stage_args(6, __doc__.splitlines()[0], task="words")
    root = args.root.resolve()
    with run_stage(root, 6, args.size, args.seed, inputs=(2, 4, 5), task="words") as run:
        if not run:
            return
        import kaldi_hmm_gmm  # noqa: F401  (before kaldifst: some import orders of the kaldi packages hang)
        import kaldifst

        from bru_kaldi.kaldi.transition_model import read_transition_model

        tm = read_transition_model(root / "exp" / "mono_words" / "final.mdl")
        lang = root / "data" / "lang_words"
        words = symbols(lang / "words.txt")
        phone_names = {i: p for p, i in symbols(lang / "phones.txt").items()}
        prons: dict[str, set[tuple[str, ...]]] = {}
        for line in (lang / "phones" / "align_lexicon.txt").read_text().splitlines():
            f = line.split()
            prons.setdefault(f[0], set()).add(tuple(f[2:]))
        fsts = [lang / "L.fst", lang / "L_disambig.fst"]
        fsts += [root / "data" / f"lang_words_test_{lm}" / "G.fst" for lm in LMS]
        fsts += [root / "exp" / "mono_words" / f"graph_{lm}" / "HCLG.fst" for lm in LMS]
        for path in fsts:
            if kaldifst.StdVectorFst.read(str(path)).num_states == 0:
                raise ValueError(f"{path} is empty")
        check_disjoint_speakers({split: check_split(root, split, tm, words, phone_names, prons) for split in SPLITS})
        result, hyps = oracle_decode(root / "exp" / "mono_words_ali_test", root / "exp" / "mono_words" / "graph_tg",
                                     root / "data" / "test_words" / "text", tm, "wsj")
        report_oracle(root / "exp" / "mono_words" / "decode_oracle_test", result, hyps, "wer", ORACLE_MAX_WER,
                      "oracle word decode of test (graph_tg)", "graph, lexicon and alignments")


if __name__ == "__main__":
    main()

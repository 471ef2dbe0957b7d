"""A Kaldi lang directory from a dictionary directory, as ``utils/prepare_lang.sh`` makes it for WSJ.

The defaults of ``prepare_lang.sh``: word-position-dependent phones (``_B _I _E _S``; silence phones
also get the plain version, used for optional silence between words), optional silence with
probability ``sil_prob`` = 0.5 after every word and at the start, separate silence models, one tree
root per phone (``shared split``), Kaldi's default topology (3 states, 5 for silence phones).

From ``<dict>/{lexicon,silence_phones,nonsilence_phones,optional_silence,extra_questions}.txt`` it
writes ``phones.txt words.txt topo L.fst L_disambig.fst oov.{txt,int}`` and ``phones/``:
``{silence,nonsilence,optional_silence,disambig,context_indep}.{txt,int,csl}``,
``{sets,roots,extra_questions,word_boundary}.{txt,int}``, ``align_lexicon.{txt,int}``,
``wdisambig.txt wdisambig_{phones,words}.int``, in Kaldi's formats (``utils/validate_lang.pl``).
Disambiguation symbols are added as ``utils/add_lex_disambig.pl`` does: ``#1, #2, ...`` on
pronunciations that are shared or a prefix of another, plus one for the optional silence.
"""

from __future__ import annotations

import math
from pathlib import Path

from bru_kaldi.atomic import write_atomically
from bru_kaldi.kaldi.transition_model import standard_topology_text
from recipes.mini_timit.local.layout import atomic_write_text

POSITIONS = ("_B", "_E", "_I", "_S")
SIL_PROB = 0.5  # prepare_lang.sh's default


def _lines(path: Path) -> list[list[str]]:
    if not path.is_file():
        raise FileNotFoundError(f"dictionary file {path} does not exist")
    return [line.split() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def _c_sorted(lines) -> list[str]:
    return sorted(set(lines), key=str.encode)


def read_dict(dict_dir: Path) -> dict:
    """The dictionary directory (``local/wsj_prepare_dict.sh``'s output), checked as ``validate_dict_dir.pl``."""
    dict_dir = Path(dict_dir)
    lexicon = [(fields[0], fields[1:]) for fields in _lines(dict_dir / "lexicon.txt")]
    silence = _lines(dict_dir / "silence_phones.txt")
    nonsilence = _lines(dict_dir / "nonsilence_phones.txt")
    optional = _lines(dict_dir / "optional_silence.txt")
    extra = _lines(dict_dir / "extra_questions.txt")
    phones = [p for line in silence + nonsilence for p in line]
    if len(set(phones)) != len(phones):
        raise ValueError(f"{dict_dir}: a phone is listed twice in silence_phones.txt / nonsilence_phones.txt")
    if len(optional) != 1 or len(optional[0]) != 1 or optional[0][0] not in {p for line in silence for p in line}:
        raise ValueError(f"{dict_dir / 'optional_silence.txt'}: expected one silence phone")
    for number, (word, pron) in enumerate(lexicon, 1):
        unknown = set(pron) - set(phones)
        if not pron or unknown or word in ("<s>", "</s>", "<eps>") or word.startswith("#"):
            raise ValueError(f"{dict_dir / 'lexicon.txt'}:{number}: bad entry {word} {' '.join(pron)}"
                             + (f" (phones {sorted(unknown)} not in the phone lists)" if unknown else ""))
    return dict(lexicon=lexicon, silence=silence, nonsilence=nonsilence, optional=optional[0][0], extra=extra)


def with_positions(pron: list[str]) -> list[str]:
    """``a b c`` -> ``a_B b_I c_E``; a one-phone word is ``a_S``."""
    if len(pron) == 1:
        return [pron[0] + "_S"]
    return [pron[0] + "_B", *(p + "_I" for p in pron[1:-1]), pron[-1] + "_E"]


def add_disambig(prons: list[list[str]]) -> tuple[list[list[str]], int]:
    """add_lex_disambig.pl: ``#n`` on shared pronunciations and on prefixes of others; also returns the largest n."""
    count: dict[tuple, int] = {}
    prefixes: set[tuple] = set()
    for pron in prons:
        count[tuple(pron)] = count.get(tuple(pron), 0) + 1
        prefixes.update(tuple(pron[:k]) for k in range(len(pron)))
    last_used: dict[tuple, int] = {}
    out, largest = [], 0
    for pron in prons:
        key = tuple(pron)
        if count[key] == 1 and key not in prefixes:
            out.append(list(pron))
            continue
        last_used[key] = last_used.get(key, 0) + 1
        largest = max(largest, last_used[key])
        out.append([*pron, f"#{last_used[key]}"])
    return out, largest


def lexicon_fst_text(entries: list[tuple[str, list[str]]], sil_prob: float, sil_phone: str,
                     sil_disambig: str | None = None) -> str:
    """make_lexicon_fst.pl's text FST: a loop state, optional silence at the start and after each word."""
    sil_cost, nosil_cost = -math.log(sil_prob), -math.log(1.0 - sil_prob)
    start, loop, sil_state = 0, 1, 2
    lines = [f"{start}\t{loop}\t<eps>\t<eps>\t{nosil_cost!r}"]
    if sil_disambig is None:
        lines += [f"{start}\t{loop}\t{sil_phone}\t<eps>\t{sil_cost!r}", f"{sil_state}\t{loop}\t{sil_phone}\t<eps>"]
        next_state = 3
    else:  # the silence leads through its own disambiguation symbol (keeps L o G determinizable)
        lines += [f"{start}\t3\t{sil_phone}\t<eps>\t{sil_cost!r}", f"{sil_state}\t3\t{sil_phone}\t<eps>",
                  f"3\t{loop}\t{sil_disambig}\t<eps>"]
        next_state = 4
    for word, pron in entries:
        state, output = loop, word
        for i, phone in enumerate(pron):
            if i + 1 < len(pron):
                lines.append(f"{state}\t{next_state}\t{phone}\t{output}")
                state, next_state, output = next_state, next_state + 1, "<eps>"
            elif phone != sil_phone:
                lines.append(f"{state}\t{loop}\t{phone}\t{output}\t{nosil_cost!r}")
                lines.append(f"{state}\t{sil_state}\t{phone}\t{output}\t{sil_cost!r}")
            else:
                lines.append(f"{state}\t{loop}\t{phone}\t{output}")
    lines.append(f"{loop}\t0")
    return "\n".join(lines) + "\n"


def compile_lexicon_fst(text: str, phone_ids: dict[str, int], word_ids: dict[str, int],
                        self_loop: tuple[int, int] | None):
    """fstcompile + (fstaddselfloops) + fstarcsort --sort_type=olabel, with kaldifst."""
    import kaldi_hmm_gmm  # noqa: F401  (before kaldifst: some import orders of the kaldi packages hang)
    import kaldifst

    numbered = []
    for line in text.splitlines():
        f = line.split("\t")
        if len(f) >= 4:
            f[2], f[3] = str(phone_ids[f[2]]), str(word_ids[f[3]])
        numbered.append("\t".join(f))
    fst = kaldifst.compile("\n".join(numbered) + "\n", acceptor=False)
    if self_loop is not None:  # fstaddselfloops: on final states and states with a word on an arc out
        for state in range(fst.num_states):
            arcs = list(kaldifst.ArcIterator(fst, state))
            if fst.final(state).value != math.inf or any(a.olabel != 0 for a in arcs):
                fst.add_arc(state=state, arc=kaldifst.StdArc(self_loop[0], self_loop[1], 0.0, state))
    kaldifst.arcsort(fst, sort_type="olabel")
    return fst


def prepare_lang(dict_dir: Path, oov_word: str, lang: Path, sil_prob: float = SIL_PROB) -> dict[str, int]:
    """Write the lang directory ``lang`` from ``dict_dir`` (module doc); returns its phone ids."""
    d = read_dict(dict_dir)
    lang = Path(lang)
    silence_versions = ["", "_B", "_E", "_I", "_S"]  # the plain one serves the optional silence
    phone_map = {p: [p + s for s in silence_versions] for line in d["silence"] for p in line}
    phone_map.update({p: [p + s for s in POSITIONS] for line in d["nonsilence"] for p in line})
    sets = [[v for p in line for v in phone_map[p]] for line in d["silence"] + d["nonsilence"]]
    silence = [v for line in d["silence"] for p in line for v in phone_map[p]]
    nonsilence = [v for line in d["nonsilence"] for p in line for v in phone_map[p]]
    entries = [(word, with_positions(pron)) for word, pron in d["lexicon"]]
    if oov_word not in {w for w, _ in entries}:
        raise ValueError(f"{dict_dir / 'lexicon.txt'}: the OOV word {oov_word} has no entry")
    disambig_prons, largest = add_disambig([pron for _, pron in entries])
    disambig = [f"#{n}" for n in range(largest + 2)]  # #0 (LM backoff) .. #largest, + one for the silence
    phone_ids = {p: i for i, p in enumerate(["<eps>", *silence, *nonsilence, *disambig])}
    words = _c_sorted(w for w, _ in entries)
    word_ids = {w: i for i, w in enumerate(["<eps>", *words, "#0", "<s>", "</s>"])}
    write = atomic_write_text

    def table(name: str, items: list[str]) -> None:  # .txt, .int and (for phone lists) .csl
        write(lang / "phones" / f"{name}.txt", "".join(f"{p}\n" for p in items))
        write(lang / "phones" / f"{name}.int", "".join(f"{phone_ids[p]}\n" for p in items))
        write(lang / "phones" / f"{name}.csl", ":".join(str(phone_ids[p]) for p in items) + "\n")

    write(lang / "phones.txt", "".join(f"{p} {i}\n" for p, i in phone_ids.items()))
    write(lang / "words.txt", "".join(f"{w} {i}\n" for w, i in word_ids.items()))
    for name, items in (("silence", silence), ("nonsilence", nonsilence), ("optional_silence", [d["optional"]]),
                        ("disambig", disambig), ("context_indep", silence)):
        table(name, items)
    questions = [[v for p in line for v in phone_map[p]] for line in d["extra"]]  # utils/apply_map.pl
    questions += [[p + suffix for line in d["nonsilence"] for p in line] for suffix in POSITIONS]
    questions += [[p + suffix for line in d["silence"] for p in line] for suffix in silence_versions]
    for name, rows, prefix in (("sets", sets, ""), ("roots", sets, "shared split "),
                               ("extra_questions", questions, "")):
        write(lang / "phones" / f"{name}.txt", "".join(prefix + " ".join(r) + "\n" for r in rows))
        write(lang / "phones" / f"{name}.int",
              "".join(prefix + " ".join(str(phone_ids[p]) for p in r) + "\n" for r in rows))
    kinds = {"_B": "begin", "_E": "end", "_I": "internal", "_S": "singleton"}
    boundary = [(p, kinds.get(p[-2:], "nonword")) for p in silence + nonsilence]
    write(lang / "phones" / "word_boundary.txt", "".join(f"{p} {k}\n" for p, k in boundary))
    write(lang / "phones" / "word_boundary.int", "".join(f"{phone_ids[p]} {k}\n" for p, k in boundary))
    align = _c_sorted([f"{w} {w} {' '.join(pron)}" for w, pron in entries] + [f"<eps> <eps> {d['optional']}"])
    write(lang / "phones" / "align_lexicon.txt", "".join(f"{line}\n" for line in align))
    write(lang / "phones" / "align_lexicon.int", "".join(
        " ".join([str(word_ids[f[0]]), str(word_ids[f[1]]), *(str(phone_ids[p]) for p in f[2:])]) + "\n"
        for f in (line.split() for line in align)))
    write(lang / "oov.txt", f"{oov_word}\n")
    write(lang / "oov.int", f"{word_ids[oov_word]}\n")
    write(lang / "phones" / "wdisambig.txt", "#0\n")
    write(lang / "phones" / "wdisambig_phones.int", f"{phone_ids['#0']}\n")
    write(lang / "phones" / "wdisambig_words.int", f"{word_ids['#0']}\n")
    write(lang / "topo", standard_topology_text([phone_ids[p] for p in nonsilence], [phone_ids[p] for p in silence]))
    plain = compile_lexicon_fst(lexicon_fst_text(entries, sil_prob, d["optional"]), phone_ids, word_ids, None)
    write_atomically(lang / "L.fst", lambda tmp: plain.write(str(tmp)))
    with_disambig = lexicon_fst_text([(w, p) for (w, _), p in zip(entries, disambig_prons)], sil_prob,
                                     d["optional"], sil_disambig=disambig[-1])
    fst = compile_lexicon_fst(with_disambig, phone_ids, word_ids, (phone_ids["#0"], word_ids["#0"]))
    write_atomically(lang / "L_disambig.fst", lambda tmp: fst.write(str(tmp)))
    return phone_ids

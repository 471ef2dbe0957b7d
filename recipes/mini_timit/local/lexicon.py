"""Pronunciations for the word task: espeak-ng's phonemes on the corpus's phone set, checked against the audio.

Each entry remembers where it first came from (:data:`SOURCES`, in this order):

1. ``isolation``: the word alone, in each accent the corpus speaks (``prepare_text.ACCENTS``),
   mapped onto the 39 phones by ``phoneset.to_timit`` (stress and modifier marks dropped);
2. ``context``: the words of every LM training sentence as espeak-ng reads them in context (the
   drawn sentences take the accents in turn, a training prompt its speaker's). Running speech
   changes words: reduced function words (``A`` -> ah, ``THE`` -> dh ih before a vowel, ``FOR`` ->
   f er), linking r, flaps across words, homographs read by part of speech (``RECORD``);
3. ``deletion``: espeak-ng sometimes gives a post-vocalic l or r, or the g after ng, no time of its
   own (its phoneme event starts where the next one does), so the synthesiser's segments lack it:
   every pronunciation also appears without up to :data:`MAX_DELETIONS` of them;
4. ``observed``: every utterance of train, dev and test is aligned to its phone segments
   (``data/local/<split>/phone_segments.txt``, the synthesiser's own timing, the ground truth) by
   a DP over the variants with optional silence between words. An utterance that does not fit is
   aligned with the fewest phone edits instead, and each word whose stretch of phones is not a
   pronunciation yet gets that stretch as a variant: listed, with its utterance, in the report.

The alignment also gives every utterance its word boundaries, from which the word task's phone
segments (word-position-dependent phones, ``sil`` between words) are made.
"""

from __future__ import annotations

import itertools
from typing import Iterable, Sequence

from recipes.mini_timit.local import phoneset

SOURCES = ("isolation", "context", "deletion", "observed")
MAX_DELETIONS = 2  # optional deletions per pronunciation (the data show one, rarely two)
Pron = tuple[str, ...]
Lexicon = dict[str, dict[Pron, str]]  # word -> {pronunciation: source}, in the order they were added


def espeak_phones(mnemonics: Iterable[str]) -> Pron:
    """espeak-ng phoneme mnemonics of one word -> phones (pauses and modifiers dropped)."""
    phones = (phoneset.to_timit(m) for m in mnemonics)
    return tuple(p for p in phones if p is not None and p != phoneset.SIL)


def add(lexicon: Lexicon, word: str, pron: Pron, source: str) -> bool:
    """Add a pronunciation unless the word has it already; True when it is new."""
    if not pron:
        raise ValueError(f"word {word}: empty pronunciation ({source})")
    variants = lexicon.setdefault(word, {})
    if pron in variants:
        return False
    variants[pron] = source
    return True


def isolation_lexicon(tts, words: Sequence[str], accents: Sequence[str]) -> Lexicon:
    """Each word spoken alone in each accent (``tts``: an ``espeak.Espeak``)."""
    lexicon: Lexicon = {}
    for accent in accents:
        for word in words:
            tokens = tts.phonemize(word.lower(), accent)
            try:
                add(lexicon, word, espeak_phones(m for token in tokens for m in token), "isolation")
            except (ValueError, phoneset.UnknownPhoneme) as error:
                raise ValueError(f"word {word} ({accent}): {error}") from None
    return lexicon


def edit_distance(a: Sequence[str], b: Sequence[str]) -> int:
    """Levenshtein distance of two phone sequences (short ones: plain Python beats a library call here).

    >>> edit_distance(("w", "ih", "l"), ("w", "ih"))
    1
    """
    previous = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        current = [i]
        for j, y in enumerate(b, 1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (x != y)))
        previous = current
    return previous[-1]


def _closest(lexicon: Lexicon, word: str, phones: Sequence[str], memo: dict | None = None) -> int:
    """The fewest edits from ``phones`` to a pronunciation of ``word`` (memoised in ``memo`` if given)."""
    key = (word, tuple(phones))
    if memo is not None and key in memo:
        return memo[key]
    cost = min(edit_distance(p, phones) for p in lexicon[word])
    if memo is not None:
        memo[key] = cost
    return cost


_SLACK = 2  # a word's share of a joined phonetic word is within this many phones of a pronunciation's length


def _lengths(lexicon: Lexicon, word: str) -> set[int]:
    return {n + d for n in map(len, lexicon[word]) for d in range(-_SLACK, _SLACK + 1) if n + d > 0}


def _split(lexicon: Lexicon, words: Sequence[str], phones: Pron, memo: dict) -> tuple[int, list[Pron]]:
    """Cut one phonetic word that spells several written words where their pronunciations fit best."""
    best = None
    for cuts in itertools.combinations(range(1, len(phones)), len(words) - 1):
        bounds = list(zip((0, *cuts), (*cuts, len(phones))))
        if any(b - a not in _lengths(lexicon, w) for w, (a, b) in zip(words, bounds)):
            continue  # a share far from every pronunciation's length
        parts = [phones[a:b] for a, b in bounds]
        cost = sum(_closest(lexicon, w, p, memo) for w, p in zip(words, parts))
        if best is None or cost < best[0]:
            best = (cost, parts)
    return best if best else (10**6, [])


def word_pronunciations(lexicon: Lexicon, words: Sequence[str], tokens: Sequence[Pron],
                        memo: dict | None = None) -> list[Pron] | None:
    """Share espeak-ng's phonetic words (``tokens``) among the written ``words``.

    Mostly one each; espeak-ng joins some pairs (``with the``) and may split a word, so a DP pairs
    up to three words with one token or one word with up to three tokens, cutting a joined token
    where the words' pronunciations in ``lexicon`` fit best. Its cost is the phone edits from those
    pronunciations plus one for every word or token beyond one in a pair, so that one each wins a
    tie (``saw a`` read ``s aa r | ah`` is SAW + A, not SAW ``s aa`` + A ``r``). None when no
    pairing exists. ``memo`` keeps edit costs from call to call (valid while ``lexicon`` does not change).
    """
    tokens = [t for t in tokens if t]
    memo = {} if memo is None else memo
    if len(tokens) == len(words) and all(t in lexicon[w] or _closest(lexicon, w, t, memo) <= len(t) // 2
                                         for w, t in zip(words, tokens)):
        return list(tokens)  # one each (a join and a split elsewhere could also give equal counts)
    steps = [(1, 1), (2, 1), (3, 1), (1, 2), (1, 3)]
    best: dict[tuple[int, int], tuple[int, tuple, list[Pron]]] = {(0, 0): (0, (), [])}
    # i - t goes from 0 to len(words) - len(tokens); a pairing that strays further is not worth trying
    low, high = min(0, len(words) - len(tokens)) - 1, max(0, len(words) - len(tokens)) + 1
    for i in range(len(words) + 1):
        for t in range(len(tokens) + 1):
            if (i, t) not in best or not low <= i - t <= high:
                continue
            cost, _, _ = best[i, t]
            for a, b in steps:
                if i + a > len(words) or t + b > len(tokens):
                    continue
                joined = tuple(p for token in tokens[t:t + b] for p in token)
                if sum(min(map(len, lexicon[w])) for w in words[i:i + a]) > len(joined) + _SLACK * a or \
                        sum(max(map(len, lexicon[w])) for w in words[i:i + a]) < len(joined) - _SLACK * b:
                    continue  # the words cannot spell these phones
                if a == 1:
                    extra, parts = _closest(lexicon, words[i], joined, memo), [joined]
                else:
                    if len(joined) < a:
                        continue
                    extra, parts = _split(lexicon, words[i:i + a], joined, memo)
                extra += a + b - 2  # joins and splits cost: one each is the rule
                if (i + a, t + b) not in best or cost + extra < best[i + a, t + b][0]:
                    best[i + a, t + b] = (cost + extra, (i, t), parts)
    if (len(words), len(tokens)) not in best:
        return None
    prons, at = [], (len(words), len(tokens))
    while at != (0, 0):
        _, back, parts = best[at]
        prons = parts + prons
        at = back
    return prons


def add_context(lexicon: Lexicon, tts, sentences: Sequence[tuple[list[str], str, str]]) -> int:
    """Add the in-context pronunciations of ``(words, prompt, accent)`` sentences; returns how many were new.

    Joined phonetic words are cut against the pronunciations known before this call (isolation).
    """
    new, reference, memo = 0, {w: dict(v) for w, v in lexicon.items()}, {}
    for words, prompt, accent in sentences:
        tokens = [espeak_phones(t) for t in tts.phonemize(prompt, accent)]
        prons = word_pronunciations(reference, words, tokens, memo)
        if prons is None:
            raise ValueError(f"espeak-ng's phonetic words for {prompt!r} ({accent}) do not pair with its words")
        new += sum(add(lexicon, w, p, "context") for w, p in zip(words, prons) if p)
    return new


def deletion_variants(pron: Pron) -> list[Pron]:
    """``pron`` without up to MAX_DELETIONS of its post-vocalic l/r and post-ng g (see the module doc).

    >>> deletion_variants(("w", "ih", "l"))
    [('w', 'ih')]
    """
    optional = [i for i, p in enumerate(pron) if i > 0 and (
        (p in ("l", "r") and pron[i - 1] in phoneset.VOWELS) or (p == "g" and pron[i - 1] == "ng"))]
    variants = []
    for k in range(1, min(MAX_DELETIONS, len(optional)) + 1):
        for dropped in itertools.combinations(optional, k):
            variants.append(tuple(p for i, p in enumerate(pron) if i not in dropped))
    return variants


def add_deletions(lexicon: Lexicon) -> int:
    """Add every pronunciation's deletion variants; returns how many were new."""
    new = 0
    for word, variants in lexicon.items():
        for pron in list(variants):
            new += sum(add(lexicon, word, v, "deletion") for v in deletion_variants(pron))
    return new


def _skip_silence(phones: Sequence[str], k: int) -> int:
    while k < len(phones) and phones[k] == phoneset.SIL:
        k += 1
    return k


def segment(lexicon: Lexicon, words: Sequence[str], phones: Sequence[str]) -> list[tuple[int, int]] | None:
    """Where each word is in ``phones`` (silences only between words), or None when no variant fits.

    Exact match of a variant per word. Where the words can share a phone either way (a linking r),
    the earlier word takes it, as espeak-ng writes it (``3|r-``).
    """
    starts = [{_skip_silence(phones, 0): None}]  # per word: phone position -> (prev start, end, word start)
    for word in words:
        ends: dict[int, int] = {}
        for j in sorted(starts[-1], reverse=True):  # the latest start first: the earlier word takes the phone
            for pron in lexicon.get(word, ()):
                k = j + len(pron)
                if k not in ends and tuple(phones[j:k]) == pron:
                    ends[k] = j
        following: dict[int, tuple[int, int]] = {}
        for k in sorted(ends):
            following.setdefault(_skip_silence(phones, k), (ends[k], k))
        if not following:
            return None
        starts.append(following)
    if len(phones) not in starts[-1]:
        return None
    spans, at = [], len(phones)
    for level in range(len(words), 0, -1):
        j, k = starts[level][at]
        spans.append((j, k))
        at = j
    return spans[::-1]


def closest_segmentation(lexicon: Lexicon, words: Sequence[str], phones: Sequence[str], where: str,
                         beam: int = 6) -> list[tuple[int, int]]:
    """The segmentation with the fewest phone edits against the words' variants (each word >= 1 phone)."""
    longest = {w: max(map(len, lexicon[w])) for w in words}
    states = {_skip_silence(phones, 0): (0, None)}  # start position -> (cost, back pointer)
    history = [states]
    for word in words:
        nxt: dict[int, tuple[int, tuple[int, int]]] = {}
        floor = min(c for c, _ in states.values())
        for j in sorted(states):
            cost = states[j][0]
            if cost > floor + beam:
                continue
            for k in range(j + 1, min(len(phones), j + longest[word] + 3) + 1):
                if phones[k - 1] == phoneset.SIL:
                    break
                total = cost + _closest(lexicon, word, phones[j:k])
                m = _skip_silence(phones, k)
                if m not in nxt or total <= nxt[m][0]:  # ties: the latest start, as segment()
                    nxt[m] = (total, (j, k))
        if not nxt:
            raise ValueError(f"{where}: the words {' '.join(words)} cannot be laid on the phones {' '.join(phones)}")
        states = nxt
        history.append(states)
    if len(phones) not in states:
        raise ValueError(f"{where}: the phones after the last word are not silence: {' '.join(phones)}")
    spans, at = [], len(phones)
    for level in range(len(words), 0, -1):
        j, k = history[level][at][1]
        spans.append((j, k))
        at = j
    return spans[::-1]


def restricted(lexicon: Lexicon, sources: Sequence[str]) -> Lexicon:
    """The lexicon with only the variants of the given sources."""
    return {w: {p: s for p, s in v.items() if s in sources} for w, v in lexicon.items()}


def fit_utterances(lexicon: Lexicon, utterances: Sequence[tuple[str, str, list[str], list[str]]]):
    """Align every ``(split, utt, words, phones)``, adding observed variants where needed (module doc).

    Returns ``({utt: [(start, end) per word]}, [(split, utt, word, observed, closest variant)])``.
    """
    spans, observed = {}, []
    for split, utt, words, phones in utterances:
        where = f"data/local/{split}/phone_segments.txt: utterance {utt}"
        missing = [w for w in words if w not in lexicon]
        if missing:
            raise ValueError(f"{where}: no pronunciation for {missing}")
        found = segment(lexicon, words, phones)
        if found is None:
            for word, (j, k) in zip(words, closest_segmentation(lexicon, words, phones, where)):
                stretch = tuple(phones[j:k])
                if stretch not in lexicon[word]:
                    nearest = min(lexicon[word], key=lambda p: (edit_distance(p, stretch), p))
                    add(lexicon, word, stretch, "observed")
                    observed.append((split, utt, word, stretch, nearest))
            found = segment(lexicon, words, phones)
            if found is None:
                raise RuntimeError(f"{where}: still no alignment after adding the observed variants")
        spans[utt] = found
    return spans, observed


def position_dependent(segments: Sequence[tuple[str, int, int]],
                       spans: Sequence[tuple[int, int]]) -> list[tuple[str, int, int]]:
    """Phone segments with word-position suffixes (``_B _I _E``, ``_S`` for a one-phone word); ``sil`` as is.

    >>> position_dependent([("sil", 0, 5), ("ah", 5, 9), ("k", 9, 12), ("sil", 12, 20)], [(1, 2), (2, 3)])
    [('sil', 0, 5), ('ah_S', 5, 9), ('k_S', 9, 12), ('sil', 12, 20)]
    """
    labels = [p for p, _, _ in segments]
    for j, k in spans:
        if k - j == 1:
            labels[j] += "_S"
        else:
            labels[j:k] = [labels[j] + "_B", *(p + "_I" for p in labels[j + 1:k - 1]), labels[k - 1] + "_E"]
    if any(not (p == phoneset.SIL or "_" in p) for p in labels):
        raise ValueError(f"phones outside every word that are not silence: {labels}")
    return [(p, s, e) for p, (_, s, e) in zip(labels, segments)]

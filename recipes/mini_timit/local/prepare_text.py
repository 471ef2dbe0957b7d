"""Stage 0: the speakers and the sentences they read.

Speakers are espeak-ng accents x voice variants x pitch, pitch range, speaking rate and word gap,
drawn with a seeded numpy Generator and split speaker-disjointly into train / dev / test in the
proportions of ``layout.SIZES``. Sentences are filled templates whose content words come from the
word lists of the ``wonderwords`` package (MIT licence); every sentence is read once, so no
sentence is shared between splits.

Writes ``data/local/speakers.txt`` (``spk split gender voice pitch range rate word_gap``) and
``data/local/<split>/prompts.txt`` (``utt sentence``).
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from recipes.mini_timit.local.layout import SIZES, SPLITS, run_stage, stage_args, write_table

# espeak-ng English accents (espeak-ng-data/lang/gmw): US, New York, British, RP, Scottish,
# Caribbean, Lancashire, West Midlands
ACCENTS = ("en-us", "en-us-nyc", "en", "en-gb-x-rp", "en-gb-scotland", "en-029", "en-gb-x-gbclan", "en-gb-x-gbcwmd")
# voice variants (espeak-ng-data/voices/!v) that sound like a person, by the gender they declare
# or, where they declare none, by their formants
VARIANTS = {
    "m": ("m1", "m2", "m3", "m4", "m5", "m6", "m7", "m8", "klatt", "klatt2", "klatt3", "Andy", "Denis", "Lee",
          "Marco", "antonio", "david", "edward", "sandro", "travis", "victor", "michel", "Henrique", "Hugo"),
    "f": ("f1", "f2", "f3", "f4", "f5", "Alicia", "Andrea", "Annie", "anika", "aunty", "belinda", "linda",
          "steph", "steph2", "steph3"),
}
MALE_SHARE = 0.6  # TIMIT is 70 % male

# closed-class words of the templates (ours); content words come from wonderwords
DETERMINERS = ("the", "a", "my", "your", "our", "their", "this", "that", "every", "some", "one", "no")
PRONOUNS = ("I", "you", "we", "they", "she", "he")
MODALS = ("can", "could", "should", "would", "might", "must", "will")
PREPOSITIONS = ("near", "behind", "under", "above", "beside", "with", "without", "across", "inside",
                "around", "from", "into", "for", "after")
ADVERBS = ("today", "again", "slowly", "quickly", "soon", "tonight", "later", "now", "together", "gently")
TEMPLATES = (
    "{D} {A} {N} will {V} {D} {N}.",
    "{S} {M} {V} the {N} {P} {D} {A} {N}.",
    "Why did {D} {N} {V} {D} {N} {P} the {N}?",
    "{D} {N} and {D} {A} {N} {M} not {V} {R}.",
    "Please {V} the {A} {N} before {S} {V} it.",
    "When the {N} is {A}, {S} {M} {V} {D} {N}.",
    "{D} {A} {N} was {P} the {N}, so {S} {M} {V} it {R}.",
    "Do not {V} {D} {N} {P} {D} {A} {N}.",
)


def word_lists() -> dict[str, tuple[str, ...]]:
    """Nouns, verbs and adjectives shipped by wonderwords, lower-case alphabetic words only.

    Abbreviations (``ATM``) would be spelled out and hyphenated compounds read as two words, so
    both are left out, and so is every word of wonderwords' own profanity list.
    """
    import wonderwords

    assets = Path(wonderwords.__file__).parent / "assets"
    profane = set((assets / "profanitylist.txt").read_text(encoding="utf-8").lower().split())
    lists = {}
    for slot, name in (("N", "nounlist.txt"), ("V", "verblist.txt"), ("A", "adjectivelist.txt")):
        text = (assets / name).read_text(encoding="utf-8")
        words = sorted({w for w in text.split() if re.fullmatch(r"[a-z]+", w) and w not in profane})
        if len(words) < 100:
            raise RuntimeError(f"{assets / name}: expected a word list, found {len(words)} words")
        lists[slot] = tuple(words)
    return lists


def make_sentence(rng: np.random.Generator, words: dict[str, tuple[str, ...]]) -> str:
    """Fill one template; ``a`` becomes ``an`` before a vowel letter."""
    slots = {"D": DETERMINERS, "S": PRONOUNS, "M": MODALS, "P": PREPOSITIONS, "R": ADVERBS, **words}
    template = TEMPLATES[rng.integers(len(TEMPLATES))]
    text = re.sub(r"\{(\w)\}", lambda m: slots[m.group(1)][rng.integers(len(slots[m.group(1)]))], template)
    text = re.sub(r"\ba (?=[aeiou])", "an ", text)
    return text[0].upper() + text[1:]


def make_speakers(rng: np.random.Generator, count: int, taken: list[dict] = ()) -> list[dict]:
    """``count`` distinct speakers, none of them one of ``taken``: gender, voice (accent + variant),
    pitch, range, rate, word gap."""
    speakers, seen = [], {tuple(t.values()) for t in taken}
    while len(speakers) < count:
        gender = "m" if rng.random() < MALE_SHARE else "f"
        voice = f"{ACCENTS[rng.integers(len(ACCENTS))]}+{VARIANTS[gender][rng.integers(len(VARIANTS[gender]))]}"
        # espeak-ng pitch 0-100 (50 = the variant's own); men lower, women higher
        pitch = int(rng.integers(20, 60) if gender == "m" else rng.integers(40, 85))
        speaker = dict(gender=gender, voice=voice, pitch=pitch, range=int(rng.integers(20, 95)),
                       rate=int(rng.integers(140, 215)), word_gap=int(rng.integers(0, 4)))
        key = tuple(speaker.values())
        if key not in seen:
            seen.add(key)
            speakers.append(speaker)
    return speakers


def main() -> None:
    args = stage_args(0, __doc__.splitlines()[0])
    size = SIZES[args.size]
    with run_stage(args.root, 0, args.size, args.seed) as run:
        if not run:
            return
        rng = np.random.default_rng([args.seed, 0])
        words = word_lists()
        speakers = make_speakers(rng, sum(size.core))  # the core speakers (layout.Size), drawn first
        order = rng.permutation(len(speakers))  # speaker-disjoint splits
        # The rest of dev and test, after every core speaker and from a stream of their own: the
        # training speakers and sentences are the core draw's.
        added = [n - c for n, c in zip(size.speakers, size.core)]
        speakers += make_speakers(np.random.default_rng([args.seed, 0, 1]), sum(added), taken=speakers)
        table, seen_text = {}, set()
        first, first_added = 0, sum(size.core)
        for split, n_core, n_added in zip(SPLITS, size.core, added):
            prompts = {}
            counts = {"m": 0, "f": 0}
            chosen = list(order[first:first + n_core]) + list(range(first_added, first_added + n_added))
            first, first_added = first + n_core, first_added + n_added
            n_spk = len(chosen)
            for index in chosen:
                sp = speakers[index]
                counts[sp["gender"]] += 1
                # TIMIT-like ids: gender letter + number; utterance ids start with the speaker id
                spk = f"{sp['gender']}{len(table):03d}"
                table[spk] = f"{split} {sp['gender']} {sp['voice']} {sp['pitch']} {sp['range']} {sp['rate']} {sp['word_gap']}"
                for k in range(size.utts_per_speaker):
                    text = make_sentence(rng, words)
                    while text in seen_text:
                        text = make_sentence(rng, words)
                    seen_text.add(text)
                    prompts[f"{spk}_s{k:02d}"] = text
            write_table(args.root / "data" / "local" / split / "prompts.txt", prompts)
            print(f"{split}: {n_spk} speakers ({counts['m']} m, {counts['f']} f), {len(prompts)} sentences")
        write_table(args.root / "data" / "local" / "speakers.txt", table)


if __name__ == "__main__":
    main()

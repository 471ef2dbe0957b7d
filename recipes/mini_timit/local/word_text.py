"""The word task's text: transcripts normalised as WSJ's, its data dirs, and the LM training text.

Normalisation as WSJ's transcripts: upper case, punctuation removed, one space between words (the
prompts hold only letters, spaces and ``. , ?``; anything else is an error naming the utterance).

``data/<split>_words/`` is ``data/<split>/`` with word transcripts: every other table is copied
byte for byte, so both tasks read the same features (absolute paths into ``data/<split>/data``), and
so is ``conf/``, the options they were computed with.

The LM training text is drawn from the same templates and word lists as the prompts
(``prepare_text.make_sentence``), seeded apart from them, plus the training prompts; a drawn
sentence that equals a dev or test prompt is dropped, so the LM never sees a dev or test sentence.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from recipes.mini_timit.local.layout import SPLITS, copy_conf, read_table, write_table
from recipes.mini_timit.local.prepare_text import make_sentence, word_lists

# generated LM sentences per size, besides the training prompts: several thousand for the default
# size (about 14 per vocabulary word); fewer for tiny, whose graph must build in a second
LM_SENTENCES = {"default": 6000, "tiny": 50}
# the tables of data/<split> that the word data dirs share (text is the word transcript instead)
SHARED_TABLES = ("wav.scp", "utt2spk", "spk2utt", "spk2gender", "feats.scp", "cmvn.scp", "feats_mfcc.scp",
                 "cmvn_mfcc.scp", "utt2num_frames", "utt2dur")


def normalise(sentence: str, where: str = "") -> list[str]:
    """WSJ-style words of a prompt: upper case, punctuation removed.

    >>> normalise("When the cat is calm, I will go.")
    ['WHEN', 'THE', 'CAT', 'IS', 'CALM', 'I', 'WILL', 'GO']
    """
    if re.search(r"[^A-Za-z .,?']", sentence):
        raise ValueError(f"{where}: unexpected characters in {sentence!r}")
    words = re.sub(r"[.,?]", " ", sentence).upper().split()
    if not words:
        raise ValueError(f"{where}: empty sentence")
    return words


def read_prompts(root: Path) -> dict[str, dict[str, str]]:
    """``{split: {utt: prompt}}`` from ``data/local/<split>/prompts.txt``."""
    return {split: read_table(Path(root) / "data" / "local" / split / "prompts.txt") for split in SPLITS}


def write_word_data_dir(root: Path, split: str, prompts: dict[str, str]) -> dict[str, list[str]]:
    """``data/<split>_words``: the tables of ``data/<split>`` and word transcripts; returns them."""
    source, target = Path(root) / "data" / split, Path(root) / "data" / f"{split}_words"
    utts = set(read_table(source / "utt2spk"))
    if set(prompts) != utts:
        raise ValueError(f"{source / 'utt2spk'} and data/local/{split}/prompts.txt list different utterances: "
                         f"{sorted(set(prompts) ^ utts)[:3]}")
    text = {u: normalise(p, f"data/local/{split}/prompts.txt: utterance {u}") for u, p in prompts.items()}
    target.mkdir(parents=True, exist_ok=True)
    for name in SHARED_TABLES:
        write_table(target / name, read_table(source / name))  # same rows, sorted, written atomically
    copy_conf(source, target)
    write_table(target / "text", {u: " ".join(words) for u, words in text.items()})
    return text


def drawn_sentences(prompts: dict[str, dict[str, str]], size: str, seed: int) -> tuple[list[str], int]:
    """The drawn part of the LM training text: ``LM_SENTENCES[size]`` sentences, none a dev or test prompt.

    Returns the sentences (with their punctuation, as espeak-ng reads them) and how many draws
    were dropped because they equal a dev or test prompt. The training prompts are the rest of the
    LM training text.
    """
    held_out = {tuple(normalise(p)) for split in ("dev", "test") for p in prompts[split].values()}
    rng = np.random.default_rng([seed, 3])  # prepare_text draws from [seed, 0]: another stream
    words = word_lists()
    drawn, dropped = [], 0
    while len(drawn) < LM_SENTENCES[size]:
        sentence = make_sentence(rng, words)
        if tuple(normalise(sentence)) in held_out:
            dropped += 1
            continue
        drawn.append(sentence)
    return drawn, dropped

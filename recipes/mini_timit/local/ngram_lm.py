"""Word n-gram LMs: interpolated Kneser-Ney estimation, relative-entropy pruning, ARPA, perplexity.

Hand-written because no installable package estimates n-grams here: KenLM's ``lmplz`` and SRILM's
``ngram-count`` are compiled programs (a compiler and their sources would be needed), and the pip
packages that exist only read ARPA files. The corpus's text is small (a few thousand sentences), so
plain Python dictionaries are fast enough.

Estimation (Chen and Goodman's interpolated Kneser-Ney, one discount per order): the highest order
counts n-grams; each lower order counts, for an n-gram, the distinct words seen before it (its
continuation count), except n-grams starting with ``<s>``, which nothing precedes (raw counts, as
KenLM does). With ``a(h w)`` those counts and ``D_n = n1 / (n1 + 2 n2)`` from their counts of
counts::

    p(w | h) = max(a(h w) - D, 0) / a(h .) + gamma(h) p(w | h'),   gamma(h) = D N1+(h .) / a(h .)

where ``h'`` drops the oldest word; the unigrams interpolate with the uniform distribution over the
vocabulary, so every word of the vocabulary (seen in the text or not) has a probability. In ARPA
form a listed n-gram holds the interpolated probability and ``gamma(h)`` is the backoff weight of
``h``: the backoff model is then exactly the interpolated one.

Pruning (Stolcke 1998, as SRILM's ``-prune``): an n-gram of order >= 2 goes when dropping it (its
probability then comes from the backoff, whose weight is renormalised) raises the model's
perplexity by less than ``threshold`` (relative), each n-gram judged against the full model; an
n-gram that is the history of a kept longer one, or the state it backs off to, stays. Backoff
weights are then recomputed so that every history's distribution sums to one.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Iterable, Sequence

BOS, EOS = "<s>", "</s>"
Gram = tuple[str, ...]


@dataclass
class BackoffLM:
    """An ARPA-style backoff model: natural-log probabilities of the listed n-grams, and backoff weights."""

    order: int
    vocab: list[str]  # the words that can be predicted, </s> included, <s> not
    logprob: dict[Gram, float] = field(default_factory=dict)
    backoff: dict[Gram, float] = field(default_factory=dict)  # log gamma(h) of histories that have one

    def prob(self, word: str, history: Gram) -> float:
        """log p(word | history), backing off through shorter histories."""
        history = history[-(self.order - 1):] if self.order > 1 else ()
        penalty = 0.0
        while True:
            gram = history + (word,)
            if gram in self.logprob:
                return penalty + self.logprob[gram]
            if not history:
                raise KeyError(f"{word!r} is not in the LM's vocabulary")
            penalty += self.backoff.get(history, 0.0)
            history = history[1:]

    def counts(self) -> list[int]:
        """Number of listed n-grams per order (1 first)."""
        sizes = Counter(len(g) for g in self.logprob)
        return [sizes[n] for n in range(1, self.order + 1)]


def _padded(sentence: Sequence[str]) -> list[str]:
    return [BOS, *sentence, EOS]


def kneser_ney(sentences: Iterable[Sequence[str]], vocab: Iterable[str], order: int = 3) -> BackoffLM:
    """Interpolated Kneser-Ney model of the given order (see the module doc) over ``vocab`` (+ </s>)."""
    vocab = sorted(set(vocab) | {EOS}, key=str.encode)
    if BOS in vocab:
        raise ValueError(f"{BOS} cannot be a word of the vocabulary")
    known = set(vocab)
    raw: dict[int, Counter] = {n: Counter() for n in range(1, order + 1)}
    for sentence in sentences:
        unknown = set(sentence) - known
        if unknown:
            raise ValueError(f"LM training sentence {' '.join(sentence)!r} has words outside the vocabulary: "
                             f"{sorted(unknown)}")
        words = _padded(sentence)
        for n in range(1, order + 1):
            raw[n].update(tuple(words[i:i + n]) for i in range(len(words) - n + 1))
    del raw[1][(BOS,)]
    # adjusted counts: occurrences for the highest order and for n-grams after <s>, else continuations
    adjusted: dict[int, Counter] = {order: raw[order]}
    for n in range(order - 1, 0, -1):
        adjusted[n] = Counter({g: c for g, c in raw[n].items() if g[0] == BOS})
        adjusted[n].update(g[1:] for g in raw[n + 1])  # one per distinct word before (never <s>)
    lm = BackoffLM(order=order, vocab=vocab)
    for n in range(1, order + 1):
        grams = adjusted[n]
        count_of_counts = Counter(min(c, 3) for c in grams.values())
        n1, n2 = count_of_counts[1], count_of_counts[2]
        discount = n1 / (n1 + 2 * n2) if n1 and n2 else 0.5  # tiny texts lack singletons or doubletons
        totals: Counter = Counter()
        followers: Counter = Counter()
        for gram, count in grams.items():
            totals[gram[:-1]] += count
            followers[gram[:-1]] += 1
        gamma = {h: discount * followers[h] / totals[h] for h in totals}
        current: dict[Gram, float] = {}
        targets = grams if n > 1 else {(w,): 0 for w in vocab}
        for gram in targets:
            history, word = gram[:-1], gram[-1]
            below = 1.0 / len(vocab) if n == 1 else math.exp(lm.prob(word, history[1:]))
            seen = max(grams.get(gram, 0) - discount, 0) / totals[history] if totals[history] else 0.0
            current[gram] = seen + gamma.get(history, 1.0) * below
        for gram, p in current.items():
            lm.logprob[gram] = math.log(p)
        for history, g in gamma.items():
            if history:
                lm.backoff[history] = math.log(g)
    lm.logprob[(BOS,)] = -math.inf  # listed (it carries a backoff weight) but never predicted
    return lm


def _history_prob(lm: BackoffLM, history: Gram) -> float:
    """log P(history) by the chain rule, starting after <s> when the history does."""
    total, context = 0.0, ()
    for word in history:
        if word == BOS:
            context = (BOS,)
            continue
        total += lm.prob(word, context)
        context = context + (word,)
    return total


def _renormalise(lm: BackoffLM, histories: Iterable[Gram]) -> None:
    """Backoff weights that make each history's distribution sum to one again."""
    successors: dict[Gram, list[str]] = defaultdict(list)
    for gram in lm.logprob:
        if len(gram) > 1:
            successors[gram[:-1]].append(gram[-1])
    for history in histories:
        words = successors.get(history)
        if not words:
            lm.backoff.pop(history, None)
            continue
        listed = sum(math.exp(lm.logprob[history + (w,)]) for w in words)
        shorter = sum(math.exp(lm.prob(w, history[1:])) for w in words)
        lm.backoff[history] = math.log(max(1.0 - listed, 1e-12) / max(1.0 - shorter, 1e-12))


def prune(lm: BackoffLM, threshold: float) -> BackoffLM:
    """Relative-entropy pruning of the n-grams of order >= 2 (see the module doc); a new model."""
    successors: dict[Gram, list[str]] = defaultdict(list)
    for gram in lm.logprob:
        if len(gram) > 1:
            successors[gram[:-1]].append(gram[-1])
    doomed: set[Gram] = set()
    for n in range(lm.order, 1, -1):
        kept = [g for g in lm.logprob if len(g) == n + 1 and g not in doomed]
        needed = {g[:-1] for g in kept} | {g[1:] for g in kept}
        for history in sorted((h for h in successors if len(h) == n - 1), key=lambda h: " ".join(h).encode()):
            words = successors[history]
            listed = sum(math.exp(lm.logprob[history + (w,)]) for w in words)
            shorter = sum(math.exp(lm.prob(w, history[1:])) for w in words)
            numerator, denominator = 1.0 - listed, 1.0 - shorter  # backoff weight = numerator / denominator
            old_backoff = math.log(max(numerator, 1e-12) / max(denominator, 1e-12))
            p_history = math.exp(_history_prob(lm, history))
            for word in words:
                gram = history + (word,)
                if gram in needed:
                    continue  # the history (or the backoff state) of a kept longer n-gram
                p = math.exp(lm.logprob[gram])
                q = math.exp(lm.prob(word, history[1:]))
                new_backoff = math.log(max(numerator + p, 1e-12) / max(denominator + q, 1e-12))
                change = -p_history * (p * (new_backoff + math.log(q) - math.log(p))
                                       + numerator * (new_backoff - old_backoff))
                if math.expm1(change) < threshold:
                    doomed.add(gram)
    pruned = BackoffLM(order=lm.order, vocab=list(lm.vocab),
                       logprob={g: p for g, p in lm.logprob.items() if g not in doomed}, backoff=dict(lm.backoff))
    for n in range(1, lm.order):  # shorter histories first: longer ones back off through them
        _renormalise(pruned, [h for h in lm.backoff if len(h) == n])
    return pruned


def _log10(x: float) -> str:
    return "-99" if x == -math.inf else f"{x / math.log(10):.7f}"


def arpa_text(lm: BackoffLM) -> str:
    """The model in ARPA format (log10; n-grams sorted in the C locale within each order)."""
    counts = lm.counts()
    lines = ["", "\\data\\", *(f"ngram {n}={c}" for n, c in enumerate(counts, 1))]
    for n in range(1, lm.order + 1):
        lines += ["", f"\\{n}-grams:"]
        for gram in sorted((g for g in lm.logprob if len(g) == n), key=lambda g: " ".join(g).encode()):
            entry = f"{_log10(lm.logprob[gram])}\t{' '.join(gram)}"
            if gram in lm.backoff and n < lm.order:
                entry += f"\t{_log10(lm.backoff[gram])}"
            lines.append(entry)
    return "\n".join(lines + ["", "\\end\\", ""])


def read_arpa(text: str, where: str = "<arpa>") -> BackoffLM:
    """Parse an ARPA model (as :func:`arpa_text` writes it) back into a :class:`BackoffLM`."""
    logprob, backoff, order, section = {}, {}, 0, None
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line == "\\data\\" or line == "\\end\\":
            continue
        if line.startswith("ngram "):
            order = max(order, int(line.split("=")[0].split()[1]))
        elif line.startswith("\\") and line.endswith("-grams:"):
            section = int(line[1:].split("-")[0])
        else:
            fields = line.split("\t")
            if section is None or len(fields) not in (2, 3) or len(fields[1].split()) != section:
                raise ValueError(f"{where}:{number}: not an ARPA n-gram line: {line!r}")
            gram = tuple(fields[1].split())
            logprob[gram] = -math.inf if fields[0] == "-99" else float(fields[0]) * math.log(10)
            if len(fields) == 3:
                backoff[gram] = float(fields[2]) * math.log(10)
    vocab = sorted({g[0] for g in logprob if len(g) == 1} - {BOS}, key=str.encode)
    return BackoffLM(order=order, vocab=vocab, logprob=logprob, backoff=backoff)


@dataclass(frozen=True)
class Perplexity:
    """What SRILM's ``ngram -ppl`` reports: OOV words are left out of the perplexity and counted."""

    sentences: int
    words: int
    oovs: int
    logprob: float  # natural log, over the predicted words and </s>

    @property
    def perplexity(self) -> float:
        return math.exp(-self.logprob / (self.words - self.oovs + self.sentences))

    @property
    def oov_rate(self) -> float:
        return 100.0 * self.oovs / self.words if self.words else 0.0


def perplexity(lm: BackoffLM, sentences: Iterable[Sequence[str]]) -> Perplexity:
    """Perplexity of ``sentences`` (each with </s>); an OOV word is skipped and resets the history."""
    known = set(lm.vocab)
    n_sentences = n_words = n_oov = 0
    total = 0.0
    for sentence in sentences:
        n_sentences += 1
        history: Gram = (BOS,)
        for word in [*sentence, EOS]:
            if word != EOS:
                n_words += 1
            if word not in known:
                n_oov += 1
                history = ()
                continue
            total += lm.prob(word, history)
            history = (history + (word,))[-(lm.order - 1):]
    return Perplexity(n_sentences, n_words, n_oov, total)

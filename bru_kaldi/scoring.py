"""Error rates from Kaldi ``text`` files: WER/PER with Kaldi's ins/del/sub counts, per utterance.

Alignment is kaldialign's (the same counts as Kaldi's ``compute-wer``). Before alignment, references and
hypotheses alike go through the corpus's scoring filter, ``[decoding] scoring``: ``plain`` (tokens as they
are), or a filter file. A filter belongs to its corpus, not to the library: it is data, kept by the corpus's
recipe as ``recipes/<corpus>/scoring_filter.txt`` and named by the corpus (``timit``: the 48 training phones
folded to the 39 scoring classes; ``wsj``: the noise words dropped; ``ami``: hesitations and noise markers
dropped), or any file given by its path. The format, one rule a line, ``#`` to the end of a line a comment::

    uh ah          # the token on the left is scored as the one on the right
    [cough]        # a token alone is not scored

An utterance with a reference but no hypothesis (a failed decode, or every token filtered away)
counts as all deletions and is listed in :attr:`Score.missing`; it is never dropped silently.

>>> refs = {"u1": "sil ao r ix sil".split(), "u2": "b zh".split()}
>>> hyps = {"u1": "sil aa r ih".split()}
>>> s = score(refs, hyps, "timit")
>>> s.total.kaldi_line(), s.missing
('%WER 42.86 [ 3 / 7, 0 ins, 3 del, 0 sub ]', ['u2'])
"""

from __future__ import annotations

import difflib
import functools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Mapping, Sequence

import kaldialign

from bru_kaldi.atomic import write_text_atomically

# Where a corpus's recipe keeps its scoring filter: a name in [decoding] scoring is <RECIPES>/<name>/<FILTER_FILE>.
RECIPES = Path(__file__).resolve().parents[1] / "recipes"
FILTER_FILE = "scoring_filter.txt"
PLAIN = "plain"  # no filter


@dataclass(frozen=True)
class TokenFilter:
    """A scoring filter: tokens scored as others (``fold``), tokens not scored (``drop``); see the module docstring.

    >>> TokenFilter({"uh": "ah"}, frozenset({"[cough]"}))("uh [cough] b".split())
    ['ah', 'b']
    """

    fold: Mapping[str, str] = field(default_factory=dict)
    drop: frozenset = frozenset()

    def __call__(self, tokens: Iterable[str]) -> list[str]:
        return [self.fold.get(t, t) for t in tokens if t not in self.drop]


def read_filter(path) -> TokenFilter:
    """A filter file (the module docstring's format); a line of more than two tokens, or a token given two
    rules, is a ``ValueError`` naming the file and the line."""
    fold, drop, seen = {}, set(), {}
    for number, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        fields = line.split("#", 1)[0].split()
        if not fields:
            continue
        if len(fields) > 2 or fields[0] in seen:
            why = "expected 'token' or 'token replacement'" if len(fields) > 2 else f"{fields[0]} has a rule on line {seen.get(fields[0])}"
            raise ValueError(f"{path}:{number}: {why}, got {line.strip()!r}")
        seen[fields[0]] = number
        if len(fields) == 2:
            fold[fields[0]] = fields[1]
        else:
            drop.add(fields[0])
    return TokenFilter(fold, frozenset(drop))


def corpus_filters() -> list[str]:
    """The corpora whose recipe keeps a scoring filter (``recipes/<corpus>/scoring_filter.txt``)."""
    return sorted(p.parent.name for p in RECIPES.glob(f"*/{FILTER_FILE}"))


def filter_path(scoring: str) -> Path | None:
    """The filter file ``[decoding] scoring`` names: ``None`` for ``plain``, a corpus's recipe's, or a path to one.
    Raises ``ValueError`` naming what is accepted when it is none of them."""
    if scoring == PLAIN:
        return None
    recipe = RECIPES / scoring / FILTER_FILE
    if "/" not in scoring and recipe.is_file():
        return recipe
    if Path(scoring).is_file():
        return Path(scoring)
    close = difflib.get_close_matches(scoring, corpus_filters(), n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    raise ValueError(f"scoring {scoring!r}{hint} is neither {PLAIN}, a corpus whose recipe keeps a scoring filter "
                     f"({', '.join(corpus_filters())}: recipes/<corpus>/{FILTER_FILE}) nor a filter file")


@functools.lru_cache(maxsize=None)
def scoring_filter(scoring: str) -> TokenFilter:
    """The filter ``[decoding] scoring`` names (:func:`filter_path`), read once."""
    path = filter_path(scoring)
    return TokenFilter() if path is None else read_filter(path)


def filter_tokens(tokens: Iterable[str], scoring: str) -> list[str]:
    """Apply the scoring filter ``scoring`` names (:func:`filter_path`) to a token sequence."""
    return scoring_filter(scoring)(tokens)


@dataclass
class ErrorCounts:
    """Insertions, deletions and substitutions against ``ref_len`` reference tokens."""

    ins: int = 0
    dels: int = 0
    subs: int = 0
    ref_len: int = 0

    @property
    def errors(self) -> int:
        return self.ins + self.dels + self.subs

    @property
    def rate(self) -> float:
        """Error rate in percent (Kaldi prints 0 errors over 0 tokens as 0)."""
        return 100.0 * self.errors / self.ref_len if self.ref_len else 0.0

    def __add__(self, other: "ErrorCounts") -> "ErrorCounts":
        return ErrorCounts(self.ins + other.ins, self.dels + other.dels, self.subs + other.subs, self.ref_len + other.ref_len)

    def kaldi_line(self) -> str:
        """Kaldi's compute-wer summary: ``%WER 12.34 [ 123 / 997, 10 ins, 20 del, 93 sub ]``."""
        return f"%WER {self.rate:.2f} [ {self.errors} / {self.ref_len}, {self.ins} ins, {self.dels} del, {self.subs} sub ]"


@dataclass
class Score:
    """A scored set: totals, per-utterance counts (for matched-pair tests) and what was missing."""

    total: ErrorCounts
    per_utterance: dict[str, ErrorCounts] = field(default_factory=dict)
    missing: list[str] = field(default_factory=list)  # references without a hypothesis
    extra: list[str] = field(default_factory=list)  # hypotheses without a reference (not scored)


def score(refs: Mapping[str, Sequence[str]], hyps: Mapping[str, Sequence[str]], scoring: str = "plain") -> Score:
    """Align each reference with its hypothesis after the corpus filter; sum Kaldi-style counts."""
    per_utterance, missing, total = {}, [], ErrorCounts()
    for utt in sorted(refs):
        ref = filter_tokens(refs[utt], scoring)
        if utt not in hyps:
            missing.append(utt)
        hyp = filter_tokens(hyps.get(utt, ()), scoring)
        d = kaldialign.edit_distance(ref, hyp)
        counts = ErrorCounts(d["ins"], d["del"], d["sub"], len(ref))
        per_utterance[utt] = counts
        total = total + counts
    extra = sorted(set(hyps) - set(refs))
    return Score(total, per_utterance, missing, extra)


def read_text(path) -> dict[str, list[str]]:
    """Read a Kaldi ``text`` file (``utt-id token token ...`` per line) into token lists."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"transcript file {path} does not exist")
    table = {}
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        parts = line.split()
        if not parts:
            continue
        if parts[0] in table:
            raise ValueError(f"{path}:{number}: utterance {parts[0]} appears twice")
        table[parts[0]] = parts[1:]
    return table


def write_text(table: Mapping[str, Sequence[str]], path) -> None:
    """Write token lists as a Kaldi ``text`` file, sorted by utterance id (C locale), atomically."""
    write_text_atomically(path, "".join(" ".join([utt, *table[utt]]) + "\n" for utt in sorted(table)))


def write_per_utterance(result: Score, path) -> None:
    """Per-utterance counts, one line each: ``utt ref_len errors ins del sub`` (for significance tests)."""
    lines = ["# utt ref_len errors ins del sub\n"]
    lines += [f"{utt} {c.ref_len} {c.errors} {c.ins} {c.dels} {c.subs}\n" for utt, c in sorted(result.per_utterance.items())]
    write_text_atomically(path, "".join(lines))


def main(argv=None) -> None:
    """Command line: ``filter SCORING`` (stdin to stdout, used by kaldi_decoding_scripts/score.sh) or ``score``."""
    import argparse
    import sys

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    filtering = commands.add_parser("filter", help="apply a corpus filter to a Kaldi text stream on stdin")
    filtering.add_argument("scoring", help=f"{PLAIN}, a corpus with a filter in its recipe ({', '.join(corpus_filters())}) or a filter file")
    scorer = commands.add_parser("score", help="score a hypothesis text file against a reference text file")
    scorer.add_argument("--scoring", default=PLAIN, help="as for filter")
    scorer.add_argument("ref")
    scorer.add_argument("hyp")
    scorer.add_argument("--against", metavar="HYP2", help="a second hypothesis file of the same utterances: the "
                        "difference (HYP2 - HYP), its matched-pairs test and the probability that HYP2 is better")
    args = parser.parse_args(argv)
    try:
        scoring_filter(args.scoring)
    except (ValueError, OSError) as error:
        parser.error(str(error))
    if args.command == "filter":
        for line in sys.stdin:
            parts = line.split()
            if parts:
                print(" ".join([parts[0], *filter_tokens(parts[1:], args.scoring)]))
        return
    refs = read_text(args.ref)
    result = score(refs, read_text(args.hyp), args.scoring)
    print(result.total.kaldi_line())
    if result.missing:
        print(f"{len(result.missing)} utterance(s) without a hypothesis, counted as deletions: {' '.join(result.missing[:10])}")
    if args.against:
        print(compared(result, score(refs, read_text(args.against), args.scoring), args.against))


def compared(a: Score, b: Score, name: str) -> str:
    """B against A on the same utterances, one line: B's error rate, the difference in points, the
    matched-pairs test over utterances and the bootstrap probability that B is better (Kaldi's
    ``compute-wer-bootci``); one system each, so the only variation is the test set's."""
    from bru_kaldi.comparison import statistics

    utts = sorted(a.per_utterance)
    errors_a, errors_b = ([s.per_utterance[u].errors for u in utts] for s in (a, b))
    lengths = [a.per_utterance[u].ref_len for u in utts]
    paired = statistics.matched_pairs(errors_a, errors_b)
    better = statistics.bootstrap_probability_of_improvement(errors_a, errors_b, lengths)
    return (f"{name}: {b.total.kaldi_line()}, {b.total.rate - a.total.rate:+.2f} points; matched pairs "
            f"p = {paired.p_value:.2g}; probability of improvement {better:.3f}")


if __name__ == "__main__":
    main()

"""Word timings from a best path, as a CTM (``utt channel start duration word``) for sclite users.

Kaldi gets them with ``lattice-align-words`` and ``nbest-to-ctm``: the path's transition-ids are cut
into phone instances (the TransitionModel's ``SplitToPhones``), and the lang directory's
``phones/word_boundary.int`` says where words begin and end: a ``begin`` phone opens a word, ``end``
closes it, ``singleton`` is a word alone, ``internal`` continues one, ``nonword`` (silence) lies
between words. The n-th word so found is the n-th word of the path. A graph without
``word_boundary.int`` (a phone recogniser whose words are its phones) has no word timings to give.

>>> boundary = {1: "nonword", 2: "begin", 3: "end", 4: "singleton"}
>>> phones = [(1, 0, 10), (2, 10, 14), (3, 14, 20), (4, 20, 27), (1, 27, 30)]  # (phone, first frame, end frame)
>>> word_spans(phones, boundary)
[(10, 20), (20, 27)]
"""

from __future__ import annotations

from pathlib import Path
from typing import Mapping, Optional, Sequence

import numpy as np

FRAME_SHIFT = 0.01  # seconds per frame (Kaldi's default 10 ms shift)
BOUNDARIES = ("nonword", "begin", "end", "internal", "singleton")


def read_word_boundary(graph_dir) -> Optional[dict[int, str]]:
    """``phones/word_boundary.int`` of a graph (or lang) directory as ``{phone: kind}``; None without one."""
    path = Path(graph_dir) / "phones" / "word_boundary.int"
    if not path.is_file():
        return None
    table = {}
    for number, line in enumerate(path.read_text().splitlines(), 1):
        parts = line.split()
        if len(parts) != 2 or not parts[0].isdigit() or parts[1] not in BOUNDARIES:
            raise ValueError(f"{path}:{number}: expected 'phone-id {'|'.join(BOUNDARIES)}', got {line!r}")
        table[int(parts[0])] = parts[1]
    return table


def word_spans(phones: Sequence[tuple[int, int, int]], boundary: Mapping[int, str]) -> list[tuple[int, int]]:
    """``(first frame, end frame)`` of each word, from ``(phone, first frame, end frame)`` of each phone
    instance of a path. Raises ``ValueError`` on a phone sequence no lexicon could have made."""
    spans, start = [], None
    for phone, first, end in phones:
        kind = boundary.get(phone)
        if kind is None:
            raise ValueError(f"phone {phone} is not in word_boundary.int")
        if kind == "singleton" and start is None:
            spans.append((first, end))
        elif kind == "begin" and start is None:
            start = first
        elif kind == "internal" and start is not None:
            continue
        elif kind == "end" and start is not None:
            spans.append((start, end))
            start = None
        elif kind == "nonword" and start is None:
            continue
        else:
            raise ValueError(f"a {kind} phone ({phone}) at frame {first} where a word is "
                             f"{'open' if start is not None else 'not open'}")
    if start is not None:
        raise ValueError("the path ends inside a word")
    return spans


def path_word_spans(alignment: Sequence[int], model, boundary: Mapping[int, str]) -> list[tuple[int, int]]:
    """``(first frame, end frame)`` of each word of a best path: ``alignment`` (transition-id per frame)
    cut into phones by the TransitionModel ``model`` that made the graph, then :func:`word_spans`."""
    phones, frame = [], 0
    for piece in model.split_to_phones(np.asarray(alignment, dtype=np.int32)):
        phones.append((int(model.tid2phone[piece[0]]), frame, frame + len(piece)))
        frame += len(piece)
    return word_spans(phones, boundary)


def ctm_lines(utt: str, alignment: Sequence[int], words: Sequence[str], model, boundary: Mapping[int, str],
              frame_shift: float = FRAME_SHIFT) -> list[str]:
    """CTM lines of one utterance's best path: ``alignment`` (transition-id per frame), its ``words``
    (symbols, in order) and the TransitionModel ``model`` that made the graph."""
    spans = path_word_spans(alignment, model, boundary)
    if len(spans) != len(words):
        raise ValueError(f"utterance {utt}: the path has {len(words)} words but its phones make {len(spans)}")
    return [f"{utt} 1 {first * frame_shift:.2f} {(end - first) * frame_shift:.2f} {word}"
            for (first, end), word in zip(spans, words)]

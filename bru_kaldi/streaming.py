"""A trained model on audio as it arrives: features, network and decoder advanced chunk by chunk.

:class:`Stream` decodes one file or pipe. Each chunk of samples goes through kaldi-native-fbank's
online extractor of every input stream; its new frames through causal CMVN
(``transcription.normalisers``) and ``feature_transforms.OnlineContext`` (deltas and splicing: a frame
waits for the frames its window reaches, :func:`check_streamable`); the global normalisation; the network
chunk by chunk, each layer carrying its recurrent state (``AcousticModel.stream``; batch norm on its
running statistics; a bidirectional layer or a backward recursion is refused); and kaldi-decoder's
``FasterDecoder`` (Kaldi's faster-decoder.cc, the search the offline decode runs), advanced over the
new frames only (``DecodableCtc`` with the frames' offset). The best partial path after each chunk is
the partial hypothesis; at the end of the input, the best path as offline.

:func:`word_latencies` measures what a listener waits: from the end of a word's audio (its end in the
final best path) to the moment it appears in the partial hypotheses for good, the moment a chunk's
processing ends when chunks arrive in real time.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

import kaldi_hmm_gmm  # noqa: F401  (before kaldifst and kaldi_decoder: see decoding.utterance)
import kaldi_decoder
import kaldifst
import numpy as np
import torch

from bru_kaldi import decoding
from bru_kaldi.decoding.ctm import path_word_spans, read_word_boundary
from bru_kaldi.decoding.utterance import load_graph, transition_loglikes, with_word_penalty
from bru_kaldi.feature_transforms import OnlineContext
from bru_kaldi.frontend import frames_ready
from bru_kaldi.kaldi.transition_model import read_transition_model
from bru_kaldi.transcription import TranscribeError, Trained


class Searcher:
    """What every stream of a model shares: the graph (with the chosen insertion penalty on its word
    arcs), its words, the transition model and the decoder's options; loaded once."""

    def __init__(self, trained: Trained):
        graph_dir, model_file = trained.graph_dir, trained.folder / "final.mdl"
        try:
            self.model = read_transition_model(model_file)
            self.words = decoding.read_words(graph_dir / "words.txt")
            graph = decoding.load_graph(graph_dir / "HCLG.fst")
            decoding.check_graph(graph, self.model.num_transition_ids, self.words, graph_dir / "HCLG.fst", model_file,
                                 graph_dir / "words.txt")
        except (ValueError, OSError) as error:
            raise TranscribeError(f"{trained.folder}: {error}") from None
        penalty = trained.decoding.wip_sweep[0]
        self.graph = with_word_penalty(graph, penalty) if penalty else graph
        self.boundary = read_word_boundary(graph_dir)
        d = trained.decoding
        self.options = kaldi_decoder.FasterDecoderOptions(beam=d.beam, max_active=d.max_active, min_active=d.min_active)
        self.scale = d.acwt


def check_streamable(trained: Trained) -> int:
    """Refuse a network that reads the future (a bidirectional layer, a backward recursion): one frame of
    zeros through ``AcousticModel.stream`` finds the layer. Returns the lookahead of the input's context:
    the frames after a frame that its deltas and spliced right context reach."""
    try:
        with torch.no_grad():
            trained.network.stream(torch.zeros(1, 1, trained.network.input_size))
    except ValueError as error:
        raise TranscribeError(f"{trained.folder}: the model cannot stream: {error}") from None
    return max(OnlineContext(s.options.delta_order, s.options.delta_window, s.cw_left, s.cw_right).lookahead
               for s in trained.streams)


@dataclass
class Partial:
    """The hypothesis after one chunk: its words, the audio heard so far, and the seconds the chunk took,
    on the wall clock and in this process's CPU time (what it costs on a core to itself, whatever else
    the machine runs)."""

    words: list[str]
    audio_seconds: float
    compute_seconds: float
    cpu_seconds: float = 0.0


@dataclass
class Outcome:
    """One stream's end: the words, the best path's transition-ids, each word's (first, end) output frame
    (empty for a phone graph), and the partial hypotheses, one per chunk (the last is the final one)."""

    words: list[str]
    alignment: list[int]
    spans: list[tuple[int, int]]
    partials: list[Partial] = field(default_factory=list)


class Stream:
    """One file (or pipe) decoded as it arrives: :meth:`accept` each chunk of int16-scale samples at the
    model's rate, then :meth:`finish`. ``cmvn``: one causal function per input stream
    (``transcription.normalisers``)."""

    def __init__(self, trained: Trained, searcher: Searcher, cmvn: Sequence[Callable], name: str):
        self.trained, self.searcher, self.name = trained, searcher, name
        self.extractors = [s.front_end.online() for s in trained.streams]
        self.read = [0] * len(self.extractors)  # frames taken from each extractor
        self.cmvn = list(cmvn)
        self.contexts = [OnlineContext(s.options.delta_order, s.options.delta_window, s.cw_left, s.cw_right)
                         for s in trained.streams]
        self.waiting = [np.zeros((0, s.width), dtype=np.float32) for s in trained.streams]
        self.states = None  # the network's, per stack
        self.inputs = 0  # network input frames so far (the output keeps every subsampling-th)
        self.decoder = kaldi_decoder.FasterDecoder(searcher.graph, searcher.options)
        self.decoder.init_decoding()
        self.decoded = 0  # output frames given to the decoder
        self.samples = 0
        self.partials: list[Partial] = []

    def accept(self, samples: np.ndarray) -> Partial:
        """Feed a chunk; returns the partial hypothesis after it (also kept in :attr:`partials`)."""
        started = time.perf_counter(), time.process_time()
        self.samples += len(samples)
        for extractor in self.extractors:
            extractor.accept_waveform(self.trained.sample_rate, np.asarray(samples, dtype=np.float32))
        self._advance(final=False)
        return self._partial(self._best()[0], started)

    def finish(self) -> Outcome:
        """The end of the input: the last frames, and the best path as offline (to a final state if one
        was reached)."""
        started = time.perf_counter(), time.process_time()
        for extractor in self.extractors:
            extractor.input_finished()
        self._advance(final=True)
        if self.decoded == 0:
            raise TranscribeError(f"{self.name}: {self.samples / self.trained.sample_rate:.3f} s of audio, shorter than "
                                  "one frame")
        words, alignment = self._best(final=True)
        if words is None:
            raise TranscribeError(f"{self.name}: no path survived the search (widen [decoding] beam)")
        self._partial(words, started)
        spans = path_word_spans(alignment, self.searcher.model, self.searcher.boundary) \
            if self.searcher.boundary is not None else []
        return Outcome(words, alignment, spans, self.partials)

    def _partial(self, words: Optional[list[str]], started: tuple[float, float]) -> Partial:
        partial = Partial(words or [], self.samples / self.trained.sample_rate, time.perf_counter() - started[0],
                          time.process_time() - started[1])
        self.partials.append(partial)
        return partial

    @torch.no_grad()
    def _advance(self, final: bool) -> None:
        """Every frame that is complete now, through CMVN, context, the network and the decoder."""
        for k, (extractor, stream) in enumerate(zip(self.extractors, self.trained.streams)):
            raw = frames_ready(extractor, self.read[k], stream.dim)
            self.read[k] += len(raw)
            ready = self.contexts[k].push(self.cmvn[k](raw) if len(raw) else raw, final=final)
            self.waiting[k] = np.concatenate([self.waiting[k], ready])
        count = min(len(w) for w in self.waiting)  # every stream frames alike: they keep pace
        if count == 0:
            return
        x = self.trained.norm.apply(np.concatenate([w[:count] for w in self.waiting], axis=1))
        self.waiting = [w[count:] for w in self.waiting]
        out, self.states = self.trained.network.stream(torch.from_numpy(x)[None], self.states)
        factor = self.trained.subsampling
        # the output frames the whole sequence would keep: input frames 0, factor, 2 factor ...
        first = -self.inputs % factor
        self.inputs += count
        out = {"senone": out["senone"][:, first::factor]}
        scores = self.trained.loglikes(out)
        if len(scores):
            ids = transition_loglikes(scores, self.searcher.model.tid2pdf, self.searcher.scale)
            self.decoder.advance_decoding(kaldi_decoder.DecodableCtc(ids, offset=self.decoded))
            self.decoded += len(ids)

    def _best(self, final: bool = False) -> tuple[Optional[list[str]], list[int]]:
        """The best path so far: words and transition-ids, or ``(None, [])`` when there is none yet."""
        if self.decoded == 0:
            return None, []
        ok, path = self.decoder.get_best_path(use_final_probs=final and self.decoder.reached_final())
        if not ok:
            return None, []
        ok, alignment, labels, _ = kaldifst.get_linear_symbol_sequence(path)
        return [self.searcher.words[w] for w in labels], list(alignment)


def common_prefix(a: Sequence[str], b: Sequence[str]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def word_latencies(partials: Sequence[Partial], spans: Sequence[tuple[int, int]], frame_shift: float,
                   cpu: bool = False) -> list[float]:
    """Seconds from the end of each final word's audio to its appearance for good, chunks arriving in real time.

    Chunk ``i`` arrives when its audio has been heard (``partials[i].audio_seconds``), and is processed once
    it has arrived and the chunk before it is done: its hypothesis is shown at ``shown[i] = max(heard_i,
    shown[i-1]) + compute_i``, ``compute_i`` its wall-clock seconds (``cpu``: its CPU seconds). Word ``k`` of the final hypothesis (the last partial) appears for good at the
    first chunk from which on every hypothesis begins with the final words up to ``k``; its audio ends at
    ``spans[k][1] * frame_shift``.

    >>> p = [Partial(["a"], 0.2, 0.05), Partial(["a", "x"], 0.4, 0.05), Partial(["a", "b"], 0.5, 0.1)]
    >>> [round(v, 3) for v in word_latencies(p, [(0, 10), (10, 30)], 0.01)]  # a: 0.25 - 0.1; b: 0.6 - 0.3
    [0.15, 0.3]
    """
    final = partials[-1].words
    shown, clock = [], 0.0
    for p in partials:
        clock = max(clock, p.audio_seconds) + (p.cpu_seconds if cpu else p.compute_seconds)
        shown.append(clock)
    since = [len(partials) - 1] * len(final)  # the first chunk of the last run in which word k stays
    for i in range(len(partials) - 1, -1, -1):
        agree = common_prefix(partials[i].words, final)
        for k in range(agree):
            if since[k] == i + 1:
                since[k] = i
    return [shown[since[k]] - spans[k][1] * frame_shift for k in range(min(len(final), len(spans)))]

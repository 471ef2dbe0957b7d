#!/usr/bin/env python3
"""Use a trained model on new audio: one line per file, the file and then its words (phones, for a phone model).

Usage: python transcribe.py EXP_DIR AUDIO... [--cmvn sliding|file | --cmvn-from DATA_DIR] [--ctm] [--acwt S]
                            [--streaming [--chunk SECONDS]] [--channel N] [--decoder auto|kaldi|python]
 e.g.: python transcribe.py exp/MINIW_liBRU my_recording.wav
       python transcribe.py exp/MINIW_liBRU scp:recipes/mini_timit/data/test_words/wav.scp > hyp.txt
       python transcribe.py exp/MINIW_liBRU --streaming long_recording.wav
       arecord -f S16_LE -r 16000 -c 1 | python transcribe.py exp/MINIW_liBRU --streaming -

AUDIO is a WAV file of integer PCM (another sample rate than the model's is resampled with soxr, and the
log says so; of several channels, --channel picks one), ``scp:WAV_SCP`` (a Kaldi wav.scp of files: each
line is then named by its utterance id), or ``-``: raw 16-bit little-endian mono PCM at the model's rate on
standard input. Everything else comes from EXP_DIR, as ``run_exp.py`` trained and decoded it: the front end
of its features with their CMVN, deltas and splicing, the network, and the graph at the acoustic scale and
insertion penalty chosen on dev (``--acwt`` replaces the scale); offline, Kaldi's decoder when its binaries
are on PATH, else the Python one (``[decoding] decoder``, or ``--decoder``).

CMVN: the corpus normalised per speaker; for one file of a speaker never seen the default is Kaldi's online
(sliding-window) CMVN from the training set's statistics, causal, so offline and streaming runs normalise
alike. ``--cmvn file`` uses the whole file's statistics; ``--cmvn-from DATA_DIR`` a Kaldi data folder's
per-speaker statistics (cmvn.scp, utt2spk), as training did.

``--streaming`` (a one-way model) feeds the audio in chunks of ``--chunk`` seconds: features, network and
decoder advance chunk by chunk, partial hypotheses go to the log (standard error) as they change, and the
end gives the real-time factor and each word's latency: from the end of its audio to its appearance for
good, the chunks arriving in real time. A spliced right context delays each frame (the stated lookahead).

Standard output holds only the transcripts (``--ctm``: word timings, ``file 1 start duration word``). A file
that cannot be read or decoded is named on standard error, nothing is written for it, the others are
transcribed, and the exit status is 1.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Iterator, Optional

import numpy as np

from bru_kaldi import audio, transcription
from bru_kaldi.decoding.ctm import ctm_lines
from bru_kaldi.decoding.sets import KaldiNotFoundError
from bru_kaldi.kaldi.tables import KaldiIOError, read_text_table
from bru_kaldi.torch_state import run_settings

log = logging.getLogger("transcribe")


def parse_arguments(argv):
    parts = __doc__.split("\n\n")
    parser = argparse.ArgumentParser(description=parts[0], usage=parts[1].replace("Usage: ", "", 1),
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="\n\n".join(parts[2:]))
    parser.add_argument("exp_dir", type=Path, help="a trained experiment folder (run_exp.py's [exp] out_folder)")
    parser.add_argument("audio", nargs="+", help="WAV files, scp:WAV_SCP, or - (raw PCM on standard input)")
    parser.add_argument("--cmvn", choices=("sliding", "file"), default="sliding",
                        help="CMVN of a file: sliding window from the training statistics, or the file's own")
    parser.add_argument("--cmvn-from", type=Path, metavar="DATA_DIR",
                        help="per-speaker CMVN statistics from this Kaldi data folder (cmvn.scp, utt2spk, wav.scp)")
    parser.add_argument("--ctm", action="store_true", help="print word timings (CTM) instead of transcripts")
    parser.add_argument("--acwt", type=float, help="acoustic scale (default: the one chosen on dev)")
    parser.add_argument("--decoder", choices=("auto", "kaldi", "python"), help="default: the experiment's [decoding] decoder")
    parser.add_argument("--channel", type=int, help="the channel of a multi-channel file, from 0")
    parser.add_argument("--streaming", action="store_true", help="decode as the audio arrives, chunk by chunk")
    parser.add_argument("--chunk", type=float, default=0.2, help="seconds of audio per chunk with --streaming")
    args = parser.parse_args(argv)
    if args.cmvn_from and args.cmvn != "sliding":
        parser.error("--cmvn and --cmvn-from are alternatives")
    if args.streaming and args.cmvn == "file":
        parser.error("--cmvn file needs the whole file before its first frame: it cannot stream (the default, "
                     "sliding, is causal)")
    if not args.chunk > 0:
        parser.error(f"--chunk must be positive, got {args.chunk}")
    return args


def inputs(arguments: list[str]) -> Iterator[tuple[str, Optional[str], str]]:
    """``(name, utterance id or None, file or "-")`` of each audio argument, ``scp:`` lists expanded."""
    for argument in arguments:
        if not argument.startswith("scp:"):
            yield argument, None, argument
            continue
        try:
            table = read_text_table(argument[4:])
        except KaldiIOError as error:
            raise transcription.TranscribeError(str(error)) from None
        for utt, where in table.items():
            if where.rstrip().endswith("|"):
                raise transcription.TranscribeError(f"{argument[4:]}: utterance {utt} is a command ({where}); only "
                                                    "files are read")
            yield utt, utt, where


class Run:
    """One invocation: the model, the CMVN choice, and the failures so far."""

    def __init__(self, args):
        self.args = args
        self.trained = transcription.load(args.exp_dir, acwt=args.acwt, decoder=args.decoder)
        if args.ctm:
            transcription.check_ctm(self.trained)
        self.mode = "speaker" if args.cmvn_from else args.cmvn
        self.speakers = transcription.SpeakerStats(args.cmvn_from, self.trained.streams) if args.cmvn_from else None
        if not self.trained.normalised and (args.cmvn_from or args.cmvn != "sliding"):
            log.warning("%s was trained without CMVN: --cmvn and --cmvn-from change nothing", args.exp_dir)
        self.failed = 0

    def fail(self, message: str) -> None:
        log.error("%s", message)
        self.failed += 1

    def samples(self, path: str, name: str) -> np.ndarray:
        rate = self.trained.sample_rate
        if path == "-":
            return np.concatenate([np.zeros(0, np.float32), *audio.pcm_chunks(sys.stdin.buffer, rate, 1.0)])
        return audio.read_wav(path, rate, self.args.channel, name=name, log=log.info)

    def cmvn(self, name: str, key: Optional[str]) -> list:
        speaker = self.speakers.of(name, key) if self.speakers else None
        return transcription.normalisers(self.trained, self.mode, speaker)

    def show(self, name: str, transcript: transcription.Transcript) -> None:
        lines = transcript.ctm if self.args.ctm else [" ".join([name, *transcript.words])]
        for line in lines:
            print(line, flush=True)

    def offline(self) -> None:
        scores = {}
        for name, key, path in inputs(self.args.audio):
            try:
                feats = transcription.features(self.trained, self.samples(path, name), name, self.cmvn(name, key))
                scores[name] = transcription.loglikes(self.trained, feats)
            except (audio.AudioError, transcription.TranscribeError) as error:
                self.fail(str(error))
        if not scores:
            return
        done, failed = transcription.decode_offline(self.trained, scores, self.args.ctm)
        for name in scores:
            if name in failed:
                self.fail(f"{name}: {failed[name]}")
            else:
                self.show(name, done[name])

    def streaming(self) -> None:
        from bru_kaldi import streaming

        searcher = streaming.Searcher(self.trained)
        lookahead = streaming.check_streamable(self.trained)
        log.info("streaming in chunks of %g s; each frame waits for %d frames of context after it (%g ms of lookahead)",
                 self.args.chunk, lookahead, lookahead * self.trained.streams[0].front_end.frame_shift * 1000)
        heard, spent, latencies = 0.0, {"wall": 0.0, "cpu": 0.0}, {"wall": [], "cpu": []}
        for name, key, path in inputs(self.args.audio):
            try:
                stream = streaming.Stream(self.trained, searcher, self.cmvn(name, key), name)
                shown: list[str] = []
                for chunk in self.chunks(path, name):
                    partial = stream.accept(chunk)
                    if partial.words != shown:
                        log.info("%s (%.2f s): %s", name, partial.audio_seconds, " ".join(partial.words))
                        shown = partial.words
                outcome = stream.finish()
            except (audio.AudioError, transcription.TranscribeError) as error:
                self.fail(str(error))
                continue
            ctm = ctm_lines(name, outcome.alignment, outcome.words, searcher.model, searcher.boundary,
                            self.trained.frame_shift) if self.args.ctm else []
            self.show(name, transcription.Transcript(outcome.words, ctm))
            heard += outcome.partials[-1].audio_seconds
            spent["wall"] += sum(p.compute_seconds for p in outcome.partials)
            spent["cpu"] += sum(p.cpu_seconds for p in outcome.partials)
            for clock in latencies:
                latencies[clock] += streaming.word_latencies(outcome.partials, outcome.spans, self.trained.frame_shift,
                                                             cpu=clock == "cpu")
        if heard:
            log.info("%s", streaming_summary(self, heard, spent, latencies, lookahead))

    def chunks(self, path: str, name: str) -> Iterator[np.ndarray]:
        rate = self.trained.sample_rate
        if path == "-":  # as the pipe delivers them
            yield from audio.pcm_chunks(sys.stdin.buffer, rate, self.args.chunk)
            return
        samples = self.samples(path, name)
        step = max(1, int(round(self.args.chunk * rate)))
        for start in range(0, len(samples), step):
            yield samples[start:start + step]


def streaming_summary(run: Run, heard: float, spent: dict, latencies: dict, lookahead: int) -> str:
    """The real-time factor and the word latencies, in CPU time (a core to itself) and on the wall clock
    (whatever else the machine ran: its load average is given)."""
    import os

    import torch

    frame_shift = run.trained.streams[0].front_end.frame_shift
    line = (f"streaming: {heard:.1f} s of audio, real-time factor {spent['cpu'] / heard:.3f} in CPU time and "
            f"{spent['wall'] / heard:.3f} on the wall clock ({torch.get_num_threads()} thread, load average "
            f"{os.getloadavg()[0]:.1f}); chunks of {run.args.chunk:g} s, lookahead {lookahead} frames "
            f"({lookahead * frame_shift * 1000:g} ms)")
    if latencies["cpu"]:
        cpu, wall = np.array(latencies["cpu"]), np.array(latencies["wall"])
        line += (f"; word latency (end of a word's audio to its appearance for good) over {len(cpu)} words: median "
                 f"{np.median(cpu):.2f} s, 90th percentile {np.percentile(cpu, 90):.2f} s, max {cpu.max():.2f} s in "
                 f"CPU time; {np.median(wall):.2f} s, {np.percentile(wall, 90):.2f} s, {wall.max():.2f} s on the "
                 "wall clock")
    return line


def main(argv=None) -> int:
    args = parse_arguments(argv)
    handler = logging.StreamHandler(sys.stderr)  # standard output is the transcripts'
    handler.setFormatter(logging.Formatter("transcribe.py: %(message)s"))
    root = logging.getLogger()
    saved = root.level, list(root.handlers), log.level
    root.handlers, root.level = [handler], logging.WARNING  # the libraries' progress is not the user's
    log.setLevel(logging.INFO)
    # Streaming multiplies one frame at a time: products too small to share among threads, which only wait
    # for each other (ten times slower with two threads on a busy machine). Subnormal floats run in
    # microcode on x86 (see run_exp.py). Both are put back at the end.
    try:
        with run_settings(threads=1 if args.streaming else None, flush_denormal=True):
            run = Run(args)
            run.streaming() if args.streaming else run.offline()
    except (transcription.TranscribeError, audio.AudioError, KaldiNotFoundError) as error:
        log.error("error: %s", error)
        return 1
    finally:
        root.setLevel(saved[0])
        root.handlers = saved[1]
        log.setLevel(saved[2])
    return 1 if run.failed else 0


if __name__ == "__main__":
    sys.exit(main())

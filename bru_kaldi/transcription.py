"""A trained model on new audio: its front end, normalisation, network and decoder, as ``transcribe.py`` runs them.

:func:`load` reads an experiment folder as ``run_exp.py``'s forward stage does (the resolved config,
``final.pt``, ``feature_norm.npz``, ``pdf_counts``), and what ``run_exp.py`` recorded for new audio
(``bru_kaldi.records``: ``front_end.json``, ``decoding.json``). Audio then takes the path the training
features took: each input stream's front end, CMVN, deltas and splicing, the global normalisation,
the network, log posteriors minus log priors (a chain model's output as it is), and the graph at the
acoustic scale and insertion penalty chosen on dev. Offline, :func:`decode_offline` decodes every
file's log-likelihoods together with ``decoding.decode_sets``: Kaldi's binaries where they are on
PATH, else the Python decoder, as ``run_exp.py``. Streaming is ``bru_kaldi.streaming``.

CMVN for a file of a speaker never seen (the corpus normalised per speaker), :data:`CMVN_MODES`:

* ``sliding`` (the default): Kaldi's online CMVN from the training set's global statistics
  (``feature_transforms.OnlineCmvn``); causal, so offline and streaming normalise alike;
* ``file``: the file's own statistics (it needs the whole file: offline only);
* ``speaker``: a Kaldi data directory's per-speaker statistics (``cmvn.scp`` and ``utt2spk``), as
  training normalised; the file is found in its ``wav.scp``, or by its name as an utterance id.

A model trained without CMVN gets none, whatever is asked. Every problem is a :class:`TranscribeError`
naming the folder, file or option.
"""

from __future__ import annotations

import dataclasses
import logging
import pickle
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional, Sequence

import numpy as np
import torch
from torch.nn import functional as F

from bru_kaldi import decoding, scoring
from bru_kaldi.config import Config, ConfigError, Decoding, parse_config
from bru_kaldi.decoding.ctm import read_word_boundary
from bru_kaldi.feature_transforms import GlobalNorm, OnlineCmvn, add_deltas, apply_cmvn, compute_cmvn_stats, splice
from bru_kaldi.kaldi.tables import KaldiIOError, read_matrices, read_text_table
from bru_kaldi.network import check_architectures, load_trained
from bru_kaldi.posteriors import LoglikeWriter, log_priors, read_counts
from bru_kaldi.records import DecodingChoice, RecordError, StreamRecord, read_decoding, read_front_end

log = logging.getLogger(__name__)

CMVN_MODES = ("sliding", "file", "speaker")


class TranscribeError(ValueError):
    """What stops a transcription: the message names the experiment folder, the file or the option."""


@dataclass
class Trained:
    """A trained experiment, loaded: the network, what its inputs and outputs need, and the decoding."""

    folder: Path
    config: Config
    network: torch.nn.Module  # models.acoustic.AcousticModel, in evaluation mode
    norm: GlobalNorm  # of the network's input columns
    priors: Optional[np.ndarray]  # (num_pdfs,) log priors, None: the output is written as it is
    chain: bool  # an LF-MMI model: its output is not a softmax
    streams: list[StreamRecord]
    choice: DecodingChoice
    decoding: Decoding  # [decoding] at the chosen setting

    @property
    def subsampling(self) -> int:
        """Input frames per output frame: the network's ``[model] frame_subsampling_factor`` (a chain model's 3)."""
        return self.network.frame_subsampling_factor

    @property
    def graph_dir(self) -> Path:
        return Path(self.choice.graph)

    @property
    def sample_rate(self) -> int:
        return self.streams[0].front_end.sample_rate

    @property
    def frame_shift(self) -> float:
        """Seconds between the network's output frames."""
        return self.streams[0].front_end.frame_shift * self.subsampling

    @property
    def normalised(self) -> bool:
        """Whether training normalised any input stream with CMVN."""
        return any(s.options.cmvn != "none" for s in self.streams)

    def loglikes(self, out: dict[str, torch.Tensor]) -> np.ndarray:
        """The network's output frames for one sequence (``(1, T', num_pdfs)`` under ``"senone"``) as the decoder
        reads them, ``(T', num_pdfs)`` float32: log posteriors minus log priors, as forward."""
        senone = out["senone"][0].float()
        scores = (senone if self.chain else F.log_softmax(senone, dim=-1)).cpu().numpy()
        if self.priors is not None:
            scores = scores - self.priors
        return np.ascontiguousarray(scores, dtype=np.float32)


def _config(folder: Path) -> Config:
    resolved = folder / "config.resolved.cfg"
    if not resolved.is_file():
        raise TranscribeError(f"{folder}: not an experiment folder (no config.resolved.cfg; run_exp.py writes it)")
    try:
        config = parse_config(resolved)
        check_architectures(config)
    except ConfigError as error:
        raise TranscribeError(f"{resolved}: a config this version cannot read: {error}") from None
    return config


def load(folder, acwt: Optional[float] = None, decoder: Optional[str] = None,
         device: torch.device = torch.device("cpu")) -> Trained:
    """Load an experiment folder (see the module docstring); ``acwt`` and ``decoder`` replace the recorded
    acoustic scale and ``[decoding] decoder``."""
    folder = Path(folder)
    if not folder.is_dir():
        raise TranscribeError(f"{folder}: no such experiment folder")
    config = _config(folder)
    if config.model.features_arch or not config.model.senone_output:
        raise TranscribeError(f"{folder}: the model has no senone output to decode ([model] senone_output, "
                              "features_arch)")
    try:
        network = load_trained(config, folder, device)
        norm = GlobalNorm.load(folder / "feature_norm.npz")
        streams, choice = read_front_end(folder), read_decoding(folder)
    except FileNotFoundError as error:
        raise TranscribeError(f"{folder}: no trained model: {error}") from None
    except (RuntimeError, KeyError, EOFError, pickle.UnpicklingError) as error:  # what torch.load raises
        raise TranscribeError(f"{folder / 'final.pt'}: a trained model that cannot be read ({error})") from None
    except (ConfigError, RecordError) as error:
        raise TranscribeError(str(error)) from None
    for stream in streams:
        if stream.front_end is None:
            raise TranscribeError(f"{folder / 'front_end.json'}: stream {stream.fea_name}: {stream.why}")
    if sum(s.width for s in streams) != network.input_size or not streams:
        raise TranscribeError(f"{folder / 'front_end.json'}: its streams make {sum(s.width for s in streams)} values "
                              f"per frame, the network reads {network.input_size}")
    framing = {(s.front_end.sample_rate, s.front_end.get("frame-shift"), s.front_end.get("frame-length"),
                s.front_end.get("snip-edges")) for s in streams}
    if len(framing) > 1:
        raise TranscribeError(f"{folder / 'front_end.json'}: the streams are framed differently ({sorted(framing)})")
    chain = config.model.objective == "lfmmi"
    priors = None
    if config.forward.normalize_posteriors and not chain:  # as run_exp.py's forward
        try:
            priors = log_priors(read_counts(str(folder / "pdf_counts")))
        except (KaldiIOError, ValueError) as error:
            raise TranscribeError(f"{folder}: the pdf counts of the priors: {error}") from None
    graph = Path(choice.graph)
    for name in ("HCLG.fst", "words.txt"):
        if not (graph / name).is_file():
            raise TranscribeError(f"{folder / 'decoding.json'} names the graph {graph}, which has no {name}")
    scale = choice.acoustic_scale if acwt is None else acwt
    if not scale > 0:
        raise TranscribeError(f"--acwt must be positive, got {scale}")
    chosen = dataclasses.replace(config.decoding, acwt=scale, acwt_sweep=[], wip_sweep=[choice.word_penalty],
                                 decoder=decoder or config.decoding.decoder)
    return Trained(folder, config, network, GlobalNorm(norm.mean[:network.input_size], norm.std[:network.input_size]),
                   priors, chain, streams, choice, chosen)


# --------------------------------------------------------------------------- normalisation
class SpeakerStats:
    """Per-speaker CMVN statistics of a Kaldi data directory (``--cmvn-from``): each stream's statistics
    file (the one training read, ``cmvn.scp``) and ``utt2spk``; a file is found by its path in ``wav.scp``,
    or its name (without extension) as an utterance id."""

    def __init__(self, data_dir, streams: Sequence[StreamRecord]):
        self.data_dir = Path(data_dir)
        if not self.data_dir.is_dir():
            raise TranscribeError(f"--cmvn-from {data_dir}: no such data directory")
        try:
            self.utt2spk = read_text_table(str(self.data_dir / "utt2spk"))
            wavs = read_text_table(str(self.data_dir / "wav.scp")) if (self.data_dir / "wav.scp").is_file() else {}
            self.stats = [dict(read_matrices(str(self.data_dir / s.cmvn_file), dtype=np.float64)) for s in streams]
        except KaldiIOError as error:
            raise TranscribeError(f"--cmvn-from {data_dir}: {error}") from None
        self.by_path = {str(Path(v).resolve()): k for k, v in wavs.items() if not v.rstrip().endswith("|")}
        self.streams = streams

    def utterance(self, name: str, key: Optional[str]) -> str:
        """The utterance id of a file (``key``: given by an ``scp:`` list)."""
        utt = key or self.by_path.get(str(Path(name).resolve())) or Path(name).stem
        if utt not in self.utt2spk:
            raise TranscribeError(f"{name}: not in {self.data_dir / 'wav.scp'}, and {self.data_dir / 'utt2spk'} has no "
                                  f"utterance {utt!r}")
        return utt

    def of(self, name: str, key: Optional[str]) -> list[np.ndarray]:
        """Each stream's statistics for the file ``name``: its speaker's (or, for a model trained with
        per-utterance CMVN, its utterance's)."""
        utt = self.utterance(name, key)
        found = []
        for stream, table in zip(self.streams, self.stats):
            owner = self.utt2spk[utt] if stream.options.cmvn == "speaker" else utt
            if owner not in table:
                raise TranscribeError(f"{self.data_dir / stream.cmvn_file}: no CMVN statistics for {owner!r} ({name})")
            found.append(table[owner])
        return found


def normalisers(trained: Trained, mode: str, speaker: Optional[list[np.ndarray]] = None) -> list[Callable]:
    """One CMVN function per input stream for one file, ``(T, D)`` -> ``(T, D)``: ``mode`` of
    :data:`CMVN_MODES` (``speaker``: with that file's ``speaker`` statistics). Each is causal but for
    ``file``: called chunk by chunk it normalises as called once on the whole file."""
    out = []
    for k, stream in enumerate(trained.streams):
        o = stream.options
        if o.cmvn == "none":
            out.append(lambda feats: feats)
        elif mode == "sliding":
            if stream.global_cmvn is None:
                raise TranscribeError(f"{trained.folder / 'front_end.json'}: stream {stream.fea_name} has no global CMVN "
                                      "statistics, the prior of sliding CMVN (use --cmvn file or --cmvn-from)")
            out.append(OnlineCmvn(stream.global_cmvn, norm_vars=o.norm_vars) if o.norm_means else lambda feats: feats)
        elif mode == "file":
            out.append(lambda feats, o=o: apply_cmvn(feats, compute_cmvn_stats(feats), o.norm_means, o.norm_vars))
        else:
            out.append(lambda feats, o=o, stats=speaker[k]: apply_cmvn(feats, stats, o.norm_means, o.norm_vars))
    return out


# --------------------------------------------------------------------------- offline
def features(trained: Trained, samples: np.ndarray, name: str, cmvn: Sequence[Callable]) -> np.ndarray:
    """The network's input for a file's int16-scale samples at the model's rate: ``(T, input_size)`` float32,
    each stream as training's (front end, CMVN, deltas, splicing), concatenated, globally normalised."""
    parts = []
    for stream, normalise in zip(trained.streams, cmvn):
        raw = stream.front_end.compute(samples)
        if len(raw) == 0:
            raise TranscribeError(f"{name}: {len(samples) / trained.sample_rate:.3f} s of audio, shorter than one frame "
                                  f"({stream.front_end.get('frame-length'):g} ms)")
        parts.append(splice(add_deltas(normalise(raw), stream.options.delta_order, stream.options.delta_window),
                            stream.cw_left, stream.cw_right))
    return trained.norm.apply(np.concatenate(parts, axis=1))


@torch.no_grad()
def loglikes(trained: Trained, feats: np.ndarray) -> np.ndarray:
    """The decoder's input for a file's network input ``(T, F)``: see :meth:`Trained.loglikes`."""
    return trained.loglikes(trained.network(torch.from_numpy(feats)[None], torch.tensor([len(feats)])))


@dataclass
class Transcript:
    """One file's result: its words (phones, for a phone model) and, for a word graph, its CTM lines."""

    words: list[str]
    ctm: list[str]


def decode_offline(trained: Trained, scores: dict[str, np.ndarray], with_ctm: bool,
                   say: Callable[[str], None] = log.debug) -> tuple[dict[str, Transcript], dict[str, str]]:
    """Decode every file's log-likelihoods (``{name: (T, num_pdfs)}``) together, as ``run_exp.py`` decodes a
    set, in a temporary folder; returns ``({name: Transcript}, {name: why it failed})``."""
    names = list(scores)
    keys = {f"file{i:07d}": name for i, name in enumerate(names)}  # Kaldi keys: file names may hold spaces
    with tempfile.TemporaryDirectory(prefix="transcribe.") as tmp:
        tmp = Path(tmp)
        with LoglikeWriter(str(tmp / "loglikes.ark"), str(tmp / "loglikes.scp")) as writer:
            for key, name in keys.items():
                writer.write(key, scores[name])
        job = decoding.DecodeJob("files", tmp / "loglikes.scp", trained.graph_dir, trained.folder / "final.mdl", None,
                                 tmp / "decode", frame_shift=trained.frame_shift)
        try:
            result = decoding.decode_sets([job], trained.decoding, tune_on=None, log=say)["files"]
        except (decoding.DecodeInputError, decoding.MissingInputError, decoding.KaldiDecodeError) as error:
            raise TranscribeError(f"decoding with {trained.graph_dir}: {error}") from None
        hyps = scoring.read_text(tmp / "decode" / "text")
        ctm: dict[str, list[str]] = {}
        if with_ctm and (tmp / "decode" / "ctm").is_file():
            for line in (tmp / "decode" / "ctm").read_text().splitlines():
                key, rest = line.split(" ", 1)
                ctm.setdefault(key, []).append(f"{keys[key]} {rest}")
    failed = {keys[key]: "no path survived the search (widen [decoding] beam)" for key in result.failed}
    for key in result.partial:
        say(f"{keys[key]}: no final state of the graph was reached; the best partial path is given")
    done = {keys[k]: Transcript(words, ctm.get(k, [])) for k, words in hyps.items() if keys[k] not in failed}
    return done, failed


def check_ctm(trained: Trained) -> None:
    """Word timings need a word graph (``phones/word_boundary.int``): a phone recogniser's has none."""
    if read_word_boundary(trained.graph_dir) is None:
        raise TranscribeError(f"{trained.folder}: a phone model (its graph {trained.graph_dir} has no "
                              "phones/word_boundary.int), asked for word timings: run it without --ctm")

"""Opt-in feature streams of a built corpus for pytorch-kaldi's raw-waveform and multi-microphone configs.

Neither is built by ``run.sh`` (the raw stream of the default size is 7.5 GB); run this after stage 2:

    python -m recipes.mini_timit.local.extra_streams --raw --mics 6 recipes/mini_timit/tiny

* ``--raw``: ``data/<split>/feats_raw.scp``, what pytorch-kaldi's ``save_raw_fea.py`` makes for
  ``TIMIT_SincNet_raw.cfg`` / ``TIMIT_CNN_raw.cfg`` (read with empty ``fea_opts``, ``cw 0``): per
  utterance a (T, 3200) float32 matrix, row t the 200 ms of samples around frame t (frame t starts at
  sample 160 t, as the 25 ms / 10 ms Kaldi frames of ``feats.scp``; row t, column j is sample
  160 t - 1401 + j, zero outside the utterance), the samples divided by the utterance's peak
  magnitude. T is the Kaldi frame count (``utt2num_frames``, the alignments' length); pytorch-kaldi's
  loop (``beg + 400 < N``) gives one row fewer when (N - 400) is a multiple of 160.
* ``--mics N`` (N <= 6, DIRHA's six microphones ``mfccLA1..LA6``): for microphone m,
  ``data/<split>/feats_mfcc_mic<m>.scp`` and ``cmvn_mfcc_mic<m>.scp``: the corpus's waveform through
  the microphone's room (a synthetic impulse response: a direct path after a per-microphone delay,
  then exponentially decaying noise with the microphone's RT60) and its channel (a short random FIR),
  plus white noise at the microphone's SNR, then the corpus's own MFCC (``make_features.compute``,
  that of ``feats_mfcc.scp``) and per-speaker CMVN statistics (``make_features.cmvn_stats``). The
  rooms and channels are drawn from ``--seed`` (the corpus's seed by default) and microphone number,
  the noise from the seed, microphone and utterance id, so the archives are the same run to run.

Splits: train, dev, test; the derived data dirs that exist (``dev_core``, ``<split>_words``,
``dev_core_words``) get the rows of their utterances and speakers (their archives are shared). A
stream is rebuilt only when its marker (``data/.done/extra.raw``, ``extra.mics``) is missing or
records other settings or an older stage 2.

>>> mic = draw_microphones(seed=1, count=2)[1]
>>> mic.room.ndim, mic.channel.shape, bool(20 <= mic.snr_db <= 30)
(1, (8,), True)
>>> raw_frames(np.arange(1000.0), 4).shape
(4, 3200)
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import zlib
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import scipy.signal

from bru_kaldi.atomic import write_text_atomically
from recipes.mini_timit.local.layout import CORE, SPLITS, read_table, stage_marker, write_table
from recipes.mini_timit.local.make_features import ark_scp_writer, cmvn_stats, compute, read_wav

RATE = 16000
SHIFT, FRAME = 160, 400  # Kaldi's 10 ms shift and 25 ms window at 16 kHz (the frames of feats.scp)
RAW_WIDTH = 3200  # save_raw_fea.py's sig_wlen: 200 ms
RAW_LEFT = 1401  # row t starts 1401 samples before its frame: save_raw_fea.py centres on sample 160 t + 199
MAX_MICS = 6  # DIRHA's LA1..LA6
DELAY_MS = (0.0, 3.0)  # direct-path delay per microphone (a linear array: a few ms apart)
RT60_S = (0.25, 0.55)  # reverberation time per microphone
TAIL_ENERGY = (0.2, 0.6)  # reverberant tail's energy relative to the direct path's
CHANNEL_TAPS = 8
SNR_DB = (20.0, 30.0)  # white noise, per microphone


# --------------------------------------------------------------------------- raw waveform frames
def raw_frames(samples: np.ndarray, num_frames: int) -> np.ndarray:
    """``save_raw_fea.py``'s frames: (num_frames, 3200) float32 of ``samples`` (N,), peak-normalised.

    Row t holds samples 160 t - 1401 ... 160 t + 1798 (zero outside 0 .. N - 1), divided by the
    largest magnitude of ``samples``.

    >>> rows = raw_frames(np.array([0.0, 2.0, -4.0]), 1)
    >>> rows.shape, rows[0, 1401:1404].tolist(), float(abs(rows[0, :1401]).sum())
    ((1, 3200), [0.0, 0.5, -1.0], 0.0)
    """
    x = np.asarray(samples, dtype=np.float64)
    x = x / max(np.abs(x).max(), np.finfo(np.float64).tiny)
    right = max(0, SHIFT * (num_frames - 1) + RAW_WIDTH - RAW_LEFT - len(x))
    padded = np.concatenate([np.zeros(RAW_LEFT), x, np.zeros(right)])
    windows = np.lib.stride_tricks.sliding_window_view(padded, RAW_WIDTH)  # (N', 3200), a view
    return windows[: SHIFT * num_frames: SHIFT].astype(np.float32)


def kaldi_num_frames(num_samples: int) -> int:
    """Frames of a 25 ms / 10 ms Kaldi analysis with ``snip_edges=true`` (``utt2num_frames``).

    >>> kaldi_num_frames(16000), kaldi_num_frames(399)
    (98, 0)
    """
    return 0 if num_samples < FRAME else 1 + (num_samples - FRAME) // SHIFT


# --------------------------------------------------------------------------- simulated microphones
@dataclass(frozen=True)
class Microphone:
    """One simulated microphone: ``room`` impulse response (L,), ``channel`` FIR (K,), noise ``snr_db``
    (``inf``: none). ``Microphone(np.ones(1), np.ones(1), np.inf)`` passes the waveform through unchanged."""

    room: np.ndarray
    channel: np.ndarray
    snr_db: float


def room_response(rng: np.random.Generator) -> np.ndarray:
    """A room impulse response (L,): 1 after a delay of 0-3 ms, then, from 2 ms after it, Gaussian noise
    decaying by 60 dB over an RT60 of 0.25-0.55 s, with 0.2-0.6 of the direct path's energy."""
    delay = int(round(rng.uniform(*DELAY_MS) * RATE / 1000))
    rt60 = rng.uniform(*RT60_S)
    t = np.arange(int(rt60 * RATE)) / RATE
    tail = rng.standard_normal(len(t)) * np.exp(-6.9 * t / rt60)  # exp(-6.9) = -60 dB
    tail[: int(0.002 * RATE)] = 0  # the first reflection comes after the direct sound
    tail *= np.sqrt(rng.uniform(*TAIL_ENERGY) / np.sum(tail ** 2))
    h = np.zeros(delay + len(tail))
    h[delay:] = tail
    h[delay] = 1.0
    return h


def channel_response(rng: np.random.Generator) -> np.ndarray:
    """A microphone's colouring: an 8-tap FIR (1, then taps of +-0.3 decaying), unit energy."""
    fir = np.concatenate([[1.0], rng.uniform(-0.3, 0.3, CHANNEL_TAPS - 1) * 0.7 ** np.arange(1, CHANNEL_TAPS)])
    return fir / np.sqrt(np.sum(fir ** 2))


def draw_microphones(seed: int, count: int = MAX_MICS) -> list[Microphone]:
    """Microphones 1..count for ``seed``: each its own room, channel and SNR (its own random stream,
    so microphone m is the same whatever ``count``)."""
    if not 1 <= count <= MAX_MICS:
        raise ValueError(f"--mics: expected 1 to {MAX_MICS} microphones (DIRHA's LA1..LA6), got {count}")
    mics = []
    for m in range(1, count + 1):
        rng = np.random.default_rng([seed, m])
        mics.append(Microphone(room_response(rng), channel_response(rng), float(rng.uniform(*SNR_DB))))
    return mics


def microphone_signal(samples: np.ndarray, mic: Microphone, rng: np.random.Generator) -> np.ndarray:
    """What ``mic`` records of ``samples`` (N,): room, then channel, cut to N samples, plus noise from ``rng``
    (unused when ``mic.snr_db`` is ``inf``). (N,) float64.

    >>> x = np.arange(5.0)
    >>> microphone_signal(x, Microphone(np.ones(1), np.ones(1), np.inf), None).tolist()
    [0.0, 1.0, 2.0, 3.0, 4.0]
    >>> microphone_signal(x, Microphone(np.array([0.0, 1.0]), np.ones(1), np.inf), None).tolist()  # 1-sample delay
    [0.0, 0.0, 1.0, 2.0, 3.0]
    """
    x = np.asarray(samples, dtype=np.float64)
    # scipy picks a direct sum for short filters (exact: a delta returns x) and FFTs for long ones
    y = scipy.signal.convolve(x, mic.room)[: len(x)]
    y = scipy.signal.convolve(y, mic.channel)[: len(x)]
    if np.isfinite(mic.snr_db):
        noise = rng.standard_normal(len(y))
        y = y + noise * np.sqrt(np.mean(y ** 2) / 10 ** (mic.snr_db / 10))
    return y


def noise_rng(seed: int, mic: int, utt: str) -> np.random.Generator:
    """The noise stream of microphone ``mic`` (1-based) for utterance ``utt``: independent of the order."""
    return np.random.default_rng([seed, mic, zlib.crc32(utt.encode())])


def microphone_features(samples: np.ndarray, mic: Microphone, rng: np.random.Generator) -> np.ndarray:
    """``feats_mfcc.scp``'s MFCC (T, 13) float32 of what ``mic`` records of ``samples`` (N,).

    >>> mic = draw_microphones(1, 1)[0]
    >>> microphone_features(np.sin(np.arange(16000.0)) * 1000, mic, noise_rng(1, 1, "utt")).shape
    (98, 13)
    """
    return compute("mfcc", microphone_signal(samples, mic, rng))


# --------------------------------------------------------------------------- writing the streams
def _split_job(job: dict) -> dict[str, int]:
    """One split's streams: the raw archive and/or each microphone's; returns frames per utterance."""
    data, split = Path(job["data"]), job["split"]
    (data / "data").mkdir(exist_ok=True)
    expected = {u: int(n) for u, n in read_table(data / "utt2num_frames").items()}
    wavs = read_table(data / "wav.scp")
    utt2spk = read_table(data / "utt2spk")
    stems = ([("feats_raw", data / "data" / f"raw_wave_{split}")] if job["raw"] else []) + \
        [(f"feats_mfcc_mic{m}", data / "data" / f"raw_mfcc_mic{m}_{split}") for m in range(1, len(job["mics"]) + 1)]
    per_speaker: list[dict[str, list[np.ndarray]]] = [{} for _ in job["mics"]]
    frames = {}
    with ExitStack() as stack:
        writers = [stack.enter_context(ark_scp_writer(stem)) for _, stem in stems]
        for utt in sorted(wavs, key=lambda s: s.encode()):
            samples = read_wav(wavs[utt])
            frames[utt] = kaldi_num_frames(len(samples))
            if frames[utt] != expected[utt]:
                raise RuntimeError(f"{data}/utt2num_frames: {utt} has {expected[utt]} frames, its wav {frames[utt]}")
            outputs = [raw_frames(samples, frames[utt])] if job["raw"] else []
            for m, mic in enumerate(job["mics"], 1):
                feats = microphone_features(samples, mic, noise_rng(job["seed"], m, utt))
                per_speaker[m - 1].setdefault(utt2spk[utt], []).append(feats)
                outputs.append(feats)
            for writer, matrix in zip(writers, outputs):
                writer(utt, matrix)
    for name, stem in stems:
        scp = Path(f"{stem}.scp")
        write_table(data / f"{name}.scp", read_table(scp))
        scp.unlink()
    for m, speakers in enumerate(per_speaker, 1):
        stem = data / "data" / f"cmvn_mfcc_mic{m}_{split}"
        with ark_scp_writer(stem) as writer:
            for spk in sorted(speakers, key=lambda s: s.encode()):
                writer(spk, cmvn_stats(speakers[spk]))
        write_table(data / f"cmvn_mfcc_mic{m}.scp", read_table(Path(f"{stem}.scp")))
        Path(f"{stem}.scp").unlink()
    return frames


def derived_dirs(root: Path) -> dict[Path, Path]:
    """Data dirs made from a split's tables (``dev_core``, ``<split>_words``), each with its source split's dir."""
    out = {}
    for data in sorted((root / "data").iterdir()):
        base = data.name.removesuffix("_words")
        source = "dev" if base == CORE else base
        if data.name not in SPLITS and source in SPLITS and (data / "utt2spk").is_file():
            out[data] = root / "data" / source
    return out


def stream_tables(raw: bool, mics: int) -> list[str]:
    """The tables the streams add to each data dir."""
    return (["feats_raw.scp"] if raw else []) + \
        [f"{kind}_mfcc_mic{m}.scp" for m in range(1, mics + 1) for kind in ("feats", "cmvn")]


def build(root: Path, raw: bool = False, mics: list[Microphone] = (), seed: int = 1, jobs: int = 1) -> None:
    """Write the raw stream (``raw``) and the microphones' streams (``mics``: microphone m = ``mics[m-1]``)
    into every data dir of the corpus at ``root``, with ``seed`` for the noise. No markers (see :func:`main`)."""
    root = Path(root)
    tasks = [dict(data=str(root / "data" / s), split=s, raw=raw, mics=list(mics), seed=seed) for s in SPLITS]
    if jobs > 1:
        with multiprocessing.get_context("fork").Pool(min(jobs, len(tasks))) as pool:
            results = pool.map(_split_job, tasks, chunksize=1)
    else:
        results = [_split_job(task) for task in tasks]
    for split, frames in zip(SPLITS, results):
        print(f"{split}: {len(frames)} utterances, {sum(frames.values())} frames")
    tables = stream_tables(raw, len(mics))
    for target, source in derived_dirs(root).items():
        keep = set(read_table(target / "utt2spk")) | set(read_table(target / "spk2utt"))
        for table in tables:
            write_table(target / table, {k: v for k, v in read_table(source / table).items() if k in keep})


def _marker_record(root: Path, what: dict) -> str:
    features = stage_marker(root, 2)
    return json.dumps({**what, "stage2": features.read_text(), "stage2_mtime_ns": features.stat().st_mtime_ns}) + "\n"


def main(argv: list[str] | None = None) -> None:
    """The command line (module docstring); a stream whose marker matches is skipped."""
    parser = argparse.ArgumentParser(prog="python -m recipes.mini_timit.local.extra_streams",
                                     description=__doc__.split("\n\n")[0],
                                     epilog="e.g.: python -m recipes.mini_timit.local.extra_streams --raw --mics 6 "
                                            "recipes/mini_timit/tiny")
    parser.add_argument("--raw", action="store_true", help="data/<split>/feats_raw.scp (200 ms of samples a frame)")
    parser.add_argument("--mics", type=int, default=0, help=f"simulated microphones, 0 to {MAX_MICS}")
    parser.add_argument("--seed", type=int, default=None, help="seed of the microphones (default: the corpus's)")
    parser.add_argument("--jobs", type=int, default=1, help="splits written in parallel")
    parser.add_argument("root", type=Path, help="a corpus built up to stage 2 at least (run.sh)")
    args = parser.parse_args(argv)
    root = args.root.resolve()
    features = stage_marker(root, 2)
    if not features.is_file():
        parser.error(f"{root}: stage 2 (make_features) is not complete ({features} missing): run run.sh first")
    if not args.raw and not args.mics:
        parser.error("nothing to do: give --raw and/or --mics N")
    if not 0 <= args.mics <= MAX_MICS:
        parser.error(f"--mics: expected 0 to {MAX_MICS} microphones (DIRHA's LA1..LA6), got {args.mics}")
    seed = json.loads(features.read_text())["seed"] if args.seed is None else args.seed
    wanted = {"raw": ({"raw": True}, args.raw), "mics": ({"mics": args.mics, "seed": seed}, args.mics > 0)}
    todo = {}
    for name, (what, asked) in wanted.items():
        marker = root / "data" / ".done" / f"extra.{name}"
        if asked and not (marker.is_file() and marker.read_text() == _marker_record(root, what)):
            todo[name] = (what, marker)
        elif asked:
            print(f"extra_streams: {name} complete, skipping ({marker})")
    if not todo:
        return
    for _, marker in todo.values():
        marker.unlink(missing_ok=True)
    build(root, raw="raw" in todo, mics=draw_microphones(seed, args.mics) if "mics" in todo else [], seed=seed,
          jobs=args.jobs)
    for what, marker in todo.values():
        write_text_atomically(marker, _marker_record(root, what))


if __name__ == "__main__":
    main()

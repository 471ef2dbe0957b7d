"""Stage 1: speak every prompt, corrupt it, and write the Kaldi data dirs' audio and text tables.

Each split is cut into ``num_jobs`` jobs by speaker (as Kaldi's ``split_data.sh``); every job runs
in a fresh process (espeak-ng is only reproducible that way, see ``espeak.py``), so the audio is
byte-identical for a seed whatever the number of CPU cores.

Per utterance: espeak-ng audio at 22050 Hz and its phoneme events -> TIMIT-39 phone segments ->
resampled to 16 kHz (soxr) -> 0.25 s of silence added at both ends -> channel, reverberation and
noise (``augment.py``) -> 16-bit wav. Writes, per split, ``data/<split>/{wav.scp,text,utt2spk,
spk2utt,spk2gender}`` and ``data/local/<split>/phone_segments.txt`` (``utt phone start end ...``
in samples at 16 kHz, the synthesiser's own timing, used by the alignment stage).
"""

from __future__ import annotations

import multiprocessing
import os
import wave
from pathlib import Path

import numpy as np

from bru_kaldi.atomic import atomic_path
from recipes.mini_timit.local import augment, phoneset
from recipes.mini_timit.local.layout import SIZES, SPLITS, read_table, run_stage, stage_args, write_table

RATE = augment.RATE
PAD_S = 0.25  # silence added before and after every utterance, as TIMIT's h# segments
MIN_PAUSE_S = 0.05  # a shorter pause between words is not transcribed: its time joins the previous phone


def phone_segments(events: list[tuple[str, int]], n_samples: int) -> list[list]:
    """espeak-ng phoneme events -> ``[[phone, start, end], ...]`` covering ``[0, n_samples)``.

    Marks without a segment of their own extend the previous phone; adjacent silences merge; short
    pauses between words join the previous phone.
    """
    segments: list[list] = [[phoneset.SIL, 0, 0]]
    for name, start in sorted(events, key=lambda e: e[1]):
        start = min(max(start, segments[-1][1]), n_samples)
        segments[-1][2] = start
        phone = phoneset.to_timit(name)
        if phone is None or (phone == phoneset.SIL and segments[-1][0] == phoneset.SIL):
            continue  # the previous segment goes on
        segments.append([phone, start, start])
    segments[-1][2] = n_samples
    merged: list[list] = []
    for seg in segments:
        if seg[2] <= seg[1]:
            continue
        if merged and seg[0] == phoneset.SIL == merged[-1][0]:
            merged[-1][2] = seg[2]
        else:
            merged.append(seg)
    # short pauses inside the utterance are not silences a transcriber would mark
    out: list[list] = []
    for i, seg in enumerate(merged):
        inside = 0 < i < len(merged) - 1
        if inside and seg[0] == phoneset.SIL and seg[2] - seg[1] < MIN_PAUSE_S * 22050 and out:
            out[-1][2] = seg[2]
        else:
            out.append(seg)
    return out


def write_wav(path: Path, samples: np.ndarray) -> None:
    """16-bit mono wav at 16 kHz, written atomically."""
    with atomic_path(path, sync=False) as tmp, wave.open(str(tmp), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(RATE)
        w.writeframes(np.clip(np.round(samples), -32768, 32767).astype("<i2").tobytes())


def synth_job(task: dict) -> list[tuple[str, list[list]]]:
    """Synthesise one job's utterances in order (runs in a fresh process); returns their segments."""
    import soxr

    from recipes.mini_timit.local.espeak import SAMPLE_RATE, Espeak

    tts = Espeak.shared()
    out, babble_pool, channels = [], [], {}
    wav_dir = Path(task["wav_dir"])
    for utt, spk, text, sp, utt_seed in task["utts"]:
        rng = np.random.default_rng(utt_seed)
        if spk not in channels:  # the speaker's microphone, the same in every job and split
            channels[spk] = augment.speaker_channel(np.random.default_rng([task["seed"], 2, int(spk[1:])]))
        rate = int(sp["rate"] * rng.uniform(0.92, 1.08))
        pitch = int(np.clip(sp["pitch"] + rng.integers(-5, 6), 0, 100))
        audio, events = tts.synth(text, sp["voice"], rate, pitch, sp["range"], sp["word_gap"], seed=int(rng.integers(2**31)))
        try:
            segments = phone_segments(events, len(audio))
        except phoneset.UnknownPhoneme as e:
            raise phoneset.UnknownPhoneme(f"utterance {utt} ({sp['voice']}, {text!r}): {e}") from None
        speech = soxr.resample(audio.astype(np.float32), SAMPLE_RATE, RATE, quality="HQ").astype(np.float64)
        pad = int(PAD_S * RATE)
        scale = RATE / SAMPLE_RATE
        bounds = [[p, pad + round(s * scale), pad + round(e * scale)] for p, s, e in segments]
        bounds[0][1] = 0
        bounds[-1][2] = len(speech) + 2 * pad
        if bounds[-1][0] != phoneset.SIL:
            bounds[-1][2] = pad + len(speech)
            bounds.append([phoneset.SIL, pad + len(speech), len(speech) + 2 * pad])
        if bounds[0][0] != phoneset.SIL:
            bounds[0][1] = pad
            bounds.insert(0, [phoneset.SIL, 0, pad])
        clean = np.concatenate([np.zeros(pad), speech, np.zeros(pad)])
        noisy = augment.corrupt(clean, channels[spk], rng, babble_pool)
        babble_pool = (babble_pool + [clean / (np.abs(clean).max() + 1e-9)])[-8:]
        write_wav(wav_dir / f"{utt}.wav", noisy)
        out.append((utt, bounds))
    return out


def split_by_speaker(utts: list[str], num_jobs: int) -> list[list[str]]:
    """Cut sorted utterance ids into ``num_jobs`` groups of whole speakers (Kaldi's split_data.sh)."""
    speakers = sorted({u.split("_")[0] for u in utts})
    num_jobs = min(num_jobs, len(speakers))
    groups = [speakers[i * len(speakers) // num_jobs:(i + 1) * len(speakers) // num_jobs] for i in range(num_jobs)]
    return [[u for u in utts if u.split("_")[0] in set(g)] for g in groups]


def main() -> None:
    args = stage_args(1, __doc__.splitlines()[0])
    size = SIZES[args.size]
    root = args.root.resolve()
    with run_stage(root, 1, args.size, args.seed, inputs=(0,)) as run:
        if not run:
            return
        speakers = {}
        for spk, row in read_table(root / "data" / "local" / "speakers.txt").items():
            split, gender, voice, pitch, rng_, rate, gap = row.split()
            speakers[spk] = dict(split=split, gender=gender, voice=voice, pitch=int(pitch), range=int(rng_),
                                 rate=int(rate), word_gap=int(gap))
        tasks = []
        for split_index, split in enumerate(SPLITS):
            prompts = read_table(root / "data" / "local" / split / "prompts.txt")
            wav_dir = root / "data" / "wav" / split
            wav_dir.mkdir(parents=True, exist_ok=True)
            ordinal = {u: i for i, u in enumerate(sorted(prompts))}
            for job in split_by_speaker(sorted(prompts), size.num_jobs):
                utts = [(u, u.split("_")[0], prompts[u], speakers[u.split("_")[0]], [args.seed, 1, split_index, ordinal[u]])
                        for u in job]
                tasks.append(dict(split=split, wav_dir=str(wav_dir), seed=args.seed, utts=utts))
        cores = len(os.sched_getaffinity(0))
        # maxtasksperchild=1: a fresh process (and espeak-ng) per job, the condition for reproducible audio
        with multiprocessing.get_context("spawn").Pool(min(cores, len(tasks)), maxtasksperchild=1) as pool:
            results = pool.map(synth_job, tasks, chunksize=1)
        by_split = {s: [] for s in SPLITS}
        for task, result in zip(tasks, results):
            by_split[task["split"]].extend(result)
        for split in SPLITS:
            data = root / "data" / split
            rows = sorted(by_split[split])
            write_table(data / "wav.scp", {u: str(root / "data" / "wav" / split / f"{u}.wav") for u, _ in rows})
            write_table(data / "text", {u: " ".join(p for p, _, _ in segs) for u, segs in rows})
            write_table(data / "utt2spk", {u: u.split("_")[0] for u, _ in rows})
            spk2utt: dict[str, list[str]] = {}
            for u, _ in rows:
                spk2utt.setdefault(u.split("_")[0], []).append(u)
            write_table(data / "spk2utt", {s: " ".join(us) for s, us in spk2utt.items()})
            write_table(data / "spk2gender", {s: speakers[s]["gender"] for s in spk2utt})
            write_table(root / "data" / "local" / split / "phone_segments.txt",
                        {u: " ".join(f"{p} {s} {e}" for p, s, e in segs) for u, segs in rows})
            hours = sum(segs[-1][2] for _, segs in rows) / RATE / 3600
            print(f"{split}: {len(rows)} utterances, {len(spk2utt)} speakers, {hours:.2f} h")


if __name__ == "__main__":
    main()

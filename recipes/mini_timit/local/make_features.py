"""Stage 2: Kaldi features and per-speaker CMVN statistics for every split.

Two feature types, both with kaldi-native-fbank (``bru_kaldi.frontend``) and Kaldi's defaults
(``compute-fbank-feats``, ``compute-mfcc-feats``: 25 ms Povey window every 10 ms, pre-emphasis 0.97,
DC removal, ``snip_edges=true``, mel bins from 20 Hz to Nyquist) except:

* ``dither = 0``: Kaldi's default (1.0) adds random noise; without it the archives are
  byte-identical run to run (the noise added by the synthesis stage already fills empty bins);
* fbank: 40 mel bins (``--num-mel-bins=40``, as TIMIT hybrid systems use); MFCC keeps Kaldi's
  23 bins, 13 cepstra and ``--use-energy=true``.

Samples are fed on the int16 scale, as Kaldi reads wav files. Per split, as Kaldi's
``make_fbank.sh`` / ``compute_cmvn_stats.sh --spk2utt`` leave it:

* ``data/<split>/feats.scp`` + ``cmvn.scp``: 40-dim log mel filterbank (the toolkit's default input);
* ``data/<split>/feats_mfcc.scp`` + ``cmvn_mfcc.scp``: 13-dim MFCC;
* ``data/<split>/conf/fbank.conf`` and ``conf/mfcc.conf``: the options of each, as Kaldi's
  ``make_fbank.sh`` and ``make_mfcc.sh`` leave theirs (what a trained model's front end is read from);
* the archives in ``data/<split>/data/`` (one per job), ``utt2num_frames``, ``utt2dur``.

CMVN statistics are Kaldi's: a (2, dim + 1) double matrix per speaker, row 0 the sums and the
frame count, row 1 the sums of squares.
"""

from __future__ import annotations

import multiprocessing
import os
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Iterator

import numpy as np

from bru_kaldi import audio
from bru_kaldi.atomic import atomic_path
from bru_kaldi.frontend import FrontEnd
from recipes.mini_timit.local.layout import (CORE, SIZES, SPLITS, core_speakers, read_table, run_stage, stage_args,
                                             subset_data_dir, write_table)
from recipes.mini_timit.local.synthesize import split_by_speaker

FEATURES = ("fbank", "mfcc")
SCP_NAMES = {"fbank": ("feats.scp", "cmvn.scp"), "mfcc": ("feats_mfcc.scp", "cmvn_mfcc.scp")}
_COMMON = {"sample-frequency": "16000", "dither": "0", "snip-edges": "true", "low-freq": "20", "high-freq": "0"}
FRONT_ENDS = {  # Kaldi's defaults but for these (see the module doc)
    "fbank": FrontEnd("fbank", {**_COMMON, "num-mel-bins": "40", "use-energy": "false"}),
    "mfcc": FrontEnd("mfcc", {**_COMMON, "num-mel-bins": "23", "num-ceps": "13", "use-energy": "true",
                              "cepstral-lifter": "22"}),
}


def compute(kind: str, samples: np.ndarray) -> np.ndarray:
    """Features (T, D) float32 of int16-scale ``samples`` (N,)."""
    return FRONT_ENDS[kind].compute(samples)


def write_confs(data: Path) -> None:
    """``data/conf/<kind>.conf`` for each feature type, as Kaldi's make_fbank.sh and make_mfcc.sh write theirs."""
    for kind in FEATURES:
        FRONT_ENDS[kind].write_conf(data / "conf" / f"{kind}.conf")


def read_wav(path: str) -> np.ndarray:
    """int16 samples of a 16 kHz mono wav, as float32 on the int16 scale."""
    return audio.read_wav(path, rate=16000)


def feature_job(task: dict) -> dict[str, tuple[int, int]]:
    """Write one job's archives (ark + scp per feature type); returns (frames, samples) per utterance."""

    frames = {}
    with ExitStack() as stack:
        writers = {kind: stack.enter_context(ark_scp_writer(Path(task["dir"]) / f"raw_{kind}_{task['split']}.{task['job']}"))
                   for kind in FEATURES}
        for utt, wav in task["utts"]:
            samples = read_wav(wav)
            for kind in FEATURES:
                feats = compute(kind, samples)
                writers[kind](utt, feats)
                frames[utt] = (len(feats), len(samples))
    return frames


@contextmanager
def ark_scp_writer(stem: Path) -> Iterator:
    """kaldiio's writer of ``stem.ark`` and ``stem.scp``, both written atomically (the archive first);
    the scp names the archive by its final name."""
    import kaldiio

    ark, scp = Path(f"{stem}.ark"), Path(f"{stem}.scp")
    with atomic_path(scp) as scp_tmp, atomic_path(ark) as ark_tmp:
        with kaldiio.WriteHelper(f"ark,scp:{ark_tmp},{scp_tmp}") as writer:
            yield writer
        scp_tmp.write_text(scp_tmp.read_text().replace(f"{ark_tmp}:", f"{ark}:"))


def cmvn_stats(feats: list[np.ndarray]) -> np.ndarray:
    """Kaldi's CMVN statistics of a speaker's utterances: (2, D + 1) float64."""
    x = np.concatenate(feats).astype(np.float64)
    stats = np.zeros((2, x.shape[1] + 1))
    stats[0, :-1], stats[0, -1] = x.sum(0), len(x)
    stats[1, :-1] = (x ** 2).sum(0)
    return stats


def write_cmvn(data: Path, split: str, kind: str) -> None:
    """Per-speaker CMVN stats archive of one split and feature type, and its scp."""
    import kaldiio

    feats = kaldiio.load_scp(str(data / SCP_NAMES[kind][0]))
    ark = data / "data" / f"cmvn_{kind}_{split}.ark"
    with ark_scp_writer(ark.with_suffix("")) as writer:
        for spk, utts in read_table(data / "spk2utt").items():
            writer(spk, cmvn_stats([feats[u] for u in utts.split()]))
    scp = ark.with_suffix(".scp")
    write_table(data / SCP_NAMES[kind][1], read_table_text(scp.read_text()))
    scp.unlink()


def read_table_text(text: str) -> dict[str, str]:
    """A Kaldi table given as text."""
    return dict(line.split(" ", 1) for line in text.splitlines() if line)


def main() -> None:
    args = stage_args(2, __doc__.splitlines()[0])
    size = SIZES[args.size]
    root = args.root.resolve()
    with run_stage(root, 2, args.size, args.seed, inputs=(1,)) as run:
        if not run:
            return
        tasks = []
        for split in SPLITS:
            data = root / "data" / split
            (data / "data").mkdir(parents=True, exist_ok=True)
            wavs = read_table(data / "wav.scp")
            for job, utts in enumerate(split_by_speaker(sorted(wavs), size.num_jobs), 1):
                tasks.append(dict(split=split, job=job, dir=str(data / "data"), utts=[(u, wavs[u]) for u in utts]))
        cores = len(os.sched_getaffinity(0))
        with multiprocessing.get_context("fork").Pool(min(cores, len(tasks))) as pool:
            results = pool.map(feature_job, tasks, chunksize=1)
        for split in SPLITS:
            data = root / "data" / split
            frames = {}
            for task, result in zip(tasks, results):
                if task["split"] == split:
                    frames.update(result)
            for kind in FEATURES:
                scp = {}
                for task in tasks:
                    if task["split"] == split:
                        scp.update(read_table(Path(task["dir"]) / f"raw_{kind}_{split}.{task['job']}.scp"))
                write_table(data / SCP_NAMES[kind][0], scp)
                write_cmvn(data, split, kind)
            write_confs(data)
            write_table(data / "utt2num_frames", {u: str(n) for u, (n, _) in frames.items()})
            write_table(data / "utt2dur", {u: f"{samples / 16000:.4f}" for u, (_, samples) in frames.items()})
            print(f"{split}: {len(frames)} utterances, {sum(n for n, _ in frames.values())} frames")
        dev = root / "data" / "dev"
        subset_data_dir(dev, root / "data" / CORE, core_speakers(dev, size.core[1]))


if __name__ == "__main__":
    main()

"""Speed of the data pipeline against the trainer it feeds: the loader must not be what
the trainer waits for.

Builds a synthetic Kaldi corpus in a temporary folder, as Kaldi would have written it: two compressed
feature streams (13-dim MFCC with per-speaker CMVN from cmvn.scp and deltas of order 2, 40-dim fbank
with per-utterance CMVN; 79 features per frame), gzipped alignments and a binary final.mdl. Then it
measures, on this machine:

1. loader: frames per second read and prepared (indexing excluded, reported apart), batches built,
   the next chunk prepared in the background, nothing consuming them;
2. trainer: frames per second of a 4x550 Li-BRU training step (forward, masked cross-entropy over the
   pdfs, backward, RMSprop step) on batches prepared beforehand, after a warm-up step;
3. both together: the training loop fed by the loader, and the share of its time spent waiting for
   the next batch.

Usage: python bench/data_pipeline.py [--utts 400] [--frames 200] [--seconds 20] [--batch-size 8]
  e.g. python bench/data_pipeline.py --utts 2000 --n-chunks 8 --keep /tmp/bench_corpus
"""

from __future__ import annotations

import argparse
import gzip
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import kaldi_hmm_gmm as khg  # before the other kaldi packages (some import orders of the kaldi packages hang)
import kaldi_native_fbank as knf
import kaldi_native_io as knio
import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import models  # noqa: E402
from data_io import Corpus, Dataset, FeatureStream, LabelStream, LoaderOptions  # noqa: E402
from models.acoustic import AcousticModel  # noqa: E402
from bru_kaldi.training import frame_cross_entropy  # noqa: E402
from bru_kaldi.kaldi.transition_model import standard_topology_text, write_transition_model  # noqa: E402


def build_corpus(root: Path, utts: int, frames: int, speakers: int, seed: int) -> int:
    """Write data/ (feats.scp, fbank.scp, utt2spk, cmvn.scp) and ali/ (final.mdl, ali.*.gz); return frames."""
    rng = np.random.default_rng(seed)
    data, ali = root / "data", root / "ali"
    data.mkdir(parents=True)
    ali.mkdir(parents=True)
    topo = khg.HmmTopology()
    topo.read(standard_topology_text(range(2, 49), [1]))  # 48 phones, TIMIT-sized: 146 pdfs
    ctx = khg.monophone_context_dependency(topo.phones, topo.get_phone_to_num_pdf_classes())
    model = khg.TransitionModel(ctx, topo)
    write_transition_model(model, ali / "final.mdl")
    keys = sorted(f"spk{i % speakers:03d}-utt{i:06d}" for i in range(utts))
    lengths = rng.integers(frames // 2, frames * 3 // 2, size=utts)
    stats = {}
    mfcc_w = knio.CompressedMatrixWriter(f"ark,scp:{data}/mfcc.ark,{data}/feats.scp")
    fbank_w = knio.CompressedMatrixWriter(f"ark,scp:{data}/fbank.ark,{data}/fbank.scp")
    alignments = [gzip.open(ali / f"ali.{job}.gz", "wb") for job in (1, 2, 3, 4)]
    for i, (key, T) in enumerate(zip(keys, lengths)):
        mfcc = rng.standard_normal((T, 13)).astype(np.float32) * 5
        fbank = rng.standard_normal((T, 40)).astype(np.float32) + 8
        mfcc_w.write(key, mfcc, knio.CompressionMethod.kAutomaticMethod)
        fbank_w.write(key, fbank, knio.CompressionMethod.kAutomaticMethod)
        stats.setdefault(key.split("-")[0], knf.CmvnAccumulator(13)).accumulate(mfcc)
        tids = rng.integers(1, model.num_transition_ids + 1, size=T).astype("<i4")
        record = np.empty(T, dtype=[("size", "i1"), ("value", "<i4")])  # Kaldi binary int32 vector
        record["size"], record["value"] = 4, tids
        alignments[i % 4].write(f"{key} ".encode() + b"\0B\x04" + np.int32(T).tobytes() + record.tobytes())
    for handle in (mfcc_w, fbank_w, *alignments):
        handle.close()
    with knio.DoubleMatrixWriter(f"ark,scp:{data}/cmvn.ark,{data}/cmvn.scp") as w:
        for speaker in sorted(stats):
            w.write(speaker, np.asarray(stats[speaker].stats, dtype=np.float64))
    (data / "utt2spk").write_text("".join(f"{k} {k.split('-')[0]}\n" for k in keys))
    return int(lengths.sum())


def make_corpus(root: Path, args) -> Corpus:
    d = root / "data"
    spec = Dataset("bench", [
        FeatureStream("mfcc", f"{d}/feats.scp", "cmvn=speaker delta_order=2"),
        FeatureStream("fbank", f"{d}/fbank.scp", "cmvn=utterance"),
    ], [LabelStream("lab_cd", str(root / "ali")),
        LabelStream("lab_mono", str(root / "ali"), "ali-to-phones --per-frame=true")], args.n_chunks)
    return Corpus(spec, LoaderOptions(batch_size=args.batch_size, seed=args.seed))


def measure_loader(corpus: Corpus) -> float:
    start, frames = time.perf_counter(), 0
    for batch in corpus.batches(epoch=0):
        frames += batch.num_frames
    return frames / (time.perf_counter() - start)


def training_step(net, optimizer, batch, device) -> int:
    batch = batch.to(device)
    logits = net(batch.x, batch.lengths)["senone"]
    loss_sum, _, frames = frame_cross_entropy(logits, batch.labels["lab_cd"])
    optimizer.zero_grad(set_to_none=True)
    (loss_sum / frames).backward()
    optimizer.step()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return frames


def measure_trainer(corpus: Corpus, args, device) -> tuple[float, float, float]:
    """(trainer frames/s on prepared batches, frames/s fed by the loader, share of time waiting).

    Each phase trains for about ``--seconds`` (at least one step) after one warm-up step.
    """
    torch.manual_seed(args.seed)
    stack = models.build_stack("libru", corpus.feature_dim, [550] * 4)
    net = AcousticModel([stack], corpus.label_dims["lab_cd"]).to(device)
    optimizer = torch.optim.RMSprop(net.parameters(), lr=1e-4)

    def timed_phase(batches, waits: bool) -> tuple[float, float]:
        training_step(net, optimizer, next(batches), device)  # warm-up (and, fed, the first chunk's load)
        waited, frames, start = 0.0, 0, time.perf_counter()
        while time.perf_counter() - start < args.seconds:
            before = time.perf_counter()
            try:
                batch = next(batches)
            except StopIteration:
                break
            waited += time.perf_counter() - before if waits else 0.0
            frames += training_step(net, optimizer, batch, device)
        total = time.perf_counter() - start
        return frames / total, waited / total

    prepared = list(corpus.batches(epoch=1))  # the whole epoch in memory: the trainer alone
    alone, _ = timed_phase(iter(prepared), waits=False)
    del prepared
    batches = corpus.batches(epoch=2)  # now the loader runs beside the trainer
    fed, waiting = timed_phase(batches, waits=True)
    batches.close()
    return alone, fed, waiting


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--utts", type=int, default=400, help="utterances in the synthetic corpus")
    parser.add_argument("--frames", type=int, default=200, help="mean frames per utterance")
    parser.add_argument("--speakers", type=int, default=20)
    parser.add_argument("--n-chunks", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=20.0, help="time spent training in each timed phase")
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--keep", default="", help="build the corpus in this (new) folder and keep it")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, a few seconds: what the tests run, so that the bench cannot rot (numbers meaningless)")
    args = parser.parse_args()
    if args.smoke:
        args.utts, args.frames, args.speakers, args.n_chunks, args.seconds = 12, 40, 3, 2, 0.2
    print(" ".join([os.path.basename(sys.argv[0])] + sys.argv[1:]))
    device = torch.device(args.device)
    cpu = f"{platform.processor() or platform.machine()} CPU"
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else cpu
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, device {name}, "
          f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores (other work skews the timings)")

    with tempfile.TemporaryDirectory() as scratch:
        root = Path(args.keep or scratch)
        start = time.perf_counter()
        total = build_corpus(root, args.utts, args.frames, args.speakers, args.seed)
        print(f"corpus: {args.utts} utterances, {total} frames, written in {time.perf_counter() - start:.1f} s")
        start = time.perf_counter()
        corpus = make_corpus(root, args)
        print(f"index (scp headers, alignments, CMVN stats): {time.perf_counter() - start:.2f} s, "
              f"{corpus.feature_dim} features, {corpus.label_dims['lab_cd']} pdfs, {args.n_chunks} chunks")
        measure_loader(corpus)  # warm the page cache, as any epoch after the first
        loader = measure_loader(corpus)
        alone, fed, waiting = measure_trainer(corpus, args, device)
    print(f"loader:  {loader:12,.0f} frames/s read and prepared")
    print(f"trainer: {alone:12,.0f} frames/s (4x550 Li-BRU training step, batch {args.batch_size}, {device.type})")
    print(f"ratio loader/trainer: {loader / alone:.1f}x")
    print(f"trainer fed by the loader: {fed:,.0f} frames/s, {100 * waiting:.1f}% of its time waiting for batches")


if __name__ == "__main__":
    main()

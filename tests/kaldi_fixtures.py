"""Kaldi-shaped test data, written the way Kaldi would write it (kaldi-native-io, kaldi-hmm-gmm).

* :func:`khg_model`: a kaldi-hmm-gmm TransitionModel for the standard topology (3-state phones, 5-state
  silence, as utils/gen_topo.pl), for a shared-pdf monophone tree, or for a chain-style topology with
  separate self-loop pdf classes.
* :func:`random_alignment`: a valid transition-id sequence for a phone sequence, found by walking each
  phone's HMM, in Kaldi's plain or reordered arc order.
* :func:`build_corpus`: a data directory (feats.scp from two streams, one compressed; utt2spk;
  cmvn.scp) and an alignment directory (final.mdl, ali.1.gz, ali.2.gz).
"""

from __future__ import annotations

from pathlib import Path

import kaldi_hmm_gmm as khg  # imported first: some import orders of the kaldi packages hang (`import kaldilm, kaldifst` hangs; kaldi_hmm_gmm first is safe)
import kaldi_native_fbank as knf
import kaldi_native_io as knio
import numpy as np

from bru_kaldi.kaldi.transition_model import TransitionModel, standard_topology_text, write_transition_model

SILENCE = 1
NONSILENCE = [2, 3, 4, 5]

CHAIN_TOPOLOGY = """<Topology>
<TopologyEntry>
<ForPhones> 1 2 3 </ForPhones>
<State> 0 <ForwardPdfClass> 0 <SelfLoopPdfClass> 1 <Transition> 0 0.5 <Transition> 1 0.5 </State>
<State> 1 </State>
</TopologyEntry>
</Topology>
"""


def khg_model(kind: str = "standard"):
    """A ``kaldi_hmm_gmm.TransitionModel``: ``"standard"``, ``"shared"`` (phones 4 and 5 share pdfs) or ``"chain"``."""
    topo = khg.HmmTopology()
    topo.read(CHAIN_TOPOLOGY if kind == "chain" else standard_topology_text(NONSILENCE, [SILENCE]))
    classes = topo.get_phone_to_num_pdf_classes()
    if kind == "shared":
        ctx = khg.monophone_context_dependency_shared([[1], [2], [3], [4, 5]], classes)
    else:
        ctx = khg.monophone_context_dependency(topo.phones, classes)
    return khg.TransitionModel(ctx, topo)


def random_alignment(tm: TransitionModel, phones, rng: np.random.Generator, reordered: bool = False) -> np.ndarray:
    """Transition-ids of a random path through the HMMs of ``phones`` (monophone models only).

    Each frame is an arc taken out of an emitting state. Plain order puts a state's self-loops
    before its exit arc; Kaldi's reordered graphs put the exit arc first.
    """
    tstate = {(t.phone, t.hmm_state): n for n, t in enumerate(tm.tuples, 1)}
    out = []
    for phone in phones:
        states = tm.topology.entry(phone)
        state = 0
        while state != len(states) - 1:
            arcs = states[state].transitions
            probs = np.array([p for _, p in arcs])
            first = int(tm.state2id[tstate[(phone, state)]])
            loops = []
            while True:
                k = int(rng.choice(len(arcs), p=probs / probs.sum()))
                if arcs[k][0] != state:
                    break
                loops.append(first + k)
            exit_tid = first + k
            out += [exit_tid] + loops if reordered else loops + [exit_tid]
            state = arcs[k][0]
    return np.array(out, dtype=np.int32)


def random_phones(rng: np.random.Generator, count: int) -> list[int]:
    """Silence, ``count`` phones (repeats allowed, so that splitting must not merge them), silence."""
    return [SILENCE] + [int(p) for p in rng.choice(NONSILENCE, size=count)] + [SILENCE]


def build_corpus(root, num_utts: int = 12, speakers: int = 3, dims=(13, 5), seed: int = 0, jobs: int = 2) -> dict:
    """Write ``root/data`` and ``root/ali`` as Kaldi would; return paths and the truth.

    Returns a dict with ``data``, ``ali`` (paths), ``keys``, ``utt2spk``, ``ali_of`` (key -> tids),
    ``phones_of`` (key -> phone sequence), ``model`` (our TransitionModel), ``khg`` (theirs).
    """
    root = Path(root)
    data, ali = root / "data", root / "ali"
    data.mkdir(parents=True)
    ali.mkdir(parents=True)
    rng = np.random.default_rng(seed)
    reference = khg_model()
    write_transition_model(reference, ali / "final.mdl", binary=True)
    model = TransitionModel.from_kaldi_text(str(reference))
    keys = [f"spk{i % speakers}-utt{i:03d}" for i in range(num_utts)]
    keys.sort()  # Kaldi tables are sorted by key
    utt2spk = {k: k.split("-")[0] for k in keys}
    ali_of, phones_of = {}, {}
    writers = [knio.FloatMatrixWriter(f"ark,scp:{data}/raw_mfcc.ark,{data}/feats.scp"),
               knio.CompressedMatrixWriter(f"ark,scp:{data}/raw_fbank.ark,{data}/fbank.scp")]
    stats: dict[str, knf.CmvnAccumulator] = {}
    for key in keys:
        phones_of[key] = random_phones(rng, int(rng.integers(2, 6)))
        ali_of[key] = random_alignment(model, phones_of[key], rng, reordered=bool(rng.integers(2)))
        T = len(ali_of[key])
        offset = 3.0 * int(utt2spk[key][3:])  # a speaker offset that CMVN must remove
        mfcc = (rng.standard_normal((T, dims[0])) * 2 + offset).astype(np.float32)
        fbank = (rng.standard_normal((T, dims[1])) + 10).astype(np.float32)
        writers[0].write(key, mfcc)
        writers[1].write(key, fbank, knio.CompressionMethod.kAutomaticMethod)
        stats.setdefault(utt2spk[key], knf.CmvnAccumulator(dims[0])).accumulate(mfcc)
    for w in writers:
        w.close()
    with knio.DoubleMatrixWriter(f"ark,scp:{data}/cmvn.ark,{data}/cmvn.scp") as w:
        for speaker in sorted(stats):
            w.write(speaker, np.asarray(stats[speaker].stats, dtype=np.float64))
    (data / "utt2spk").write_text("".join(f"{k} {s}\n" for k, s in utt2spk.items()))
    for job in range(jobs):
        with knio.Int32VectorWriter(f"ark:| gzip -c > {ali}/ali.{job + 1}.gz") as w:
            for key in keys[job::jobs]:
                w.write(key, ali_of[key].tolist())
    return {"data": data, "ali": ali, "keys": keys, "utt2spk": utt2spk, "ali_of": ali_of,
            "phones_of": phones_of, "model": model, "khg": reference}


def path_without_kaldi(path: str) -> str:
    """``path`` (a PATH value) without the folders that hold one of the Kaldi binaries the decoder and
    its scripts call: a test of what happens without Kaldi, or with stand-ins for it, arranges that
    itself, also for a user who has sourced Kaldi's path.sh."""
    import os

    from bru_kaldi.decoding import KALDI_BINARIES

    binaries = (*KALDI_BINARIES, "lattice-beam")
    kept = [folder for folder in path.split(os.pathsep)
            if not any(os.path.exists(os.path.join(folder, name)) for name in binaries)]
    return os.pathsep.join(kept)


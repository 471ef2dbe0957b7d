"""Stage 4: the monophone model ``exp/mono`` and the alignments ``exp/mono_ali_<split>``.

The model is a monophone tree (``tree``) and a TransitionModel over ``data/lang/topo``, both from
kaldi-hmm-gmm, and one diagonal Gaussian per pdf estimated on the training alignments (what
``gmm-init-mono`` and a ``gmm-est`` pass on a fixed alignment give): ``final.mdl`` is a complete GMM
model, which Kaldi's ``gmm-*`` programs and ``steps/align_si.sh`` read. The Gaussians model the
training features as ``align_si.sh`` prepares them: ``feats.scp`` with per-speaker CMVN (means) and
deltas (``add-deltas`` defaults).
Alignments need no acoustic model: the synthesiser says where every phone is
(``data/local/<split>/phone_segments.txt``). A frame belongs to the phone under its centre; each
phone's frames are cut into its HMM states in equal parts; every frame gets the transition-id of
the transition it leaves by (the self-loop, or the forward transition on a state's last frame), as
in a Kaldi alignment. Phones shorter than their number of states borrow frames from neighbours.

Writes ``exp/mono/{final.mdl,tree,phones.txt,num_pdfs}`` and, per split,
``exp/mono_ali_<split>/{ali.N.gz,num_jobs,final.mdl,tree,phones.txt}``: gzipped Kaldi archives of
int32 transition-id vectors, one per speaker-split job, as ``align_si.sh`` leaves them.
"""

from __future__ import annotations

import gzip
import io
import shutil
from pathlib import Path

import numpy as np

from bru_kaldi.atomic import atomic_path, write_atomically
from recipes.mini_timit.local.layout import CORE, SIZES, SPLITS, atomic_write_text, read_table, run_stage, stage_args
from recipes.mini_timit.local.synthesize import split_by_speaker
from bru_kaldi.feature_transforms import add_deltas, apply_cmvn
from bru_kaldi.kaldi.alignments import read_alignments
from bru_kaldi.kaldi.gmm import GaussianStats, write_gmm_model
from bru_kaldi.kaldi.tables import read_matrices
from bru_kaldi.kaldi.transition_model import TransitionModel, write_transition_model

FRAME_SHIFT, FRAME_LENGTH = 160, 400  # samples at 16 kHz; snip_edges=true


def build_model(lang: Path):
    """(topology, tree, TransitionModel) of a monophone system over ``lang/topo``."""
    import kaldi_hmm_gmm as khg

    topo = khg.HmmTopology()
    topo.read((lang / "topo").read_text())
    tree = khg.monophone_context_dependency(topo.phones, topo.get_phone_to_num_pdf_classes())
    return topo, tree, khg.TransitionModel(tree, topo)


def transition_table(topo, tm) -> dict[tuple[int, int, int], int]:
    """``(phone, hmm_state, next_state) -> transition-id`` for every transition of the model.

    kaldi-hmm-gmm does not expose the (phone, hmm-state) of a transition state; for a monophone
    model the transition states of a phone are numbered in HMM-state order, which gives it.
    """
    table, seen_states = {}, {}
    for tid in range(1, tm.num_transition_ids + 1):
        phone, state = tm.transition_id_to_phone(tid), tm.id2state[tid]
        hmm_state = seen_states.setdefault(phone, {}).setdefault(state, len(seen_states[phone]))
        index = tid - tm.state2id[state]
        dest = topo.topology_for_phone(phone)[hmm_state].transitions[index][0]
        if tm.is_self_loop(tid) != (dest == hmm_state):
            raise RuntimeError(f"transition-id {tid}: phone {phone} state {hmm_state} -> {dest} disagrees with the model")
        table[phone, hmm_state, dest] = tid
    return table


def phone_frames(segments: list[tuple[str, int, int]], num_frames: int, min_frames: dict[str, int], utt: str) -> list[int]:
    """Frames per phone: the phone under each frame's centre, then short phones lengthened."""
    centre = np.arange(num_frames) * FRAME_SHIFT + FRAME_LENGTH // 2
    ends = np.array([end for _, _, end in segments])
    counts = np.bincount(np.searchsorted(ends, centre, side="right").clip(max=len(segments) - 1), minlength=len(segments))
    need = np.array([min_frames[p] for p, _, _ in segments])
    if need.sum() > num_frames:
        raise ValueError(f"utterance {utt}: {len(segments)} phones need {need.sum()} frames, it has {num_frames}")
    # a short phone takes frames from the neighbour with the most to spare; the silences at both ends
    # (25 frames of padding) make sure some neighbour always has frames to give
    for _ in range(4 * len(segments)):
        short = np.nonzero(counts < need)[0]
        if len(short) == 0:
            return counts.tolist()
        for i in short:
            while counts[i] < need[i]:
                left = counts[i - 1] - need[i - 1] if i > 0 else -1
                right = counts[i + 1] - need[i + 1] if i + 1 < len(counts) else -1
                donor = i - 1 if left >= right else i + 1
                counts[donor] -= 1
                counts[i] += 1
    raise ValueError(f"utterance {utt}: could not give every phone its minimum number of frames")


def align(segments, num_frames, phone_ids, num_states, table, utt, reorder: bool = False) -> np.ndarray:
    """The transition-id of every frame (num_frames,) int32 of one utterance. Each state's frames are its
    self-loops and then the transition that leaves it, or with ``reorder`` (Kaldi's arc order for graphs
    built with ``reorder = true``, as chain models always are) the transition that leaves it first."""
    min_frames = {p: num_states[phone_ids[p]] for p, _, _ in segments}
    tids = []
    for (phone, _, _), n in zip(segments, phone_frames(segments, num_frames, min_frames, utt)):
        pid, states = phone_ids[phone], num_states[phone_ids[phone]]
        cuts = [round(k * n / states) for k in range(states + 1)]  # equal parts, each >= 1 frame as n >= states
        for s in range(states):
            length = cuts[s + 1] - cuts[s]
            loops, leave = [table[pid, s, s]] * (length - 1), [table[pid, s, s + 1]]
            tids += leave + loops if reorder else loops + leave
    return np.asarray(tids, dtype=np.int32)


def write_gzip_ark(path: Path, vectors: dict[str, np.ndarray]) -> None:
    """A gzipped binary Kaldi archive of int32 vectors (ali.N.gz); mtime 0 keeps it byte-identical."""
    import kaldiio

    buffer = io.BytesIO()
    kaldiio.save_ark(buffer, {k: vectors[k] for k in sorted(vectors, key=str.encode)})
    with atomic_path(path) as tmp, open(tmp, "wb") as raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as gz:
        gz.write(buffer.getvalue())


def write_model(tm, tree, mono: Path) -> None:
    """final.mdl (Kaldi TransitionModel) and tree (binary ContextDependency) into ``mono``."""
    mono.mkdir(parents=True, exist_ok=True)
    write_atomically(mono / "tree", lambda tmp: tree.write(binary=True, filename=str(tmp)))
    # Kaldi's binary format, through the project's writer (kaldi-hmm-gmm writes only text)
    write_transition_model(tm, mono / "final.mdl", binary=True)
    atomic_write_text(mono / "num_pdfs", f"{tm.num_pdfs}\n")


def add_gmm(tm, data_dir: Path, train_ali: Path, mono: Path, ali_dirs) -> None:
    """Estimate a Gaussian per pdf on ``data_dir``'s features (CMVN per speaker, deltas) under the
    alignments of ``train_ali``, and rewrite ``mono/final.mdl`` (and its copies in ``ali_dirs``) as
    TransitionModel + AmDiagGmm."""
    model = tm if isinstance(tm, TransitionModel) else TransitionModel.from_kaldi_text(str(tm), source="mono")
    utt2spk = read_table(data_dir / "utt2spk")
    cmvn = dict(read_matrices(f"scp:{data_dir / 'cmvn.scp'}", dtype=np.float64))
    alignments = dict(read_alignments(str(train_ali)))
    stats = None
    for utt, feats in read_matrices(f"scp:{data_dir / 'feats.scp'}"):
        if utt not in alignments:
            continue
        frames = add_deltas(apply_cmvn(feats, cmvn[utt2spk[utt]]))
        stats = stats or GaussianStats(model.num_pdfs, frames.shape[1])
        stats.add(frames, model.ali_to_pdf(alignments[utt]), source=f"{data_dir}/feats.scp utterance {utt}")
    if stats is None:
        raise ValueError(f"no utterance of {data_dir}/feats.scp has an alignment in {train_ali}")
    write_gmm_model(model, stats.estimate(), mono / "final.mdl")
    for ali_dir in ali_dirs:
        shutil.copyfile(mono / "final.mdl", ali_dir / "final.mdl")
    print(f"GMM: one Gaussian per pdf, {model.num_pdfs} pdfs, dimension {stats.dim}, "
          f"{int(stats.counts.sum())} frames")


def read_segments(path: Path) -> dict[str, list[tuple[str, int, int]]]:
    """``utt phone start end ...`` rows (start and end in samples) as ``{utt: [(phone, start, end)]}``."""
    out = {}
    for utt, row in read_table(path).items():
        f = row.split()
        if len(f) % 3:
            raise ValueError(f"{path}: utterance {utt}: expected phone start end triples")
        out[utt] = [(f[i], int(f[i + 1]), int(f[i + 2])) for i in range(0, len(f), 3)]
    return out


def make_system(root: Path, lang: Path, mono: str, data_suffix: str, segments: str, model, num_jobs: int,
                reorder: bool = False) -> None:
    """The model ``exp/<mono>`` and the alignments ``exp/<mono>_ali_<split>`` of one task.

    ``model`` is ``(topology, tree, TransitionModel)`` over ``lang``; each split's frames are those of
    ``data/<split><data_suffix>`` and its phone segments ``data/local/<split>/<segments>``; ``reorder``:
    the alignments' arc order (:func:`align`). The GMM is estimated last, on the training alignments.
    """
    topo, tree, tm = model
    exp = root / "exp"
    write_model(tm, tree, exp / mono)
    shutil.copyfile(lang / "phones.txt", exp / mono / "phones.txt")
    table = transition_table(topo, tm)
    phone_ids = {p: int(i) for p, i in read_table(lang / "phones.txt").items()}
    num_states = {p: len(topo.topology_for_phone(p)) - 1 for p in topo.phones}  # emitting: all but the last
    for split in SPLITS + (CORE,):  # and the core of dev, data/dev_core (layout.Size), aligned on its own
        ali_dir = exp / f"{mono}_ali_{split}"
        ali_dir.mkdir(parents=True, exist_ok=True)
        frames = {u: int(n) for u, n in read_table(root / "data" / f"{split}{data_suffix}" / "utt2num_frames").items()}
        segs = read_segments(root / "data" / "local" / ("dev" if split == CORE else split) / segments)
        if split == CORE:
            segs = {u: row for u, row in segs.items() if u in frames}
        if set(segs) != set(frames):
            raise ValueError(f"{split}: {segments} and utt2num_frames list different utterances")
        for utt, row in segs.items():
            unknown = {p for p, _, _ in row} - set(phone_ids)
            if unknown:
                raise ValueError(f"data/local/{split}/{segments}: utterance {utt} has phones not in "
                                 f"{lang / 'phones.txt'}: {sorted(unknown)}")
        jobs = split_by_speaker(sorted(frames, key=str.encode), num_jobs)
        for job, utts in enumerate(jobs, 1):
            write_gzip_ark(ali_dir / f"ali.{job}.gz",
                           {u: align(segs[u], frames[u], phone_ids, num_states, table, u, reorder) for u in utts})
        for name in ("final.mdl", "tree", "phones.txt"):
            shutil.copyfile(exp / mono / name, ali_dir / name)
        atomic_write_text(ali_dir / "num_jobs", f"{len(jobs)}\n")
        print(f"{split}: {len(frames)} alignments in {len(jobs)} archives")
    add_gmm(tm, root / "data" / f"train{data_suffix}", exp / f"{mono}_ali_train", exp / mono,
            [exp / f"{mono}_ali_{split}" for split in SPLITS + (CORE,)])


def main() -> None:
    args = stage_args(4, __doc__.splitlines()[0])
    root = args.root.resolve()
    with run_stage(root, 4, args.size, args.seed, inputs=(2, 3)) as run:
        if not run:
            return
        lang = root / "data" / "lang"
        make_system(root, lang, "mono", "", "phone_segments.txt", build_model(lang), SIZES[args.size].num_jobs)


if __name__ == "__main__":
    main()

"""Stage 4 of the word task: the monophone model ``exp/mono_words`` and the alignments ``exp/mono_words_ali_<split>``.

What ``gmm-init-mono --shared-phones=phones/sets.int`` starts from in WSJ's ``train_mono.sh``, without
Gaussians: a monophone tree whose four word-position versions of a phone (``aa_B aa_E aa_I aa_S``;
five for silence phones) share their pdfs, and a TransitionModel over ``data/lang_words/topo``, so
the transition-ids still tell the word positions apart. Alignments are made as the phone task's
(``make_mono.align``: the synthesiser's segments, equal state splits) from the segments with
word-position-dependent phones that stage 3 wrote (``data/local/<split>/word_phone_segments.txt``).

Writes ``exp/mono_words/{final.mdl,tree,phones.txt,num_pdfs}`` and, per split,
``exp/mono_words_ali_<split>/{ali.N.gz,num_jobs,final.mdl,tree,phones.txt}``.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from recipes.mini_timit.local.layout import SIZES, SPLITS, atomic_write_text, read_table, run_stage, stage_args
from recipes.mini_timit.local.make_mono import add_gmm, align, transition_table, write_gzip_ark, write_model
from recipes.mini_timit.local.synthesize import split_by_speaker


def build_shared_model(lang: Path):
    """(topology, tree, TransitionModel): a monophone system whose phone sets share pdfs."""
    import kaldi_hmm_gmm as khg

    topo = khg.HmmTopology()
    topo.read((lang / "topo").read_text())
    sets = [[int(p) for p in line.split()] for line in (lang / "phones" / "sets.int").read_text().splitlines()]
    if sorted(p for s in sets for p in s) != sorted(topo.phones):
        raise ValueError(f"{lang / 'phones/sets.int'} does not list each phone of {lang / 'topo'} once")
    tree = khg.monophone_context_dependency_shared(sets, topo.get_phone_to_num_pdf_classes())
    return topo, tree, khg.TransitionModel(tree, topo)


def read_segments(path: Path) -> dict[str, list[tuple[str, int, int]]]:
    """``utt phone start end ...`` rows as ``{utt: [(phone, start, end)]}``."""
    out = {}
    for utt, row in read_table(path).items():
        f = row.split()
        if len(f) % 3:
            raise ValueError(f"{path}: utterance {utt}: expected phone start end triples")
        out[utt] = [(f[i], int(f[i + 1]), int(f[i + 2])) for i in range(0, len(f), 3)]
    return out


def main() -> None:
    args = stage_args(4, __doc__.splitlines()[0], task="words")
    size = SIZES[args.size]
    root = args.root.resolve()
    with run_stage(root, 4, args.size, args.seed, inputs=(2, 3), task="words") as run:
        if not run:
            return
        lang, mono = root / "data" / "lang_words", root / "exp" / "mono_words"
        topo, tree, tm = build_shared_model(lang)
        write_model(tm, tree, mono)
        shutil.copyfile(lang / "phones.txt", mono / "phones.txt")
        table = transition_table(topo, tm)
        phone_ids = {p: int(i) for p, i in read_table(lang / "phones.txt").items()}
        num_states = dict(zip(topo.phones, topo.get_phone_to_num_pdf_classes()[1:]))
        for split in SPLITS:
            ali_dir = root / "exp" / f"mono_words_ali_{split}"
            ali_dir.mkdir(parents=True, exist_ok=True)
            frames = {u: int(n) for u, n in read_table(root / "data" / f"{split}_words" / "utt2num_frames").items()}
            segs = read_segments(root / "data" / "local" / split / "word_phone_segments.txt")
            if set(segs) != set(frames):
                raise ValueError(f"{split}: word_phone_segments.txt and utt2num_frames list different utterances")
            for utt, row in segs.items():
                unknown = {p for p, _, _ in row} - set(phone_ids)
                if unknown:
                    raise ValueError(f"data/local/{split}/word_phone_segments.txt: utterance {utt} has phones "
                                     f"not in {lang / 'phones.txt'}: {sorted(unknown)}")
            jobs = split_by_speaker(sorted(frames, key=str.encode), size.num_jobs)
            for job, utts in enumerate(jobs, 1):
                write_gzip_ark(ali_dir / f"ali.{job}.gz",
                               {u: align(segs[u], frames[u], phone_ids, num_states, table, u) for u in utts})
            for name in ("final.mdl", "tree", "phones.txt"):
                shutil.copyfile(mono / name, ali_dir / name)
            atomic_write_text(ali_dir / "num_jobs", f"{len(jobs)}\n")
            print(f"{split}: {len(frames)} alignments in {len(jobs)} archives")
        add_gmm(tm, root / "data" / "train_words", root / "exp" / "mono_words_ali_train", mono,
                [root / "exp" / f"mono_words_ali_{split}" for split in SPLITS])
        print(f"model: {tm.num_pdfs} pdfs, {tm.num_transition_ids} transition-ids")


if __name__ == "__main__":
    main()

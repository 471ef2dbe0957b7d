"""Stage 4 of the word task: the monophone model ``exp/mono_words`` and the alignments ``exp/mono_words_ali_<split>``.

What ``gmm-init-mono --shared-phones=phones/sets.int`` starts from in WSJ's ``train_mono.sh``, without
Gaussians: a monophone tree whose four word-position versions of a phone (``aa_B aa_E aa_I aa_S``;
five for silence phones) share their pdfs, and a TransitionModel over ``data/lang_words/topo``, so
the transition-ids still tell the word positions apart. Alignments are made as the phone task's
(``make_mono.make_system``: the synthesiser's segments, equal state splits) from the segments with
word-position-dependent phones that stage 3 wrote (``data/local/<split>/word_phone_segments.txt``).

Writes ``exp/mono_words/{final.mdl,tree,phones.txt,num_pdfs}`` and, per split,
``exp/mono_words_ali_<split>/{ali.N.gz,num_jobs,final.mdl,tree,phones.txt}``.
"""

from __future__ import annotations

from pathlib import Path

from recipes.mini_timit.local.layout import SIZES, run_stage, stage_args
from recipes.mini_timit.local.make_mono import make_system


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


def main() -> None:
    args = stage_args(4, __doc__.splitlines()[0], task="words")
    root = args.root.resolve()
    with run_stage(root, 4, args.size, args.seed, inputs=(2, 3), task="words") as run:
        if not run:
            return
        lang = root / "data" / "lang_words"
        topo, tree, tm = build_shared_model(lang)
        make_system(root, lang, "mono_words", "_words", "word_phone_segments.txt", (topo, tree, tm),
                    SIZES[args.size].num_jobs)
        print(f"model: {tm.num_pdfs} pdfs, {tm.num_transition_ids} transition-ids")


if __name__ == "__main__":
    main()

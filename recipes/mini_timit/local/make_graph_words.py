"""Stage 5 of the word task: ``exp/mono_words/graph_{tg,tgpr}``, as ``utils/mkgraph.sh`` makes them.

One graph per LM, from ``data/lang_words_test_<lm>`` (L_disambig.fst + G.fst) and the word task's
model, by the phone task's steps (``make_graph.make_hclg``: LG determinised and minimised, context
width 1, H, disambiguation transition-ids removed, self-loops with scale 0.1). Each graph dir holds
``HCLG.fst``, ``words.txt``, ``phones.txt``, ``phones/`` (``word_boundary.int`` and
``align_lexicon.int`` among them, for word alignment of lattices), ``disambig_tid.int`` and ``num_pdfs``.

Runs in its own process: kaldi_hmm_gmm is imported before kaldifst (see ``make_graph.py``).
"""

from __future__ import annotations

import time

from recipes.mini_timit.local.layout import LMS, run_stage, stage_args
from recipes.mini_timit.local.make_graph import make_hclg, write_graph  # imports kaldi_hmm_gmm, then kaldifst
from recipes.mini_timit.local.make_mono_words import build_shared_model


def write_word_graphs(root, name: str = "graph", self_loop_scale: float = 0.1) -> None:
    """``exp/mono_words/<name>_<lm>`` for each LM, at ``self_loop_scale`` (stage 7 makes the chain graphs)."""
    _, tree, tm = build_shared_model(root / "data" / "lang_words")
    for lm in LMS:
        start = time.time()
        lang = root / "data" / f"lang_words_test_{lm}"
        hclg, disambig_tid = make_hclg(lang, tree, tm, self_loop_scale=self_loop_scale)
        write_graph(root / "exp" / "mono_words" / f"{name}_{lm}", lang, hclg, disambig_tid, tm.num_pdfs)
        print(f"{name}_{lm}: HCLG {hclg.num_states} states; {tm.num_pdfs} pdfs, {tm.num_transition_ids} "
              f"transition-ids ({time.time() - start:.1f} s)")


def main() -> None:
    args = stage_args(5, __doc__.splitlines()[0], task="words")
    root = args.root.resolve()
    with run_stage(root, 5, args.size, args.seed, inputs=(3, 4), task="words") as run:
        if run:
            write_word_graphs(root)


if __name__ == "__main__":
    main()

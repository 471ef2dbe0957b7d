"""Stage 8 of the word task: the chain model ``exp/chain_words`` and its graphs ``exp/chain_words/graph_{tg,tgpr}``.

As stage 8 of the phone task (``make_chain``: the chain topology, its tree, the alignments in reordered arc
order, the graphs at scale 1.0), over ``data/lang_words``: ``data/lang_words_chain`` holds the chain
topology, the tree shares each phone's pdfs among its word-position versions as stage 4's does
(``phones/sets.int``), and the graphs are made from the same ``data/lang_words_test_<lm>`` as stage 5's.

Runs in its own process: kaldi_hmm_gmm is imported before kaldifst (see ``make_graph.py``).
"""

from __future__ import annotations

import time

from recipes.mini_timit.local.layout import LMS, SIZES, run_stage, stage_args
from recipes.mini_timit.local.make_chain import CHAIN_SCALE, chain_lang  # imports kaldi_hmm_gmm, then kaldifst
from recipes.mini_timit.local.make_graph import make_hclg, write_graph
from recipes.mini_timit.local.make_mono import make_system
from recipes.mini_timit.local.make_mono_words import build_shared_model


def main() -> None:
    args = stage_args(8, __doc__.splitlines()[0], task="words")
    root = args.root.resolve()
    with run_stage(root, 8, args.size, args.seed, inputs=(3, 4), task="words") as run:
        if not run:
            return
        lang = chain_lang(root / "data" / "lang_words", root / "data" / "lang_words_chain")
        topo, tree, tm = build_shared_model(lang)
        make_system(root, lang, "chain_words", "_words", "word_phone_segments.txt", (topo, tree, tm),
                    SIZES[args.size].num_jobs, reorder=True)
        for lm in LMS:
            start = time.time()
            test_lang = root / "data" / f"lang_words_test_{lm}"
            hclg, disambig_tid = make_hclg(test_lang, tree, tm, self_loop_scale=CHAIN_SCALE)
            write_graph(root / "exp" / "chain_words" / f"graph_{lm}", test_lang, hclg, disambig_tid, tm.num_pdfs)
            print(f"graph_{lm}: HCLG {hclg.num_states} states ({time.time() - start:.1f} s)")
        print(f"chain model: {tm.num_pdfs} pdfs, {tm.num_transition_ids} transition-ids")


if __name__ == "__main__":
    main()

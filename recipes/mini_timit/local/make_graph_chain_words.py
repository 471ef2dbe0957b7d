"""Stage 7 of the word task: the chain models' graphs ``exp/mono_words/graph_chain_{tg,tgpr}``.

As stage 5 of the word task (``make_graph_words``), with ``mkgraph.sh --self-loop-scale 1.0`` as Kaldi's
chain recipes (``make_graph_chain`` says why).

Runs in its own process: kaldi_hmm_gmm is imported before kaldifst (see ``make_graph.py``).
"""

from __future__ import annotations

import time

from recipes.mini_timit.local.layout import LMS, run_stage, stage_args
from recipes.mini_timit.local.make_graph import make_hclg, write_graph  # imports kaldi_hmm_gmm, then kaldifst
from recipes.mini_timit.local.make_graph_chain import CHAIN_SELF_LOOP_SCALE
from recipes.mini_timit.local.make_mono_words import build_shared_model


def main() -> None:
    args = stage_args(7, __doc__.splitlines()[0], task="words")
    root = args.root.resolve()
    with run_stage(root, 7, args.size, args.seed, inputs=(3, 4), task="words") as run:
        if not run:
            return
        _, tree, tm = build_shared_model(root / "data" / "lang_words")
        for lm in LMS:
            start = time.time()
            lang = root / "data" / f"lang_words_test_{lm}"
            hclg, disambig_tid = make_hclg(lang, tree, tm, self_loop_scale=CHAIN_SELF_LOOP_SCALE)
            write_graph(root / "exp" / "mono_words" / f"graph_chain_{lm}", lang, hclg, disambig_tid, tm.num_pdfs)
            print(f"graph_chain_{lm}: HCLG {hclg.num_states} states ({time.time() - start:.1f} s)")


if __name__ == "__main__":
    main()

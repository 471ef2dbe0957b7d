"""Stage 7 of the word task: the chain models' graphs ``exp/mono_words/graph_chain_{tg,tgpr}``.

As stage 5 of the word task (``make_graph_words``), with ``mkgraph.sh --self-loop-scale 1.0`` as Kaldi's
chain recipes (``make_graph_chain`` says why).

Runs in its own process: kaldi_hmm_gmm is imported before kaldifst (see ``make_graph.py``).
"""

from __future__ import annotations

from recipes.mini_timit.local.layout import run_stage, stage_args
from recipes.mini_timit.local.make_graph_chain import CHAIN_SELF_LOOP_SCALE  # imports kaldi_hmm_gmm, then kaldifst
from recipes.mini_timit.local.make_graph_words import write_word_graphs


def main() -> None:
    args = stage_args(7, __doc__.splitlines()[0], task="words")
    root = args.root.resolve()
    with run_stage(root, 7, args.size, args.seed, inputs=(3, 4), task="words") as run:
        if run:
            write_word_graphs(root, "graph_chain", CHAIN_SELF_LOOP_SCALE)


if __name__ == "__main__":
    main()

"""Stage 7: the decoding graph of chain (LF-MMI) models, ``exp/mono/graph_chain``.

Kaldi's chain recipes build their graphs with ``utils/mkgraph.sh --self-loop-scale 1.0`` (transition
scale 1.0 too, mkgraph's default), because a chain model is decoded at acoustic scale 1.0: with the
cross-entropy graphs' self-loop scale of 0.1 the self-loops' probabilities would be scaled down
against outputs that are not scaled. Otherwise the steps of stage 5 (``make_graph.make_hclg``), on the
same lang dir and model; the graph dir holds the same files.

Runs in its own process: kaldi_hmm_gmm is imported before kaldifst (see ``make_graph.py``).
"""

from __future__ import annotations

from recipes.mini_timit.local.layout import run_stage, stage_args
from recipes.mini_timit.local.make_graph import write_phone_graph  # imports kaldi_hmm_gmm, then kaldifst

CHAIN_SELF_LOOP_SCALE = 1.0  # mkgraph.sh --self-loop-scale 1.0, as Kaldi's chain recipes


def main() -> None:
    args = stage_args(7, __doc__.splitlines()[0])
    root = args.root.resolve()
    with run_stage(root, 7, args.size, args.seed, inputs=(3, 4)) as run:
        if run:
            write_phone_graph(root, "graph_chain", CHAIN_SELF_LOOP_SCALE)


if __name__ == "__main__":
    main()

"""Stage 8: a chain model ``exp/chain``, as Kaldi's chain recipes make one before training: the chain topology,
a tree for it, the alignments in its transition-ids, and its decoding graph.

Without Kaldi, the steps of ``steps/nnet3/chain/gen_topo.py``, ``build_tree.sh`` and ``mkgraph.sh
--self-loop-scale 1.0``:

* ``data/lang_chain``: ``data/lang`` with the chain topology (``chain_topology_text``: one emitting state per
  phone, a forward pdf and a self-loop pdf);
* ``exp/chain/{final.mdl,tree,phones.txt,num_pdfs}``: a monophone tree over it, two pdfs per phone, and the
  TransitionModel with one Gaussian per pdf (what stage 4 makes, for this topology);
* ``exp/chain_ali_<split>/ali.N.gz``: the synthesiser's phone segments (stage 4's), in the reordered arc order
  of chain graphs: each phone's first frame leaves its state (its forward pdf), the others are self-loops;
* ``exp/chain/graph/HCLG.fst``: the decoding graph at transition and self-loop scale 1.0, the scales of the
  LF-MMI denominator (``bru_kaldi.chain.den_graph``), so that decoding weighs HMM arcs as training did.

The network is trained at a third of the frame rate (``[model] frame_subsampling_factor = 3``), so a phone
lasts at least 30 ms in the graph; the alignments stay at the full rate, as Kaldi keeps them, and the
LF-MMI numerator subsamples them (``bru_kaldi.chain.supervision``).

Runs in its own process: kaldi_hmm_gmm is imported before kaldifst (see ``make_graph.py``).
"""

from __future__ import annotations

from pathlib import Path

from bru_kaldi.kaldi.transition_model import chain_topology_text
from recipes.mini_timit.local.layout import SIZES, atomic_write_text, copy_folder, run_stage, stage_args
from recipes.mini_timit.local.make_graph import make_hclg, write_graph  # imports kaldi_hmm_gmm, then kaldifst
from recipes.mini_timit.local.make_mono import build_model, make_system

CHAIN_SCALE = 1.0  # mkgraph.sh --self-loop-scale 1.0 (and --transition-scale 1.0), as the denominator's


def chain_lang(lang: Path, chain: Path) -> Path:
    """``chain``: a copy of the lang dir ``lang`` with the chain topology over the same phones."""
    copy_folder(lang, chain)
    phones = [int(p) for p in (lang / "phones" / "silence.int").read_text().split()
              + (lang / "phones" / "nonsilence.int").read_text().split()]
    atomic_write_text(chain / "topo", chain_topology_text(sorted(phones)))
    return chain


def main() -> None:
    args = stage_args(8, __doc__.splitlines()[0])
    root = args.root.resolve()
    with run_stage(root, 8, args.size, args.seed, inputs=(3, 4)) as run:
        if not run:
            return
        lang = chain_lang(root / "data" / "lang", root / "data" / "lang_chain")
        topo, tree, tm = build_model(lang)
        make_system(root, lang, "chain", "", "phone_segments.txt", (topo, tree, tm), SIZES[args.size].num_jobs,
                    reorder=True)
        hclg, disambig_tid = make_hclg(lang, tree, tm, self_loop_scale=CHAIN_SCALE)
        write_graph(root / "exp" / "chain" / "graph", lang, hclg, disambig_tid, tm.num_pdfs)
        print(f"chain model: {tm.num_pdfs} pdfs, {tm.num_transition_ids} transition-ids; graph: HCLG "
              f"{hclg.num_states} states (scale {CHAIN_SCALE})")


if __name__ == "__main__":
    main()

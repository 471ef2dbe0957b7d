"""Stage 5 of the word task: ``exp/mono_words/graph_{tg,tgpr}``, as ``utils/mkgraph.sh`` makes them.

One graph per LM, from ``data/lang_words_test_<lm>`` (L_disambig.fst + G.fst) and the word task's
model, by the phone task's steps (``make_graph.make_hclg``: LG determinised and minimised, context
width 1, H, disambiguation transition-ids removed, self-loops with scale 0.1). Each graph dir holds
``HCLG.fst``, ``words.txt``, ``phones.txt``, ``phones/`` (``word_boundary.int`` and
``align_lexicon.int`` among them, for word alignment of lattices), ``disambig_tid.int`` and ``num_pdfs``.

Runs in its own process: kaldi_hmm_gmm is imported before kaldifst (see ``make_graph.py``).
The one step done differently: ``fstrmsymbols`` (disambiguation transition-ids to epsilon) is a
composition with a one-state transducer that reads nothing where HCLG reads one of them, in C++,
where ``make_graph.remove_input_symbols`` copies the FST arc by arc in Python (seconds for a word
graph); the result is the same FST up to the numbering of its states.
"""

from __future__ import annotations

import time
from pathlib import Path

import kaldi_hmm_gmm as khg  # first: some import orders of the kaldi packages hang
import kaldifst

from bru_kaldi.atomic import write_atomically
from recipes.mini_timit.local.layout import LMS, atomic_write_text, run_stage, stage_args
from recipes.mini_timit.local.make_graph import read_fst
from recipes.mini_timit.local.make_mono_words import build_shared_model
from recipes.mini_timit.local.prepare_lang_words import copy_lang


def drop_input_symbols(fst: kaldifst.StdVectorFst, symbols: set[int], num_symbols: int) -> kaldifst.StdVectorFst:
    """fstrmsymbols on the input side: ``symbols`` (all below ``num_symbols`` + 1) become epsilon."""
    relabel = kaldifst.StdVectorFst()
    state = relabel.add_state()
    relabel.start = state
    relabel.set_final(state=state, weight=0.0)
    for label in range(1, num_symbols + 1):  # keeps every other label, reads nothing for the dropped ones
        relabel.add_arc(state=state, arc=kaldifst.StdArc(0 if label in symbols else label, label, 0.0, state))
    kaldifst.arcsort(relabel, sort_type="olabel")
    return kaldifst.compose(relabel, fst)


def make_hclg(lang: Path, tree, tm) -> tuple[kaldifst.StdVectorFst, list[int]]:
    """HCLG.fst and the disambiguation transition-ids: ``make_graph.make_hclg``'s steps (see the module doc)."""
    phone_ids = dict(line.split() for line in (lang / "phones.txt").read_text().splitlines())
    disambig = [int(i) for p, i in phone_ids.items() if p.startswith("#")]
    lg = kaldifst.compose(read_fst(lang / "L_disambig.fst"), read_fst(lang / "G.fst"))
    kaldifst.determinize_star(lg, use_log=True)
    kaldifst.minimize_encoded(lg)
    clg, ilabels = kaldifst.compose_context(disambig_syms=disambig, context_width=tree.context_width,
                                            central_position=tree.central_position, ifst=lg)
    kaldifst.arcsort(clg, sort_type="ilabel")
    ha, disambig_tid = khg.get_h_transducer(ilabel_info=ilabels, ctx_dep=tree, trans_model=tm,
                                            config=khg.HTransducerConfig(transition_scale=1.0))
    hclga = kaldifst.compose(ha, clg)
    kaldifst.determinize_star(hclga, use_log=True)
    hclga = drop_input_symbols(hclga, set(disambig_tid), tm.num_transition_ids + len(disambig_tid))
    kaldifst.rmepsilon(hclga)
    kaldifst.minimize_encoded(hclga)
    hclg = khg.add_self_loops(self_loop_scale=0.1, disambig_syms=[], reorder=True, trans_model=tm, ifst=hclga)
    return hclg, list(disambig_tid)


def main() -> None:
    args = stage_args(5, __doc__.splitlines()[0], task="words")
    root = args.root.resolve()
    with run_stage(root, 5, args.size, args.seed, inputs=(3, 4), task="words") as run:
        if not run:
            return
        _, tree, tm = build_shared_model(root / "data" / "lang_words")
        for lm in LMS:
            start = time.time()
            lang, graph = root / "data" / f"lang_words_test_{lm}", root / "exp" / "mono_words" / f"graph_{lm}"
            hclg, disambig_tid = make_hclg(lang, tree, tm)
            graph.mkdir(parents=True, exist_ok=True)
            write_atomically(graph / "HCLG.fst", lambda tmp: hclg.write(str(tmp)))
            for name in ("words.txt", "phones.txt"):
                atomic_write_text(graph / name, (lang / name).read_text(encoding="utf-8"))
            copy_lang(lang / "phones", graph / "phones")
            atomic_write_text(graph / "disambig_tid.int", "".join(f"{t}\n" for t in disambig_tid))
            atomic_write_text(graph / "num_pdfs", f"{tm.num_pdfs}\n")
            print(f"graph_{lm}: HCLG {hclg.num_states} states; {tm.num_pdfs} pdfs, {tm.num_transition_ids} "
                  f"transition-ids ({time.time() - start:.1f} s)")


if __name__ == "__main__":
    main()

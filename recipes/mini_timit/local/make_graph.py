"""Stage 5: the decoding graph ``exp/mono/graph``, the steps of Kaldi's ``utils/mkgraph.sh``.

With kaldi-hmm-gmm and kaldifst in place of Kaldi's binaries (mono: context width 1)::

    LG    = fstminimizeencoded(fstdeterminizestar --use-log(fsttablecompose L_disambig G))
    CLG   = fstcomposecontext --context-size=1 --central-position=0 LG          (+ ilabels)
    Ha    = make-h-transducer --transition-scale=1.0 ilabels tree final.mdl    (+ disambig_tid)
    HCLGa = fstminimizeencoded(fstrmepslocal(fstrmsymbols disambig_tid (fstdeterminizestar --use-log(Ha o CLG))))
    HCLG  = add-self-loops --self-loop-scale=0.1 --reorder=true final.mdl HCLGa

``fstpushspecial`` (weight pushing for speed) has no counterpart and is left out: it moves weights
along paths without changing any path's total, so the best path is the same. ``fstrmepslocal``
becomes a full ``rmepsilon``, which is exact too. Writes ``HCLG.fst``, ``words.txt``,
``phones.txt``, ``phones/`` (copied from the lang dir), ``disambig_tid.int`` and ``num_pdfs``.

Runs in its own process: it imports kaldi_hmm_gmm first and kaldifst second (some import orders
of these packages hang for ever, e.g. ``import kaldilm, kaldifst``).
"""

from __future__ import annotations

from pathlib import Path

import kaldi_hmm_gmm as khg  # first: see the module docstring
import kaldifst

from bru_kaldi.atomic import write_atomically
from recipes.mini_timit.local.layout import atomic_write_text, copy_folder, run_stage, stage_args
from recipes.mini_timit.local.make_mono import build_model


def read_fst(path: Path) -> kaldifst.StdVectorFst:
    """Read a binary FST, naming the file when it is missing."""
    if not path.is_file():
        raise FileNotFoundError(f"no such FST {path}")
    return kaldifst.StdVectorFst.read(str(path))


def drop_input_symbols(fst: kaldifst.StdVectorFst, symbols: set[int]) -> kaldifst.StdVectorFst:
    """fstrmsymbols on the input side: ``symbols`` become epsilon.

    kaldifst has no such call. A composition with a one-state transducer that reads nothing where
    ``fst`` reads one of ``symbols`` and copies every other label does it in C++; copying the FST arc
    by arc in Python took seconds for a word graph. The result is the FST with those labels replaced,
    up to the numbering of its states. The transducer knows labels 1..max(symbols): here ``symbols`` are
    the disambiguation transition-ids, which make-h-transducer numbers after every real one.
    """
    if not symbols:  # (a grammar without disambiguation symbols)
        return fst
    relabel = kaldifst.StdVectorFst()
    state = relabel.add_state()
    relabel.start = state
    relabel.set_final(state=state, weight=0.0)
    for label in range(1, max(symbols) + 1):
        relabel.add_arc(state=state, arc=kaldifst.StdArc(0 if label in symbols else label, label, 0.0, state))
    kaldifst.arcsort(relabel, sort_type="olabel")
    return kaldifst.compose(relabel, fst)


def make_hclg(lang: Path, tree, tm, self_loop_scale: float = 0.1) -> tuple[kaldifst.StdVectorFst, list[int]]:
    """HCLG.fst of a monophone model over ``lang`` (L_disambig.fst, G.fst, phones.txt) and its
    disambiguation transition-ids (see the module doc); the word task's graphs are made by it too.
    ``self_loop_scale``: ``mkgraph.sh``'s, 0.1 for cross-entropy models, 1.0 for chain models (stage 7)."""
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
    hclga = drop_input_symbols(hclga, set(disambig_tid))
    kaldifst.rmepsilon(hclga)
    kaldifst.minimize_encoded(hclga)
    hclg = khg.add_self_loops(self_loop_scale=self_loop_scale, disambig_syms=[], reorder=True, trans_model=tm, ifst=hclga)
    return hclg, list(disambig_tid)


def write_graph(graph: Path, lang: Path, hclg: kaldifst.StdVectorFst, disambig_tid: list[int], num_pdfs: int) -> None:
    """The graph dir as ``utils/mkgraph.sh`` leaves it: ``HCLG.fst``, ``words.txt``, ``phones.txt`` and
    ``phones/`` from ``lang``, ``disambig_tid.int`` and ``num_pdfs``."""
    graph.mkdir(parents=True, exist_ok=True)
    write_atomically(graph / "HCLG.fst", lambda tmp: hclg.write(str(tmp)))
    for name in ("words.txt", "phones.txt"):
        atomic_write_text(graph / name, (lang / name).read_text(encoding="utf-8"))
    copy_folder(lang / "phones", graph / "phones")
    atomic_write_text(graph / "disambig_tid.int", "".join(f"{t}\n" for t in disambig_tid))
    atomic_write_text(graph / "num_pdfs", f"{num_pdfs}\n")


def write_phone_graph(root: Path, name: str = "graph", self_loop_scale: float = 0.1) -> None:
    """``exp/mono/<name>`` of the phone task at ``self_loop_scale`` (stage 7 makes the chain graph)."""
    lang = root / "data" / "lang"
    _, tree, tm = build_model(lang)
    hclg, disambig_tid = make_hclg(lang, tree, tm, self_loop_scale=self_loop_scale)
    write_graph(root / "exp" / "mono" / name, lang, hclg, disambig_tid, tm.num_pdfs)
    print(f"{name}: HCLG {hclg.num_states} states (self-loop scale {self_loop_scale}); {tm.num_pdfs} pdfs, "
          f"{tm.num_transition_ids} transition-ids")


def main() -> None:
    args = stage_args(5, __doc__.splitlines()[0])
    root = args.root.resolve()
    with run_stage(root, 5, args.size, args.seed, inputs=(3, 4)) as run:
        if run:
            write_phone_graph(root)


if __name__ == "__main__":
    main()

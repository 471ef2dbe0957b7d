"""One set of HMM transition weights for LF-MMI training and for decoding: every HMM arc of the denominator
graph (bru_kaldi/chain/den_graph.py, what den.fst holds) weighs what the same arc weighs in the chain decoding
graph that the built-in corpus's recipe makes with kaldi-hmm-gmm's H transducer and add_self_loops (Kaldi's
own code, mkgraph.sh --self-loop-scale 1.0), arc for arc, by transition-id.

Two models of the tiny corpus: the chain model (stage 8: one state per phone, 0.5 / 0.5) and the 3-state
monophone model (stage 4: 0.75 / 0.25, silence's five states with skips) under its chain graph (stage 7),
whose weights are uneven enough that a missing factor shows.

* On the recipe's own graphs, whose arcs also carry the word (here phone) LM's weights: the self-loops and the
  transitions inside a phone, which no LM weight touches.
* On graphs made by the same recipe code from a grammar without weights (a phone loop) and a denominator LM
  without weights: every arc, phone entries included.
"""

import subprocess
import sys
from collections import defaultdict

import numpy as np
import pytest

from bru_kaldi.chain.den_graph import denominator_graph
from bru_kaldi.chain.phone_lm import PhoneLM
from bru_kaldi.chain.supervision import estimate_denominator
from bru_kaldi.kaldi.transition_model import read_transition_model

pytestmark = pytest.mark.slow  # builds decoding graphs in a subprocess


def hclg_weights(path):
    """transition-id -> the set of weights (probabilities, to 4 decimals) of the HCLG arcs it labels, each
    times the epsilon arcs that lead to it: add_self_loops with reorder splits a state entered from several
    HMM states into one copy per HMM state, joined to it by an epsilon arc that carries that state's
    "not the self-loop" factor, where the denominator (without epsilons) puts it on the arcs themselves."""
    import kaldifst

    fst = kaldifst.StdVectorFst.read(str(path))
    arcs = [[(a.ilabel, float(np.exp(-a.weight.value)), a.nextstate) for a in kaldifst.ArcIterator(fst, state)]
            for state in range(fst.num_states)]

    def closure(state, weight=1.0):  # (state, weight) of every epsilon path from state, itself included
        yield state, weight
        for label, w, following in arcs[state]:
            if label == 0:
                yield from closure(following, weight * w)

    entered = {fst.start} | {d for out in arcs for label, _, d in out if label}
    out = defaultdict(set)
    for state in entered:
        for source, weight in closure(state):
            for label, w, _ in arcs[source]:
                if label:
                    out[label].add(round(weight * w, 4))  # (float32 weights, and products of them)
    return out


def den_weights(den):
    out = defaultdict(set)
    for t, w in zip(den.tid.tolist(), den.weight.tolist()):
        out[t].add(round(w, 4))
    return out


def inside_a_phone(tm, tid):
    """A self-loop, or a transition out of an HMM state other than the first: no LM weight is on its arc."""
    return bool(tm.tid_is_self_loop[tid]) or tm.tuples[int(tm.tid2state[tid]) - 1].hmm_state != 0


MODELS = [("chain", "chain_ali_train", "chain/graph"), ("mono", "mono_ali_train", "mono/graph_chain")]


@pytest.mark.parametrize("name, ali, graph", MODELS, ids=[m[0] for m in MODELS])
def test_the_arcs_inside_phones_weigh_the_same_in_den_fst_and_the_chain_decoding_graph(tiny_corpus, name, ali, graph):
    exp = tiny_corpus.root / "exp"
    tm = read_transition_model(exp / ali / "final.mdl")
    den = den_weights(estimate_denominator(exp / ali, order=2))
    hclg = hclg_weights(exp / graph / "HCLG.fst")
    compared = [t for t in hclg if inside_a_phone(tm, t)]
    assert len(compared) >= len(tm.topology.phones)  # every phone's self-loops (and the 3-state inner arcs)
    for t in compared:
        assert hclg[t] == den[t], (name, t, hclg[t], den[t])
    assert {w for t in compared for w in hclg[t]} >= ({0.5} if name == "chain" else {0.75, 0.25})


MAKE_HCLG = """
import sys
from pathlib import Path
from recipes.mini_timit.local.make_graph import make_hclg  # imports kaldi_hmm_gmm, then kaldifst
from recipes.mini_timit.local.make_chain import CHAIN_SCALE
from recipes.mini_timit.local.make_mono import build_model
import kaldifst

lang, topo_lang, out = map(Path, sys.argv[1:])
words = dict(line.split() for line in (lang / "words.txt").read_text().splitlines())
grammar = kaldifst.StdVectorFst()  # a phone loop without weights
grammar.add_state()
grammar.start = 0
grammar.set_final(0, 0.0)
for word, number in words.items():
    if not word.startswith(("<", "#")):
        grammar.add_arc(0, kaldifst.StdArc(int(number), int(number), 0.0, 0))
grammar.write(str(out / "G.fst"))
for name in ("L_disambig.fst", "phones.txt"):
    (out / name).write_bytes((lang / name).read_bytes())
_, tree, tm = build_model(topo_lang)
hclg, _ = make_hclg(out, tree, tm, self_loop_scale=CHAIN_SCALE)
hclg.write(str(out / "HCLG.fst"))
"""


@pytest.mark.parametrize("name, ali, lang", [("chain", "chain_ali_train", "lang_chain"), ("mono", "mono_ali_train", "lang")],
                         ids=["chain", "mono"])
def test_without_lm_weights_every_arc_weighs_the_same(tiny_corpus, tmp_path, name, ali, lang):
    root = tiny_corpus.root
    subprocess.run([sys.executable, "-c", MAKE_HCLG, str(root / "data" / "lang"), str(root / "data" / lang),
                    str(tmp_path)], check=True, cwd=str(__import__("pathlib").Path(__file__).parents[1]))
    tm = read_transition_model(root / "exp" / ali / "final.mdl")
    phones = sorted(p for p in tm.topology.phones)
    loop = PhoneLM(order=1, histories=[(0,)], arcs=[(0, p, 0, 1.0) for p in phones], final=[1.0])
    den = den_weights(denominator_graph(loop, tm))
    hclg = hclg_weights(tmp_path / "HCLG.fst")
    assert set(hclg) == set(den) == set(range(1, tm.num_transition_ids + 1))  # every transition-id, both graphs
    for t in hclg:
        assert hclg[t] == den[t], (name, t, hclg[t], den[t])

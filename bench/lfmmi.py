#!/usr/bin/env python3
"""The share of a training step that the LF-MMI objective takes: its forward-backward against the network's.

Usage: python bench/lfmmi.py [--config cfg/MINI_liBRU_lfmmi.cfg] [--repeats 5] [--orders 2 3 4] [--smoke]

The largest batch of the config's training set (the first of its training batch size, if any is),
the config's network: the network's forward and backward with a stand-in loss, against the LF-MMI loss's
forward and backward (numerator graphs made from the batch's alignments, the denominator of each phone
LM order asked for). Prints medians in ms and the objective's share of the whole step,
``objective / (network + objective)``: the target is at most 20 %. ``--smoke``: the tiny corpus, 1 repeat.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from bru_kaldi.chain.supervision import ChainSupervision, denominator_from_alignments  # noqa: E402
from bru_kaldi.config import parse_config  # noqa: E402
from bru_kaldi.corpus import Corpus, dataset_for, loader_options  # noqa: E402
from bru_kaldi.network import build_model  # noqa: E402
from bru_kaldi.training import feature_columns  # noqa: E402

TARGET = 0.20


def timed(function, repeats: int) -> float:
    function()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        function()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1000


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=str(ROOT / "cfg" / "MINI_liBRU_lfmmi.cfg"))
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--orders", type=int, nargs="+", default=None, help="phone LM orders (default: the config's)")
    parser.add_argument("--smoke", action="store_true", help="the tiny corpus, one repeat")
    args = parser.parse_args(argv)
    overrides = []
    if args.smoke:
        from recipes.mini_timit.corpus import ensure_corpus

        root = Path(os.environ.get("BRU_BENCH_TINY", "/tmp/bru_kaldi_bench_tiny"))
        ensure_corpus(root / "tiny", size="tiny", seed=1, log=lambda line: None)  # the tiny size's own folder
        os.environ["MINI_TIMIT"] = str(root)
        overrides = ["--exp,builtin_corpus=tiny"]
        args.repeats = 1
    config = parse_config(args.config, overrides)
    senone = config.model.senone_lab
    spec = dataset_for(config, config.data_use.train_with, with_labels=True)
    corpus = Corpus(spec, loader_options(config, "valid"))
    corpus.options = loader_options(config, "train")
    batch = max((b for b in corpus.batches(0)), key=lambda b: len(b.keys))  # a full batch
    input_dim, _ = feature_columns(config.model, corpus.sources)
    model, _ = build_model(config, input_dim, corpus.label_dims[senone], None)
    x, lengths, pdfs = batch.x[..., :input_dim], batch.lengths, batch.labels[senone]
    torch.manual_seed(0)
    print(f"{Path(args.config).name}: batch of {len(batch.keys)} utterances, {int(lengths.sum())} frames, "
          f"{torch.get_num_threads()} threads, medians of {args.repeats}")

    def network():
        model.zero_grad(set_to_none=True)
        out = model(x, lengths)
        (out["senone"].sum() + out["xent"].sum()).backward()

    network_ms = timed(network, args.repeats)
    print(f"network forward + backward: {network_ms:.1f} ms")
    with torch.no_grad():
        out = model(x, lengths)
    lab_folder = next(s.lab_folder for s in spec.lab if s.lab_name == senone)
    worst = 0.0
    for order in args.orders or [config.model.lfmmi_phone_lm_order]:
        den = denominator_from_alignments(lab_folder, order)
        m = config.model
        chain = ChainSupervision(den, m.lfmmi_leaky_hmm, m.lfmmi_xent_regularize, m.lfmmi_output_l2,
                                 m.lfmmi_tolerance).to("cpu")
        output = out["senone"].detach().requires_grad_()
        xent = out["xent"].detach().requires_grad_()

        def objective():
            chain.loss(output, pdfs, xent).loss.backward()

        objective_ms = timed(objective, args.repeats)
        share = objective_ms / (network_ms + objective_ms)
        worst = max(worst, share)
        print(f"LF-MMI objective, {order}-gram denominator ({den.num_states} states, {den.num_arcs} arcs): "
              f"{objective_ms:.1f} ms, {100 * share:.0f} % of the step (target <= {100 * TARGET:.0f} %: "
              f"{'met' if share <= TARGET else 'MISSED'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

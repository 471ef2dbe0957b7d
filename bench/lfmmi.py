#!/usr/bin/env python3
"""The share of a training step that the LF-MMI objective takes: its forward-backward against the network's.

Usage: python bench/lfmmi.py [--config cfg/MINI_liBRU_lfmmi.cfg] [--repeats 5] [--orders 2 3 4] [--threads N]
                             [--device cpu|cuda] [--smoke]

The largest batch of the config's training set (the first of its training batch size, if any is),
the config's network: the network's forward and backward with a stand-in loss, against the LF-MMI loss's
forward and backward (numerator graphs made from the batch's alignments, the denominator of each phone
LM order asked for). Prints medians in ms and the objective's share of the whole step,
``objective / (network + objective)``: the target is at most 20 %. The objective is timed on both of its
paths in the same run, their repeats interleaved with the network's (the machine's load then weighs on
all alike): the loop of torch ops (``BRU_KALDI_NATIVE=0``) and the C++ op that CPU training uses
(``bru_kaldi.chain.native``; the target is judged on it, or on the torch loop where it cannot be built).
``--device cuda``: the network on the GPU, the objective's torch loop on the GPU, its C++ op on the host
(the outputs copied there and the posteriors back) and its Triton kernel on the GPU
(``bru_kaldi.chain.triton_fb``, what GPU training runs: the target is judged on it); each timing ends with
``torch.cuda.synchronize``. ``--smoke``: the tiny corpus, 1 repeat.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from bru_kaldi.chain import native  # noqa: E402
from bru_kaldi.chain.supervision import chain_supervision  # noqa: E402
from bru_kaldi.config import parse_config  # noqa: E402
from bru_kaldi.corpus import Corpus, dataset_for, loader_options, transition_ids_of  # noqa: E402
from bru_kaldi.network import build_model  # noqa: E402
from bru_kaldi.training import feature_columns  # noqa: E402

TARGET = 0.20


def timed(functions: dict, repeats: int, device: torch.device) -> dict:
    """The median ms of each of ``functions`` (name -> callable), after one warm-up each, their repeats
    interleaved so that a change in the machine's load falls on all of them alike; on a GPU each ends
    when the device has finished its work."""
    times = {name: [] for name in functions}
    for _ in range(repeats + 1):
        for name, function in functions.items():
            start = time.perf_counter()
            function()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(values[1:]) * 1000 for name, values in times.items()}


def with_environment(settings: dict, function):
    """``function`` run with the environment variables ``settings`` (put back after)."""
    def run():
        before = {name: os.environ.get(name) for name in settings}
        os.environ.update(settings)
        try:
            function()
        finally:
            for name, value in before.items():
                if value is None:
                    del os.environ[name]
                else:
                    os.environ[name] = value
    return run


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=str(ROOT / "cfg" / "MINI_liBRU_lfmmi.cfg"))
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--orders", type=int, nargs="+", default=None, help="phone LM orders (default: the config's)")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch's threads (default: as they are); 1 gives steadier numbers on a busy machine")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"],
                        help="where the network runs (cuda: the torch loop on the GPU, the C++ op on the host)")
    parser.add_argument("--smoke", action="store_true", help="the tiny corpus, one repeat")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: torch sees no CUDA device")
    if args.threads:
        torch.set_num_threads(args.threads)
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
    corpus = Corpus(spec, loader_options(config, "valid"), transition_ids=[senone])
    corpus.options = loader_options(config, "train")
    batch = max((b for b in corpus.batches(0)), key=lambda b: len(b.keys))  # a full batch
    input_dim, _ = feature_columns(config.model, corpus.sources)
    model, _ = build_model(config, input_dim, corpus.label_dims[senone], None)
    model.to(device)
    x, lengths = batch.x[..., :input_dim].to(device), batch.lengths.to(device)
    tids = batch.labels[transition_ids_of(senone)].to(device)
    torch.manual_seed(0)
    with torch.no_grad():
        out = model(x, lengths)
    print(f"{Path(args.config).name}: batch of {len(batch.keys)} utterances, {int(lengths.sum())} frames "
          f"(outputs (B, T', P) = {tuple(out['senone'].shape)}), "
          f"{torch.get_num_threads()} threads, device {device}"
          f"{f' ({torch.cuda.get_device_name(device)})' if device.type == 'cuda' else ''}, medians of {args.repeats}")

    def network():
        model.zero_grad(set_to_none=True)
        out = model(x, lengths)
        (out["senone"].sum() + out["xent"].sum()).backward()

    output = out["senone"].detach().requires_grad_()
    xent = out["xent"].detach().requires_grad_()
    has_native = native.native_ops(output.new_empty(0, device="cpu")) is not None  # (builds it on first use)
    cpp = "C++" if device.type == "cpu" else "C++ on the host"  # GPU outputs copied there and back
    # path -> its switches; the last is what training runs (the target is judged on it)
    paths = {"torch loop": {"BRU_KALDI_TRITON": "0", "BRU_KALDI_NATIVE": "0"}}
    if has_native:
        paths[cpp] = {"BRU_KALDI_TRITON": "0", "BRU_KALDI_NATIVE": "1"}
    if device.type == "cuda":  # the Triton kernel on the GPU (bru_kaldi.chain.triton_fb): it runs or raises
        paths["Triton kernel"] = {"BRU_KALDI_TRITON": "1"}
    lab_folder = next(s.lab_folder for s in spec.lab if s.lab_name == senone)
    functions, graphs = {"network": network}, {}
    for order in args.orders or [config.model.lfmmi_phone_lm_order]:
        m = dataclasses.replace(config.model, lfmmi_phone_lm_order=order)
        chain = chain_supervision(m, lab_folder, corpus.label_dims[senone]).to(device)
        graphs[order] = chain.den_graph

        def objective(chain=chain):  # (its numerators are made each step, as in training)
            chain.loss(output, tids, xent).loss.backward()

        for path, settings in paths.items():
            functions[order, path] = with_environment(settings, objective)
    ms = timed(functions, args.repeats, device)
    print(f"network forward + backward: {ms['network']:.1f} ms")
    if not has_native and device.type == "cpu":
        print("the C++ forward-backward could not be built here: the torch loop alone is timed")
    judged = list(paths)[-1]  # what training runs
    for order, den in graphs.items():
        for path in paths:
            objective_ms = ms[order, path]
            share = objective_ms / (ms["network"] + objective_ms)
            verdict = (f" (target <= {100 * TARGET:.0f} %: {'met' if share <= TARGET else 'MISSED'})"
                       if path == judged else "")
            print(f"LF-MMI objective, {order}-gram denominator ({den.num_states} states, {den.num_arcs} arcs), "
                  f"{path}: {objective_ms:.1f} ms, {100 * share:.0f} % of the step{verdict}")
        for path in list(paths)[1:]:
            print(f"  the {path} is {ms[order, 'torch loop'] / ms[order, path]:.1f} times as fast as the torch loop")
    return 0


if __name__ == "__main__":
    sys.exit(main())

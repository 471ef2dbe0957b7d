#!/usr/bin/env python3
"""Run one experiment, from Kaldi features to error rates in ``res.res``.

Usage: python run_exp.py <config.cfg> [--section,option=value ...] [--force] [--stage forward|decode]
                         [--stop-stage train|forward] [--forward-only [--model EXP_DIR]]
 e.g.: python run_exp.py cfg/MINI_liBRU.cfg
       python run_exp.py cfg/TIMIT_liBRU.cfg --exp,out_folder=exp/TIMIT_liBRU_seed2 --exp,seed=2
       torchrun --nproc_per_node=4 run_exp.py cfg/TIMIT_liBRU.cfg    (distributed data parallel)

Long because it is the experiment in one file, as nanoGPT's train.py: the training loop in plain PyTorch,
then forward, decode and score; the pieces it calls are in ``bru_kaldi``.

Stages, each skipped when already complete (re-running the command after a crash resumes):
  corpus   build the built-in corpus when ``[exp] builtin_corpus`` asks for it
  train    epochs x chunks, a checkpoint after every chunk, one ``res.res`` line per epoch
  forward  log-likelihoods (log posteriors - log priors) for every ``forward_with`` set
  decode   decode and score; the acoustic scale is chosen on ``valid_with`` and applied unchanged
           to the other sets; the results are appended to ``res.res``

The experiment folder (``[exp] out_folder``)::

  config.resolved.cfg   every option, defaults included      log.txt   this log
  res.res               one line per epoch, then one per decoded set   learning_curve.png
  checkpoint.pt         the latest complete chunk (model, optimisers, progress)
  final.pt              the trained weights    feature_norm.npz, pdf_counts, final.mdl: what forward needs
  front_end.json        the inputs' front end    decoding.json  the graph and the chosen scale: what transcribe.py reads
  forward_<set>/        loglikes.ark, loglikes.scp     decode_<set>/   hypotheses, per-utterance counts
"""

from __future__ import annotations

import argparse
import logging
import shutil
import signal
import sys
import time
from contextlib import closing, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np
import torch
from torch.nn import functional as F
from tqdm import tqdm

from bru_kaldi import decoding, records
from bru_kaldi.atomic import WriteError, write_atomically
from bru_kaldi.builtin_corpus import BuiltinCorpusError, ensure_builtin_corpus
from bru_kaldi.chain import native as chain_native
from bru_kaldi.chain.supervision import ChainSupervision, chain_supervision
from bru_kaldi.config import Config, ConfigError, convert_pytorch_kaldi, parse_config, parse_overrides, write_resolved
from bru_kaldi.distributed import Distributed
from bru_kaldi.experiment import Experiment, check_same_experiment, epoch_line, stages_to_redo
from bru_kaldi.machine import run_line
from bru_kaldi.torch_state import run_settings
from bru_kaldi.network import (build_model, check_architectures, has_unused_parameters, load_trained,
                               set_epoch_dropout, trained_architectures)
from bru_kaldi.learning_rate import epoch_rates, step_rate
from bru_kaldi.checkpoints import CheckpointError, Progress, load_checkpoint, save_checkpoint, save_tensors
from bru_kaldi.training import (Diverged, autocast, batch_loss, chance_frame_error, dev_criterion, epochs_since_best,
                                evaluate, feature_columns, gradient_norm, keep_best_weights, make_optimizer,
                                param_groups, pick_device, plot_learning_curve, seed_everything, stopped_early,
                                warn_if_not_learning)
from bru_kaldi.corpus import Corpus, dataset_for, fingerprint, loader_options
from bru_kaldi.feature_transforms import GlobalNorm
from bru_kaldi.kaldi.tables import KaldiIOError
from bru_kaldi.posteriors import LoglikeWriter, log_priors, read_counts, write_counts
from models.acoustic import AcousticModel
from models.fast import native

log = logging.getLogger("run_exp")


# --------------------------------------------------------------------------- training
@dataclass
class Training:
    """What one training run holds between its stages: the data, the network and its optimisers, and the
    progress that a checkpoint saves (``bru_kaldi.checkpoints.Progress``: epoch, chunk, history, step, rollbacks)."""

    config: Config
    exp: Experiment
    device: torch.device
    dist: Distributed
    train_set: Corpus
    dev_set: Corpus
    chance: Optional[float]  # the dev frame error of always answering the most frequent pdf
    chain: Optional[ChainSupervision] = None  # [model] objective = lfmmi: its denominator graph and options
    model: AcousticModel = None
    net: torch.nn.Module = None  # the model, or its DistributedDataParallel wrapper
    groups: list = None  # each trained architecture's parameters
    archs: list = None
    optimizers: list = None
    input_dim: int = 0
    target: Optional[slice] = None  # the columns of an mse target after the inputs
    progress: Progress = None

    def checkpoint(self) -> None:
        if self.dist.main:
            save_checkpoint(self.exp.checkpoint, self.model, self.optimizers, self.progress, self.exp.resolved.read_text())
        self.dist.barrier()


def train(config: Config, exp: Experiment, device: torch.device, dist: Distributed) -> None:
    """Train on ``train_with`` chunk by chunk, validate on ``valid_with`` each epoch; resumes from ``checkpoint.pt``."""
    # Every rank decides before any can write one: a rank that looked after rank 0 had written the initial
    # checkpoint would skip its barrier and wait in the first step's all-reduce for ever.
    fresh = not exp.checkpoint.is_file()
    dist.barrier()
    run = load_training_data(config, exp, device, dist)
    build_network(run)
    if fresh:
        run.checkpoint()  # the initial weights: what a blow-up in the first chunk rolls back to
    criterion = dev_criterion(config)  # what "dev improves" means: the frame error, or the loss (LF-MMI's objective)
    while run.progress.epoch < config.exp.n_epochs_tr and not stopped_early(run.progress.dev_scores(criterion),
                                                                              config.exp.patience):
        try:
            train_epoch(run, run.progress.epoch)
        except Diverged as blowup:
            roll_back(run, blowup)
    if config.exp.patience and run.progress.history:
        keep_best_weights(run.model, exp.best, run.progress.dev_scores(criterion), config.exp.patience,
                          criterion.replace("_", " "))
    if dist.main:
        senone, mono = config.model.senone_lab, config.model.mono_lab
        final = {"model": run.model.state_dict(), "input_dim": run.input_dim,
                 "num_pdfs": run.train_set.label_dims[senone],
                 "num_mono": run.train_set.label_dims[mono] if mono != "none" else 0,
                 "stream_dims": stream_dims(run.train_set)}
        save_tensors(final, exp.final)
        records.write_front_end(exp.folder, run.train_set.sources, run.input_dim)  # for transcribe.py
        exp.mark("train")
    dist.barrier()


def load_training_data(config: Config, exp: Experiment, device: torch.device, dist: Distributed) -> Training:
    """The training and dev corpora, normalised by the training set's statistics (computed once, and again
    only if the training data changed before training used them), and what forward and decode need later:
    the pdf counts and ``final.mdl``."""
    senone = config.model.senone_lab
    train_spec = dataset_for(config, config.data_use.train_with, with_labels=True)
    inputs = fingerprint(train_spec)
    norm, derived = exp.training_norm(inputs, lambda: Corpus(train_spec, loader_options(config, "valid")).global_norm(),
                                      save=dist.main)
    lfmmi = config.model.objective == "lfmmi"  # its numerators are made from the alignments' transition-ids
    tids = [senone] if lfmmi else []
    train_set = Corpus(train_spec, loader_options(config, "train"), norm, transition_ids=tids)
    dev_set = Corpus(dataset_for(config, config.data_use.valid_with, with_labels=True), loader_options(config, "valid"),
                     norm, transition_ids=tids)
    if dev_set.label_dims[senone] != train_set.label_dims[senone]:
        raise KaldiIOError(f"dataset {config.data_use.valid_with}: {dev_set.label_dims[senone]} pdfs in its alignments' "
                           f"final.mdl, {train_set.label_dims[senone]} in the training set's")
    log.info("train: %s, %d utterances, %d frames, feature dim %d, %d pdfs; dev: %s, %d utterances",
             config.data_use.train_with, len(train_set), int(train_set.lengths.sum()), train_set.feature_dim,
             train_set.label_dims[senone], config.data_use.valid_with, len(dev_set))
    counts = train_set.counts(senone)
    if dist.main:  # what forward and decode need, also for --forward-only runs on other data
        if counts is not None:
            write_counts(str(exp.counts), counts)
        lab_folder = next(s.lab_folder for s in train_spec.lab if s.lab_name == senone)
        write_atomically(exp.model, lambda tmp: shutil.copyfile(Path(lab_folder) / "final.mdl", tmp))
        if not derived:
            exp.record_derived(inputs)  # last: a run killed before this recomputes them all
    # a model without a senone output reports pytorch-kaldi's cost_err of its mse output, no chance level of senones
    chance = chance_frame_error(counts) if counts is not None and config.model.senone_output else None
    chain = None
    if lfmmi:  # the denominator (a phone LM of the training alignments, with the HMMs) and the numerators
        lab_folder = next(s.lab_folder for s in train_spec.lab if s.lab_name == senone)
        chain = chain_supervision(config.model, lab_folder, train_set.label_dims[senone],
                                  exp.folder / "den.fst" if dist.main else None).to(device)
    return Training(config, exp, device, dist, train_set, dev_set, chance, chain)


def stream_dims(corpus) -> dict:
    """``fea_name`` -> values per frame (context window included) of each feature stream a corpus reads: where
    an architecture that reads some of the streams (``[architectureN] inputs``) finds them in the input."""
    return {s.stream.fea_name: s.dim for s in corpus.sources}


def build_network(run: Training) -> None:
    """The network and one optimiser per trained architecture, from the seed or from the checkpoint."""
    config, train_set = run.config, run.train_set
    mono = config.model.mono_lab
    num_mono = train_set.label_dims[mono] if mono != "none" else None
    run.input_dim, run.target = feature_columns(config.model, train_set.sources)  # the inputs, then an mse target
    seed_everything(config.exp.seed)  # the initial weights
    run.model, run.groups = build_model(config, run.input_dim, train_set.label_dims[config.model.senone_lab], num_mono,
                                        run.target.stop - run.target.start if run.target else None,
                                        stream_dims(train_set))
    run.model.to(run.device)
    run.archs = trained_architectures(config)
    run.optimizers = [make_optimizer(a.arch_opt, param_groups(params, run.model, config.model), a.arch_lr, a)
                      for a, params in zip(run.archs, run.groups)]
    log.info("model: %s, %.2fM parameters",
             " + ".join(f"{a.arch_name}={a.unit} {a.sizes or '(output layer)'}" for a in run.archs),
             sum(p.numel() for p in run.model.parameters()) / 1e6)
    run.progress = load_checkpoint(run.exp.checkpoint, run.model, run.optimizers) or Progress()
    if run.progress.epoch or run.progress.chunk:
        log.info("resuming from %s: epoch %d, chunk %d", run.exp.checkpoint, run.progress.epoch + 1, run.progress.chunk + 1)
        if run.dist.main and run.progress.history:  # a run killed between its checkpoint and res.res lost a line
            run.exp.write_res(run.progress.history)
    run.net = run.model
    if run.dist.world > 1:
        device = run.device
        run.net = torch.nn.parallel.DistributedDataParallel(
            run.model, device_ids=[device.index] if device.type == "cuda" else None,
            find_unused_parameters=has_unused_parameters(run.model, device))


def train_epoch(run: Training, epoch: int) -> None:
    """The rest of ``epoch`` from ``progress.chunk``, a checkpoint after every chunk, then the dev set and
    the epoch's line in ``res.res``; raises :class:`Diverged` at the first non-finite loss or gradient,
    before any weight takes it."""
    config, progress, dist = run.config, run.progress, run.dist
    lrs = epoch_rates(run.archs, epoch, config.exp.n_epochs_tr, progress.dev_scores(dev_criterion(config)),
                      progress.rollbacks)
    run.train_set.options = loader_options(config, "train", epoch)  # this epoch's batch size and length limit
    for name, rates in set_epoch_dropout(run.model, config, epoch).items():  # and its dropout rates (a schedule's)
        log.info("epoch %d: %s dropout rates %s", epoch + 1, name, ",".join(f"{r:g}" for r in rates))
    plan = run.train_set.chunk_keys(epoch)
    frames_of = dict(zip(run.train_set.keys, run.train_set.lengths.tolist()))
    remaining = sum(frames_of[key] for keys in plan[progress.chunk:] for key in keys)
    run.model.train()
    chunk, stats, started = progress.chunk, [0.0, 0, 0], time.time()
    seed_everything(config.exp.seed, epoch, chunk)

    def finish_chunk(next_chunk):
        progress.chunk_stats.append(tuple(dist.sum(stats)) + (time.time() - started,))
        progress.chunk = next_chunk
        run.checkpoint()

    with tqdm(total=remaining, unit="frame", unit_scale=True, desc=f"epoch {epoch + 1}/{config.exp.n_epochs_tr}",
              disable=None if dist.main else True, leave=False, dynamic_ncols=True) as bar, \
            closing(run.train_set.batches(epoch, first_chunk=progress.chunk)) as batches:
        for batch in batches:
            if batch.chunk != chunk:
                finish_chunk(batch.chunk)
                chunk, stats, started = batch.chunk, [0.0, 0, 0], time.time()
                seed_everything(config.exp.seed, epoch, chunk)  # dropout masks independent of where a run resumed
            step = train_step(run, batch, lrs, f"epoch {epoch + 1}, chunk {chunk + 1}")
            if step is not None:
                stats = [total + value for total, value in zip(stats, step)]
            bar.update(batch.num_frames)
            bar.set_postfix(loss=f"{stats[0] / max(stats[2], 1):.3f}", refresh=False)
    if progress.chunk < len(plan):
        finish_chunk(len(plan))
    end_epoch(run, epoch, lrs)


def train_step(run: Training, batch, lrs: dict[str, float], where: str) -> Optional[tuple[float, int, int]]:
    """One optimiser step on this rank's share of ``batch``: ``(loss sum, frame errors, frames)``, or None
    for a rank with no rows (it takes a zero-weighted step, to keep the ranks in step)."""
    share = run.dist.share(batch)
    empty = share is None
    share = (batch.select(slice(0, 1)) if empty else share).to(run.device, non_blocking=True)
    # a chain model's output frames start at input frame `shift`, a different one from pass to pass (Kaldi's
    # --frame-shift): a chunk's utterances change every epoch, so each meets every shift
    shift = (run.progress.epoch + batch.chunk) % run.model.frame_subsampling_factor
    with autocast(run.config, run.device):
        out = run.net(share.x[..., :run.input_dim], share.lengths, frame_shift=shift)
    target = share.x[..., run.target] if run.target else None
    global_frames = int(run.model.output_lengths(batch.lengths, shift).sum())  # of every rank's share
    loss, (loss_sum, errors, frames) = batch_loss(out, share.labels, run.config.model, global_frames,
                                                  run.dist.world, target, run.chain, shift)
    for optimizer in run.optimizers:
        optimizer.zero_grad(set_to_none=True)
    (loss * 0 if empty else loss).backward()
    norms = [gradient_norm(params, arch.clip_grad_norm) for arch, params in zip(run.archs, run.groups)]
    bad = 0.0 if empty else float(not np.isfinite(loss_sum) or not all(map(np.isfinite, norms)))
    if run.dist.sum([bad])[0]:  # every rank stops at the same step, before any weight moves
        raise Diverged(f"{where}: the loss is {loss_sum:g} and the gradient norms are {norms} on utterances "
                       f"{batch.keys[:4]}")
    for arch, optimizer in zip(run.archs, run.optimizers):
        for group in optimizer.param_groups:  # (LF-MMI's xent head learns at its own factor of the rate)
            group["lr"] = step_rate(lrs[arch.arch_name], arch, run.progress.step) * group.get("lr_factor", 1.0)
        optimizer.step()
    run.progress.step += 1
    return None if empty else (loss_sum, errors, frames)


def end_epoch(run: Training, epoch: int, lrs: dict[str, float]) -> None:
    """The dev set, the epoch's line in ``res.res`` and the learning curve, the best weights so far (with
    ``[exp] patience``), and the checkpoint that closes the epoch."""
    progress = run.progress
    dev_loss, dev_err = evaluate(run.net, run.dev_set, run.config, run.device, run.dist, run.chain)
    loss_sum, errors, frames, seconds = (sum(column) for column in zip(*progress.chunk_stats))
    progress.history.append({"epoch": epoch + 1, "train_loss": loss_sum / frames, "train_err": errors / frames,
                             "dev_loss": dev_loss, "dev_err": dev_err, "lr": lrs, "seconds": seconds})
    progress.epoch, progress.chunk, progress.chunk_stats = epoch + 1, 0, []
    best_now = epochs_since_best(progress.dev_scores(dev_criterion(run.config))) == 0
    if run.config.exp.patience and run.dist.main and best_now:
        # before the checkpoint: a checkpoint that counts this epoch always has its best weights beside it
        save_tensors({"model": run.model.state_dict(), "epoch": epoch + 1}, run.exp.best)
    run.checkpoint()
    log.info("%s (%.0f frames/s)", epoch_line(progress.history[-1]), frames / max(seconds, 1e-9))
    warn_if_not_learning(epoch + 1, dev_err, run.chance)
    if run.dist.main:
        run.exp.write_res(progress.history)
        plot_learning_curve(progress.history, run.exp.folder / "learning_curve.png")


def roll_back(run: Training, blowup: Diverged) -> None:
    """A blow-up costs the chunk, not the run: back to the last checkpoint, with every rate halved from
    then on. The same chunk blowing up again is a stop: halving once more would hide it."""
    failed_at = (run.progress.epoch, run.progress.chunk)
    run.progress = load_checkpoint(run.exp.checkpoint, run.model, run.optimizers)
    if failed_at in run.progress.rollbacks:
        raise FloatingPointError(
            f"{blowup}, again after rolling back to {run.exp.checkpoint} with the learning rates halved; lower "
            f"[architectureN] arch_lr, or set arch_warmup_steps or opt_bias_correction = True (RMSprop's first "
            f"steps are several times lr), or clip_grad_norm") from None
    run.progress.rollbacks.append(failed_at)
    log.warning("%s: rolling back to %s (epoch %d, chunk %d) with the learning rates halved (x%g from now on)",
                blowup, run.exp.checkpoint, run.progress.epoch + 1, run.progress.chunk + 1, run.progress.lr_scale)
    run.checkpoint()


# --------------------------------------------------------------------------- forward
@torch.no_grad()
def forward(config: Config, exp: Experiment, model_dir: Path, device: torch.device) -> None:
    """Write log-likelihoods for every ``forward_with`` set: log posteriors - log priors (Kaldi's hybrid recipe),
    or with ``[model] objective = lfmmi`` the chain output as it is (no softmax, no prior: Kaldi's chain models)."""
    model = load_trained(config, model_dir, device)
    chain = config.model.objective == "lfmmi"
    norm = GlobalNorm.load(model_dir / "feature_norm.npz")  # of the inputs first, then of an mse target
    norm = GlobalNorm(norm.mean[:model.input_size], norm.std[:model.input_size])
    priors = None
    if config.forward.normalize_posteriors and not chain:
        counts_file = model_dir / "pdf_counts"
        if not counts_file.is_file():
            raise FileNotFoundError(f"{counts_file}: pdf counts for the priors are missing ([forward] normalize_posteriors = "
                                    "True needs lab_count_file = auto or a counts file)")
        priors = log_priors(read_counts(str(counts_file)))
    for name in config.data_use.forward_with:
        out_dir = exp.folder / f"forward_{name}"
        if exp.done(f"forward_{name}"):
            continue
        corpus = Corpus(dataset_for(config, name, with_labels=False), loader_options(config, "forward"), norm)
        if corpus.feature_dim != model.input_size:
            raise KaldiIOError(f"dataset {name}: features of dimension {corpus.feature_dim}, the model takes {model.input_size}")
        out_dir.mkdir(parents=True, exist_ok=True)
        started = time.time()
        with LoglikeWriter(str(out_dir / "loglikes.ark"), str(out_dir / "loglikes.scp"), priors) as writer:
            for batch in tqdm(corpus.batches(), desc=f"forward {name}", unit="batch", disable=None, leave=False):
                batch = batch.to(device)
                with autocast(config, device):
                    out = model(batch.x, batch.lengths)
                if config.model.features_arch:  # an architecture's output as it is (an autoencoder's code)
                    scores = out["features"].float()
                else:
                    scores = out["senone"].float() if chain else F.log_softmax(out["senone"].float(), dim=-1)
                writer.write_batch(batch.keys, scores.cpu(), model.output_lengths(batch.lengths).cpu())
        exp.mark(f"forward_{name}")
        log.info("forward %s: %d utterances in %.1f s -> %s", name, len(corpus), time.time() - started, out_dir / "loglikes.scp")


# --------------------------------------------------------------------------- decode and score
def decode_jobs(config: Config, exp: Experiment, model_dir: Path) -> list:
    """One decoding job per ``forward_with`` set whose senone label stream names a graph."""
    jobs = []
    for name in config.data_use.forward_with:
        lab = next((s for s in config.dataset(name).lab if s.lab_name == config.model.senone_lab), None)
        if lab is None or not lab.lab_graph:
            log.warning("forward set %s: no lab_graph for %s, so its log-likelihoods are written but not decoded",
                        name, config.model.senone_lab)
            continue
        text = Path(lab.lab_data_folder) / "text" if lab.lab_data_folder else None
        jobs.append(decoding.DecodeJob(name=name, loglikes_scp=exp.folder / f"forward_{name}" / "loglikes.scp",
                                     graph_dir=Path(lab.lab_graph), model=model_dir / "final.mdl",
                                     ref_text=text if text and text.is_file() else None,
                                     out_dir=exp.folder / f"decode_{name}",
                                     frame_shift=decoding.FRAME_SHIFT * config.model.frame_subsampling_factor))
    return jobs


def decode_and_score(config: Config, exp: Experiment, model_dir: Path, history: list[dict]) -> None:
    """Decode every forwarded set (scales tuned on dev), score it, and add its error line to ``res.res``."""
    jobs = decode_jobs(config, exp, model_dir)
    if not jobs:
        return
    valid = config.data_use.valid_with
    tune_on = valid if any(j.name == valid and j.ref_text for j in jobs) else None
    if tune_on is None:
        log.warning("valid_with=%s is not decoded with a reference (add it to forward_with): every set is decoded "
                    "at [decoding] acwt=%s, untuned", valid, config.decoding.acwt)
    results = decoding.decode_sets(jobs, config.decoding, tune_on, log=log.info)
    records.record_decoding(exp.folder, jobs, results, tune_on)  # the graph and setting transcribe.py uses
    lines = [results[job.name].res_line() for job in jobs]
    exp.write_res(history, lines)
    for line in lines:
        log.info("%s", line)


# --------------------------------------------------------------------------- main
def setup_logging(folder: Optional[Path], main: bool) -> None:
    """Progress to stdout and ``log.txt``, errors to stderr; other ranks log errors only."""
    out, err = logging.StreamHandler(sys.stdout), logging.StreamHandler(sys.stderr)
    out.addFilter(lambda record: record.levelno < logging.ERROR)
    err.setLevel(logging.ERROR)
    handlers = [out, err, logging.FileHandler(folder / "log.txt")] if main else [err]
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S", handlers=handlers,
                        force=True)


def parse_arguments(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], usage=__doc__.split("\n\n")[1].replace("Usage: ", "", 1),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("config", help="the experiment config (cfg/*.cfg)")
    parser.add_argument("--force", action="store_true", help="delete the experiment folder's outputs and start again")
    parser.add_argument("--stage", choices=("forward", "decode"), help="run again from this stage on (training kept)")
    parser.add_argument("--stop-stage", choices=("train", "forward", "decode"), default="decode",
                        help="the last stage to run (as a Kaldi recipe's --stop-stage)")
    parser.add_argument("--forward-only", action="store_true", help="no training: forward and decode with a trained model")
    parser.add_argument("--model", type=Path, help="with --forward-only: the trained experiment folder (default out_folder)")
    parser.add_argument("--convert", action="store_true", help="print a pytorch-kaldi config in our vocabulary and stop")
    args, overrides = parser.parse_known_args(argv)
    return args, overrides


def run(argv=None) -> None:
    args, overrides = parse_arguments(argv)
    if args.convert:
        return print(convert_pytorch_kaldi(args.config, parse_overrides(overrides)))
    config = parse_config(args.config, overrides)
    check_architectures(config)  # every unit and its options, before anything runs
    device = pick_device(config)
    dist = Distributed.from_environment(device.type)
    if dist.world > 1 and device.type == "cuda":
        device = torch.device("cuda", dist.local_rank)
        torch.cuda.set_device(device)
    # Processes share the cores; subnormal floats (gradients decaying through hundreds of frames) run in microcode on
    # x86, and flushing them halved a Li-GRU backward pass. Both are torch's for the process: put back at the end.
    threads = max(1, torch.get_num_threads() // dist.world) if dist.world > 1 and device.type != "cuda" else None
    with run_settings(threads=threads, flush_denormal=True):
        exp = Experiment(config.exp.out_folder)
        if args.force and exp.folder.resolve() in (Path.cwd().resolve(), *Path.cwd().resolve().parents):
            raise ConfigError(f"{config.source} [exp] out_folder = {exp.folder}: --force will not delete the working directory")
        with exp.lock() if dist.main else nullcontext():  # one run per folder
            if args.force and dist.main:
                exp.clear()
            dist.barrier()
            setup_logging(exp.folder, dist.main)
            run_stages(args, config, exp, device, dist, argv)


def run_stages(args, config: Config, exp: Experiment, device: torch.device, dist: Distributed, argv) -> None:
    log.info("%s", " ".join([Path(sys.argv[0]).name, *(argv if argv is not None else sys.argv[1:])]))
    log.info("%s", run_line(torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
                            torch.get_num_threads(), torch.__version__))
    for note in dict.fromkeys(config.notes):  # a translated pytorch-kaldi config: what replaced what, once
        log.info("%s", note)
    if config.exp.mixed_precision and device.type != "cuda":
        log.warning("[exp] mixed_precision is ignored on the CPU")
    if device.type == "cpu":  # build (first run) or load the C++ time loops now, not in the first batch
        native.native_ops(torch.zeros(1))
        if config.model.objective == "lfmmi":  # and the C++ forward-backward of LF-MMI
            chain_native.native_ops(torch.zeros(1))

    if config.exp.builtin_corpus != "none" and dist.main:
        log.info("built-in corpus (%s, %s task) in %s", config.exp.builtin_corpus, config.exp.builtin_corpus_task,
                 config.exp.builtin_corpus_dir)
        ensure_builtin_corpus(config.exp.builtin_corpus_dir, size=config.exp.builtin_corpus, seed=1, log=log.info,
                              task=config.exp.builtin_corpus_task, replace=True)  # another size is rebuilt
    dist.barrier()

    model_dir = Path(args.model) if args.model else exp.folder
    if args.forward_only:
        exp.unmark([f"forward_{name}" for name in config.data_use.forward_with] + ["decode"])
        write_resolved(config, exp.folder / "config.forward.cfg")
    else:
        if dist.main:
            resolved = exp.folder / "config.resolved.new"
            try:
                write_resolved(config, resolved)
                check_same_experiment(exp, resolved.read_text(), config.source)
                redo = stages_to_redo(exp, resolved.read_text())
                resolved.replace(exp.resolved)
            finally:
                resolved.unlink(missing_ok=True)
            if redo:  # decode-only (or forward) options changed since the last run: those stages again
                log.info("options changed since the last run make %s stale: running it again", " and ".join(redo))
                exp.unmark(["decode"] + ([f"forward_{name}" for name in config.data_use.forward_with]
                                         if "forward" in redo else []))
            if args.stage == "forward":
                exp.unmark([f"forward_{name}" for name in config.data_use.forward_with])
            if args.stage in ("forward", "decode"):
                exp.unmark(["decode"])
        dist.barrier()
        forward_done = all(exp.done(f"forward_{name}") for name in config.data_use.forward_with)
        if exp.done("train") and forward_done and (exp.done("decode") or not config.forward.require_decoding):
            log.info("experiment %s has already finished (see %s); --force runs it again", exp.folder, exp.res)
            return
        if not exp.done("train"):
            train(config, exp, device, dist)
    if not dist.main or args.stop_stage == "train":
        return
    forward(config, exp, model_dir, device)
    if args.stop_stage == "forward":
        return
    history = []  # the epoch lines res.res keeps above the decoding results
    if exp.checkpoint.is_file():
        history = torch.load(exp.checkpoint, map_location="cpu", weights_only=True)["progress"]["history"]
    if config.forward.require_decoding and not exp.done("decode"):
        decode_and_score(config, exp, model_dir, history)
        exp.mark("decode")
    log.info("results in %s", exp.res)


def _report(message: str) -> None:
    if logging.getLogger().handlers:  # also in log.txt
        log.error("%s", message)
    else:
        print(f"run_exp.py: {message}", file=sys.stderr)


def _terminate(signum, frame):
    raise KeyboardInterrupt(signal.Signals(signum).name)


def main(argv=None) -> int:
    # SIGTERM (a scheduler's, or kill's) stops the run as Ctrl-C does: between writes, never inside one
    # (every file is written atomically), with a message saying how to resume.
    previous = signal.signal(signal.SIGTERM, _terminate)
    try:
        run(argv)
    except (ConfigError, KaldiIOError, FileNotFoundError, FloatingPointError, BuiltinCorpusError, CheckpointError,
            WriteError, decoding.DecodeInputError, decoding.KaldiDecodeError) as error:
        _report(f"error: {error}")
        return 1
    except KeyboardInterrupt as interrupt:
        name = str(interrupt) or "SIGINT"
        _report(f"stopped by {name}: every file written so far is complete, and the training resumes from its last "
                "checkpoint (at most one chunk is lost); run the same command again to go on")
        return 128 + (signal.SIGTERM if name == "SIGTERM" else signal.SIGINT)
    finally:
        signal.signal(signal.SIGTERM, previous)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Pieces of the training loop that run_exp.py shows in one place: the loss, optimisers, seeds, the end of
an epoch and the learning curve (the learning rate: ``bru_kaldi.learning_rate``; checkpoints:
``bru_kaldi.checkpoints``).

Everything that changes between epochs is a pure function of the config and the recorded history
(as nanoGPT's ``get_lr(it)``), so a resumed run recomputes it instead of trusting saved state.
"""

from __future__ import annotations

import logging
import random
from contextlib import nullcontext
from pathlib import Path
from typing import Optional, Sequence

import numpy as np
import torch
from torch.nn import functional as F

from bru_kaldi.atomic import write_atomically
from bru_kaldi.batching import IGNORE
from bru_kaldi.config import OPTIMIZERS, Config, ConfigError, Model
from bru_kaldi.corpus import transition_ids_of

log = logging.getLogger(__name__)


# --------------------------------------------------------------------------- loss and error
def frame_cross_entropy(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, int, int]:
    """Cross-entropy summed over the real frames, frame errors, and the number of real frames.

    The one loss of the toolkit: padded frames (label ``IGNORE``) never enter the loss or the error.

    Args:
        logits: ``(B, T, C)``.
        labels: ``(B, T)`` class ids, ``IGNORE`` on padded frames.

    Returns:
        ``(loss_sum, errors, frames)``: the summed loss (a scalar tensor with gradient, float32 even
        under autocast), the number of wrongly classified frames and the number of real frames.

    >>> logits = torch.tensor([[[2.0, 0.0], [0.0, 2.0], [9.0, -9.0]]])
    >>> loss_sum, errors, frames = frame_cross_entropy(logits, torch.tensor([[0, 0, IGNORE]]))
    >>> round(float(loss_sum), 4), errors, frames
    (2.2539, 1, 2)
    """
    if labels.shape != logits.shape[:2]:
        raise ValueError(f"labels of shape {tuple(labels.shape)} do not match logits {tuple(logits.shape)}")
    loss_sum = F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(), ignore_index=IGNORE, reduction="sum")
    real = labels != IGNORE
    errors = int(((logits.argmax(-1) != labels) & real).sum())
    return loss_sum, errors, int(real.sum())


def feature_columns(model: Model, sources: Sequence) -> tuple[int, Optional[slice]]:
    """Where the features of a batch hold what, for a corpus of the feature streams ``sources`` (its
    ``FeatureSource`` s, concatenated per frame in that order): ``[model] inputs``, then ``mse_target`` where it
    is not one of them (``data_io.dataset_for`` picks them so). The network reads the first ``n`` columns;
    ``mse_target`` is in the slice (``None`` without an mse term).

    Returns ``(n, target columns or None)``.

    >>> from types import SimpleNamespace as S
    >>> fbank, mfcc = S(stream=S(fea_name="fbank"), dim=40), S(stream=S(fea_name="mfcc"), dim=13)
    >>> feature_columns(Model(inputs=["fbank"], mse_arch="front_end", mse_target="mfcc"), [fbank, mfcc])
    (40, slice(40, 53, None))
    """
    names, ends = [s.stream.fea_name for s in sources], np.cumsum([s.dim for s in sources]).tolist()
    n = ends[len(model.inputs or names) - 1]  # without inputs every stream is one (the target too)
    if not model.mse_arch:
        return n, None
    i = names.index(model.mse_target)
    return n, slice(ends[i] - sources[i].dim, ends[i])


def frame_squared_error(output: torch.Tensor, target: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
    """The squared error of ``output`` against ``target`` averaged over the values of each frame and
    summed over the real frames: pytorch-kaldi's ``mse`` (``mean((out - fea)^2)``) times the number of
    frames, with padded frames left out.

    Shapes: ``output``, ``target`` ``(B, T, D)``, ``real`` ``(B, T)`` bool -> a scalar (float32 under autocast).

    >>> out, target = torch.tensor([[[1.0, 2.0], [5.0, 5.0]]]), torch.tensor([[[0.0, 0.0], [0.0, 0.0]]])
    >>> float(frame_squared_error(out, target, torch.tensor([[True, False]])))  # (1 + 4) / 2, padding left out
    2.5
    """
    if output.shape != target.shape:
        raise ValueError(f"an output of shape {tuple(output.shape)} compared with a target of shape {tuple(target.shape)}")
    return (output.float() - target.float())[real].square().sum() / output.size(-1)


def output_frames(labels: torch.Tensor, factor: int, frame_shift: int, output: torch.Tensor) -> torch.Tensor:
    """The labels ``(B, T)`` of a network's output frames ``(B, T', C)``: input frames ``f t + frame_shift``.

    >>> output_frames(torch.tensor([[1, 2, 3, 4, 5, -100]]), 3, 1, torch.zeros(1, 2, 7)).tolist()
    [[2, 5]]
    """
    return labels[:, frame_shift::factor][:, :output.shape[1]]


def batch_loss(out: dict, labels: dict, model: Model, global_frames: int, world: int = 1,
               target: Optional[torch.Tensor] = None, chain=None, frame_shift: int = 0):
    """The training loss of one batch (or this rank's share of it) and the senone statistics.

    Senone cross-entropy plus ``mono_weight`` x the monophone cross-entropy (pytorch-kaldi's
    multi-task recipes) plus ``mse_weight`` x the squared error of ``out["mse"]`` against ``target``
    (its ``mse``, :func:`frame_squared_error`), summed over this share's frames and divided by the frames
    of the *global* batch, times ``world`` because DDP averages gradients over ranks: the gradient is
    exactly the single-process one. Per frame that is pytorch-kaldi's ``loss_final``, e.g.
    ``sum(cost_nll, mult_constant(mse, w))``.

    Args:
        out: the model's logits, ``"senone"`` (and ``"mono"``) ``(B, T, C)``; ``"mse"`` ``(B, T, D)``.
        labels: the batch's label streams by name, ``(B, T)``.
        model: ``[model]`` of the config (``senone_lab``, ``mono_lab``, ``mono_weight``, ``mse_weight``).
        target: ``(B, T, D)``, the features ``out["mse"]`` is compared with (``[model] mse_target``).
        chain: ``[model] objective = lfmmi``'s ``ChainSupervision`` (``bru_kaldi.chain``): the senone term is then
            the LF-MMI loss summed over the output frames, the loss reported its objective alone, negated (frame
            errors: the best pdf's); the labels include the senone stream's transition-ids
            (``corpus.transition_ids_of``), and ``out`` is at ``1 / frame_subsampling_factor`` of their rate,
            from input frame ``frame_shift`` on. ``global_frames`` then counts output frames.

    Without a senone output (``"senone"`` not in ``out``: ``[model] senone_output = False``) the loss is the
    mse term alone and the statistics are its sum and pytorch-kaldi's ``cost_err`` of the mse output: frames
    whose argmax over its values is not the ``senone_lab`` label.

    Returns:
        ``(loss, (loss_sum, errors, frames))``: the loss to backpropagate and the senone output's
        summed loss, frame errors and frames on this share (what ``res.res`` reports).
    """
    if "senone" not in out:  # [model] senone_output = False: loss_final = mse, err_final = cost_err(mse output)
        if target is None:
            raise ValueError("the model has an mse output ([model] mse_arch) but the batch no mse_target features")
        real = labels[model.senone_lab] != IGNORE
        total = model.mse_weight * frame_squared_error(out["mse"], target, real)
        errors = int(((out["mse"].argmax(-1) != labels[model.senone_lab]) & real).sum())
        return total / global_frames * world, (float(total.detach()), errors, int(real.sum()))
    if chain is None:
        senone_sum, errors, frames = frame_cross_entropy(out["senone"], labels[model.senone_lab])
        reported = senone_sum
    else:  # the loss is LF-MMI's, with its regularisers; what res.res reports, its objective alone, negated
        pdfs = output_frames(labels[model.senone_lab], chain.frame_subsampling_factor, frame_shift, out["senone"])
        _, errors, frames = frame_cross_entropy(out["senone"], pdfs)  # the best pdf's frame errors
        xent = out["xent"].float() if "xent" in out else None
        result = chain.loss(out["senone"].float(), labels[transition_ids_of(model.senone_lab)], xent, frame_shift)
        senone_sum, reported = result.loss * result.num_frames, torch.tensor(-result.objf * result.num_frames)
    total = senone_sum
    if "mono" in out:
        mono = labels[model.mono_lab]
        if chain is not None:
            mono = output_frames(mono, chain.frame_subsampling_factor, frame_shift, out["mono"])
        total = total + model.mono_weight * frame_cross_entropy(out["mono"], mono)[0]
    if "mse" in out:
        if target is None:
            raise ValueError("the model has an mse output ([model] mse_arch) but the batch no mse_target features")
        total = total + model.mse_weight * frame_squared_error(out["mse"], target, labels[model.senone_lab] != IGNORE)
    return total / global_frames * world, (float(reported.detach()), errors, frames)


class Diverged(FloatingPointError):
    """A non-finite loss or gradient in training: the run rolls back to its last checkpoint."""


def gradient_norm(params: list, clip: float) -> float:
    """The gradients' total 2-norm, after clipping them to ``clip`` when it is positive (the norm is
    that of before the clipping, so a non-finite gradient shows in it either way).

    >>> w = torch.nn.Parameter(torch.zeros(2)); w.grad = torch.tensor([3.0, 4.0])
    >>> gradient_norm([w], clip=1.0), [round(v, 2) for v in w.grad.tolist()]
    (5.0, [0.6, 0.8])
    """
    grads = [p.grad for p in params if p.grad is not None]
    if clip > 0:
        return float(torch.nn.utils.clip_grad_norm_(params, clip))
    return float(torch.nn.utils.get_total_norm(grads)) if grads else 0.0


# --------------------------------------------------------------------------- optimisers
class BiasCorrectedRMSprop(torch.optim.Adam):
    """RMSprop whose square average is divided by ``1 - alpha^t``, as Adam corrects its own.

    Plain RMSprop starts its square average ``v`` at zero, so its first step is
    ``lr * g / sqrt((1 - alpha) g^2) = lr / sqrt(1 - alpha)`` in the direction of every gradient's sign:
    4.5 x lr at alpha 0.95, on every weight at once. Corrected, the first step is ``lr``, and after a few
    dozen steps (``alpha^t`` -> 0) the two are the same optimiser. That is exactly Adam without a first
    moment: ``m_t = g_t`` (beta1 = 0, whose correction ``1 - 0^t`` is 1) and ``v_t`` corrected with
    beta2 = alpha, so torch's Adam runs it. Weight decay is added to the gradient, as RMSprop does.

    >>> w = torch.nn.Parameter(torch.zeros(3))
    >>> opt = BiasCorrectedRMSprop([w], lr=0.01, alpha=0.95)
    >>> w.grad = torch.tensor([1e-3, -2.0, 30.0]); opt.step()
    >>> [round(v, 4) for v in w.tolist()]  # first step: lr * sign(g), not 4.5 lr
    [-0.01, 0.01, -0.01]
    """

    def __init__(self, params, lr: float, alpha: float = 0.99, eps: float = 1e-8, weight_decay: float = 0.0):
        super().__init__(params, lr=lr, betas=(0.0, alpha), eps=eps, weight_decay=weight_decay)


def param_groups(params: list, model: torch.nn.Module, config_model: Model) -> list[dict]:
    """An architecture's parameters as optimiser groups: one, or with LF-MMI's cross-entropy head among them a
    second that learns at ``[model] lfmmi_xent_lr_factor`` times the rate, by default (0) ``0.5 /
    xent_regularize``, as Kaldi's recipes set the ``output-xent`` layer's ``learning-rate-factor`` (the head's
    gradient is scaled down by ``xent_regularize``, its rate up). The training loop multiplies each group's
    rate by its ``lr_factor``.

    >>> from types import SimpleNamespace as S
    >>> head, body = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
    >>> groups = param_groups([*body.parameters(), *head.parameters()], S(xent=head),
    ...                       S(lfmmi_xent_regularize=0.1, lfmmi_xent_lr_factor=0.0))
    >>> [(len(g["params"]), g["lr_factor"]) for g in groups]
    [(2, 1.0), (2, 5.0)]
    """
    head = getattr(model, "xent", None)
    xent = {id(p) for p in head.parameters()} if head is not None else set()
    mine = [p for p in params if id(p) in xent]
    if not mine:
        return [{"params": params, "lr_factor": 1.0}]
    factor = config_model.lfmmi_xent_lr_factor or 0.5 / max(config_model.lfmmi_xent_regularize, 1e-10)
    return [{"params": [p for p in params if id(p) not in xent], "lr_factor": 1.0},
            {"params": mine, "lr_factor": factor}]


def make_optimizer(name: str, params, lr: float, arch) -> torch.optim.Optimizer:
    """One optimiser per architecture, as pytorch-kaldi: ``arch`` carries its ``opt_*`` options."""
    if name == "rmsprop" and arch.opt_bias_correction:
        if arch.opt_momentum or arch.opt_centered:
            raise ValueError("opt_bias_correction is for plain RMSprop: set opt_momentum = 0 and opt_centered = False")
        return BiasCorrectedRMSprop(params, lr=lr, alpha=arch.opt_alpha, eps=arch.opt_eps,
                                    weight_decay=arch.opt_weight_decay)
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=arch.opt_momentum, weight_decay=arch.opt_weight_decay,
                               nesterov=arch.opt_nesterov)
    if name == "adam":
        return torch.optim.Adam(params, lr=lr, betas=tuple(arch.opt_betas), eps=arch.opt_eps, weight_decay=arch.opt_weight_decay)
    if name == "rmsprop":
        return torch.optim.RMSprop(params, lr=lr, alpha=arch.opt_alpha, eps=arch.opt_eps, momentum=arch.opt_momentum,
                                   centered=arch.opt_centered, weight_decay=arch.opt_weight_decay)
    if name == "adadelta":
        return torch.optim.Adadelta(params, lr=lr, rho=arch.opt_rho, eps=arch.opt_eps, weight_decay=arch.opt_weight_decay)
    raise ValueError(f"optimizer must be one of {', '.join(OPTIMIZERS)}, got {name!r}")


def dev_criterion(config: Config) -> str:
    """``[exp] dev_criterion`` resolved: ``"loss"`` or ``"frame_error"`` (``auto``: the loss for LF-MMI, whose
    output is not trained to classify frames, as Kaldi's chain recipes follow its objective; else the error)."""
    if config.exp.dev_criterion != "auto":
        return config.exp.dev_criterion
    return "loss" if config.model.objective == "lfmmi" else "frame_error"


def epochs_since_best(dev_errors: Sequence[float]) -> int:
    """Epochs finished after the one with the lowest dev error (the first of equals): 0 when the last
    epoch is the best so far.

    >>> epochs_since_best([0.5, 0.4, 0.41, 0.4]), epochs_since_best([0.5, 0.4, 0.3]), epochs_since_best([])
    (2, 0, 0)
    """
    if not dev_errors:
        return 0
    best = min(range(len(dev_errors)), key=lambda i: (dev_errors[i], i))
    return len(dev_errors) - 1 - best


def stopped_early(dev_errors: Sequence[float], patience: int) -> bool:
    """Whether ``patience`` epochs in a row have brought no new best dev error (never when patience is 0).

    >>> stopped_early([0.5, 0.4, 0.41, 0.42], 2), stopped_early([0.5, 0.4, 0.41, 0.42], 3)
    (True, False)
    """
    return patience > 0 and epochs_since_best(dev_errors) >= patience


# --------------------------------------------------------------------------- the end of an epoch, of a run
def keep_best_weights(model: torch.nn.Module, best: Path, errors: Sequence[float], patience: int,
                      what: str = "frame error") -> None:
    """Load the weights of the epoch with the lowest dev error (of ``errors``, one per epoch) from ``best``
    (the experiment's ``best.pt``) into ``model``: with ``[exp] patience`` they, not the last epoch's,
    become ``final.pt``."""
    best_epoch = len(errors) - epochs_since_best(errors)
    stop = "stopped early" if stopped_early(errors, patience) else "reached n_epochs_tr"
    saved = torch.load(best, map_location="cpu", weights_only=True) if best.is_file() else None
    if saved is None or saved["epoch"] != best_epoch:
        # a run begun without patience and resumed with it: the best epoch's weights were never kept
        log.warning("%s has no weights of epoch %d (the best on dev); final.pt holds the last epoch's", best, best_epoch)
        return
    model.load_state_dict(saved["model"])
    log.info("training %s after %d epochs; final.pt holds epoch %d's weights (dev %s %.4f, the lowest)",
             stop, len(errors), best_epoch, what, errors[best_epoch - 1])


@torch.no_grad()
def evaluate(net, corpus, config: Config, device: torch.device, dist, chain=None) -> tuple[float, float]:
    """Mean senone loss (cross-entropy, or with ``chain`` the LF-MMI loss) and frame error over ``corpus`` (a
    ``bru_kaldi.corpus.Corpus``; every rank of ``dist``, a ``bru_kaldi.distributed.Distributed``, scores its share)."""
    net.eval()
    totals = [0.0, 0, 0]
    input_dim, target = feature_columns(config.model, corpus.sources)
    for batch in corpus.batches():
        share = dist.share(batch)
        if share is None:
            continue
        share = share.to(device)
        with autocast(config, device):
            out = net(share.x[..., :input_dim], share.lengths)
        _, (loss_sum, errors, frames) = batch_loss(out, share.labels, config.model, 1, 1,
                                                   share.x[..., target] if target else None, chain)
        totals = [totals[0] + loss_sum, totals[1] + errors, totals[2] + frames]
    loss_sum, errors, frames = dist.sum(totals)
    return loss_sum / frames, errors / frames


def chance_frame_error(counts: np.ndarray) -> float:
    """The frame error of always answering the most frequent pdf of ``counts`` (frames per pdf in the
    training alignments): a network whose dev error is no lower has learned nothing from its input.
    A recurrent net whose first steps blew it up can end up there with a finite loss, which no NaN
    check catches (plain RMSprop, ``MINI_liGRU`` at seeds 2 and 4: 0.977 against 0.965).

    >>> round(chance_frame_error(np.array([10, 30, 60])), 3)
    0.4
    """
    counts = np.asarray(counts, dtype=np.float64)
    if counts.ndim != 1 or not counts.size or counts.sum() <= 0 or (counts < 0).any():
        raise ValueError(f"expected frames per pdf (non-negative, not all zero), got {counts!r}")
    return float(1.0 - counts.max() / counts.sum())


def warn_if_not_learning(epoch: int, dev_err: float, chance: Optional[float]) -> None:
    """Log a warning when epoch ``epoch``'s dev frame error is no better than ``chance``
    (:func:`chance_frame_error`; ``None``: nothing to compare with)."""
    if chance is not None and dev_err >= chance:
        log.warning("epoch %d: the dev frame error %.4f is no better than always answering the most frequent pdf "
                    "(%.4f): the network has learned nothing from its input yet. Too few updates can do that; so "
                    "can a blow-up in the first steps that left the loss finite (then lower [architectureN] "
                    "arch_lr, or set arch_warmup_steps or opt_bias_correction = True)", epoch, dev_err, chance)


# --------------------------------------------------------------------------- device
def pick_device(config: Config) -> torch.device:
    wanted = config.exp.device
    if wanted == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"{config.source} [exp] device = cuda, but torch sees no CUDA device; use auto or cpu")
    if wanted == "cpu" or not torch.cuda.is_available():
        return torch.device("cpu")
    return torch.device("cuda")


def autocast(config: Config, device: torch.device):
    """bf16 autocast on CUDA when ``[exp] mixed_precision``; a no-op on the CPU."""
    if config.exp.mixed_precision and device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return nullcontext()


# --------------------------------------------------------------------------- seeds
def seed_everything(seed: int, *keys: int) -> int:
    """Seed Python, NumPy and torch from ``seed`` and position keys (epoch, chunk); returns the derived seed.

    Seeding at every chunk boundary from (seed, epoch, chunk) makes a resumed run draw exactly the
    dropout masks and batch order an uninterrupted one draws.
    """
    derived = int(np.random.SeedSequence([seed, *keys]).generate_state(1)[0])
    random.seed(derived)
    np.random.seed(derived)
    torch.manual_seed(derived)
    return derived


# --------------------------------------------------------------------------- learning curve
def plot_learning_curve(history: Sequence[dict], path) -> None:
    """Train and dev loss and frame error per epoch, as a PNG written atomically."""
    import matplotlib

    matplotlib.use("Agg")  # no display on servers
    import matplotlib.pyplot as plt

    epochs = [h["epoch"] for h in history]
    figure, (loss, error) = plt.subplots(1, 2, figsize=(9, 3.5))
    for axis, key, title in ((loss, "loss", "cross-entropy"), (error, "err", "frame error")):
        axis.plot(epochs, [h[f"train_{key}"] for h in history], "o-", label="train")
        axis.plot(epochs, [h[f"dev_{key}"] for h in history], "s-", label="dev")
        axis.set_xlabel("epoch")
        axis.set_title(title)
        axis.grid(alpha=0.3)
        axis.legend()
    figure.tight_layout()
    write_atomically(path, lambda tmp: figure.savefig(tmp, format="png", dpi=100))
    plt.close(figure)

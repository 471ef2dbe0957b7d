"""Training that survives its first steps and its blow-ups: the bias-corrected RMSprop, the learning-rate
warmup, and the rollback of a NaN to the last checkpoint with halved rates (a clear stop if the same
chunk blows up again). The runs are in-process, on the tests' tiny built-in corpus, so that a NaN can
be injected at a chosen step."""

import copy
import logging
import math
import re
from pathlib import Path

import numpy as np
import pytest
import torch

import run_exp
from bru_kaldi.learning_rate import warmup
from bru_kaldi.training import BiasCorrectedRMSprop

pytestmark = pytest.mark.slow  # trains on the tiny corpus in-process

ROOT = Path(__file__).resolve().parents[1]
CFG = ROOT / "tests" / "data" / "tiny_liBRU.cfg"


def test_bias_corrected_rmsprop_against_its_definition():
    """v_t = alpha v_{t-1} + (1 - alpha) (g_t + wd w)^2, w -= lr (g_t + wd w) / (sqrt(v_t / (1 - alpha^t)) + eps),
    written out in NumPy over several steps."""
    rng = np.random.default_rng(0)
    lr, alpha, eps, wd = 0.01, 0.95, 1e-8, 0.001
    w0 = rng.normal(size=5)
    weight = torch.nn.Parameter(torch.tensor(w0))
    optimizer = BiasCorrectedRMSprop([weight], lr=lr, alpha=alpha, eps=eps, weight_decay=wd)
    w, v = w0.copy(), np.zeros(5)
    for t in range(1, 8):
        g = rng.normal(size=5) * 10 ** rng.uniform(-3, 2)
        weight.grad = torch.tensor(g)
        optimizer.step()
        g = g + wd * w
        v = alpha * v + (1 - alpha) * g * g
        w = w - lr * g / (np.sqrt(v / (1 - alpha ** t)) + eps)
        np.testing.assert_allclose(weight.detach().numpy(), w, rtol=1e-12, atol=1e-14)


def test_plain_rmsprop_first_step_is_several_times_lr():
    """The problem the correction solves: torch's RMSprop moves every weight by lr / sqrt(1 - alpha) at first."""
    weight = torch.nn.Parameter(torch.zeros(3))
    optimizer = torch.optim.RMSprop([weight], lr=0.01, alpha=0.95, eps=1e-8)
    weight.grad = torch.tensor([1e-3, -2.0, 30.0])
    optimizer.step()
    np.testing.assert_allclose(weight.detach().abs().numpy(), 0.01 / math.sqrt(0.05), rtol=1e-4)  # eps: 4e-5


@pytest.fixture
def tiny_run(tiny_corpus, tmp_path, monkeypatch, one_thread):
    """``run(*overrides)``: run_exp.main in this process on the tiny corpus, training only; returns
    (exit code, the experiment folder, the log text)."""
    monkeypatch.setenv("MINI_TIMIT", str(tiny_corpus.root))
    monkeypatch.setenv("BRU_TEST_EXP", str(tmp_path / "exp"))

    def run(*overrides):
        code = run_exp.main([str(CFG), "--stop-stage", "train", "--exp,n_epochs_tr=2", *overrides])
        logging.shutdown()
        return code, tmp_path / "exp", (tmp_path / "exp" / "log.txt").read_text()

    return run


def inject_nan(monkeypatch, when):
    """Make the loss of optimiser step number ``i`` (counted over the run, from 0) NaN where ``when(i)``."""
    calls = {"step": -1}
    original = run_exp.batch_loss

    def batch_loss(out, labels, model, global_frames, *args, **kwargs):
        loss, stats = original(out, labels, model, global_frames, *args, **kwargs)
        if global_frames > 1:  # a training step, not an evaluation
            calls["step"] += 1
            if when(calls["step"]):
                return loss * float("nan"), (float("nan"),) + stats[1:]
        return loss, stats

    monkeypatch.setattr(run_exp, "batch_loss", batch_loss)
    return calls


def checkpoint_progress(exp_dir: Path) -> dict:
    return torch.load(exp_dir / "checkpoint.pt", map_location="cpu", weights_only=True)["progress"]


def watch_rollbacks(monkeypatch) -> list[dict]:
    """Wrap run_exp.roll_back: for each rollback, the checkpoint it rolls back to (read before it runs), the
    model and optimiser states at the blow-up, and those training goes on with."""
    seen = []
    original = run_exp.roll_back

    def states(run) -> dict:
        return {"model": copy.deepcopy(run.model.state_dict()),
                "optimizers": [copy.deepcopy(o.state_dict()) for o in run.optimizers]}

    def roll_back(run, blowup):
        checkpoint = torch.load(run.exp.checkpoint, map_location="cpu", weights_only=True)
        at_blowup = states(run)
        original(run, blowup)
        seen.append({"checkpoint": checkpoint, "at_blowup": at_blowup, "after": states(run),
                     "parameters": [name for name, _ in run.model.named_parameters()]})

    monkeypatch.setattr(run_exp, "roll_back", roll_back)
    return seen


def same_optimizer_state(mine: dict, theirs: dict) -> bool:
    return mine["state"].keys() == theirs["state"].keys() and all(
        torch.equal(torch.as_tensor(value), torch.as_tensor(theirs["state"][index][key]))
        for index, state in mine["state"].items() for key, value in state.items())


@pytest.mark.parametrize("objective", ["ce", "lfmmi"])
def test_a_nan_rolls_back_to_the_last_checkpoint_with_halved_rates(objective, tiny_run, monkeypatch):
    # the fifth step: the second of a chunk (the tiny corpus's chunks take 3 or 4 steps), so that the weights
    # and the optimiser states have moved since the checkpoint at the chunk's start
    steps = inject_nan(monkeypatch, lambda step: step == 4)
    rollbacks = watch_rollbacks(monkeypatch)
    code, exp_dir, log = tiny_run(f"--model,objective={objective}")
    assert code == 0, log
    # training goes on from the checkpoint's weights and optimiser states, not from those of the blow-up
    (rollback,) = rollbacks
    saved, at_blowup, after = rollback["checkpoint"], rollback["at_blowup"], rollback["after"]
    moved = [name for name in rollback["parameters"] if not torch.equal(saved["model"][name], at_blowup["model"][name])]
    assert moved and not all(map(same_optimizer_state, at_blowup["optimizers"], saved["optimizers"])), \
        "no step since the checkpoint: this run cannot tell a rollback from none"
    assert saved["model"].keys() == after["model"].keys()
    for name, value in after["model"].items():
        assert torch.equal(value, saved["model"][name]), name
    assert all(map(same_optimizer_state, after["optimizers"], saved["optimizers"]))
    assert "rolling back to" in log and "learning rates halved" in log
    rollbacks = checkpoint_progress(exp_dir)["rollbacks"]
    assert len(rollbacks) == 1 and rollbacks[0][0] == 0  # epoch 1
    # both epochs trained at half the configured rate (arch_lr = 0.004), and the weights stayed finite
    res = (exp_dir / "res.res").read_text()
    assert re.findall(r"lr_rnn=(\S+)", res) == ["0.002", "0.002"]
    weights = torch.load(exp_dir / "final.pt", weights_only=True)["model"]
    assert all(torch.isfinite(w).all() for w in weights.values())
    assert steps["step"] > 3  # the chunk was replayed after the rollback


def test_a_nan_again_in_the_same_chunk_stops_with_a_clear_message(tiny_run, monkeypatch, capsys):
    inject_nan(monkeypatch, lambda step: step >= 2)  # every step from the third: the replay fails too
    code, exp_dir, log = tiny_run()
    assert code == 1
    assert "again after rolling back" in log and "arch_lr" in log and "arch_warmup_steps" in log
    assert len(checkpoint_progress(exp_dir)["rollbacks"]) == 1
    assert not (exp_dir / "final.pt").exists()


def test_a_nan_gradient_with_a_finite_loss_is_caught_before_the_step(tiny_run, monkeypatch):
    """A gradient can overflow where the loss does not; no weight may take a NaN step."""
    original = torch.nn.utils.clip_grad_norm_
    calls = {"n": 0}

    def poisoned(params, max_norm, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 2:
            for p in params:
                if p.grad is not None:
                    p.grad.fill_(float("nan"))
        return original(params, max_norm, *args, **kwargs)

    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", poisoned)
    code, exp_dir, log = tiny_run()
    assert code == 0 and "rolling back" in log
    weights = torch.load(exp_dir / "final.pt", weights_only=True)["model"]
    assert all(torch.isfinite(w).all() for w in weights.values())


def test_the_warmup_raises_the_rate_step_by_step_and_survives_a_resume(tiny_run, monkeypatch):
    rates = []
    original = BiasCorrectedRMSprop.step  # the tiny config's RMSprop, bias-corrected by default

    def step(self, *args, **kwargs):
        rates.append(self.param_groups[0]["lr"])
        return original(self, *args, **kwargs)

    monkeypatch.setattr(BiasCorrectedRMSprop, "step", step)
    code, exp_dir, log = tiny_run("--architecture1,arch_warmup_steps=5", "--exp,n_epochs_tr=1")
    assert code == 0, log
    expected = [0.004 * warmup(i, 5) for i in range(len(rates))]
    np.testing.assert_allclose(rates, expected)
    assert rates[:5] == pytest.approx([0.0008, 0.0016, 0.0024, 0.0032, 0.004]) and len(rates) > 5
    assert checkpoint_progress(exp_dir)["step"] == len(rates)


def scripted_dev(monkeypatch, dev_errors):
    """Make the dev evaluation after epoch k report ``dev_errors[k - 1]`` (losses alike), so that when a
    run stops early is known in advance."""
    scripted = iter(dev_errors)

    def evaluate(*arguments, **keywords):
        error = next(scripted)
        return error * 4, error

    monkeypatch.setattr(run_exp, "evaluate", evaluate)


def test_patience_stops_after_epochs_without_a_new_best_and_keeps_the_best_weights(tiny_run, monkeypatch):
    """Dev errors 0.5, 0.4, 0.45, 0.42, ...: with patience 2 the run stops after epoch 4 (two epochs
    without beating epoch 2's 0.4) of a budget of 6, and final.pt holds epoch 2's weights, not the last."""
    scripted_dev(monkeypatch, [0.5, 0.4, 0.45, 0.42, 0.3, 0.2])
    code, folder, log = tiny_run("--exp,n_epochs_tr=6", "--exp,patience=2")
    assert code == 0
    epochs = [line for line in (folder / "res.res").read_text().splitlines() if line.startswith("epoch=")]
    assert [line.split()[0] for line in epochs] == ["epoch=001", "epoch=002", "epoch=003", "epoch=004"]
    # the rate halves after epoch 3 (worse than epoch 2), not after epoch 4 (better than epoch 3): the halving
    # looks at the previous epoch, the stop at the best one
    assert [re.search(r"lr_\S+=(\S+)", line).group(1) for line in epochs] == ["0.004", "0.004", "0.004", "0.002"]
    best = torch.load(folder / "best.pt", weights_only=True)
    final = torch.load(folder / "final.pt", weights_only=True)["model"]
    last = torch.load(folder / "checkpoint.pt", weights_only=True)["model"]
    assert best["epoch"] == 2
    assert all(torch.equal(final[name], best["model"][name]) for name in final)
    assert not all(torch.equal(final[name], last[name]) for name in final)
    assert "stopped early after 4 epochs; final.pt holds epoch 2's weights" in log


def test_without_patience_every_epoch_runs_and_the_last_weights_are_final(tiny_run, monkeypatch):
    scripted_dev(monkeypatch, [0.5, 0.4, 0.45, 0.46])
    code, folder, _ = tiny_run("--exp,n_epochs_tr=4")
    assert code == 0
    assert len([line for line in (folder / "res.res").read_text().splitlines() if line.startswith("epoch=")]) == 4
    assert not (folder / "best.pt").exists()
    final = torch.load(folder / "final.pt", weights_only=True)["model"]
    last = torch.load(folder / "checkpoint.pt", weights_only=True)["model"]
    assert all(torch.equal(final[name], last[name]) for name in final)



def _interrupt_and_roll_back(monkeypatch, interrupt_at):
    """Wrap run_exp.train_step: a blow-up at the first step of epoch 1's second chunk (once: the replay
    trains), and, when ``interrupt_at`` is ``(epoch, chunk)``, a Ctrl-C at the first step of that chunk."""
    original = getattr(run_exp.train_step, "wrapped", run_exp.train_step)

    def train_step(run, batch, lrs, where):
        progress = run.progress
        if (progress.epoch, progress.chunk) == (0, 1) and not progress.rollbacks:
            raise run_exp.Diverged(f"{where}: a blow-up planted by the test")
        if (progress.epoch, progress.chunk) == interrupt_at:
            raise KeyboardInterrupt("SIGINT")
        return original(run, batch, lrs, where)

    train_step.wrapped = original
    monkeypatch.setattr(run_exp, "train_step", train_step)


def _without_times(progress: dict) -> dict:
    history = [{key: value for key, value in epoch.items() if key != "seconds"} for epoch in progress["history"]]
    return dict(progress, history=history, chunk_stats=[row[:-1] for row in progress["chunk_stats"]])


def test_a_resumed_run_restores_every_part_of_the_training_state(tiny_run, monkeypatch, tmp_path):
    """Killed in epoch 2 after a rollback in epoch 1, the resumed run ends in exactly the state of an
    uninterrupted one: weights, every optimiser state (bias-corrected RMSprop's step counts and square
    averages), the rates (a warmup still under way, plateau halving from the dev history, the rollback's
    halving), the step count, the rollbacks and the history. The overrides make each of those matter:
    a resume that lost any one of them would train on at another rate or from another state."""
    overrides = ("--exp,n_epochs_tr=3", "--architecture1,arch_warmup_steps=500", "--architecture1,opt_bias_correction=True",
                 "--architecture1,arch_improvement_threshold=0.5")
    states = {}
    for name, interrupt_at in (("uninterrupted", None), ("resumed", (1, 1))):
        _interrupt_and_roll_back(monkeypatch, interrupt_at)
        code, exp_dir, log = tiny_run(*overrides)
        if interrupt_at:
            assert code == 130, log
            assert checkpoint_progress(exp_dir)["epoch"] == 1 and checkpoint_progress(exp_dir)["rollbacks"]
            _interrupt_and_roll_back(monkeypatch, None)
            code, exp_dir, log = tiny_run(*overrides)
            assert "resuming from" in log
        assert code == 0, log
        states[name] = torch.load(exp_dir / "checkpoint.pt", map_location="cpu", weights_only=True)
        exp_dir.rename(tmp_path / name)  # the next run starts from an empty folder
    expected, got = states["uninterrupted"], states["resumed"]
    progress = _without_times(expected["progress"])
    assert progress["rollbacks"] == [[0, 1]] and progress["epoch"] == 3 and 0 < progress["step"] < 500
    assert _without_times(got["progress"]) == progress
    assert expected["model"].keys() == got["model"].keys()
    for name in expected["model"]:
        assert torch.equal(expected["model"][name], got["model"][name]), name
    for mine, theirs in zip(expected["optimizers"], got["optimizers"], strict=True):
        assert mine["param_groups"] == theirs["param_groups"]  # the rate of the last step included
        for index, state in mine["state"].items():
            for key, value in state.items():
                assert torch.equal(torch.as_tensor(value), torch.as_tensor(theirs["state"][index][key])), (index, key)

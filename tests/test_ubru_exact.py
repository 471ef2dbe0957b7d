"""The ``ubru`` unit against exact HMM inference by brute force over all 2^T state sequences."""

import itertools

import numpy as np
import pytest
import torch

import models


def gaussian_log_density(x, mean, cov_inv, log_det):
    d = x - mean
    return -0.5 * (d @ cov_inv @ d) - 0.5 * log_det - 0.5 * len(x) * np.log(2 * np.pi)


def brute_force_posteriors(log_lik_on, log_lik_off, rho0, tau11, tau01):
    """P(phi_t | x_1..x_t) and P(phi_t | x_1..x_T) for one unit, by enumerating s_0..s_T."""
    T = len(log_lik_on)

    def sequence_weight(states, upto):
        # states = (s_0, ..., s_upto); s_0 is the unobserved initial state with P(s_0 = 1) = rho0
        w = rho0 if states[0] else 1 - rho0
        for t in range(1, upto + 1):
            previous, current = states[t - 1], states[t]
            p_on = tau11 if previous else tau01
            w *= p_on if current else 1 - p_on
            w *= np.exp(log_lik_on[t - 1] if current else log_lik_off[t - 1])
        return w

    alpha, gamma = np.zeros(T), np.zeros(T)
    for t in range(1, T + 1):
        on = total = 0.0
        for states in itertools.product((0, 1), repeat=t + 1):
            w = sequence_weight(states, t)
            total += w
            on += w * states[t]
        alpha[t - 1] = on / total
    marginal_on, total = np.zeros(T), 0.0
    for states in itertools.product((0, 1), repeat=T + 1):
        w = sequence_weight(states, T)
        total += w
        marginal_on += w * np.array(states[1:])
    gamma[:] = marginal_on / total
    return alpha, gamma


@pytest.fixture(scope="module")
def exact_problem():
    """Two units, each with its own pair of Gaussians and its own chain; F = 3, T = 9."""
    rng = np.random.default_rng(7)
    F, H, T = 3, 2, 9
    a = rng.normal(size=(F, F))
    cov = a @ a.T + F * np.eye(F)
    cov_inv = np.linalg.inv(cov)
    log_det = np.linalg.slogdet(cov)[1]
    mu, nu = rng.normal(size=(H, F)), rng.normal(size=(H, F))
    chain = {"rho0": np.array([0.3, 0.6]), "tau11": np.array([0.85, 0.7]), "tau01": np.array([0.2, 0.05])}
    x = rng.normal(size=(T, F)) * 1.5
    # Parameters of the projection from the Gaussians: a(x) = log N(x; mu, S) - log N(x; nu, S)
    weight = (mu - nu) @ cov_inv  # (H, F)
    bias = -0.5 * (np.einsum("hf,fg,hg->h", mu, cov_inv, mu) - np.einsum("hf,fg,hg->h", nu, cov_inv, nu))
    references = []
    for h in range(H):
        on = np.array([gaussian_log_density(xt, mu[h], cov_inv, log_det) for xt in x])
        off = np.array([gaussian_log_density(xt, nu[h], cov_inv, log_det) for xt in x])
        references.append(brute_force_posteriors(on, off, chain["rho0"][h], chain["tau11"][h], chain["tau01"][h]))
    alpha = np.stack([r[0] for r in references], axis=1)  # (T, H)
    gamma = np.stack([r[1] for r in references], axis=1)
    return dict(x=x, weight=weight, bias=bias, chain=chain, alpha=alpha, gamma=gamma)


def exact_layer(problem, backward):
    layer = models.build("ubru", problem["x"].shape[1], 2, backward=backward).double()
    with torch.no_grad():
        layer.proj.weight.copy_(torch.from_numpy(problem["weight"]))
        layer.proj.bias.copy_(torch.from_numpy(problem["bias"]))
        cell = layer.cells[0]
        for name in ("rho0", "tau11", "tau01"):
            p = torch.from_numpy(problem["chain"][name])
            getattr(cell, f"{name}_logit").copy_(torch.log(p) - torch.log1p(-p))
    return layer


def test_parameters_are_exposed_as_probabilities(exact_problem):
    layer = exact_layer(exact_problem, None)
    for name in ("rho0", "tau11", "tau01"):
        value = getattr(layer, name)
        assert value.shape == (2,)
        np.testing.assert_allclose(value.detach().numpy(), exact_problem["chain"][name], atol=1e-12)


def test_alpha_is_the_exact_filtering_posterior(exact_problem):
    layer = exact_layer(exact_problem, None)
    x = torch.from_numpy(exact_problem["x"])[None]
    alpha = layer(x, [x.size(1)])[0].detach().numpy()
    assert np.abs(alpha - exact_problem["alpha"]).max() < 1e-9


@pytest.mark.parametrize("backward", ["kalman", "hmm"])
def test_gamma_is_the_exact_smoothing_posterior(exact_problem, backward):
    layer = exact_layer(exact_problem, backward)
    x = torch.from_numpy(exact_problem["x"])[None]
    gamma = layer(x, [x.size(1)])[0].detach().numpy()
    assert np.abs(gamma - exact_problem["gamma"]).max() < 1e-9
    # smoothing changes the answer: the test would catch a backward pass that returns alpha
    assert np.abs(exact_problem["gamma"] - exact_problem["alpha"]).max() > 1e-3


def test_hmm_and_kalman_recursions_agree_on_random_parameters():
    torch.manual_seed(3)
    kalman = models.build("ubru", 5, 6, backward="kalman").double()
    hmm = models.build("ubru", 5, 6, backward="hmm").double()
    with torch.no_grad():
        for p in kalman.parameters():
            p.normal_()
    hmm.load_state_dict(kalman.state_dict())
    x, lengths = torch.randn(3, 10, 5, dtype=torch.float64) * 3, torch.tensor([10, 7, 1])
    assert (kalman(x, lengths) - hmm(x, lengths)).abs().max() < 1e-9


def test_first_frame_prior_uses_rho0(exact_problem):
    """p_1 = tau11 rho0 + tau01 (1 - rho0), so alpha_1 = sigma(a_1 + logit(p_1))."""
    layer = exact_layer(exact_problem, None)
    c = exact_problem["chain"]
    p1 = c["tau11"] * c["rho0"] + c["tau01"] * (1 - c["rho0"])
    a1 = exact_problem["weight"] @ exact_problem["x"][0] + exact_problem["bias"]
    expected = 1 / (1 + np.exp(-(a1 + np.log(p1 / (1 - p1)))))
    x = torch.from_numpy(exact_problem["x"])[None]
    np.testing.assert_allclose(layer(x, [x.size(1)])[0, 0].detach().numpy(), expected, atol=1e-12)

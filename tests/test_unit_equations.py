"""Each unit against an independent float64 NumPy transcription of its paper's equations.

The references below are written from the equations (cited per function) in probability space with
plain loops; they share no code with ``models``. Weights are read from the layer, split per gate.
"""

import numpy as np
import pytest
import torch

import models
from tests.unit_variants import copy_torch_rnn_weights_, make_layer


def sig(a):
    return 1.0 / (1.0 + np.exp(-a))


def gates(matrix, count):
    return np.split(matrix, count, axis=0)


def weights(layer):
    """Input weights and biases per gate, recurrent weights per gate, as float64 NumPy arrays."""
    cell = layer.cells[0]
    g = cell.num_gates
    W = layer.proj.weight.detach().double().numpy()
    b = layer.proj.bias.detach().double().numpy()
    U = cell.recurrent.weight.detach().double().numpy() if hasattr(cell, "recurrent") else None
    return gates(W, g), np.split(b, g), (gates(U, g) if U is not None else None), cell


def reference_bru(x, layer):
    """Li-BRU paper eq. 5: h_t = sigma(W x_t + V log h_{t-1} + b), h_0 = 0.5; output log h."""
    (W,), (b,), (V,), _ = weights(layer)
    h, out = np.full(W.shape[0], 0.5), []
    for xt in x:
        h = sig(W @ xt + b + V @ np.log(h))
        out.append(np.log(h))
    return np.array(out)


def reference_libru(x, layer):
    """Li-BRU paper eq. 7a-c, gates fed with log h_{t-1}; output log h."""
    (Wz, Wh), (bz, bh), (Vz, Vh), _ = weights(layer)
    h, out = np.full(Wz.shape[0], 0.5), []
    for xt in x:
        z = sig(Wz @ xt + Vz @ np.log(h) + bz)
        candidate = sig(Wh @ xt + Vh @ np.log(h) + bh)
        h = z * candidate + (1 - z) * h
        out.append(np.log(h))
    return np.array(out)


def reference_ligru(x, layer):
    """Li-BRU paper eq. 8a-c, h_0 = 0."""
    (Wz, Wh), (bz, bh), (Vz, Vh), _ = weights(layer)
    h, out = np.zeros(Wz.shape[0]), []
    for xt in x:
        z = sig(Wz @ xt + Vz @ h + bz)
        candidate = np.maximum(Wh @ xt + Vh @ h + bh, 0)
        h = z * candidate + (1 - z) * h
        out.append(h)
    return np.array(out)


def reference_mgu(x, layer):
    """Zhou et al. 2016: f = sigma(.), h~ = tanh(W x + U (f h) + b), h = (1 - f) h + f h~."""
    (Wf, Wh), (bf, bh), (Uf, Uh), _ = weights(layer)
    h, out = np.zeros(Wf.shape[0]), []
    for xt in x:
        f = sig(Wf @ xt + Uf @ h + bf)
        h = (1 - f) * h + f * np.tanh(Wh @ xt + Uh @ (f * h) + bh)
        out.append(h)
    return np.array(out)


def reference_rnn(x, layer):
    (W,), (b,), (U,), cell = weights(layer)
    ub = cell.recurrent.bias.detach().double().numpy() if cell.recurrent.bias is not None else 0
    h, out = np.zeros(W.shape[0]), []
    for xt in x:
        h = np.tanh(W @ xt + b + U @ h + ub)
        out.append(h)
    return np.array(out)


def reference_ubru_tpami(x, layer):
    """TPAMI eq. 27 (prior), 20/29 (n), 72-73 (gates), 75 (input gate), 51 (unit-wise backward)."""
    (Wz, Wr, Wn), (bz, br, bn), (Uz, Ur, Un), cell = weights(layer)
    p = sig(cell.prior_logit.detach().double().numpy())
    h, z_previous = p.copy(), np.zeros_like(p)  # h_0 = p, z_0 = 0
    hs, zs = [], []
    for xt in x:
        prior = (1 - z_previous) * p + z_previous * h
        n = sig(Wn @ xt + Un @ h + bn + np.log(prior / (1 - prior)))
        z = sig(Wz @ xt + Uz @ h + bz)
        r = sig(Wr @ xt + Ur @ h + br)
        h = (1 - r) * n + r * h if cell.input_gate else n
        hs.append(h)
        zs.append(z)
        z_previous = z
    if cell.backward == "unit":
        smoothed = [hs[-1]]
        for t in range(len(x) - 2, -1, -1):
            smoothed.append((1 - zs[t]) * hs[t] + zs[t] * smoothed[-1])
        hs = smoothed[::-1]
    return np.array(hs)


def reference_lbru(x, layer):
    """TPAMI eq. 72-75 (forward, with z_{t-1} in n_t) and eq. 77-78 (layer-wise backward)."""
    cell = layer.cells[0]
    Ws, bs, Us, _ = weights(layer)
    b_hh = cell.hidden_bias.detach().double().numpy()
    h, z_previous = np.full(Ws[0].shape[0], 0.5), np.zeros(Ws[0].shape[0])
    hs, ss = [], []
    for xt in x:
        a = [W @ xt + b + U @ h for W, b, U in zip(Ws, bs, Us)]  # gate pre-activations with h_{t-1}
        n = sig(Ws[2] @ xt + bs[2] + z_previous * (Us[2] @ h + b_hh))
        z, r = sig(a[0]), sig(a[1])
        if cell.backward == "layer":
            ss.append(sig(a[3]))
        h = (1 - r) * n + r * h if cell.input_gate else n
        hs.append(h)
        z_previous = z
    if cell.backward == "layer":
        Ub = cell.backward_recurrent.weight.detach().double().numpy()
        bb = cell.backward_recurrent.bias.detach().double().numpy()
        smoothed = [hs[-1]]
        for t in range(len(x) - 2, -1, -1):
            s = ss[t + 1]
            smoothed.append(s * (Ub @ smoothed[-1] + bb) + (1 - s) * hs[t])
        hs = smoothed[::-1]
    return np.array(hs)


def reference_mlp(x, layer):
    (W,), (b,), _, _ = weights(layer)
    return np.maximum(x @ W.T + b, 0)


REFERENCES = [
    ("bru", {"form": "log"}, reference_bru),
    ("bru", {"form": "prob"}, reference_bru),
    ("libru", {"form": "log"}, reference_libru),
    ("libru", {"form": "prob"}, reference_libru),
    ("ligru", {}, reference_ligru),
    ("mgu", {}, reference_mgu),
    ("rnn", {}, reference_rnn),
    ("mlp", {}, reference_mlp),
    ("ubru_tpami", {}, reference_ubru_tpami),
    ("ubru_tpami", {"backward": "unit"}, reference_ubru_tpami),
    ("ubru_tpami", {"input_gate": False}, reference_ubru_tpami),
    ("lbru", {}, reference_lbru),
    ("lbru", {"backward": "layer"}, reference_lbru),
    ("lbru", {"input_gate": False, "backward": "layer"}, reference_lbru),
]


# Units held to an independent reference in other tests: the UBRU to exact HMM filtering and smoothing
# by brute force over all state sequences (test_ubru_exact.py), GRU and LSTM to torch.nn (below); the
# cudnn_* layers are torch.nn modules themselves.
CHECKED_ELSEWHERE = {"ubru": "test_ubru_exact.py", "gru": "torch.nn.GRU", "lstm": "torch.nn.LSTM",
                     "cudnn_gru": "torch.nn.GRU itself", "cudnn_lstm": "torch.nn.LSTM itself"}


def test_every_registered_unit_has_an_independent_reference():
    """A unit added to models.UNITS fails here until its equations have a transcription above."""
    referenced = {unit for unit, _, _ in REFERENCES} | set(CHECKED_ELSEWHERE)
    missing = sorted(set(models.UNITS) - referenced)
    assert not missing, f"units without an independent reference of their equations: {missing}"


@pytest.mark.parametrize("unit, options, reference", REFERENCES, ids=lambda v: v if isinstance(v, str) else None)
def test_unit_matches_its_equations(unit, options, reference):
    layer = make_layer(unit, options, input_size=3, hidden_size=5, dtype=torch.float64, seed=11)
    x = np.random.default_rng(5).normal(size=(12, 3)) * 2
    got = layer(torch.from_numpy(x)[None], [12])[0].detach().numpy()
    np.testing.assert_allclose(got, reference(x, layer), rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize("unit", ["bru", "libru"])
def test_probability_and_log_forms_agree(unit):
    log_form = make_layer(unit, {"form": "log"}, dtype=torch.float64, seed=2)
    prob_form = models.build(unit, 3, 4, form="prob").double().eval()
    prob_form.load_state_dict(log_form.state_dict())
    x, lengths = torch.randn(3, 9, 3, dtype=torch.float64) * 3, [9, 6, 1]
    torch.testing.assert_close(log_form(x, lengths), prob_form(x, lengths), rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(log_form.posteriors(x, lengths), prob_form.posteriors(x, lengths))


@pytest.mark.parametrize("kind", ["gru", "lstm"])
@pytest.mark.parametrize("bidirectional", [False, True])
def test_gru_and_lstm_agree_with_torch(kind, bidirectional):
    torch.manual_seed(0)
    reference = {"gru": torch.nn.GRU, "lstm": torch.nn.LSTM}[kind](3, 4, batch_first=True, bidirectional=bidirectional)
    ours = models.build(kind, 3, 4, bidirectional=bidirectional)
    copy_torch_rnn_weights_(ours, reference)
    x, lengths = torch.randn(3, 6, 3), torch.tensor([6, 4, 2])
    packed = torch.nn.utils.rnn.pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
    expected, _ = torch.nn.utils.rnn.pad_packed_sequence(reference(packed)[0], batch_first=True, total_length=6)
    torch.testing.assert_close(ours(x, lengths), expected, rtol=1e-5, atol=1e-6)

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


def reference_fusionrnn(x, layer):
    """pytorch-kaldi's liGRU_layer with FusionLinearConv (neural_networks.py), in its own convention: per gate
    f = reduce_m act(W x^m + b) over the microphones (one W, b shared by all), z' = sigma(f_z + U'_z h),
    h~ = ReLU(f_h + U_h h), h = z' h + (1 - z') h~. Our U_z is -U'_z (models.fusion); no norm here."""
    cell = layer.cells[0]
    M, H = cell.mics, cell.hidden_size
    W = layer.proj.shared_weight.detach().double().numpy()
    b = layer.proj.shared_bias.detach().double().numpy()
    Uz, Uh = gates(cell.recurrent.weight.detach().double().numpy(), 2)
    slope = cell.slope.detach().double().numpy().ravel() if cell.slope is not None else (None, None)
    acts = {"linear": lambda a, s: a, "relu": lambda a, s: np.maximum(a, 0), "tanh": lambda a, s: np.tanh(a),
            "leaky_relu": lambda a, s: np.where(a > 0, a, 0.01 * a), "prelu": lambda a, s: np.where(a > 0, a, s * a)}
    act = acts[cell.fusion_act]
    h, out = np.zeros(H), []
    for xt in x:
        fused = []
        for g in range(2):
            per_mic = [act(W[g * H:(g + 1) * H] @ xm + b[g * H:(g + 1) * H], slope[g]) for xm in np.split(xt, M)]
            fused.append(np.mean(per_mic, axis=0) if cell.fusion_reduce == "mean" else np.sum(per_mic, axis=0))
        z = sig(fused[0] + (-Uz) @ h)
        h = z * h + (1 - z) * np.maximum(fused[1] + Uh @ h, 0)
        out.append(h)
    return np.array(out)


def reference_sru(x, layer):
    """Lei et al. 2018 as the sru package 2.1: f, r = sigma(W_. x + v_. c + b_.), c = f c + (1 - f) u,
    h = r g(c) + (1 - r) x'; x' a learned projection, or scale * x when x has the output width. Read from the
    raw parameters (the learned rows, the gate biases, v), not from the layer's assembled matrix."""
    cell, proj = layer.cells[0], layer.proj
    H, F = cell.hidden_size, x.shape[1]
    W = proj.learned_weight.detach().double().numpy()
    if proj.down is not None:  # sru's n_proj: x -> (P,) -> (k H,)
        W = W @ proj.down.detach().double().numpy()
    k = W.shape[0] // H
    rows = np.split(W, k)
    b_f, b_r = np.split(proj.gate_bias.detach().double().numpy(), 2)
    v_f, v_r = cell.recurrent_weight.detach().double().numpy()
    g = {"identity": lambda c: c, "tanh": np.tanh, "relu": lambda c: np.maximum(c, 0),
         "selu": lambda c: 1.0507009873554805 * np.where(c > 0, c, 1.6732632423543772 * np.expm1(c))}[cell.activation_name]
    scale = np.sqrt(1 + 2 * np.exp(cell.highway_bias)) if cell.rescale else 1.0
    c, out = np.zeros(H), []
    for xt in x:
        u = rows[0] @ xt
        f = sig(rows[1] @ xt + v_f * c + b_f)
        r = sig(rows[2] @ xt + v_r * c + b_r)
        c = f * c + (1 - f) * u
        if not cell.skip:
            h = r * g(c)
        else:
            highway = rows[3] @ xt if k == 4 else scale * xt[:H]  # F == H: the input itself
            h = r * g(c) + (1 - r) * highway
        out.append(h)
    return np.array(out)


def quaternion_product(p, q):
    """The Hamilton product p q of quaternions given as (r, i, j, k) arrays (elementwise over their shapes)."""
    a1, b1, c1, d1 = p
    a2, b2, c2, d2 = q
    return np.array([a1 * a2 - b1 * b2 - c1 * c2 - d1 * d2,
                     a1 * b2 + b1 * a2 + c1 * d2 - d1 * c2,
                     a1 * c2 - b1 * d2 + c1 * a2 + d1 * b2,
                     a1 * d2 + b1 * c2 - c1 * b2 + d1 * a2])


def quaternion_map(components, v, size):
    """y_a = sum_b W_ab v_b (Hamilton products), W ``(4, m, n)`` as [R, I, J, K]; ``v`` zero-padded at its end
    to 4n numbers read as [r..., i..., j..., k...]; the result laid out the same way, cut to ``size``."""
    _, m, n = components.shape
    padded = np.concatenate([v, np.zeros(4 * n - len(v))]).reshape(4, n)  # (component, quaternion)
    y = np.zeros((4, m))
    for a in range(m):
        for b in range(n):
            y[:, a] += quaternion_product(components[:, a, b], padded[:, b])
    return y.reshape(-1)[:size]


def reference_qlstm(x, layer):
    """Parcollet et al. 2019 (pytorch-kaldi's QLSTM): an LSTM, gates [i, f, g, o], whose products are
    quaternion maps; act(.) on the candidate and on c."""
    cell = layer.cells[0]
    H = cell.hidden_size
    Wq = layer.proj.components.detach().double().numpy()  # (4 gates, 4, m, n)
    b = np.split(layer.proj.bias.detach().double().numpy(), 4)
    Uq = cell.recurrent.components.detach().double().numpy()
    act = {"tanh": np.tanh, "relu": lambda a: np.maximum(a, 0)}[cell.activation_name]
    h, c, out = np.zeros(H), np.zeros(H), []
    for xt in x:
        a = [quaternion_map(Wq[g], xt, H) + b[g] + quaternion_map(Uq[g], h, H) for g in range(4)]
        c = sig(a[1]) * c + sig(a[0]) * act(a[2])
        h = sig(a[3]) * act(c)
        out.append(h)
    return np.array(out)


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
    ("fusionrnn", {}, reference_fusionrnn),
    ("fusionrnn", {"fusion_act": "prelu"}, reference_fusionrnn),
    ("fusionrnn", {"fusion_act": "tanh", "fusion_reduce": "mean"}, reference_fusionrnn),
    ("fusionrnn", {"fusion_act": "leaky_relu"}, reference_fusionrnn),
    ("sru", {}, reference_sru),
    ("sru", {"activation": "tanh", "highway_bias": -1.0}, reference_sru),
    ("sru", {"skip": False}, reference_sru),
    ("sru", {"rescale": False, "activation": "selu"}, reference_sru),
    ("qlstm", {}, reference_qlstm),
    ("qlstm", {"activation": "relu"}, reference_qlstm),
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

"""Our Li-GRU against pytorch-kaldi's liGRU cell, written out here from its equations
(neural_networks.py, class liGRU): with the gate weights negated, the two compute the same function.

pytorch-kaldi, per layer (one direction, ``drop`` its dropout rate)::

    wh = W_h x + b_h,  wz = W_z x + b_z              (batch norm on both when use_batchnorm)
    z'_t = sigmoid(wz_t + U_z h_{t-1})
    h~_t = relu(wh_t + U_h h_{t-1}) * m               (m: per-sequence 0/1 mask in training, 1 - drop in evaluation)
    h_t  = z'_t h_{t-1} + (1 - z'_t) h~_t

Ours has ``z = 1 - z'`` (models.gated.LiGRUCell's docstring gives the mapping used below).
"""

import numpy as np
import pytest
import torch

import models


def pytorch_kaldi_ligru(x, Wz, bz, Wh, bh, Uz, Uh, keep, bn=None):
    """float64 NumPy transcription of pytorch-kaldi's liGRU layer; ``x`` (B, T, F); ``bn``: per gate
    (mean, var, gamma, beta) of its evaluation-mode BatchNorm1d (eps 1e-5)."""
    wz, wh = x @ Wz.T + bz, x @ Wh.T + bh
    if bn is not None:
        (mz, vz, gz, betaz), (mh, vh, gh, betah) = bn
        wz = (wz - mz) / np.sqrt(vz + 1e-5) * gz + betaz
        wh = (wh - mh) / np.sqrt(vh + 1e-5) * gh + betah
    h = np.zeros((x.shape[0], Uz.shape[0]))
    out = []
    for t in range(x.shape[1]):
        z = 1 / (1 + np.exp(-(wz[:, t] + h @ Uz.T)))
        cand = np.maximum(wh[:, t] + h @ Uh.T, 0) * keep
        h = z * h + (1 - z) * cand
        out.append(h)
    return np.stack(out, 1)


@pytest.mark.parametrize("batch_norm", [False, True])
def test_our_ligru_is_pytorch_kaldis_with_the_gate_negated(batch_norm):
    rng = np.random.default_rng(0)
    B, T, F, H, p = 3, 9, 5, 4, 0.3
    x = rng.standard_normal((B, T, F))
    Wz, Wh = rng.standard_normal((H, F)), rng.standard_normal((H, F))
    Uz, Uh = rng.standard_normal((H, H)) * 0.5, rng.standard_normal((H, H)) * 0.5
    bz, bh = rng.standard_normal(H), rng.standard_normal(H)
    stats = [(rng.standard_normal(H), rng.uniform(0.5, 2, H), rng.uniform(0.5, 2, H), rng.standard_normal(H)) for _ in range(2)]

    layer = models.build("ligru", F, H, norm="batch" if batch_norm else None).double().eval()
    layer.cells[0].inner_dropout = p  # pytorch-kaldi's place: evaluation scales the candidate by 1 - p
    with torch.no_grad():
        layer.proj.weight.copy_(torch.from_numpy(np.concatenate([-Wz, Wh])))  # rows [z; h~]: the gate negated
        layer.cells[0].recurrent.weight.copy_(torch.from_numpy(np.concatenate([-Uz, Uh])))
        if batch_norm:  # the projection has no bias under a norm; the norm's shift and mean negated for z
            (mz, vz, gz, betaz), (mh, vh, gh, betah) = stats
            norm = layer.norm
            norm.running_mean.copy_(torch.from_numpy(np.concatenate([-(mz - bz), mh - bh])))
            norm.running_var.copy_(torch.from_numpy(np.concatenate([vz, vh])))
            norm.weight.copy_(torch.from_numpy(np.concatenate([gz, gh])))
            norm.bias.copy_(torch.from_numpy(np.concatenate([-betaz, betah])))
        else:
            layer.proj.bias.copy_(torch.from_numpy(np.concatenate([-bz, bh])))
    ours = layer(torch.from_numpy(x), torch.full((B,), T)).detach().numpy()
    # with batch norm, pytorch-kaldi's projections have no bias either: its mean absorbs ours
    reference = pytorch_kaldi_ligru(x, Wz, 0 * bz if batch_norm else bz, Wh, 0 * bh if batch_norm else bh, Uz, Uh, 1 - p,
                                    [(mz - bz, vz, gz, betaz), (mh - bh, vh, gh, betah)] if batch_norm else None)
    np.testing.assert_allclose(ours, reference, rtol=0, atol=1e-12)
    # the unmapped weights give another function: the mapping is what makes them equal
    with torch.no_grad():
        layer.cells[0].recurrent.weight[:H].neg_()
    assert np.abs(layer(torch.from_numpy(x), torch.full((B,), T)).detach().numpy() - reference).max() > 1e-3


def test_inside_dropout_is_one_unscaled_mask_per_sequence():
    """In training, pytorch-kaldi's candidate mask is 0/1 (not rescaled), one (B, H) draw per sequence
    carried through every step; in evaluation it is the constant 1 - p."""
    torch.manual_seed(0)
    for unit in ("ligru", "gru", "lstm", "rnn"):
        cell = models.build(unit, 3, 64).cells[0]
        cell.inner_dropout = 0.25
        proj = torch.zeros(2, cell.num_gates * 64)
        mask = cell.initial_state(proj)[-1]
        assert mask.shape == (2, 64) and set(mask.unique().tolist()) == {0.0, 1.0}
        _, state = cell.step(proj, cell.initial_state(proj))
        assert state[-1] is not None and torch.equal(cell.step(proj, state)[1][-1], state[-1])
        cell.eval()
        assert cell.initial_state(proj)[-1].tolist() == [[0.75]]



def pytorch_kaldi_input_norm(x, real, kind, ln=None, bn=None):
    """float64 NumPy transcription of pytorch-kaldi's input norms (neural_networks.py, LSTM.forward): ``ln0``,
    its LayerNorm, ``gamma (x - mean) / (std + 1e-6) + beta`` with the unbiased std over the features; then
    ``bn0``, BatchNorm1d (eps 1e-5) in training mode, here over the real frames only (``bn = (weight,
    bias)``), or in evaluation mode (``bn = (weight, bias, running_mean, running_var)``).
    ``x`` (B, T, F), ``real`` (B, T) bool. Returns the normalised x and the batch mean and biased variance."""
    mean = var = None
    if "layer" in kind:
        gamma, beta = ln
        x = gamma * (x - x.mean(-1, keepdims=True)) / (x.std(-1, ddof=1, keepdims=True) + 1e-6) + beta
    if "batch" in kind:
        weight, bias, *running = bn
        frames = x[real]  # (N, F): padding left out of the statistics
        mean, var = running if running else (frames.mean(0), frames.var(0))
        x = (x - mean) / np.sqrt(var + 1e-5) * weight + bias
    return x, mean, var


def numpy_lstm(x, W, b, U, b_hh):
    """PyTorch's LSTM (gates i, f, g, o), one direction, float64: the layer the input norm feeds."""
    H = U.shape[1]
    h, c, out = np.zeros((x.shape[0], H)), np.zeros((x.shape[0], H)), []
    sigmoid = lambda a: 0.5 * (1 + np.tanh(a / 2))  # noqa: E731
    for t in range(x.shape[1]):
        a = x[:, t] @ W.T + b + h @ U.T + b_hh
        i, f, g, o = sigmoid(a[:, :H]), sigmoid(a[:, H:2 * H]), np.tanh(a[:, 2 * H:3 * H]), sigmoid(a[:, 3 * H:])
        c = f * c + i * g
        h = o * np.tanh(c)
        out.append(h)
    return np.stack(out, 1)


@pytest.mark.parametrize("kind", ["batch", "layer", "layer+batch"])
def test_input_norm_is_pytorch_kaldis_with_padding_left_out(kind):
    """An lstm stack with ``input_norm`` (pytorch-kaldi's ``lstm_use_batchnorm_inp`` / ``lstm_use_laynorm_inp``,
    both: layer norm first) equals the transcription above to 1e-10 in float64, in training mode with garbage
    in the padded frames: they enter neither the batch statistics nor the output (zero there). The running
    statistics move by the momentum (pytorch-kaldi's 0.05) towards the real frames' mean and unbiased
    variance, and evaluation uses them."""
    rng = np.random.default_rng(1)
    B, T, F, H = 3, 7, 5, 4
    lengths = np.array([7, 3, 5])
    real = np.arange(T)[None, :] < lengths[:, None]
    x = rng.standard_normal((B, T, F)) * 2 + 1
    x[~real] = 1e3 * rng.standard_normal((int((~real).sum()), F))  # garbage padding
    torch.manual_seed(0)
    stack = models.build_stack("lstm", F, [H], input_norm=kind).double().train()
    norm = stack.input_norm
    numpy = lambda *tensors: [t.detach().numpy() for t in tensors]  # noqa: E731
    with torch.no_grad():  # scales and shifts away from 1 and 0, so that each is seen at work
        for module in (norm.layer, norm.batch):
            if module is not None:
                module.weight.copy_(torch.from_numpy(rng.uniform(0.5, 1.5, F)))
                module.bias.copy_(torch.from_numpy(rng.standard_normal(F)))
    ln = numpy(norm.layer.weight, norm.layer.bias) if norm.layer is not None else None
    bn = numpy(norm.batch.weight, norm.batch.bias) if norm.batch is not None else None
    if norm.batch is not None:
        norm.batch.momentum = 0.05
    layer = stack.layers[0]
    params = numpy(layer.proj.weight, layer.proj.bias, layer.cells[0].recurrent.weight, layer.cells[0].recurrent.bias)
    normalised, mean, var = pytorch_kaldi_input_norm(x, real, kind, ln, bn)
    got = stack(torch.from_numpy(x), torch.from_numpy(lengths)).detach().numpy()
    np.testing.assert_allclose(got[real], numpy_lstm(normalised, *params)[real], rtol=0, atol=1e-10)
    assert np.all(got[~real] == 0)
    if norm.batch is not None:
        n = real.sum()
        np.testing.assert_allclose(norm.batch.running_mean.numpy(), 0.05 * mean, rtol=0, atol=1e-12)
        np.testing.assert_allclose(norm.batch.running_var.numpy(), 0.95 + 0.05 * var * n / (n - 1), rtol=0, atol=1e-12)
        # with the padding in the statistics (BatchNorm1d on the padded batch) the mean would differ
        every_frame = pytorch_kaldi_input_norm(x, np.ones_like(real), kind, ln, bn)[1]
        assert np.abs(every_frame - mean).max() > 0.1
        stack.eval()
        running = bn + numpy(norm.batch.running_mean, norm.batch.running_var)
        expected = numpy_lstm(pytorch_kaldi_input_norm(x, real, kind, ln, running)[0], *params)
        got = stack(torch.from_numpy(x), torch.from_numpy(lengths)).detach().numpy()
        np.testing.assert_allclose(got[real], expected[real], rtol=0, atol=1e-10)
    if norm.layer is not None:  # torch.nn.LayerNorm's formula (eps on the biased variance) gives another result
        plain = (norm.layer(torch.from_numpy(x[real])).detach().numpy() - ln[1]) / ln[0]
        assert np.abs(plain - torch.nn.functional.layer_norm(torch.from_numpy(x[real]), (F,)).numpy()).max() > 1e-2


def test_mlp_layers_take_pytorch_kaldis_activations_one_per_layer():
    """pytorch-kaldi's MLP applies act_fun(dnn_act[i]) to layer i: leaky_relu is nn.LeakyReLU(0.2) (not torch's
    default slope 0.01), linear the identity. Worked by hand for x = (3, 2):

        layer 1, leaky_relu: W1 x + b1 = (3 - 4 + 0, 1.5 + 2 - 1) = (-1, 2.5)  ->  (-0.2, 2.5)
        layer 2, linear:     W2 h + b2 = (-0.2 + 2.5 + 0.5, -0.4 - 2.5 + 0) = (2.8, -2.9)
    """
    stack = models.build_stack("mlp", 2, [2, 2], options=[{"activation": "leaky_relu"}, {"activation": "linear"}]).eval()
    with torch.no_grad():
        for layer, (W, b) in zip(stack.layers, (([[1.0, -2.0], [0.5, 1.0]], [0.0, -1.0]), ([[1.0, 1.0], [2.0, -1.0]], [0.5, 0.0]))):
            layer.proj.weight.copy_(torch.tensor(W))
            layer.proj.bias.copy_(torch.tensor(b))
    x = torch.tensor([[[3.0, 2.0]]])
    assert stack.layers[0](x, torch.tensor([1])).flatten().tolist() == pytest.approx([-0.2, 2.5])
    assert stack(x, torch.tensor([1])).flatten().tolist() == pytest.approx([2.8, -2.9])

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

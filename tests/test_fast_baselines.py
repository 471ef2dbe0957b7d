"""The fast paths of the baselines (GRU, LSTM, MGU, RNN) beyond the sweep of test_fast_recurrences.py:
in the configuration the configs train them in (batch norm, dropout, training mode), against
torch.nn.GRU / torch.nn.LSTM for gradients as well as outputs, and the options they leave to the
reference loop. Both backends, the C++ kernels and the TorchScript loops, as there.
"""

import pytest
import torch

import models
from models.fast import native
from models.fast.gated import GatedRecurrence
from models.recurrent import set_implementation
from tests.unit_variants import copy_torch_rnn_weights_, randomise_

BASELINES = [("gru", {}), ("lstm", {}), ("mgu", {}), ("rnn", {}), ("rnn", {"activation": "relu"})]
IDS = ["gru", "lstm", "mgu", "rnn", "rnn-relu"]


@pytest.fixture(params=["native", "torchscript"])
def backend(request, monkeypatch):
    monkeypatch.setenv("BRU_KALDI_NATIVE", "1" if request.param == "native" else "0")
    assert (native.native_ops(torch.zeros(1)) is not None) == (request.param == "native")
    return request.param


def _train_step(layer, implementation, x, lengths, weights, seed):
    """Output and gradients of one training-mode step; ``seed`` fixes the dropout mask."""
    set_implementation(layer, implementation)
    layer.zero_grad()
    x = x.clone().requires_grad_()
    torch.manual_seed(seed)
    out = layer(x, lengths)
    (out * weights).sum().backward()
    return out.detach(), x.grad, {name: p.grad.clone() for name, p in layer.named_parameters()}


@pytest.mark.parametrize("bidirectional", [False, True], ids=["uni", "bi"])
@pytest.mark.parametrize("unit, options", BASELINES, ids=IDS)
def test_the_configs_configuration_equals_the_reference(unit, options, bidirectional, backend):
    """Batch norm on the projections and dropout 0.2 in training mode, a padded batch, float64: the
    same dropout mask (fixed seed) gives the reference loop's outputs and gradients."""
    torch.manual_seed(0)
    layer = models.build(unit, 3, 6, bidirectional=bidirectional, dropout=0.2, norm="batch", **options).double()
    randomise_(layer, seed=1).train()
    generator = torch.Generator().manual_seed(2)
    lengths = torch.tensor([9, 4, 9, 1])
    x = torch.randn(4, 9, 3, generator=generator, dtype=torch.float64)
    weights = torch.randn(4, 9, layer.output_size, generator=generator, dtype=torch.float64)
    state = {k: v.clone() for k, v in layer.state_dict().items()}
    reference = _train_step(layer, "reference", x, lengths, weights, seed=5)
    layer.load_state_dict(state)  # the batch norm's running statistics as before
    fast = _train_step(layer, "fast", x, lengths, weights, seed=5)
    torch.testing.assert_close(fast[0], reference[0], rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(fast[1], reference[1], rtol=1e-9, atol=1e-9)
    for name in reference[2]:
        torch.testing.assert_close(fast[2][name], reference[2][name], rtol=1e-9, atol=1e-9, msg=name)


@pytest.mark.parametrize("kind", ["gru", "lstm"])
def test_gradients_agree_with_torch(kind, backend):
    """The fast path with torch.nn's weights: outputs and the gradients of the input and of every weight
    and bias (``bias_hh`` is the cell's recurrent bias) equal torch.nn's, bidirectional, padded."""
    torch.manual_seed(0)
    reference = {"gru": torch.nn.GRU, "lstm": torch.nn.LSTM}[kind](3, 5, batch_first=True, bidirectional=True).double()
    ours = models.build(kind, 3, 5, bidirectional=True).double()
    copy_torch_rnn_weights_(ours, reference)
    directions = ["", "_reverse"]
    x, lengths = torch.randn(3, 7, 3, dtype=torch.float64), torch.tensor([7, 4, 2])
    upstream = torch.randn(3, 7, 10, dtype=torch.float64) * (torch.arange(7) < lengths[:, None])[..., None]
    x1, x2 = x.clone().requires_grad_(), x.clone().requires_grad_()
    packed = torch.nn.utils.rnn.pack_padded_sequence(x1, lengths, batch_first=True, enforce_sorted=False)
    expected, _ = torch.nn.utils.rnn.pad_packed_sequence(reference(packed)[0], batch_first=True, total_length=7)
    (expected * upstream).sum().backward()
    got = set_implementation(ours, "fast")(x2, lengths)
    (got * upstream).sum().backward()
    torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(x2.grad, x1.grad, rtol=1e-10, atol=1e-10)
    for cell, d in zip(ours.cells, directions):
        torch.testing.assert_close(cell.recurrent.weight.grad, getattr(reference, f"weight_hh_l0{d}").grad)
        torch.testing.assert_close(cell.recurrent.bias.grad, getattr(reference, f"bias_hh_l0{d}").grad)
    torch.testing.assert_close(ours.proj.weight.grad,
                               torch.cat([getattr(reference, f"weight_ih_l0{d}").grad for d in directions]))
    torch.testing.assert_close(ours.proj.bias.grad,
                               torch.cat([getattr(reference, f"bias_ih_l0{d}").grad for d in directions]))


@pytest.mark.parametrize("activation", ["sigmoid", "softplus"])
def test_rnn_activations_without_a_fused_step_run_the_reference(activation):
    layer = models.build("rnn", 3, 4, activation=activation)
    assert layer.cells[0].fast_forward(torch.zeros(1, 2, 4), torch.tensor([2])) is None
    x = torch.randn(2, 5, 3)
    expected = set_implementation(layer, "reference")(x, [5, 3])
    torch.testing.assert_close(set_implementation(layer, "fast")(x, [5, 3]), expected, rtol=0, atol=0)


def test_the_kernels_know_units_by_name_only(monkeypatch):
    monkeypatch.setenv("BRU_KALDI_NATIVE", "1")
    proj, weight, h0 = torch.zeros(2, 1, 4), torch.zeros(4, 2), torch.zeros(1, 2)
    with pytest.raises(RuntimeError, match="no fused kernel for unit 'rnn'"):
        GatedRecurrence.apply("rnn", proj, weight, None, h0)
    with pytest.raises(RuntimeError, match="expected 4 gates of 2 units"):
        GatedRecurrence.apply("lstm", proj[..., :2].contiguous(), weight[:2], None, h0)

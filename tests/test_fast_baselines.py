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


def _padded_batch(layer):
    """A float64 batch of 4 sequences of 9, 4, 9 and 1 frames of 3 features, and weights for a scalar loss
    on the layer's outputs."""
    generator = torch.Generator().manual_seed(2)
    x = torch.randn(4, 9, 3, generator=generator, dtype=torch.float64)
    weights = torch.randn(4, 9, layer.output_size, generator=generator, dtype=torch.float64)
    return torch.tensor([9, 4, 9, 1]), x, weights


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
    lengths, x, weights = _padded_batch(layer)
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


def test_a_malformed_kernel_call_raises_an_error_that_gives_the_sizes(monkeypatch):
    """Each check of the C++ kernels whose message carries numbers raises a RuntimeError with them. (On one
    machine, formatting an integer into such a message crashed the process instead.)"""
    monkeypatch.setenv("BRU_KALDI_NATIVE", "1")
    ops, empty = native.native_ops(torch.zeros(1)), torch.empty(0)
    proj, weight_t, h0 = torch.zeros(2, 1, 8), torch.zeros(2, 8), torch.zeros(1, 2)  # LSTM: 4 gates of 2 units
    calls = {
        "bias must be empty or of width 8": lambda: ops.gated_forward("lstm", proj, weight_t, torch.zeros(3), h0,
                                                                       empty, False),
        r"the candidate mask must be empty or \(B, H\) = \(1, 2\)": lambda: ops.gated_forward(
            "lstm", proj, weight_t, empty, h0, torch.ones(1, 3), False),
        "gated_backward: expected 3 gates of 2 units": lambda: ops.gated_backward(
            "gru", empty, empty, torch.zeros(2, 1, 2), h0, empty, torch.zeros(2, 1, 2), torch.zeros(8, 2), False),
        r"kept must be \(T, B, 4 H\)": lambda: ops.gated_backward(
            "gru", torch.zeros(1), empty, torch.zeros(2, 1, 2), h0, empty, torch.zeros(2, 1, 2), torch.zeros(6, 2),
            False),
    }
    for message, call in calls.items():
        with pytest.raises(RuntimeError, match=message):
            call()


# pytorch-kaldi's inner dropout (models.gated.InnerDropout): the cells that mix it in, by the step name
# their fast path passes to the kernels.
INNER = [("ligru", {}, "ligru"), ("gru", {}, "gru"), ("lstm", {}, "lstm"), ("rnn", {}, "rnn_tanh"),
         ("rnn", {"activation": "relu"}, "rnn_relu")]
INNER_IDS = ["ligru", "gru", "lstm", "rnn", "rnn-relu"]


class _CountingRecurrence:
    """Stands in for GatedRecurrence in models.fast.paths: records the step name and mask of each call."""

    def __init__(self):
        self.calls = []

    def apply(self, kind, proj, weight, bias, h0, mask=None, grad_mode=True):
        self.calls.append((kind, None if mask is None else mask.detach().clone()))
        return GatedRecurrence.apply(kind, proj, weight, bias, h0, mask, grad_mode)


def _inner_layer(unit, options, p=0.3, norm="batch", hidden=6):
    torch.manual_seed(0)
    layer = models.build(unit, 3, hidden, bidirectional=True, norm=norm, **options).double()
    for cell in layer.cells:
        cell.inner_dropout = p
    return randomise_(layer, seed=1)


@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
@pytest.mark.parametrize("unit, options, kind", INNER, ids=INNER_IDS)
def test_inner_dropout_runs_the_fast_path_and_equals_the_reference(unit, options, kind, training, backend, monkeypatch):
    """With inner dropout (0/1 mask per sequence in training, 1 - p in evaluation), bidirectional, padded,
    float64: the fast path is the one taken (each direction calls the fused recurrence with the cell's
    mask, the reference loop never runs), and for the same seed its outputs and gradients are the reference
    loop's."""
    layer = _inner_layer(unit, options).train(training)
    lengths, x, weights = _padded_batch(layer)
    state = {k: v.clone() for k, v in layer.state_dict().items()}
    reference = _train_step(layer, "reference", x, lengths, weights, seed=5)
    layer.load_state_dict(state)
    counting = _CountingRecurrence()
    monkeypatch.setattr("models.fast.paths.GatedRecurrence", counting)
    for cell in layer.cells:
        monkeypatch.setattr(cell, "reference_forward", lambda *a: pytest.fail("the reference loop ran"))
    fast = _train_step(layer, "fast", x, lengths, weights, seed=5)
    assert [kind for kind, _ in counting.calls] == [kind, kind]
    for _, mask in counting.calls:
        assert mask is not None and mask.shape == (4, 6)
        if training:
            assert set(mask.unique().tolist()) == {0.0, 1.0}, "a 0/1 mask, not rescaled"
        else:
            assert torch.all(mask == 0.7)
    torch.testing.assert_close(fast[0], reference[0], rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(fast[1], reference[1], rtol=1e-9, atol=1e-9)
    for name in reference[2]:
        torch.testing.assert_close(fast[2][name], reference[2][name], rtol=1e-9, atol=1e-9, msg=name)
    # the mask is at work: without it the same weights and input give another output
    monkeypatch.undo()
    for cell in layer.cells:
        cell.inner_dropout = 0.0
    layer.load_state_dict(state)
    assert (_train_step(layer, "fast", x, lengths, weights, seed=5)[0] - reference[0]).abs().max() > 1e-3


@pytest.mark.parametrize("unit, options, kind", INNER, ids=INNER_IDS)
def test_inner_dropout_fast_path_gradcheck(unit, options, kind, backend):
    """Finite differences through the masked backward passes, training mode (the seed fixes the mask for
    every evaluation), bidirectional and padded, T = 1 included."""
    layer = _inner_layer(unit, options, p=0.4, norm=None, hidden=3).train()
    names = [name for name, _ in layer.named_parameters()]
    params = tuple(p.detach().clone().requires_grad_() for p in layer.parameters())
    for T, lengths in ((5, torch.tensor([5, 2, 4])), (1, torch.tensor([1, 1, 1]))):
        x = torch.randn(3, T, 3, dtype=torch.float64, requires_grad=True)

        def run(x, *params):
            torch.manual_seed(11)  # the same mask at every evaluation
            return torch.func.functional_call(layer, dict(zip(names, params)), (x, lengths))

        torch.manual_seed(11)
        mask = layer.cells[0].candidate_mask(layer.cells[0].initial_state(torch.zeros(3, 1, dtype=torch.float64)))
        assert mask.shape == (3, 3) and 0 < mask.sum() < mask.numel(), "some units dropped, some kept"
        assert torch.autograd.gradcheck(run, (x, *params), eps=1e-6, atol=1e-6, rtol=1e-4)


def test_a_mask_for_a_unit_without_candidate_is_refused(backend):
    proj, weight, h0, mask = torch.zeros(2, 1, 4), torch.zeros(4, 2), torch.zeros(1, 2), torch.ones(1, 2)
    error = RuntimeError if backend == "native" else ValueError
    with pytest.raises(error, match="no candidate to mask"):
        GatedRecurrence.apply("mgu", proj, weight, None, h0, mask)

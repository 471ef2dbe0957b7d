"""The fast paths (models/fast_*.py) against the reference loop (`Cell.reference_forward`), issue 7.

Outputs, posteriors and the gradients of the input and of every parameter must agree for every
accelerated unit and option, both directions, ragged lengths with garbage in the padding, float64
(to 1e-8) and float32 (to 1e-5), relative to the values' scale.
"""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import models
from models.recurrent import set_implementation
from tests.unit_variants import make_layer, variant_id

FAST_VARIANTS = [
    ("bru", {}),
    ("libru", {}),
    ("ligru", {}),
    ("lbru", {}),
    ("lbru", {"backward": "layer"}),
    ("lbru", {"input_gate": False}),
    ("lbru", {"input_gate": False, "backward": "layer"}),
    ("ubru", {}),
    ("ubru", {"backward": "kalman"}),
    ("ubru", {"backward": "hmm"}),
]
CASES = [(u, o, bi, dt) for u, o in FAST_VARIANTS for bi in (False, True) for dt in (torch.float64, torch.float32)]


def _case_id(case):
    unit, options, bidirectional, dtype = case
    return variant_id((unit, options)) + ("-bi" if bidirectional else "") + ("-f64" if dtype == torch.float64 else "-f32")


def _run(layer, implementation, x, lengths, weights):
    """Output, posteriors, and the gradients of sum(weights * output) for x and every parameter."""
    set_implementation(layer, implementation)
    layer.zero_grad()
    x = x.clone().requires_grad_()
    out = layer(x, lengths)
    (out * weights).sum().backward()
    probs = layer.posteriors(x.detach(), lengths) if layer.cells[0].has_posteriors else None
    grads = {name: p.grad.clone() for name, p in layer.named_parameters() if p.grad is not None}
    return out.detach(), probs, x.grad, grads


def _assert_close(got, expected, dtype, what):
    # Relative to the size of the values. float64 is not held to rounding alone: the reference's softplus
    # switches to the identity above 20 (an error of e^-20 = 2e-9), the fast paths use exact derivatives.
    tolerance = 1e-8 if dtype == torch.float64 else 1e-5
    scale = max(float(expected.detach().abs().max()), 1.0)
    torch.testing.assert_close(got, expected, rtol=tolerance, atol=tolerance * scale, msg=lambda m: f"{what}: {m}")


@pytest.mark.parametrize("unit, options, bidirectional, dtype", CASES, ids=[_case_id(c) for c in CASES])
def test_fast_path_equals_reference(unit, options, bidirectional, dtype):
    layer = make_layer(unit, options, input_size=3, hidden_size=5, bidirectional=bidirectional, dtype=dtype, seed=3)
    assert layer.cells[0].fast_forward(torch.zeros(1, 2, layer.proj.out_features // layer.num_directions, dtype=dtype),
                                       torch.tensor([2])) is not None, "this variant should have a fast path"
    lengths = torch.tensor([11, 6, 1, 9])
    generator = torch.Generator().manual_seed(7)
    x = torch.randn(4, 11, 3, generator=generator, dtype=dtype) * 2
    for i, n in enumerate(lengths.tolist()):
        x[i, n:] = 1e3 * torch.randn(11 - n, 3, generator=generator, dtype=dtype)  # garbage padding
    weights = torch.randn(4, 11, layer.output_size, generator=generator, dtype=dtype)
    reference = _run(layer, "reference", x, lengths, weights)
    fast = _run(layer, "fast", x, lengths, weights)
    _assert_close(fast[0], reference[0], dtype, "output")
    if reference[1] is not None:
        _assert_close(fast[1], reference[1], dtype, "posteriors")
    _assert_close(fast[2], reference[2], dtype, "input gradient")
    assert fast[3].keys() == reference[3].keys()
    for name in reference[3]:
        _assert_close(fast[3][name], reference[3][name], dtype, f"gradient of {name}")


@pytest.mark.parametrize("unit, options", FAST_VARIANTS, ids=[variant_id(v) for v in FAST_VARIANTS])
def test_fast_path_gradcheck_and_single_frame(unit, options):
    """Finite differences through the hand-written backward passes, including T = 1 sequences."""
    layer = make_layer(unit, options, input_size=2, hidden_size=3, bidirectional=True, dtype=torch.float64)
    names = [name for name, _ in layer.named_parameters()]
    params = tuple(p.detach().clone().requires_grad_() for p in layer.parameters())
    for T, lengths in ((4, torch.tensor([4, 2])), (1, torch.tensor([1, 1]))):
        x = torch.randn(2, T, 2, dtype=torch.float64, requires_grad=True)

        def run(x, *params):
            return torch.func.functional_call(layer, dict(zip(names, params)), (x, lengths))

        assert torch.autograd.gradcheck(run, (x, *params), eps=1e-6, atol=1e-6, rtol=1e-4)


@pytest.mark.parametrize(
    "unit, options",
    [("bru", {"form": "prob"}), ("libru", {"form": "prob"}), ("gru", {}), ("lstm", {}), ("mgu", {}), ("rnn", {}),
     ("ubru_tpami", {})],
)
def test_units_without_fast_path_fall_back_to_the_reference(unit, options):
    layer = make_layer(unit, options)
    assert layer.cells[0].fast_forward(torch.zeros(1, 2, layer.proj.out_features), torch.tensor([2])) is None
    x = torch.randn(2, 5, 3)
    expected = set_implementation(layer, "reference")(x, [5, 3])
    torch.testing.assert_close(set_implementation(layer, "fast")(x, [5, 3]), expected, rtol=0, atol=0)


def test_set_implementation_rejects_unknown_names():
    with pytest.raises(ValueError, match="implementation must be one of"):
        set_implementation(models.build("libru", 3, 4), "cuda")


class _CountAllocations(TorchDispatchMode):
    """Counts the ops that return a tensor with new storage (not a view, not an out= or in-place op)."""

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        result = func(*args, **kwargs)
        inputs = {t.untyped_storage().data_ptr() for t in torch.utils._pytree.tree_leaves((args, kwargs))
                  if isinstance(t, torch.Tensor)}
        outputs = [t for t in torch.utils._pytree.tree_leaves(result) if isinstance(t, torch.Tensor)]
        self.count += sum(t.untyped_storage().data_ptr() not in inputs and t.numel() > 0 for t in outputs)
        return result


@pytest.mark.parametrize("unit, options", FAST_VARIANTS, ids=[variant_id(v) for v in FAST_VARIANTS])
def test_inference_allocates_nothing_per_step(unit, options):
    """Without gradients the number of allocations does not grow with the number of frames."""
    layer = make_layer(unit, options, bidirectional=True)
    counts = []
    for T in (4, 24):
        x = torch.randn(2, T, 3)
        with torch.no_grad(), _CountAllocations() as mode:
            layer(x, [T, T - 1])
        counts.append(mode.count)
    assert counts[0] == counts[1], counts


def _saved_bytes(layer, x, lengths):
    """Bytes autograd keeps for backward (storages counted once)."""
    storages = {}

    def pack(t):
        storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        layer(x.requires_grad_(), lengths)
    return sum(storages.values())


@pytest.mark.parametrize("unit, options", FAST_VARIANTS, ids=[variant_id(v) for v in FAST_VARIANTS])
def test_training_memory_no_larger_than_the_reference(unit, options):
    layer = make_layer(unit, options, input_size=8, hidden_size=16, bidirectional=True)
    x, lengths = torch.randn(4, 30, 8), [30, 20, 30, 5]
    fast = _saved_bytes(set_implementation(layer, "fast"), x.clone(), lengths)
    reference = _saved_bytes(set_implementation(layer, "reference"), x.clone(), lengths)
    assert fast <= reference, (fast, reference)

"""Properties every unit must have: gradients, padding invariance, directions, stability, errors."""

import pytest
import torch
from torch.func import functional_call

import models
from tests.unit_variants import VARIANTS, directions, make_layer, variant_id

ALL = [(unit, options, bidir) for unit, options in VARIANTS for bidir in directions(unit)]


@pytest.mark.parametrize("unit, options, bidirectional", ALL, ids=[variant_id((u, o)) + ("-bi" if b else "") for u, o, b in ALL])
def test_gradcheck_float64(unit, options, bidirectional):
    """Gradients of the output with respect to the input and every parameter, by finite differences."""
    layer = make_layer(unit, options, input_size=2, hidden_size=3, bidirectional=bidirectional, dtype=torch.float64)
    names = [name for name, _ in layer.named_parameters()]
    params = tuple(p.detach().clone().requires_grad_() for p in layer.parameters())
    x = torch.randn(2, 5, 2, dtype=torch.float64, requires_grad=True)
    lengths = torch.tensor([5, 3])

    def run(x, *params):
        return functional_call(layer, dict(zip(names, params)), (x, lengths))

    assert torch.autograd.gradcheck(run, (x, *params), eps=1e-6, atol=1e-6, rtol=1e-4)


@pytest.mark.parametrize("unit, options, bidirectional", ALL, ids=[variant_id((u, o)) + ("-bi" if b else "") for u, o, b in ALL])
def test_padding_invariance(unit, options, bidirectional):
    """A sequence inside a padded batch gives what it gives alone, whatever the padding holds."""
    layer = make_layer(unit, options, input_size=3, hidden_size=4, bidirectional=bidirectional)
    lengths = [9, 5, 1, 7]
    batch = torch.randn(len(lengths), max(lengths), 3)
    for i, n in enumerate(lengths):
        batch[i, n:] = 1e3 * torch.randn(max(lengths) - n, 3)  # garbage in the padding on purpose
    out = layer(batch, lengths)
    for i, n in enumerate(lengths):
        alone = layer(batch[i : i + 1, :n], [n])[0]
        torch.testing.assert_close(out[i, :n], alone, rtol=1e-6, atol=1e-6)  # float32 rounding of batched matmuls
        assert (out[i, n:] == 0).all()


RECURRENT = [v for v in VARIANTS if v[0] != "mlp"]


@pytest.mark.parametrize("unit, options", RECURRENT, ids=[variant_id(v) for v in RECURRENT])
def test_reverse_direction_reads_each_sequence_backwards(unit, options):
    """The second direction of a bidirectional layer equals a unidirectional layer with its weights on the reversed sequence."""
    bi = make_layer(unit, options, bidirectional=True, dtype=torch.float64, seed=4)
    uni = models.build(unit, 3, 4, **options).double().eval()
    state = {}
    for name, value in bi.state_dict().items():
        if name.startswith("proj.") or name.startswith("norm."):
            state[name] = value.chunk(2, dim=0)[1]
        elif name.startswith("cells.1."):
            state["cells.0." + name[len("cells.1.") :]] = value
        elif name.startswith("rnn.") and name.endswith("_reverse"):
            state[name[: -len("_reverse")]] = value
    uni.load_state_dict(state, strict=True)
    x, n = torch.randn(1, 8, 3, dtype=torch.float64), 6
    backwards = uni(x[:, :n].flip(1), [n]).flip(1)
    torch.testing.assert_close(bi(x, [n])[0, :n, 4:], backwards[0])


def _reverse_each(x, lengths):
    """Each sequence of ``x`` ``(B, T, ...)`` reversed within its length, padding in place: written out
    per sequence, apart from the library's index arithmetic."""
    rows = [torch.cat([x[b, :n].flip(0), x[b, n:]]) for b, n in enumerate(lengths)]
    return torch.stack(rows)


OURS = [v for v in RECURRENT if not v[0].startswith("cudnn_")]  # layers with a projection of their own


@pytest.mark.parametrize("input_size", [3, 16], ids=["narrow-input", "wide-input"])
@pytest.mark.parametrize("unit, options", OURS, ids=[variant_id(v) for v in OURS])
def test_bidirectional_training_layer_equals_two_layers(unit, options, input_size):
    """In training, with batch norm and a padded batch, a bidirectional layer equals two unidirectional
    layers with its weights, the second on each sequence reversed: outputs and input gradients. A
    narrow input (F < G*H) takes one product per direction, a wide one a product for both; the batch
    norm's statistics are per direction over real frames either way."""
    bi = make_layer(unit, dict(options, norm="batch"), input_size=input_size, hidden_size=3, bidirectional=True,
                    dtype=torch.float64, seed=5).train()
    halves = [models.build(unit, input_size, 3, norm="batch", **options).double().train() for _ in range(2)]
    for d, half in enumerate(halves):
        state = {}
        for name, value in bi.state_dict().items():
            if name.startswith("proj.") or name.startswith("norm."):
                state[name] = value.chunk(2, dim=0)[d]
            elif name.startswith(f"cells.{d}."):
                state["cells.0." + name[len(f"cells.{d}."):]] = value
        half.load_state_dict(state, strict=True)
    lengths = [7, 5, 2]
    x = torch.randn(3, 7, input_size, dtype=torch.float64, requires_grad=True)
    upstream = torch.randn(3, 7, 6, dtype=torch.float64)
    out = bi(x, lengths)
    expected = torch.cat([halves[0](x, lengths), _reverse_each(halves[1](_reverse_each(x, lengths), lengths), lengths)], -1)
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(torch.autograd.grad(out, x, upstream)[0], torch.autograd.grad(expected, x, upstream)[0])


def test_merge_directions_equals_reversal_then_concatenation():
    """The one-pass merge of a bidirectional layer's outputs, forward and backward, against the two steps it fuses."""
    from models.recurrent import merge_directions, reverse_padded

    T, B, H, lengths = 7, 3, 2, torch.tensor([7, 4, 1])
    forward_out = torch.randn(T, B, H, dtype=torch.float64, requires_grad=True)
    backward_out = torch.randn(T, B, H, dtype=torch.float64, requires_grad=True)
    upstream = torch.randn(T, B, 2 * H, dtype=torch.float64)
    merged = merge_directions(forward_out, backward_out, lengths)
    expected = torch.cat([forward_out, backward_out.flip(0)], -1)  # sequence 0 fills T: a plain flip
    torch.testing.assert_close(merged[:, 0], expected[:, 0], rtol=0, atol=0)
    expected = torch.cat([forward_out, reverse_padded(backward_out, lengths, time_dim=0)], -1)
    torch.testing.assert_close(merged, expected, rtol=0, atol=0)
    assert merged[0, 1, H:].equal(backward_out[3, 1]) and merged[5, 1, H:].equal(backward_out[5, 1])  # padding stays
    grads = torch.autograd.grad(merged, (forward_out, backward_out), upstream)
    torch.testing.assert_close(grads, torch.autograd.grad(expected, (forward_out, backward_out), upstream), rtol=0, atol=0)
    assert all(g.is_contiguous() for g in grads)  # the C++ kernels take them as they are


def _streams(layer) -> bool:
    """Whether a layer runs chunk by chunk: no backward recursion (a vendor layer has none)."""
    return all(cell.causal for cell in getattr(layer, "cells", []))


@pytest.mark.parametrize("unit, options", VARIANTS, ids=[variant_id(v) for v in VARIANTS])
def test_a_layer_run_chunk_by_chunk_gives_its_whole_sequence_output(unit, options):
    """``stream`` carries each direction's recurrent state from chunk to chunk: the chunks' outputs put
    together are the whole sequences' (the fast path where the unit has one); a unit with a backward
    recursion, and any bidirectional layer, is refused with a ValueError."""
    layer = make_layer(unit, options, input_size=5, hidden_size=6, seed=3)
    x = torch.randn(2, 11, 5, generator=torch.Generator().manual_seed(4))
    if not _streams(layer):
        with pytest.raises(ValueError, match="cannot run chunk by chunk"):
            layer.stream(x[:, :3])
        return
    whole = layer(x, torch.tensor([11, 11]))
    state, pieces = None, []
    for start, stop in ((0, 1), (1, 5), (5, 7), (7, 11)):
        out, state = layer.stream(x[:, start:stop], state)
        pieces.append(out)
    torch.testing.assert_close(torch.cat(pieces, dim=1), whole, atol=2e-5, rtol=1e-4)
    if unit != "mlp":
        with pytest.raises(ValueError, match="bidirectional|unidirectional"):
            make_layer(unit, options, input_size=5, hidden_size=6, bidirectional=True).stream(x)
    with pytest.raises(ValueError, match="evaluation"):
        layer.train().stream(x)


def test_a_stack_with_norms_streams_on_its_running_statistics():
    """Batch norm of the input and of the projections, in evaluation, uses its running statistics: frame
    by frame, so a stack streams to the output it gives whole."""
    stack = models.build_stack("libru", 5, [6, 4], norm="batch", input_norm="layer+batch")
    for module in stack.modules():  # statistics away from their initial 0 and 1, as after training
        if hasattr(module, "running_mean"):
            module.running_mean.uniform_(-1, 1)
            module.running_var.uniform_(0.5, 2)
    stack.eval()
    x = torch.randn(1, 9, 5)
    first, states = stack.stream(x[:, :4])
    second, _ = stack.stream(x[:, 4:], states)
    torch.testing.assert_close(torch.cat([first, second], dim=1), stack(x, [9]), atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("unit, options", VARIANTS, ids=[variant_id(v) for v in VARIANTS])
def test_long_sequences_with_large_preactivations_stay_finite(unit, options):
    """T = 2000 and pre-activations up to |50|: no NaN or Inf in outputs or gradients."""
    torch.manual_seed(0)
    layer = models.build(unit, 4, 8, **options)
    with torch.no_grad():
        for name, p in layer.named_parameters():
            if name in ("proj.weight", "rnn.weight_ih_l0"):
                p.copy_(torch.nn.functional.normalize(torch.randn_like(p), dim=1))  # |W x| <= |x|
    x = (torch.rand(2, 2000, 4) * 2 - 1) * 25  # |x| up to 50
    x.requires_grad_()
    out = layer(x, [2000, 1500])
    assert torch.isfinite(out).all()
    out.square().mean().backward()
    assert torch.isfinite(x.grad).all()
    for name, p in layer.named_parameters():
        assert torch.isfinite(p.grad).all(), name


@pytest.mark.parametrize("unit", models.BAYESIAN_UNITS)
def test_posteriors_are_probabilities(unit):
    layer = make_layer(unit, {}, bidirectional=True)
    p = layer.posteriors(torch.randn(2, 6, 3) * 4, [6, 4])
    assert p.shape == (2, 6, 8)
    assert ((p >= 0) & (p <= 1)).all()


def test_posteriors_refused_for_units_without_probabilities():
    with pytest.raises(TypeError, match="no probabilities"):
        models.build("gru", 3, 4).posteriors(torch.randn(1, 2, 3), [2])


def test_libru_and_bru_output_log_probabilities():
    layer = make_layer("libru", {})
    x = torch.randn(2, 6, 3)
    torch.testing.assert_close(layer(x, [6, 6]).exp(), layer.posteriors(x, [6, 6]))


def test_dropout_is_inverted_and_shared_over_time():
    torch.manual_seed(0)
    layer = models.build("mlp", 50, 8, dropout=0.5)
    with torch.no_grad():
        layer.proj.weight.copy_(torch.eye(8, 50))
        layer.proj.bias.zero_()
    layer.cells[0].activation = lambda a: a  # see the dropped input directly
    x = torch.ones(4, 10, 50)
    layer.train()
    out = layer(x, [10] * 4)
    assert set(out.unique().tolist()) <= {0.0, 2.0}  # scaled by 1 / (1 - p)
    assert (out == out[:, :1]).all()  # the same mask at every frame of a sequence
    assert not (out[0] == out[1]).all() or not (out[1] == out[2]).all()  # masks differ between sequences
    layer.eval()
    assert (layer(x, [10] * 4) == 1).all()


def test_batch_norm_statistics_ignore_padding():
    torch.manual_seed(0)
    layer = models.build("ligru", 3, 4, norm="batch")
    real = torch.randn(1, 5, 3)
    padded = torch.cat([real, torch.full((1, 20, 3), 1e3)], dim=1)
    layer.train()
    a = layer(real, [5])
    running = layer.norm.running_mean.clone()
    layer.norm.running_mean.zero_()
    layer.norm.running_var.fill_(1)
    b = layer(padded, [5])[:, :5]
    torch.testing.assert_close(a, b)
    torch.testing.assert_close(layer.norm.running_mean, running)


@pytest.mark.parametrize("padded", [True, False])
@pytest.mark.parametrize("kernels", ["c++", "torch"])
def test_batch_norm_equals_gathered_frames_reference(padded, kernels, monkeypatch):
    """The batch norm's hand-written backward, both the C++ kernels and the torch version they fall back
    to, against autograd through the straightforward version (gather the real frames, their mean and
    biased variance, normalise every frame, zero the padded ones), and float64 gradcheck; in evaluation
    too, the padded frames come out as 0."""
    from models import norm as norm_module
    from models.norm import MaskedBatchNorm

    if kernels == "torch":
        monkeypatch.setattr(norm_module, "native_ops", lambda example: None)
    else:
        assert norm_module.native_ops(torch.zeros(1)) is not None

    torch.manual_seed(0)
    norm = MaskedBatchNorm(3).double().train()
    with torch.no_grad():
        norm.weight.uniform_(0.5, 2.0), norm.bias.normal_()
    x = (3 * torch.randn(4, 6, 3, dtype=torch.float64) + 1).requires_grad_()
    mask = torch.arange(6) < torch.tensor([6, 2, 5, 1])[:, None] if padded else None
    upstream = torch.randn(4, 6, 3, dtype=torch.float64)

    def straightforward(x, weight, bias):
        frames = x[mask] if padded else x.flatten(0, 1)
        mean, var = frames.mean(0), frames.var(0, unbiased=False)
        y = (x - mean) / torch.sqrt(var + norm.eps) * weight + bias
        return torch.where(mask[..., None], y, 0.0) if padded else y

    params = (x, norm.weight, norm.bias)
    expected = straightforward(*params)
    got = norm(x, mask)
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(torch.autograd.grad(got, params, upstream),
                               torch.autograd.grad(expected, params, upstream), rtol=1e-10, atol=1e-12)
    real = x[mask] if padded else x.flatten(0, 1)
    torch.testing.assert_close(norm.running_mean, 0.1 * real.mean(0).detach())  # from zeros, momentum 0.1
    torch.testing.assert_close(norm.running_var, 0.9 + 0.1 * real.var(0).detach())  # unbiased, from ones

    def run(x, weight, bias):
        return torch.func.functional_call(norm, {"weight": weight, "bias": bias}, (x, mask))

    assert torch.autograd.gradcheck(run, params, eps=1e-6, atol=1e-7, rtol=1e-5)
    with torch.no_grad():
        evaluated = norm.eval()(x, mask)
    scale = norm.weight / torch.sqrt(norm.running_var + norm.eps)
    y = (x - norm.running_mean) * scale + norm.bias
    torch.testing.assert_close(evaluated, torch.where(mask[..., None], y, 0.0) if padded else y)


def test_batch_norm_float32_kernels_keep_precision_far_from_zero():
    """float32 frames whose mean is 300 standard deviations from zero, 20 000 of them: the C++ kernels
    (per-column sums in double about a shift) stay within float32 rounding of the float64 statistics;
    squares of such values summed in float32 would lose three digits of the variance."""
    from models.norm import MaskedBatchNorm

    torch.manual_seed(0)
    x64 = 300.0 + torch.randn(20000, 8, dtype=torch.float64)
    mask = torch.rand(20000) < 0.9
    norm = MaskedBatchNorm(8).train()
    y = norm(x64.float().requires_grad_(), mask)
    real = x64[mask]
    expected = (x64 - real.mean(0)) / torch.sqrt(real.var(0, unbiased=False) + norm.eps)
    expected[~mask] = 0.0  # padding
    torch.testing.assert_close(y.double(), expected, atol=2e-3, rtol=0)  # |x| ~ 300: a float32 ulp is 3e-5
    torch.testing.assert_close(norm.running_var.double(), 0.9 + 0.1 * real.var(0), rtol=1e-4, atol=0)


@pytest.mark.parametrize("norm", ["batch", "layer"])
def test_norms_run_in_both_modes(norm):
    layer = models.build("libru", 3, 4, norm=norm, bidirectional=True)
    x = torch.randn(2, 5, 3)
    assert layer.train()(x, [5, 3]).shape == (2, 5, 8)
    assert torch.isfinite(layer.eval()(x, [5, 3])).all()


def test_recurrent_matrices_start_orthogonal():
    layer = models.build("libru", 3, 6)
    for block in layer.cells[0].recurrent.weight.split(6):
        torch.testing.assert_close(block @ block.T, torch.eye(6), atol=1e-5, rtol=0)


def test_stack_of_units_by_name():
    stack = models.build_stack(["ligru", "ligru", "ubru"], 40, [16, 16, 8], bidirectional=[True, True, False],
                               dropout=0.2, norm=["batch", "batch", None], options=[{}, {}, {"backward": "kalman"}])
    out = stack(torch.randn(3, 11, 40), torch.tensor([11, 8, 3]))
    assert out.shape == (3, 11, 8)
    assert stack.layers[2].cells[0].backward == "kalman"


# ----------------------------------------------------------------------------- bad input
@pytest.mark.parametrize(
    "x, lengths, message",
    [
        (torch.randn(5, 3), [5], r"shape \(batch, time, 3\)"),
        (torch.randn(2, 5, 4), [5, 5], "expected 3 input features"),
        (torch.randn(2, 5, 3), [5, 6], r"every length in \[1, 5\]"),
        (torch.randn(2, 5, 3), [5, 0], r"every length in \[1, 5\]"),
        (torch.randn(2, 5, 3), [5, -1], r"every length in \[1, 5\]"),
        (torch.randn(2, 5, 3), [5], r"lengths of shape \(2,\)"),
        (torch.randn(2, 5, 3), [5.0, 2.0], "integer lengths"),
    ],
)
@pytest.mark.parametrize("unit", ["libru", "cudnn_gru"])
def test_bad_input_raises_value_error(unit, x, lengths, message):
    with pytest.raises(ValueError, match=message):
        models.build(unit, 3, 4)(x, lengths)


@pytest.mark.parametrize(
    "unit, kwargs, message",
    [
        ("li_bru", {}, r"unknown unit 'li_bru' \(did you mean 'libru'\?\)"),
        ("ubru", {"backward": "kalmann"}, "backward must be one of"),
        ("ubru", {"backwards": "kalman"}, "did you mean 'backward'"),
        ("libru", {"norm": "group"}, "norm must be one of"),
        ("libru", {"dropout": 1.0}, r"dropout must be in \[0, 1\)"),
        ("cudnn_gru", {"norm": "batch"}, "norm must be None"),
        ("mlp", {"bidirectional": True}, "no direction"),
        ("bru", {"form": "logit"}, "form must be one of"),
        ("ubru", {"tau11": 1.0}, "tau11 must be a probability"),
    ],
)
def test_bad_configuration_raises_value_error(unit, kwargs, message):
    with pytest.raises(ValueError, match=message):
        models.build(unit, 3, 4, **kwargs)


def test_units_list_names_every_required_unit():
    required = {"bru", "libru", "ubru", "lbru", "ligru", "gru", "lstm", "mgu", "rnn", "mlp", "cudnn_gru", "cudnn_lstm"}
    assert required <= set(models.UNITS)
    assert all(name == name.lower() for name in models.UNITS)

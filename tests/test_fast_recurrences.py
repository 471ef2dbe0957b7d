"""The fast paths (models/fast/) against the reference loop (`Cell.reference_forward`).

Outputs, posteriors and the gradients of the input and of every parameter must agree for every
accelerated unit and option, both directions, ragged lengths with garbage in the padding, float64
(to 1e-8) and float32 (to 1e-5), relative to the values' scale; each for both time-loop backends,
the C++ kernels (models/fast/native.py, built here if need be: the tests require them) and the
TorchScript loops (what runs without a compiler, and on a GPU without Triton). Where torch sees a GPU,
the same tests run with everything on it, for the Triton kernels (backend ``cuda``) and the TorchScript
loops (``cuda-torchscript``). ``tests/test_triton_kernels.py`` runs the Triton kernels through Triton's
interpreter on the CPU.
"""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import models
from models.fast import native, triton_loops
from models.recurrent import set_implementation
from tests.unit_variants import VARIANTS, has_fast_path, make_layer, variant_id

FAST_VARIANTS = [v for v in VARIANTS if has_fast_path(*v)]
SLOW_VARIANTS = [v for v in VARIANTS if not has_fast_path(*v) and not v[0].startswith("cudnn_")]
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


BACKENDS = ["native", "torchscript"] + (["cuda", "cuda-torchscript"] if torch.cuda.is_available() else [])
# (BRU_KALDI_NATIVE, BRU_KALDI_TRITON) of each backend; "triton" (the GPU's kernels through Triton's
# interpreter) is tests/test_triton_kernels.py's: the interpreter is too slow for every test here
_SETTINGS = {"native": ("1", "0"), "torchscript": ("0", "0"), "triton": ("0", "interpret"), "cuda": ("auto", "1"),
             "cuda-torchscript": ("auto", "0")}


def device_of(backend: str) -> torch.device:
    return torch.device("cuda" if backend.startswith("cuda") else "cpu")


def use_backend(name: str, monkeypatch) -> str:
    """Set the environment of backend ``name`` for one test (see :func:`backend`) and check it is in force."""
    native_mode, triton_mode = _SETTINGS[name]
    monkeypatch.setenv("BRU_KALDI_NATIVE", native_mode)
    monkeypatch.setenv("BRU_KALDI_TRITON", triton_mode)
    example = torch.zeros(1, device=device_of(name))
    assert (native.native_ops(example) is not None) == (name == "native")
    assert (triton_loops.route(example) is not None) == (name in ("triton", "cuda"))
    return name


@pytest.fixture(params=BACKENDS)
def backend(request, monkeypatch):
    """The time-loop backend of the fast paths on the CPU: ``native`` (the C++ kernels, which must
    build) and ``torchscript`` (the TorchScript loops); where torch sees a GPU, with the layers and
    tensors on it: ``cuda`` (the Triton kernels, compiled, which must build) and ``cuda-torchscript``
    (the TorchScript loops, their fallback)."""
    return use_backend(request.param, monkeypatch)


def _compare(unit, options, bidirectional, dtype, hidden_size=5, T=11, lengths=(11, 6, 1, 9), device="cpu"):
    layer = make_layer(unit, options, input_size=3, hidden_size=hidden_size, bidirectional=bidirectional,
                       dtype=dtype, seed=3).to(device)
    assert layer.cells[0].fast_forward(torch.zeros(1, 2, layer.proj.out_features // layer.num_directions, dtype=dtype,
                                                   device=device),
                                       torch.tensor([2], device=device)) is not None, "this variant should have a fast path"
    lengths = torch.tensor(lengths)
    B = len(lengths)
    generator = torch.Generator().manual_seed(7)
    x = torch.randn(B, T, 3, generator=generator, dtype=dtype) * 2
    for i, n in enumerate(lengths.tolist()):
        x[i, n:] = 1e3 * torch.randn(T - n, 3, generator=generator, dtype=dtype)  # garbage padding
    weights = torch.randn(B, T, layer.output_size, generator=generator, dtype=dtype)
    x, weights, lengths = x.to(device), weights.to(device), lengths.to(device)
    reference = _run(layer, "reference", x, lengths, weights)
    fast = _run(layer, "fast", x, lengths, weights)
    _assert_close(fast[0], reference[0], dtype, "output")
    if reference[1] is not None:
        _assert_close(fast[1], reference[1], dtype, "posteriors")
    _assert_close(fast[2], reference[2], dtype, "input gradient")
    assert fast[3].keys() == reference[3].keys()
    for name in reference[3]:
        _assert_close(fast[3][name], reference[3][name], dtype, f"gradient of {name}")


@pytest.mark.parametrize("unit, options, bidirectional, dtype", CASES, ids=[_case_id(c) for c in CASES])
def test_fast_path_equals_reference(unit, options, bidirectional, dtype, backend):
    _compare(unit, options, bidirectional, dtype, device=device_of(backend))


@pytest.fixture
def two_threads(monkeypatch):
    """torch on two threads for one test (the C++ loops then split the units), restored after it."""
    monkeypatch.setattr(native, "_loaded", native._loaded)  # (the build stays cached)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(threads)


@pytest.mark.parametrize("unit, options", FAST_VARIANTS, ids=[variant_id(v) for v in FAST_VARIANTS])
def test_native_kernels_split_units_across_threads(unit, options, backend, two_threads):
    """H = 45 on two threads: the C++ loops give each thread a block of units (24 and 21, the second
    ending in a partial vector) and the elementwise scans split units the same way."""
    _compare(unit, options, True, torch.float64, hidden_size=45, T=7, lengths=(7, 3, 7), device=device_of(backend))


@pytest.mark.parametrize("unit, options", FAST_VARIANTS, ids=[variant_id(v) for v in FAST_VARIANTS])
def test_float32_products_of_several_panels_and_an_odd_batch(unit, options, backend, two_threads):
    """float32 on two threads, H = 45 and 6 sequences: the AVX2 build's own per-step product (panels of
    24 rows of the recurrent matrix, 4 sequences at a time) meets full panels, a partial last panel
    and a last block of 2 sequences, forward and in the backward pass's accumulating product."""
    _compare(unit, options, True, torch.float32, hidden_size=45, T=4, lengths=(4, 2, 4, 1, 3, 4),
             device=device_of(backend))


@pytest.mark.parametrize("unit, options", FAST_VARIANTS, ids=[variant_id(v) for v in FAST_VARIANTS])
def test_inference_under_no_grad_equals_reference(unit, options, backend):
    """Under ``torch.no_grad()`` the loops keep nothing for backward (their inference variants, which run
    for decoding and validation: the parameters still require gradients there), bidirectional, ragged,
    float64 and float32."""
    device = device_of(backend)
    for dtype in (torch.float64, torch.float32):
        layer = make_layer(unit, options, input_size=3, hidden_size=5, bidirectional=True, dtype=dtype,
                           seed=4).to(device)
        x = torch.randn(4, 7, 3, dtype=dtype, generator=torch.Generator().manual_seed(4)).to(device)
        lengths = torch.tensor([7, 3, 1, 6], device=device)
        with torch.no_grad():
            expected = set_implementation(layer, "reference")(x, lengths)
            got = set_implementation(layer, "fast")(x, lengths)
        _assert_close(got, expected, dtype, "output under no_grad")


@pytest.mark.parametrize("unit, options", FAST_VARIANTS, ids=[variant_id(v) for v in FAST_VARIANTS])
def test_fast_path_gradcheck_and_single_frame(unit, options, backend):
    """Finite differences through the hand-written backward passes, including T = 1 sequences."""
    device = device_of(backend)
    layer = make_layer(unit, options, input_size=2, hidden_size=3, bidirectional=True, dtype=torch.float64).to(device)
    names = [name for name, _ in layer.named_parameters()]
    params = tuple(p.detach().clone().requires_grad_() for p in layer.parameters())
    for T, lengths in ((4, torch.tensor([4, 2], device=device)), (1, torch.tensor([1, 1], device=device))):
        x = torch.randn(2, T, 2, dtype=torch.float64, device=device, requires_grad=True)

        def run(x, *params):
            return torch.func.functional_call(layer, dict(zip(names, params)), (x, lengths))

        assert torch.autograd.gradcheck(run, (x, *params), eps=1e-6, atol=1e-6, rtol=1e-4)


def test_the_fast_paths_cover_the_units_they_claim():
    """A fast path that stopped being taken would pass every test below by running the reference loop."""
    covered = {unit for unit, _ in FAST_VARIANTS}
    assert covered == set(models.fast.FAST), (covered, set(models.fast.FAST))
    assert ("lbru", {"input_gate": False, "backward": "layer"}) in FAST_VARIANTS
    assert ("ubru", {"backward": "hmm"}) in FAST_VARIANTS


@pytest.mark.parametrize("unit, options", SLOW_VARIANTS, ids=[variant_id(v) for v in SLOW_VARIANTS])
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


def _allocations(layer, T):
    x = torch.randn(2, T, 3, device=layer.proj.weight.device)
    with torch.no_grad(), _CountAllocations() as mode:
        layer(x, [T, T - 1])
    return mode.count


def _calls_inside_kernels(layer, T):
    """ATen ops run from inside the C++ kernels (``bru_kaldi::*``) in one forward without gradients:
    the profiler sees them, a dispatch mode sees only the kernel itself."""

    def inside_kernel(event):
        parent = event.cpu_parent
        while parent is not None and not parent.name.startswith("bru_kaldi::"):
            parent = parent.cpu_parent
        return parent is not None

    x = torch.randn(2, T, 3)
    with torch.no_grad(), torch.profiler.profile() as profile:
        layer(x, [T, T - 1])
    events = profile.events()
    assert any(event.name.startswith("bru_kaldi::") for event in events)
    return sum(inside_kernel(event) for event in events)


@pytest.mark.parametrize("unit, options", FAST_VARIANTS, ids=[variant_id(v) for v in FAST_VARIANTS])
def test_inference_allocates_nothing_per_step(unit, options, backend):
    """Without gradients the number of allocations does not grow with the number of frames. Inside the
    C++ kernels nothing of ATen runs per step at all (the products call BLAS directly)."""
    layer = set_implementation(make_layer(unit, options, bidirectional=True).to(device_of(backend)), "fast")
    _allocations(layer, 2)  # once before counting: the first call on a GPU also probes the scan kernels
    counts = [_allocations(layer, T) for T in (4, 24)]
    assert counts[0] == counts[1], counts
    if backend == "native":
        counts = [_calls_inside_kernels(layer, T) for T in (4, 24)]
        assert counts[0] == counts[1], counts
    reference = [_allocations(set_implementation(layer, "reference"), T) for T in (4, 24)]
    assert reference[1] > reference[0], reference  # the count does see per-step allocations


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
def test_training_memory_no_larger_than_the_reference(unit, options, backend):
    layer = make_layer(unit, options, input_size=8, hidden_size=16, bidirectional=True).to(device_of(backend))
    x, lengths = torch.randn(4, 30, 8, device=device_of(backend)), [30, 20, 30, 5]
    fast = _saved_bytes(set_implementation(layer, "fast"), x.clone(), lengths)
    reference = _saved_bytes(set_implementation(layer, "reference"), x.clone(), lengths)
    assert fast <= reference, (fast, reference)


def test_native_mode_auto_falls_back_with_a_warning(monkeypatch):
    """Where the extension cannot be built, ``auto`` warns once and runs TorchScript; ``1`` raises."""
    def broken(verbose=False):
        raise OSError("no compiler here")

    monkeypatch.setattr(native, "_loaded", {})
    monkeypatch.setattr(native, "load", broken)
    monkeypatch.setenv("BRU_KALDI_NATIVE", "1")
    with pytest.raises(RuntimeError, match="could not be built: no compiler here"):
        native.native_ops(torch.zeros(1))
    monkeypatch.setenv("BRU_KALDI_NATIVE", "auto")
    with pytest.warns(UserWarning, match="run as TorchScript loops"):
        assert native.native_ops(torch.zeros(1)) is None
    assert native.native_ops(torch.zeros(1)) is None  # no second attempt, no second warning
    layer = make_layer("libru", {})
    assert layer(torch.randn(2, 4, 3), [4, 2]).shape == (2, 4, layer.output_size)


def test_native_mode_rejects_unknown_values(monkeypatch):
    monkeypatch.setenv("BRU_KALDI_NATIVE", "yes")
    with pytest.raises(ValueError, match="BRU_KALDI_NATIVE must be one of"):
        native.native_ops(torch.zeros(1))


def test_native_kernels_serve_only_cpu_floating_point(monkeypatch):
    monkeypatch.setenv("BRU_KALDI_NATIVE", "1")
    assert native.native_ops(torch.zeros(1, dtype=torch.float16)) is None
    assert native.native_ops(torch.zeros(1, device="meta")) is None


def test_softplus_recurrence_runs_backwards_in_time(backend):
    """``reverse=True`` is the forward recursion on time-flipped inputs (the HMM pass uses it), and
    its hand-written gradient passes gradcheck."""
    from models.fast.scans import SoftplusRecurrence

    generator = torch.Generator().manual_seed(0)
    c, k, x0 = (torch.randn(*shape, generator=generator, dtype=torch.float64).to(device_of(backend)).requires_grad_()
                for shape in ((6, 2, 3), (2, 3), (2, 3)))
    backwards = SoftplusRecurrence.apply(c, k, x0, True)
    flipped = SoftplusRecurrence.apply(c.flip(0), k, x0).flip(0)
    torch.testing.assert_close(backwards, flipped, rtol=1e-12, atol=1e-12)
    assert torch.autograd.gradcheck(lambda *a: SoftplusRecurrence.apply(*a, True), (c, k, x0))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("width, bias", [(11, True), (8, False), (1, True)])
def test_aligned_products_equal_linear(width, bias, dtype):
    """The layers' and heads' products (``models.fast.products.linear``) against ``F.linear``: the output
    and the gradients of input, weight and bias; the input gradient and ``aligned_mm``'s product of each
    of the three shapes with rows starting on 32 bytes."""
    from models.fast.products import ROW_BYTES, aligned_mm, linear

    torch.manual_seed(0)
    x = torch.randn(3, 5, 7, dtype=dtype, requires_grad=True)  # 7 inputs: the input gradient needs padded rows
    weight = torch.randn(width, 7, dtype=dtype, requires_grad=True)
    b = torch.randn(width, dtype=dtype, requires_grad=True) if bias else None
    upstream = torch.randn(3, 5, width, dtype=dtype)
    tol = {"rtol": 1e-12, "atol": 1e-12} if dtype == torch.float64 else {"rtol": 1e-5, "atol": 1e-5}
    inputs = (x, weight) + ((b,) if bias else ())
    ours = linear(x, weight, b)
    expected = torch.nn.functional.linear(x, weight, b)
    torch.testing.assert_close(ours, expected, **tol)
    grads = torch.autograd.grad(ours, inputs, upstream)
    torch.testing.assert_close(grads, torch.autograd.grad(expected, inputs, upstream), **tol)
    assert grads[0].stride(-2) * grads[0].element_size() % ROW_BYTES == 0  # 7 inputs, padded rows
    for a, c in ((x.detach().flatten(0, 1), weight.detach().t()), (upstream.flatten(0, 1), weight.detach()),
                 (upstream.flatten(0, 1).t(), x.detach().flatten(0, 1))):
        product = aligned_mm(a, c)
        assert product.stride(0) * product.element_size() % ROW_BYTES == 0
        assert product.data_ptr() % ROW_BYTES == 0
        torch.testing.assert_close(product, a @ c, **tol)
    frozen = linear(x.detach(), weight, b)  # no input gradient asked for: only the parameters'
    assert torch.autograd.grad(frozen.sum(), weight, retain_graph=True)[0].shape == weight.shape
    torch.testing.assert_close(torch.autograd.grad((frozen * upstream).sum(), weight)[0], grads[1], **tol)


def test_aligned_products_gradcheck():
    from models.fast.products import linear

    x = torch.randn(4, 6, 5, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(3, 5, dtype=torch.float64, requires_grad=True)
    bias = torch.randn(3, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(linear, (x, weight, bias))
    assert torch.autograd.gradgradcheck(linear, (x, weight, bias))  # a second derivative, as F.linear has


def test_products_under_cpu_autocast_are_torchs_own():
    """Under the CPU's bf16 autocast a network's products take torch's own op, which casts its operands:
    forward and backward run, in bf16."""
    from models.acoustic import AcousticModel

    torch.manual_seed(0)
    net = AcousticModel([models.build_stack("ligru", 20, [8, 8], bidirectional=True, norm="batch")], 10, 4)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = net(torch.randn(2, 6, 20), torch.tensor([6, 4]))
    assert out["senone"].dtype == torch.bfloat16
    (out["senone"].float().sum() + out["mono"].float().sum()).backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in net.parameters() if p.requires_grad)

"""The GPU backend of the fast paths: each recurrence as one Triton kernel per pass (``triton_kernels.py``).

On CUDA the TorchScript loops of :mod:`models.fast.loops` launch a few small kernels per time step, and
their launches (about 0.1 ms a step, forward and backward) are the whole cost at the sizes we train;
cuDNN runs a sequence in one kernel. The kernels here do the same: one launch for a whole forward or
backward pass, the programs splitting the hidden units and meeting at a barrier once per step (twice
for the MGU), see ``triton_kernels.py``. What they compute and keep is exactly what the TorchScript
loops compute and keep, so the vectorised glue around the loops (the gate derivatives before the
backward loop, the weight gradients after it) is shared, and the tests hold both to the reference.

``BRU_KALDI_TRITON`` chooses:

* ``auto`` (default): the kernels for CUDA tensors of float32 and float64, where Triton is installed
  (every CUDA build of torch depends on it); if they cannot be built, one warning and the TorchScript
  loops from then on, for that device and dtype.
* ``1``: the kernels on CUDA, or an error where they cannot run (what the GPU tests use).
* ``interpret``: as ``1``, and CPU tensors too, through Triton's interpreter (``pip install triton``
  beside a CPU torch): slow, and how the tests check the kernels on a machine without a GPU.
* ``0``: never (the TorchScript loops on CUDA too).

>>> import torch, os
>>> route(torch.zeros(1)) is None  # a CPU tensor, without BRU_KALDI_TRITON=interpret
True
"""

from __future__ import annotations

import collections
import importlib.util
import os
import warnings
from typing import Optional

import torch

KERNELS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "triton_kernels.py")
MODES = ("auto", "1", "interpret", "0")
# The unit numbers of triton_kernels.py (KIND) and the gates of their recurrent matrix.
KINDS = {"bru": 0, "libru": 1, "ligru": 2, "rnn_tanh": 3, "rnn_relu": 4, "gru": 5, "lstm": 6, "mgu": 7}
GATES = {"bru": 1, "libru": 2, "ligru": 2, "rnn_tanh": 1, "rnn_relu": 1, "gru": 3, "lstm": 4, "mgu": 2}
# Overrides of the launcher's choices, None for its own: the units a program takes (the tests split
# them, so that the interpreter runs several programs, one launch per step), the width of the slices
# of the recurrent matrix a program multiplies in turn, and the warps of a program (bench/triton_blocks.py
# times settings of these on a GPU).
BLOCK_H: Optional[int] = None
BLOCK_K: Optional[int] = None
NUM_WARPS: Optional[int] = None
# Named at every compiled launch, not left to Triton's defaults: FMAs (the default before Triton 3.10),
COMPILE_OPTIONS = {"enable_fp_fusion": True}  # with which the kernels' accuracy and speed were measured

# Kernel name -> launches in this process (the tests check that a path really runs the kernels).
LAUNCHES: collections.Counter = collections.Counter()

_modules: dict = {}  # interpret (bool) -> the kernels module
_broken: dict = {}  # (device type, dtype) -> the error that stopped its kernels


def mode() -> str:
    value = os.environ.get("BRU_KALDI_TRITON", "auto")
    if value not in MODES:
        raise ValueError(f"BRU_KALDI_TRITON must be one of {MODES}, got {value!r}")
    return value


def _load(interpret: bool):
    """``triton_kernels.py`` executed with the decorator for compiled or interpreted kernels. Two
    copies of one source, so that a process can run both (the GPU tests do)."""
    if interpret not in _modules:
        name = "models.fast._triton_kernels_" + ("interpreted" if interpret else "compiled")
        spec = importlib.util.spec_from_file_location(name, KERNELS)
        module = importlib.util.module_from_spec(spec)
        module.INTERPRET = interpret
        spec.loader.exec_module(module)
        _modules[interpret] = module
    return _modules[interpret]


def _wanted(example: torch.Tensor) -> Optional[bool]:
    """Whether the kernels serve tensors like ``example``: ``None`` if not, else whether interpreted."""
    chosen = mode()
    if chosen == "0" or example.dtype not in (torch.float32, torch.float64):
        return None
    if example.device.type == "cuda":
        return False
    return True if example.device.type == "cpu" and chosen == "interpret" else None


def route(example: torch.Tensor):
    """The kernels module for tensors like ``example``, or ``None`` (the caller runs its TorchScript loop)."""
    interpret = _wanted(example)
    if interpret is None or (example.device.type, example.dtype) in _broken:
        return None
    try:
        return _load(interpret)
    except Exception as error:  # no Triton, or one too old for these kernels
        _give_up(example, error)
        return None


def _give_up(example: torch.Tensor, error: Exception) -> None:
    if mode() != "auto":
        raise RuntimeError(f"BRU_KALDI_TRITON={mode()} but the Triton kernels ({KERNELS}) could not run on "
                           f"{example.device.type} {example.dtype}: {error!r}") from error
    _broken[example.device.type, example.dtype] = error
    warnings.warn(f"the Triton kernels ({KERNELS}) could not run on {example.device.type} {example.dtype}, so the "
                  f"recurrences there run as TorchScript loops (slower, same results): {error!r}. "
                  f"Set BRU_KALDI_TRITON=0 to silence this.")


def _dense(like: torch.Tensor) -> torch.Tensor:
    """An uninitialised contiguous tensor of ``like``'s shape: what a kernel writes with row-major offsets.
    (``torch.empty_like`` keeps the strides of a transposed ``like``, such as a gradient from a batch-major
    layer, and the kernel's output would then be read back permuted.)"""
    return torch.empty(like.shape, dtype=like.dtype, device=like.device)


def _sm_count(device: torch.device) -> int:
    if device.type != "cuda":
        return 1 << 30
    return torch.cuda.get_device_properties(device).multi_processor_count


def _blocks(B: int, H: int, device: torch.device, interpret: bool, whole: bool = False) -> tuple[int, int, int]:
    """``(BLOCK_B, BLOCK_H, BLOCK_K)``. On a GPU the units are split into blocks of 8 (a program each:
    32-69 programs at the sizes we train), or of more where that would be more programs than the GPU
    has multiprocessors (they must all be resident for the barrier), rows into blocks of up to 32; the
    interpreter takes all units in one program unless :data:`BLOCK_H` says otherwise, and always with
    ``whole``."""
    block_b = min(max(_next_power_of_2(B), 2), 32)
    if BLOCK_H is not None and not (interpret and whole):
        block_h = BLOCK_H
    elif interpret:
        block_h = max(_next_power_of_2(H), 2)
    else:
        block_h = 8
        while -(-H // block_h) > _sm_count(device) and block_h < 256:
            block_h *= 2
    return block_b, block_h, BLOCK_K or (32 if interpret else 64)


def _next_power_of_2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


def _launch(kernels, kernel, steps: int, B: int, H: int, device, interpret: bool, args: tuple, whole: bool,
            backwards: bool = False, finish: bool = False, **constants):
    """Launch ``kernel`` over ``steps`` steps: one launch with the barrier where all of its programs are
    resident at once, else (the interpreter with several unit blocks) one launch per step without it.
    Row blocks beyond what the GPU holds at once run as separate launches (rows are independent).
    ``whole``: the interpreter keeps all units in one program (a step that cannot be cut in launches:
    the MGU's two products, the LSTM's cell carried in registers without ``TRAIN``). ``backwards``: the
    kernel runs its steps from the last frame down (a launch per step goes the same way), ``finish``:
    and ends with a product of its own after step 0, which a launch per step makes alone (``t_begin =
    t_end = 0``)."""
    block_b, block_h, block_k = _blocks(B, H, device, interpret, whole)
    unit_blocks = -(-H // block_h)
    row_blocks = -(-B // block_b)
    per_launch = max(1, min(row_blocks, _sm_count(device) // unit_blocks))
    if unit_blocks > _sm_count(device):
        raise RuntimeError(f"{unit_blocks} blocks of {block_h} units exceed the GPU's {_sm_count(device)} "
                           f"multiprocessors")
    stepwise = interpret and unit_blocks > 1
    meta = dict(BLOCK_B=block_b, BLOCK_H=block_h, BLOCK_K=block_k, SYNC=not stepwise, **constants)
    if not interpret:
        meta.update(num_warps=NUM_WARPS or 4, **COMPILE_OPTIONS)
    counters = torch.zeros(row_blocks, dtype=torch.int32, device=device)
    for first in range(0, row_blocks, per_launch):
        grid = (unit_blocks, min(per_launch, row_blocks - first))
        spans = [(t, t + 1) for t in range(steps)] if stepwise else [(0, steps)]
        if backwards:
            spans = spans[::-1] + ([(0, 0)] if stepwise and finish else [])
        for t_begin, t_end in spans:
            LAUNCHES[kernel.fn.__name__] += 1
            kernel[grid](*args, counters[first:], steps, B, H, first * block_b, t_begin, t_end, **meta)


# --------------------------------------------------------------------------- the gated family
def gated_forward(kind: str, proj, weight_t, bias, h0, train: bool, mask):
    """``(out (T, B, H), kept)`` as :func:`models.fast.loops.gated_forward` returns them, or ``None`` where
    the kernels do not serve these tensors or cannot be built (warned once; the caller runs the TorchScript loop)."""
    kernels = route(proj)
    if kernels is None:
        return None
    T, B, width = proj.shape
    H = h0.size(1)
    interpret = kernels.INTERPRET
    if kind == "lstm" and bias is not None:
        proj = proj + bias
    out = proj.new_empty(T, B, H)
    empty = proj.new_empty(0)
    keep1 = keep2 = empty
    if train and kind in ("libru", "ligru", "gru", "lstm", "mgu"):
        keep1 = proj.new_empty(T, B, width)
        if kind in ("libru", "lstm"):
            keep2 = proj.new_empty(T, B, H)
        elif kind == "gru":
            keep2 = proj.new_empty(T, B, width)
    scratch = proj.new_empty(2, B, H) if kind == "mgu" else empty
    if kind == "lstm" and keep2.numel() == 0:
        keep2 = proj.new_empty(1, B, H)  # unused (c stays in registers), but a valid pointer
    args = (proj.contiguous(), weight_t.contiguous(), bias.contiguous() if bias is not None else empty,
            h0.contiguous(), out,
            mask.contiguous() if mask is not None else empty, keep1, keep2, scratch)
    try:
        _launch(kernels, kernels.gated_forward, T, B, H, proj.device, interpret, args,
                kind == "mgu" or (kind == "lstm" and not train), KIND=KINDS[kind],
                G=GATES[kind], TRAIN=bool(train), HAS_MASK=mask is not None)
    except Exception as error:
        _give_up(proj, error)
        return None
    kept = {"libru": [keep1, keep2], "ligru": [keep1], "gru": [keep1, keep2], "lstm": [keep1, keep2],
            "mgu": [keep1]}.get(kind, [])
    return out, kept


def sequential_backward(kind: str, K, C, grad_out, weight, A=None, F=None):
    """The sequential part of a gated unit's backward pass (see ``triton_kernels.gated_backward``):
    ``(da (T, B, GK*H), dL/dh_0 (B, H))``, or ``None`` where the kernel cannot be built.

    ``kind`` is ``"lstm"``, ``"mgu"`` or anything else (the units linear in ``g``); ``K`` ``(T, B, GK*H)``,
    ``C`` ``(T, B, H)`` or ``None``, ``grad_out`` ``(T, B, H)``, ``weight`` ``(G*H, H)``; ``A``, ``F`` the
    LSTM's ``o (1 - tanh^2 c)`` and forget gate, or ``F`` the MGU's ``f``."""
    kernels = route(grad_out)
    if kernels is None:
        return None
    T, B, H = grad_out.shape
    interpret = kernels.INTERPRET
    grad_out = grad_out.contiguous()
    da = _dense(K)
    g_state = grad_out[T - 1].clone()
    empty = grad_out.new_empty(0)
    dc_state = torch.zeros_like(g_state) if kind == "lstm" else empty
    kind_number = {"lstm": KINDS["lstm"], "mgu": KINDS["mgu"]}.get(kind, 0)
    given = lambda t: t.contiguous() if t is not None else empty  # noqa: E731
    args = (given(K), given(C), given(A), given(F), grad_out, weight.contiguous(), da, g_state, dc_state, empty)
    try:
        _launch(kernels, kernels.gated_backward, T, B, H, grad_out.device, interpret, args, kind == "mgu",
                backwards=True, finish=True, KIND=kind_number,
                G=weight.size(0) // H, GK=K.size(2) // H, HAS_C=C is not None)
    except Exception as error:
        _give_up(grad_out, error)
        return None
    return da, g_state


# --------------------------------------------------------------------------- the layer-wise BRU
def lbru_forward(input_gate: bool, proj, weight_t, bias, h0, train: bool):
    """``(out, s_out, kept, hidden)`` of :class:`models.fast.gated.LBRURecurrence`'s TorchScript path: ``kept``
    the pre-activations ``[a_z, a_r, q(, a_s)]`` (``[a_z, q(, a_s)]`` without the input gate) and ``hidden``
    ``U_n h_{t-1} + b_hh``, both ``T`` frames with ``train`` (else empty); ``None`` where the kernel cannot be
    built."""
    kernels = route(proj)
    if kernels is None:
        return None
    T, B, width = proj.shape
    H = h0.size(1)
    empty = proj.new_empty(0)
    out = proj.new_empty(T, B, H)
    s_out = proj.new_empty(T, B, H) if width == 4 * H else empty
    kept = proj.new_empty(T, B, width if input_gate else width - H) if train else empty
    hidden = proj.new_empty(T, B, H) if train else empty
    args = (proj.contiguous(), weight_t.contiguous(), bias.contiguous(), h0.contiguous(), out, s_out, kept, hidden)
    try:
        _launch(kernels, kernels.lbru_forward, T, B, H, proj.device, kernels.INTERPRET, args, not train,
                G=width // H, INPUT_GATE=bool(input_gate), TRAIN=bool(train))
    except Exception as error:
        _give_up(proj, error)
        return None
    return out, s_out, kept, hidden


def lbru_backward(P, M, C, grad_h, weight, du, G):
    """:func:`models.fast.loops._lbru_backward` (fills ``G`` and the ``[z, r, n]`` slots of ``du``, returns
    ``dL/dh_0``), or ``None`` where the kernel cannot be built."""
    kernels = route(grad_h)
    if kernels is None:
        return None
    T, B, H = grad_h.shape
    if not (du.is_contiguous() and G.is_contiguous()):  # written in place with row-major offsets
        raise ValueError("lbru_backward fills du and G in place: both must be contiguous")
    grad_h = grad_h.contiguous()
    state = grad_h[T - 1].clone()
    args = (P.contiguous(), M.contiguous(), C.contiguous(), grad_h, weight.contiguous(), du, G, state)
    try:
        _launch(kernels, kernels.lbru_backward, T, B, H, grad_h.device, kernels.INTERPRET, args, False,
                backwards=True, finish=True, G=du.size(2) // H)
    except Exception as error:
        _give_up(grad_h, error)
        return None
    return state


# --------------------------------------------------------------------------- the layer-wise smoothing
def matrix_forward(A, h, weight, bias):
    """``(y, lin)`` of :class:`models.fast.scans.MatrixRecurrence` (``lin = W y_{t+1} + b``, kept for backward),
    or ``None`` where the kernel cannot be built."""
    kernels = route(h)
    if kernels is None:
        return None
    T, B, H = h.shape
    y, lin = _dense(h), _dense(h)
    args = (A.contiguous(), h.contiguous(), weight.t().contiguous(), bias.contiguous(), y, lin)
    try:
        _launch(kernels, kernels.matrix_forward, T, B, H, h.device, kernels.INTERPRET, args, False, backwards=True)
    except Exception as error:
        _give_up(h, error)
        return None
    return y, lin


def matrix_backward(A, grad_y, weight):
    """``(G, GA)`` of :meth:`models.fast.scans.MatrixRecurrence.backward` (``dL/dy_t`` and ``G_t A_t``), or
    ``None`` where the kernel cannot be built."""
    kernels = route(grad_y)
    if kernels is None:
        return None
    T, B, H = grad_y.shape
    G, GA = _dense(grad_y), _dense(grad_y)
    args = (A.contiguous(), grad_y.contiguous(), weight.contiguous(), G, GA)
    try:
        _launch(kernels, kernels.matrix_backward, T, B, H, grad_y.device, kernels.INTERPRET, args, False)
    except Exception as error:
        _give_up(grad_y, error)
        return None
    return G, GA


# --------------------------------------------------------------------------- elementwise recursions
class ScanOps:
    """The elementwise recursions of :mod:`models.fast.scans` with the signatures of the C++ kernels'
    (``torch.ops.bru_kaldi.softplus_scan`` ...), as Triton kernels: one launch a pass, a program per
    block of ``B*H`` units running the time loop. Each returns ``None`` where its kernel cannot be built
    (the caller then runs its TorchScript loop)."""

    BLOCK = 128

    def __init__(self, kernels):
        self.kernels = kernels

    def _run(self, kernel, example, N, *args, **constants):
        try:
            grid = (-(-N // self.BLOCK),)
            meta = {} if self.kernels.INTERPRET else {"num_warps": 4, **COMPILE_OPTIONS}
            LAUNCHES[kernel.fn.__name__] += 1
            kernel[grid](*args, BLOCK=self.BLOCK, **constants, **meta)
            return True
        except Exception as error:
            _give_up(example, error)
            return False

    def softplus_scan(self, c, k, x0, reverse: bool):
        T, B, W = c.shape
        x = _dense(c)
        ok = self._run(self.kernels.softplus_scan, c, B * W, c.contiguous(), k.contiguous(), x0.contiguous(), x,
                       B * W, T, W, REVERSE=bool(reverse))
        return x if ok else None

    def softplus_scan_backward(self, grad, k, x0, x, reverse: bool):
        T, B, W = x.shape
        G, grad_k, grad_x0 = _dense(x), x.new_empty(2, B, W), _dense(x0)
        ok = self._run(self.kernels.softplus_scan_backward, x, B * W, grad.contiguous(), k.contiguous(),
                       x0.contiguous(), x.contiguous(), G, grad_k, grad_x0, B * W, T, W, REVERSE=bool(reverse))
        return (G, grad_k, grad_x0) if ok else None

    def kalman_smoother(self, x, k, last):
        T, B, H = x.shape
        gamma = _dense(x)
        ok = self._run(self.kernels.kalman_smoother, x, B * H, x.contiguous(), k.contiguous(), last.contiguous(),
                       gamma, B * H, T, H)
        return gamma if ok else None

    def kalman_smoother_backward(self, grad, x, k, last, gamma):
        T, B, H = x.shape
        grad_x, grad_k = _dense(x), x.new_empty(2, B, H)
        ok = self._run(self.kernels.kalman_smoother_backward, x, B * H, grad.contiguous(), x.contiguous(),
                       k.contiguous(), last.contiguous(), gamma.contiguous(), grad_x, grad_k, B * H, T, H)
        return (grad_x, grad_k) if ok else None


_probed: set = set()  # (device type, dtype) whose scan kernels all ran once


def scan_ops(example: torch.Tensor) -> Optional[ScanOps]:
    """:class:`ScanOps` for tensors like ``example``, or ``None`` (see :func:`route`). The first call for a
    device and dtype runs every scan kernel once on one unit and one frame, so that one that cannot be
    built is known before a forward pass starts on a path whose backward pass would need it."""
    kernels = route(example)
    if kernels is None:
        return None
    ops, key = ScanOps(kernels), (example.device.type, example.dtype)
    if key not in _probed:
        one = example.new_zeros(1, 1, 1)
        k, last = example.new_zeros(2, 1), torch.zeros(1, dtype=torch.long, device=example.device)
        probes = [ops.softplus_scan(one, k, one[0], reverse) for reverse in (False, True)]
        probes += [ops.softplus_scan_backward(one, k, one[0], one, reverse) for reverse in (False, True)]
        probes += [ops.kalman_smoother(one, k, last), ops.kalman_smoother_backward(one, one, k, last, one)]
        if any(probe is None for probe in probes):
            return None
        _probed.add(key)
    return ops

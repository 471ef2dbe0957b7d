"""The GPU backend of the fast paths: each recurrence as one Triton kernel per pass (``triton_kernels.py``).

On CUDA the TorchScript loops of :mod:`models.fast.loops` launch a few small kernels per time step, and
their launches (about 0.1 ms a step, forward and backward) are the whole cost at the sizes we train;
cuDNN runs a sequence in one kernel. The kernels here do the same: one launch for a whole forward or
backward pass, the programs splitting the hidden units and meeting at a barrier once per step (twice
for the MGU), see ``triton_kernels.py``. What they compute and keep is exactly what the TorchScript
loops compute and keep, so the vectorised glue around the loops (the gate derivatives before the
backward loop, the weight gradients after it) is shared, and the tests hold both to the reference.
Long because every kernel's host side is here, around the one launcher that keeps them safe.

A kernel with a barrier waits for programs that must all be resident at once. So that it cannot hang:

* it is launched cooperatively (``launch_cooperative_grid``): CUDA refuses a grid that cannot be
  co-resident, and the error sends the pass to the TorchScript loop;
* its grid is sized from the compiled kernel's occupancy (registers, shared memory and threads of a
  program against the multiprocessor's, :func:`resident_programs`): at most one program per
  multiprocessor (the fastest, measured) and at most half of what the GPU can hold (room for other
  work: NCCL's kernels, another job);
* a barrier that waits too long gives up (``triton_kernels.SPINS`` polls) and flags its counter; the
  host reads the counters after each pass (a device sync), warns once and reruns the pass on the
  TorchScript loop, and the kernels are not used again for that device and dtype;
* in ``auto`` mode a kernel is used only after its self-test (:mod:`models.fast.self_test`: once per
  device, dtype and kernel, at a production size, under a host-side deadline, against the TorchScript
  loop) has passed; the log says which path each unit takes.

Launches run under the tensors' device (Triton launches on the current one), and a pass whose int32
offsets could overflow (about 2^31 elements in a tensor) is refused and runs as the TorchScript loop.

``BRU_KALDI_TRITON`` chooses:

* ``auto`` (default): the kernels for CUDA tensors of float32 and float64, where Triton is installed
  (every CUDA build of torch depends on it) and their self-test passes; if they cannot be built, one
  warning and the TorchScript loops from then on, for that device and dtype.
* ``1``: the kernels on CUDA, or an error where they cannot run (what the GPU tests use; no self-test).
* ``interpret``: as ``1``, and CPU tensors too, through Triton's interpreter (``pip install triton``
  beside a CPU torch): slow, and how the tests check the kernels on a machine without a GPU.
* ``0``: never (the TorchScript loops on CUDA too).

>>> import torch, os
>>> route(torch.zeros(1)) is None  # a CPU tensor, without BRU_KALDI_TRITON=interpret
True
"""

from __future__ import annotations

import collections
import contextlib
import importlib.util
import os
import threading
import warnings
from typing import NamedTuple, Optional

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
# Offsets inside the kernels are int32: a tensor (plus the reach of a masked block past its end) must stay
# below this many elements, or the pass is refused (and runs as its TorchScript loop).
INDEX_LIMIT = 1 << 31

# Kernel name -> launches in this process, and (name, constants) -> launches (the tests check that a path
# really runs the kernels, and which variants: the no-grad ones under torch.no_grad()).
LAUNCHES: collections.Counter = collections.Counter()
VARIANTS: collections.Counter = collections.Counter()
# (kernel name, argument dtypes, constants) -> (Occupancy, the most programs a launch of it had): what the
# launcher sized its grids from (the compile test checks the budgets of the production variants).
GRIDS: dict = {}

_modules: dict = {}  # interpret (bool) -> the kernels module
_broken: dict = {}  # (device type, dtype) -> the error that stopped its kernels
_verdicts: dict = {}  # (device, dtype, family) -> whether the family's kernels passed their self-test
_warned: set = set()  # the reasons of refusals already warned about
# Per thread: ``testing``, the family whose self-test runs in this thread (its kernels are trusted, and
# any error of theirs raises).
_local = threading.local()


class Refused(RuntimeError):
    """A pass the kernels do not take (its offsets would overflow, its grid cannot be co-resident): it runs
    as its TorchScript loop, with one warning for each ``reason`` (``"offsets"``, ``"grid"``,
    ``"arrivals"``), and the kernels stay in use for other passes."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


class BarrierTimeout(RuntimeError):
    """A barrier gave up waiting (its programs were not all resident): the pass's results are garbage."""


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


def wanted(example: torch.Tensor) -> Optional[bool]:
    """Whether Triton kernels serve tensors like ``example``: ``None`` if not, else whether interpreted."""
    chosen = mode()
    if chosen == "0" or example.dtype not in (torch.float32, torch.float64):
        return None
    if example.device.type == "cuda":
        return False
    return True if example.device.type == "cpu" and chosen == "interpret" else None


_wanted = wanted  # (the tests replace it)


def route(example: torch.Tensor, family: Optional[str] = None):
    """The kernels module for tensors like ``example``, or ``None`` (the caller runs its TorchScript loop);
    with ``family`` (a kernel and its variant, see :mod:`models.fast.self_test`) only once that has passed
    its self-test, in ``auto`` mode."""
    interpret = _wanted(example)
    if interpret is None or (example.device.type, example.dtype) in _broken:
        return None
    try:
        kernels = _load(interpret)
    except Exception as error:  # no Triton, or one too old for these kernels
        _give_up(example, error)
        return None
    if family is not None and not _trusted(family, example):
        return None
    return kernels


def _trusted(family: str, example: torch.Tensor) -> bool:
    """Whether ``family``'s kernels passed their self-test on ``example``'s device and dtype (run on first
    asking, ``auto`` mode only: ``1`` and ``interpret`` are asked for by name and raise where they fail)."""
    if mode() != "auto" or getattr(_local, "testing", None) == family:
        return True
    key = (str(example.device), example.dtype, family)
    if key not in _verdicts:
        from models.fast import self_test  # (it runs this module's paths against the TorchScript loops)

        _verdicts[key] = self_test.run(family, example.device, example.dtype)
    return _verdicts[key]


def _give_up(example: torch.Tensor, error: Exception) -> None:
    if mode() != "auto" or getattr(_local, "testing", None):
        raise RuntimeError(f"BRU_KALDI_TRITON={mode()} but the Triton kernels ({KERNELS}) could not run on "
                           f"{example.device.type} {example.dtype}: {error!r}") from error
    _broken[example.device.type, example.dtype] = error
    warnings.warn(f"the Triton kernels ({KERNELS}) could not run on {example.device.type} {example.dtype}, so the "
                  f"recurrences there run as TorchScript loops (slower, same results): {error!r}. "
                  f"Set BRU_KALDI_TRITON=0 to silence this.")


def attempt(example: torch.Tensor, launch, give_up=None) -> bool:
    """Run ``launch()``; ``False`` where it failed, so that the caller runs its loop: a refusal is warned about
    once per reason (raised outside ``auto`` mode), any other error goes to ``give_up(example, error)``
    (:func:`_give_up` by default: the recurrences' kernels are given up for that device and dtype)."""
    try:
        launch()
        return True
    except Refused as error:
        if mode() != "auto" or getattr(_local, "testing", None):
            raise
        if error.reason not in _warned:
            _warned.add(error.reason)
            warnings.warn(f"{error}: that pass runs without the Triton kernel (slower, same results; warned once)")
        return False
    except Exception as error:
        (give_up or _give_up)(example, error)
        return False


def _dense(like: torch.Tensor) -> torch.Tensor:
    """An uninitialised contiguous tensor of ``like``'s shape: what a kernel writes with row-major offsets.
    (``torch.empty_like`` keeps the strides of a transposed ``like``, such as a gradient from a batch-major
    layer, and the kernel's output would then be read back permuted.)"""
    return torch.empty(like.shape, dtype=like.dtype, device=like.device)


def on_device(device: torch.device):
    """The context a launch runs in: the tensors' device made current (Triton launches on the current
    device and its current stream, whatever the tensors' device)."""
    return torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()


_on_device = on_device  # (the tests replace it)


def offsets_fit(numels, overshoot: int) -> bool:
    """Whether int32 offsets reach every element of tensors of ``numels`` elements, where a masked lane's
    offset may pass a tensor's end by ``overshoot`` (a block of rows of the widest row, and one of columns).

    >>> offsets_fit([1000 * 128 * 4 * 550], 32 * 4 * 550 + 256), offsets_fit([2 ** 31 - 100], 256)
    (True, False)
    """
    return all(n + overshoot < INDEX_LIMIT for n in numels)


def _check_offsets(tensors, overshoot: int, what: str) -> None:
    numels = [t.numel() for t in tensors if isinstance(t, torch.Tensor)]
    if not offsets_fit(numels, overshoot):
        raise Refused("offsets", f"{what}: a tensor of {max(numels)} elements is too large for the kernels' int32 "
                                 f"offsets")


# --------------------------------------------------------------------------- occupancy
class Limits(NamedTuple):
    """What one multiprocessor of a GPU holds."""

    multiprocessors: int
    registers: int  # 32-bit registers
    threads: int
    shared: int  # bytes of shared memory
    programs: int  # resident blocks


# An H100's or H200's (sm_90); the compile test sizes its grids for it.
HOPPER = Limits(132, 65536, 2048, 233472, 32)
# Resident blocks per multiprocessor by compute capability (CUDA's tables; 16 where unknown).
_BLOCKS = {(7, 0): 32, (7, 5): 16, (8, 0): 32, (8, 6): 16, (8, 7): 16, (8, 9): 24, (9, 0): 32, (10, 0): 32,
           (12, 0): 32}


def limits(device: torch.device) -> Limits:
    """``device``'s :class:`Limits` (from torch's properties; the smallest of the recent GPUs' where torch
    does not say)."""
    p = torch.cuda.get_device_properties(device)
    return Limits(p.multi_processor_count, getattr(p, "regs_per_multiprocessor", 65536),
                  getattr(p, "max_threads_per_multi_processor", 1024),
                  getattr(p, "shared_memory_per_multiprocessor", 65536), _BLOCKS.get((p.major, p.minor), 16))


_limits = limits  # (the tests replace it)


def resident_programs(registers: int, shared: int, threads: int, limit: Limits) -> int:
    """Programs of a kernel that one multiprocessor holds at once, as CUDA's occupancy calculator counts
    them: registers are given to a warp in units of 256, each program's shared memory has 1 KB of the
    system's beside it (sm_80 on).

    >>> resident_programs(168, 48 * 1024, 128, HOPPER), resident_programs(255, 8 * 1024, 128, HOPPER)
    (3, 2)
    """
    warps = -(-threads // 32)
    per_warp = -(-max(registers, 1) * 32 // 256) * 256
    by_registers = limit.registers // per_warp // warps
    by_shared = limit.shared // (shared + 1024)
    return max(0, min(limit.programs, by_registers, limit.threads // threads, by_shared))


class Occupancy(NamedTuple):
    """A compiled kernel's resources and how many of its programs a multiprocessor holds."""

    registers: int  # a thread's
    spilled: int  # bytes a thread spills to local memory
    shared: int  # bytes of shared memory a program
    threads: int  # a program's
    per_multiprocessor: int


def _resources(compiled) -> tuple[int, int]:
    """``(registers a thread, bytes it spills)`` of a compiled kernel, from the driver (it loads the kernel)."""
    compiled._init_handles()
    return compiled.n_regs, compiled.n_spills * 4  # (Triton counts spills in 4-byte words)


_occupancies: dict = {}  # what _occupancy found, by kernel, device and specialisation


def _occupancy(kernel, args: tuple, meta: dict, device: torch.device) -> Occupancy:
    """The occupancy of ``kernel`` compiled for ``args`` and ``meta`` (compiled here if it is not yet),
    remembered by what Triton specialises a kernel on (dtypes, alignment, integers equal to 1 or divisible
    by 16) and the constants."""
    key = (kernel.fn.__name__, str(device), tuple(sorted(meta.items())),
           tuple((str(a.dtype), a.data_ptr() % 16 == 0) if isinstance(a, torch.Tensor)
                 else (a == 1, a % 16 == 0) if isinstance(a, int) else type(a).__name__ for a in args))
    if key not in _occupancies:
        compiled = kernel.warmup(*args, grid=(1,), **meta)
        registers, spilled = _resources(compiled)
        threads = 32 * meta["num_warps"]
        shared = int(compiled.metadata.shared)
        _occupancies[key] = Occupancy(registers, spilled, shared, threads,
                                      resident_programs(registers, shared, threads, _limits(device)))
    return _occupancies[key]


def _stepwise(interpret: bool, unit_blocks: int) -> bool:
    """Whether a pass runs one launch per step without the barrier: where the interpreter, which runs
    programs one after another, has several programs that would wait for each other."""
    return interpret and unit_blocks > 1


def _next_power_of_2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


def _launch(kernel, steps: int, B: int, H: int, device, interpret: bool, args: tuple, whole: bool,
            backwards: bool = False, finish: bool = False, **constants):
    """Launch ``kernel`` over ``steps`` steps: one launch with the barrier where all of its programs are
    resident at once, else (the interpreter with several unit blocks) one launch per step without it.
    Rows are independent: row blocks beyond what a launch holds run as separate launches. Raises
    :class:`Refused` for a pass the kernels do not take and :class:`BarrierTimeout` where a barrier gave up.

    The grid: rows in blocks of up to 32; on a GPU the units in blocks of 8 (a program each: 32-69
    programs at the sizes we train), or of more where that would be more programs than a launch may have
    (:func:`_grid`); the interpreter takes all units in one program unless :data:`BLOCK_H` says otherwise,
    and always with ``whole``. ``whole``: the interpreter keeps all units in one program (a step that cannot
    be cut in launches: the MGU's two products, the LSTM's cell carried in registers without ``TRAIN``).
    ``backwards``: the kernel runs its steps from the last frame down (a launch per step goes the same way),
    ``finish``: and ends with a product of its own after step 0, which a launch per step makes alone
    (``t_begin = t_end = 0``)."""
    block_b = min(max(_next_power_of_2(B), 2), 32)
    block_k = BLOCK_K or (32 if interpret else 64)
    row_blocks = -(-B // block_b)
    counters = torch.zeros(row_blocks, dtype=torch.int32, device=device)
    name = kernel.fn.__name__

    def meta(block_h, sync):
        values = dict(BLOCK_B=block_b, BLOCK_H=block_h, BLOCK_K=block_k, SYNC=sync, **constants)
        if not interpret:  # the barrier's programs resident at once, or no launch
            values.update(num_warps=NUM_WARPS or 4, launch_cooperative_grid=True, **COMPILE_OPTIONS)
        return values

    def call_args(first, t_begin, t_end):
        return (*args, counters[first:], steps, B, H, first * block_b, t_begin, t_end)

    with _on_device(device):  # (the kernel compiled, loaded and launched for the tensors' device)
        if interpret:
            block_h = max(_next_power_of_2(H), 2) if BLOCK_H is None or whole else BLOCK_H
            per_launch, occupancy = row_blocks, None
        else:
            block_h, per_launch, occupancy = _grid(kernel, lambda bh: (call_args(0, 0, steps), meta(bh, True)), H,
                                                   row_blocks, device)
        unit_blocks = -(-H // block_h)
        if 2 * unit_blocks * max(steps, 1) >= 1 << 30:  # the barrier's targets must stay below its GAVE_UP flag
            raise Refused("arrivals", f"{name}: {steps} frames of {unit_blocks} programs are too many arrivals for "
                                      f"its barrier")
        widest = max((t.size(-1) for t in args if isinstance(t, torch.Tensor) and t.dim()), default=1)
        _check_offsets(args, max(block_b, block_k) * widest + max(block_h, block_k), name)
        stepwise = _stepwise(interpret, unit_blocks)
        values = meta(block_h, not stepwise)
        VARIANTS[name, tuple(sorted(constants.items()))] += 1
        for first in range(0, row_blocks, per_launch):
            grid = (unit_blocks, min(per_launch, row_blocks - first))
            if occupancy is not None:
                key = (name, tuple(str(t.dtype) for t in args if isinstance(t, torch.Tensor)),
                       tuple(sorted(values.items())))
                GRIDS[key] = (occupancy, max(grid[0] * grid[1], GRIDS.get(key, (None, 0))[1]))
            spans = [(t, t + 1) for t in range(steps)] if stepwise else [(0, steps)]
            if backwards:
                spans = spans[::-1] + ([(0, 0)] if stepwise and finish else [])
            for t_begin, t_end in spans:
                LAUNCHES[name] += 1
                kernel[grid](*call_args(first, t_begin, t_end), **values)
    if not stepwise and int(counters.max()) >= 1 << 30:  # GAVE_UP: one read back (a device sync) a pass
        raise BarrierTimeout(f"a barrier of the Triton kernel {name} on {device} gave up waiting: its programs "
                             f"were not all resident")


def _grid(kernel, compile_args, H: int, row_blocks: int, device) -> tuple[int, int, Occupancy]:
    """``(BLOCK_H, row blocks a launch, occupancy)`` on a GPU: units in blocks of 8, doubled while that is
    more programs than a launch may have: at most one a multiprocessor (the fastest, measured), and at most
    half of what the GPU holds of this kernel at once (:func:`resident_programs`); :class:`Refused` where
    no block of up to 256 units fits. ``compile_args(block_h)`` gives the arguments and constants to compile with."""
    limit = _limits(device)
    block_h = BLOCK_H or 8
    while True:
        args, meta = compile_args(block_h)
        occupancy = _occupancy(kernel, args, meta, device)
        budget = min(limit.multiprocessors, occupancy.per_multiprocessor * limit.multiprocessors // 2)
        unit_blocks = -(-H // block_h)
        if 0 < unit_blocks <= budget:
            return block_h, max(1, min(row_blocks, budget // unit_blocks)), occupancy
        if BLOCK_H is not None or block_h >= 256:
            raise Refused("grid", f"{kernel.fn.__name__}: {unit_blocks} programs of {block_h} units do not fit the "
                                  f"{budget} a launch may have on {device} ({occupancy})")
        block_h *= 2


# --------------------------------------------------------------------------- the gated family
def gated_forward(kind: str, proj, weight_t, bias, h0, train: bool, mask):
    """``(out (T, B, H), kept)`` as :func:`models.fast.loops.gated_forward` returns them, or ``None`` where
    the kernels do not serve these tensors or cannot run them (the caller runs the TorchScript loop)."""
    kernels = route(proj, f"gated_forward:{kind}")
    if kernels is None:
        return None
    T, B, width = proj.shape
    H = h0.size(1)
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
    if not attempt(proj, lambda: _launch(kernels.gated_forward, T, B, H, proj.device, kernels.INTERPRET, args,
                                         kind == "mgu" or (kind == "lstm" and not train), KIND=KINDS[kind],
                                         G=GATES[kind], TRAIN=bool(train), HAS_MASK=mask is not None)):
        return None
    kept = {"libru": [keep1, keep2], "ligru": [keep1], "gru": [keep1, keep2], "lstm": [keep1, keep2],
            "mgu": [keep1]}.get(kind, [])
    return out, kept


def sequential_backward(kind: str, K, C, grad_out, weight, A=None, F=None):
    """The sequential part of a gated unit's backward pass (see ``triton_kernels.gated_backward``):
    ``(da (T, B, GK*H), dL/dh_0 (B, H))``, or ``None`` where the kernel cannot run.

    ``kind`` is ``"lstm"``, ``"mgu"`` or ``"gated"`` (the units linear in ``g``); ``K`` ``(T, B, GK*H)``,
    ``C`` ``(T, B, H)`` or ``None``, ``grad_out`` ``(T, B, H)``, ``weight`` ``(G*H, H)``; ``A``, ``F`` the
    LSTM's ``o (1 - tanh^2 c)`` and forget gate, or ``F`` the MGU's ``f``."""
    kernels = route(grad_out, f"gated_backward:{kind}")
    if kernels is None:
        return None
    T, B, H = grad_out.shape
    grad_out = grad_out.contiguous()
    da = _dense(K)
    g_state = grad_out[T - 1].clone()
    empty = grad_out.new_empty(0)
    dc_state = torch.zeros_like(g_state) if kind == "lstm" else empty
    kind_number = {"lstm": KINDS["lstm"], "mgu": KINDS["mgu"]}.get(kind, 0)
    given = lambda t: t.contiguous() if t is not None else empty  # noqa: E731
    args = (given(K), given(C), given(A), given(F), grad_out, weight.contiguous(), da, g_state, dc_state, empty)
    if not attempt(grad_out, lambda: _launch(kernels.gated_backward, T, B, H, grad_out.device, kernels.INTERPRET,
                                             args, kind == "mgu", backwards=True, finish=True, KIND=kind_number,
                                             G=weight.size(0) // H, GK=K.size(2) // H, HAS_C=C is not None)):
        return None
    return da, g_state


# --------------------------------------------------------------------------- the layer-wise BRU
def lbru_forward(input_gate: bool, proj, weight_t, bias, h0, train: bool):
    """``(out, s_out, kept, hidden)`` of :class:`models.fast.gated.LBRURecurrence`'s TorchScript path: ``kept``
    the pre-activations ``[a_z, a_r, q(, a_s)]`` (``[a_z, q(, a_s)]`` without the input gate) and ``hidden``
    ``U_n h_{t-1} + b_hh``, both ``T`` frames with ``train`` (else empty); ``None`` where the kernel cannot
    run."""
    kernels = route(proj, "lbru_forward")
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
    if not attempt(proj, lambda: _launch(kernels.lbru_forward, T, B, H, proj.device, kernels.INTERPRET, args,
                                         not train, G=width // H, INPUT_GATE=bool(input_gate), TRAIN=bool(train))):
        return None
    return out, s_out, kept, hidden


def lbru_backward(P, M, C, grad_h, weight, du, G):
    """:func:`models.fast.loops._lbru_backward` (fills ``G`` and the ``[z, r, n]`` slots of ``du``, returns
    ``dL/dh_0``), or ``None`` where the kernel cannot run."""
    kernels = route(grad_h, "lbru_backward")
    if kernels is None:
        return None
    T, B, H = grad_h.shape
    if not (du.is_contiguous() and G.is_contiguous()):  # written in place with row-major offsets
        raise ValueError("lbru_backward fills du and G in place: both must be contiguous")
    grad_h = grad_h.contiguous()
    state = grad_h[T - 1].clone()
    args = (P.contiguous(), M.contiguous(), C.contiguous(), grad_h, weight.contiguous(), du, G, state)
    if not attempt(grad_h, lambda: _launch(kernels.lbru_backward, T, B, H, grad_h.device, kernels.INTERPRET, args,
                                           False, backwards=True, finish=True, G=du.size(2) // H)):
        return None
    return state


# --------------------------------------------------------------------------- the layer-wise smoothing
def matrix_forward(A, h, weight, bias):
    """``(y, lin)`` of :class:`models.fast.scans.MatrixRecurrence` (``lin = W y_{t+1} + b``, kept for backward),
    or ``None`` where the kernel cannot run."""
    kernels = route(h, "matrix")
    if kernels is None:
        return None
    T, B, H = h.shape
    y, lin = _dense(h), _dense(h)
    args = (A.contiguous(), h.contiguous(), weight.t().contiguous(), bias.contiguous(), y, lin)
    if not attempt(h, lambda: _launch(kernels.matrix_forward, T, B, H, h.device, kernels.INTERPRET, args, False,
                                      backwards=True)):
        return None
    return y, lin


def matrix_backward(A, grad_y, weight):
    """``(G, GA)`` of :meth:`models.fast.scans.MatrixRecurrence.backward` (``dL/dy_t`` and ``G_t A_t``), or
    ``None`` where the kernel cannot run."""
    kernels = route(grad_y, "matrix")
    if kernels is None:
        return None
    T, B, H = grad_y.shape
    G, GA = _dense(grad_y), _dense(grad_y)
    args = (A.contiguous(), grad_y.contiguous(), weight.contiguous(), G, GA)
    if not attempt(grad_y, lambda: _launch(kernels.matrix_backward, T, B, H, grad_y.device, kernels.INTERPRET,
                                           args, False)):
        return None
    return G, GA


# --------------------------------------------------------------------------- elementwise recursions
class ScanOps:
    """The elementwise recursions of :mod:`models.fast.scans` with the signatures of the C++ kernels'
    (``torch.ops.bru_kaldi.softplus_scan`` ...), as Triton kernels: one launch a pass, a program per
    block of ``B*H`` units running the time loop, no barrier. Each returns ``None`` where its kernel
    cannot run (the caller then runs its TorchScript loop). The UBRU's HMM backward pass has a kernel of
    its own here (:meth:`hmm_smoother`), which the C++ kernels do not."""

    BLOCK = 128

    def __init__(self, kernels):
        self.kernels = kernels

    def _run(self, kernel, example, N, *args, **constants):
        def launch():
            _check_offsets(args, self.BLOCK, kernel.fn.__name__)
            grid = (-(-N // self.BLOCK),)
            meta = {} if self.kernels.INTERPRET else {"num_warps": 4, **COMPILE_OPTIONS}
            LAUNCHES[kernel.fn.__name__] += 1
            VARIANTS[kernel.fn.__name__, tuple(sorted(constants.items()))] += 1
            with _on_device(example.device):
                kernel[grid](*args, BLOCK=self.BLOCK, **constants, **meta)

        return attempt(example, launch)

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

    def hmm_smoother(self, x, a, j, c, last):
        """``(gamma, r)`` of ``triton_kernels.hmm_smoother``: ``x``, ``a`` ``(T, B, H)``, ``j`` ``(2, H)``,
        ``c`` ``(H,)``, ``last`` ``(B,)`` int64."""
        T, B, H = x.shape
        gamma, r = _dense(x), _dense(x)
        ok = self._run(self.kernels.hmm_smoother, x, B * H, x.contiguous(), a.contiguous(), j.contiguous(),
                       c.contiguous(), last.contiguous(), gamma, r, B * H, T, H)
        return (gamma, r) if ok else None

    def hmm_smoother_backward(self, grad, j, last, gamma, r):
        """``(dL/dx, dL/da, [dL/dj_0, dL/dj_1, dL/dc] (3, B, H))`` of :meth:`hmm_smoother`."""
        T, B, H = gamma.shape
        grad_x, grad_a, grad_jc = _dense(gamma), _dense(gamma), gamma.new_empty(3, B, H)
        ok = self._run(self.kernels.hmm_smoother_backward, gamma, B * H, grad.contiguous(), j.contiguous(),
                       last.contiguous(), gamma.contiguous(), r.contiguous(), grad_x, grad_a, grad_jc, B * H, T, H)
        return (grad_x, grad_a, grad_jc) if ok else None


def scan_ops(example: torch.Tensor) -> Optional[ScanOps]:
    """:class:`ScanOps` for tensors like ``example``, or ``None`` (see :func:`route`; in ``auto`` mode the
    self-test runs every scan kernel, forward and backward, before a forward pass starts on a path whose
    backward pass needs them)."""
    kernels = route(example, "scans")
    return None if kernels is None else ScanOps(kernels)

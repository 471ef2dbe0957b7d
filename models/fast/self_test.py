"""The Triton kernels' self-test: before ``auto`` mode uses a kernel on a device and dtype, the kernel runs
once at a production size against its TorchScript loop, and only a kernel that passes is used.

Why: a kernel that hangs or computes garbage on one machine (a GPU shared with other jobs, NCCL's kernels
beside it under DDP, a Triton or a driver that compiles it differently) is worse than a slow one, and the
tests cannot see that machine. The test is per family, a kernel and the variant a unit uses (``FAMILIES``:
the forward kernel of each unit of the gated family, the three backward kernels of that family, the LBRU's
two, the layer-wise smoothing's pair, the elementwise scans of the UBRU), on random inputs of ``SHAPE``
(T = 300 frames, B = 16 sequences, H = 550 units, as TIMIT's layers), twice (a bidirectional layer's two
directions, each with its own weights and inputs), forward with and without what backward keeps, and
backward. Every output must be the TorchScript loop's to ``TOLERANCE`` of the larger of 1 and the loop's
largest value. The inputs keep the recursions contractive (recurrent weights below ``0.5 / sqrt(H)``,
gates below 1), so that the two agree to rounding over 300 frames.

The kernels run in a thread of their own, on a GPU on a stream of its own, and the caller waits for them
``DEADLINE`` seconds at most: a kernel that has not finished by then (compilation included) is not used.
It is left to finish: no kernel waits for ever, its barriers give up after ``triton_kernels.SPINS`` polls.

Each verdict goes to the log (``models.fast.self_test``, INFO: ``run_exp.py`` writes it into the
experiment's log.txt), which so says which path the layers of each unit take; a family that fails is also
warned about, once, and its layers run the TorchScript loops.

``python -m models.fast.self_test [--dtypes float32 float64] [--families ...]`` runs the families on the GPU
and prints each verdict (``bench/cuda_check.sh``'s self-test log); ``--smoke`` runs them on the CPU through
Triton's interpreter at a small size (what the tests run, so that this cannot rot).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import math
import os
import sys
import threading
import time
import warnings

import torch

from models.fast import loops, scans, triton_loops

log = logging.getLogger(__name__)

SHAPE = (300, 16, 550)  # (T, B, H)
DEADLINE = 120.0  # seconds
TOLERANCE = {torch.float32: 1e-3, torch.float64: 1e-9}
FAMILIES = ([f"gated_forward:{kind}" for kind in triton_loops.KINDS]
            + [f"gated_backward:{kind}" for kind in ("gated", "lstm", "mgu")]
            + ["lbru_forward", "lbru_backward", "matrix", "scans"])


# --------------------------------------------------------------------------- the cases
def _inputs(T, B, H, device, dtype, seed):
    """Draws of a family's inputs: ``normal(*shape, scale)``, ``fraction(*shape)`` in ``(0, 0.5)`` (gates),
    ``recurrent(G)`` a ``(G*H, H)`` matrix of entries below ``0.5 / sqrt(H)``."""
    generator = torch.Generator(device="cpu").manual_seed(seed)

    def draw(values):
        return values.to(device=device, dtype=dtype)

    def normal(*shape, scale=1.0):
        return draw(torch.randn(*shape, generator=generator, dtype=torch.float64) * scale)

    def fraction(*shape):
        return draw(torch.rand(*shape, generator=generator, dtype=torch.float64) * 0.5)

    def recurrent(G):
        return draw((torch.rand(G * H, H, generator=generator, dtype=torch.float64) * 2 - 1) * 0.5 / math.sqrt(H))

    return normal, fraction, recurrent


def _gated_forward(kind):
    G = triton_loops.GATES[kind]

    def inputs(T, B, H, device, dtype, seed):
        normal, fraction, recurrent = _inputs(T, B, H, device, dtype, seed)
        bias = normal(G * H, scale=0.1) if kind in ("gru", "lstm") else None
        return dict(proj=normal(T, B, G * H, scale=0.5), weight_t=recurrent(G).t().contiguous(), bias=bias,
                    h0=-0.1 - fraction(B, H))  # (a log-probability for the BRU and the Li-BRU)

    def kernels(proj, weight_t, bias, h0):
        results = {}
        for train in (True, False):
            out, kept = triton_loops.gated_forward(kind, proj, weight_t, bias, h0, train, None)
            results.update(_named("train" if train else "inference", out, *(kept if train else [])))
        return results

    def loop(proj, weight_t, bias, h0):
        results = {}
        for train in (True, False):
            out = proj.new_empty(proj.size(0), proj.size(1), h0.size(1))
            kept = loops._GATED[kind][0](proj, weight_t, bias, h0, out, train, None)
            results.update(_named("train" if train else "inference", out, *(kept if train else [])))
        return results

    return inputs, kernels, loop


def _gated_backward(kind):
    G, GK = {"gated": (2, 2), "lstm": (4, 4), "mgu": (2, 3)}[kind]

    def inputs(T, B, H, device, dtype, seed):
        normal, fraction, recurrent = _inputs(T, B, H, device, dtype, seed)
        return dict(K=fraction(T, B, GK * H), C=fraction(T, B, H), A=fraction(T, B, H), F=fraction(T, B, H),
                    grad_out=normal(T, B, H), weight=recurrent(G))

    def kernels(K, C, A, F, grad_out, weight):
        if kind == "lstm":
            da, g = triton_loops.sequential_backward("lstm", K, None, grad_out, weight, A=A, F=F)
        else:
            da, g = triton_loops.sequential_backward(kind, K, C, grad_out, weight, F=F if kind == "mgu" else None)
        return _named("", da[..., : G * grad_out.size(2)] if kind == "mgu" else da, g)

    def loop(K, C, A, F, grad_out, weight):
        if kind == "lstm":
            return _named("", *loops._lstm_backward_loop(K, A, F, grad_out, weight))
        if kind == "mgu":
            return _named("", *loops._mgu_backward_loop(K, C, F, grad_out, weight))
        return _named("", *loops._gated_backward_loop(K, C, grad_out, weight))

    return inputs, kernels, loop


def _lbru_forward():
    def inputs(T, B, H, device, dtype, seed):
        normal, fraction, recurrent = _inputs(T, B, H, device, dtype, seed)
        return dict(proj=normal(T, B, 4 * H, scale=0.5), weight=recurrent(4), bias=normal(H, scale=0.1),
                    h0=torch.full((B, H), 0.5, device=device, dtype=dtype))

    def kernels(proj, weight, bias, h0):
        results = {}
        for input_gate, train in ((True, True), (False, True), (True, False)):
            out, s_out, kept, hidden = triton_loops.lbru_forward(input_gate, proj, weight.t(), bias, h0, train)
            results.update(_named(f"{input_gate} {train}", out, s_out, *((kept, hidden) if train else ())))
        return results

    def loop(proj, weight, bias, h0):  # as LBRURecurrence's TorchScript path
        T, B, width = proj.shape
        H = h0.size(1)
        results = {}
        for input_gate, train in ((True, True), (False, True), (True, False)):
            out, s_out = proj.new_empty(T, B, H), proj.new_empty(T, B, H)
            pre, hidden = loops._scratch(proj, width, train and input_gate), loops._scratch(proj, H, train)
            kept = proj.new_empty(T, B, width - H) if train and not input_gate else None
            loops._lbru_loop(proj, weight.t().contiguous(), bias, h0, out, s_out, pre, kept, hidden, train, input_gate)
            results.update(_named(f"{input_gate} {train}", out, s_out,
                                  *((pre if input_gate else kept, hidden) if train else ())))
        return results

    return inputs, kernels, loop


def _lbru_backward():
    def inputs(T, B, H, device, dtype, seed):
        normal, fraction, recurrent = _inputs(T, B, H, device, dtype, seed)
        return dict(P=normal(T, B, 2, H, scale=0.3), M=fraction(T, B, H), C=fraction(T, B, H),
                    grad_h=normal(T, B, H), weight=recurrent(4))

    def run(backward, P, M, C, grad_h, weight):
        T, B, H = grad_h.shape
        du, G = torch.zeros(T, B, 4 * H, dtype=grad_h.dtype, device=grad_h.device), torch.empty_like(grad_h)
        g = backward(P, M, C, grad_h, weight, du, G)
        return _named("", du[..., : 3 * H], G, g)

    return (inputs, lambda **given: run(triton_loops.lbru_backward, **given),
            lambda **given: run(loops._lbru_backward, **given))


def _matrix():
    def inputs(T, B, H, device, dtype, seed):
        normal, fraction, recurrent = _inputs(T, B, H, device, dtype, seed)
        return dict(A=fraction(T, B, H), h=normal(T, B, H), weight=recurrent(1), bias=normal(H, scale=0.1),
                    grad_y=normal(T, B, H))

    def kernels(A, h, weight, bias, grad_y):
        return _named("", *triton_loops.matrix_forward(A, h, weight, bias), *triton_loops.matrix_backward(A, grad_y,
                                                                                                         weight))

    def loop(A, h, weight, bias, grad_y):
        y, lin, G, GA = (torch.empty_like(h) for _ in range(4))
        scans._matrix_loop(A, h, weight.t(), bias, y, lin)
        scans._matrix_backward_loop(A, grad_y, weight, G, GA)
        return _named("", y, lin, G, GA)

    return inputs, kernels, loop


def _scans():
    def inputs(T, B, H, device, dtype, seed):
        normal, fraction, recurrent = _inputs(T, B, H, device, dtype, seed)
        last = torch.randint(0, T, (B,), generator=torch.Generator().manual_seed(seed)).to(device)
        last[0] = T - 1  # ragged lengths, one of them full
        return dict(c=normal(T, B, H), k=normal(2, H, scale=0.5), x0=normal(B, H), a=normal(T, B, H),
                    j=normal(2, H, scale=0.5), c_hmm=normal(H, scale=0.3), last=last, grad=normal(T, B, H))

    def kernels(c, k, x0, a, j, c_hmm, last, grad):
        ops, results = triton_loops.scan_ops(c), {}
        for reverse in (False, True):
            x = ops.softplus_scan(c, k, x0, reverse)
            G, grad_k, grad_x0 = ops.softplus_scan_backward(grad, k, x0, x, reverse)
            results.update(_named(f"softplus {reverse}", x, G, grad_k.sum(1), grad_x0))
        x = results["softplus False 0"]
        gamma = ops.kalman_smoother(x, k, last)
        grad_x, grad_k = ops.kalman_smoother_backward(grad, x, k, last, gamma)
        results.update(_named("kalman", gamma, grad_x, grad_k.sum(1)))
        gamma, r = ops.hmm_smoother(x, a, j, c_hmm, last)
        grad_x, grad_a, grad_jc = ops.hmm_smoother_backward(grad, j, last, gamma, r)
        return {**results, **_named("hmm", gamma, r, grad_x, grad_a, grad_jc.sum(1))}

    def loop(c, k, x0, a, j, c_hmm, last, grad):
        from models.fast.paths import _at_end, _kalman

        results = {}
        for reverse in (False, True):
            flip = (lambda v: v.flip(0)) if reverse else (lambda v: v)
            x = flip(scans._softplus_loop(flip(c), k, x0, torch.empty_like(c)))
            G, grad_k, grad_x0 = scans._softplus_backward(grad, k, x0, x, reverse)
            results.update(_named(f"softplus {reverse}", x, G, grad_k, grad_x0))
        x = results["softplus False 0"]
        with torch.enable_grad():  # the Kalman pass's gradient through autograd on its linear recursion
            x_, k_ = x.detach().requires_grad_(), k.detach().requires_grad_()
            gamma = _kalman(x_, k_, _at_end(last + 1, x.size(0)))
            grad_x, grad_k = torch.autograd.grad(gamma, (x_, k_), grad)
        results.update(_named("kalman", gamma.detach(), grad_x, grad_k))
        gamma, r = scans._hmm_loop(x, a, j, c_hmm, last)
        grad_x, grad_a, grad_j, grad_c = scans._hmm_loop_backward(grad, j, last, gamma, r)
        return {**results, **_named("hmm", gamma, r, grad_x, grad_a, torch.cat([grad_j, grad_c[None]]))}

    return inputs, kernels, loop


def _named(prefix, *tensors):
    return {f"{prefix} {i}".strip(): t for i, t in enumerate(tensors)}


def case(family: str):
    """``(inputs, kernels, loop)`` of ``family``: ``inputs(T, B, H, device, dtype, seed)`` a dict of tensors,
    ``kernels(**inputs)`` and ``loop(**inputs)`` dicts of what each computes, by name."""
    name, _, kind = family.partition(":")
    makers = {"gated_forward": _gated_forward, "gated_backward": _gated_backward, "lbru_forward": _lbru_forward,
              "lbru_backward": _lbru_backward, "matrix": _matrix, "scans": _scans}
    if family not in FAMILIES:
        raise ValueError(f"no self-test for {family!r}: one of {FAMILIES}")
    return makers[name](kind) if kind else makers[name]()


# --------------------------------------------------------------------------- running one
def difference(got: dict, expected: dict) -> tuple[float, str]:
    """The largest ``max |got - expected| / max(1, max |expected|)`` over the outputs, and which output."""
    if got.keys() != expected.keys():
        return math.inf, f"the outputs {sorted(got)} against {sorted(expected)}"
    worst = (0.0, "")
    for name, value in expected.items():
        value = value.double()
        scale = max(1.0, float(value.abs().max())) if value.numel() else 1.0
        gap = float((got[name].double() - value).abs().max()) / scale if value.numel() else 0.0
        if not gap <= worst[0]:  # (NaN counts as the worst)
            worst = (gap if gap == gap else math.inf, name)
    return worst


def _work(family: str, device: torch.device, dtype: torch.dtype, outcome: dict) -> None:
    """The self-test itself, in the thread :func:`run` waits for; fills ``outcome``."""
    triton_loops._local.testing = family  # (its kernels trusted, and their errors raised)
    try:
        inputs, kernels, loop = case(family)
        cuda = device.type == "cuda"
        with torch.cuda.device(device) if cuda else contextlib.nullcontext(), \
                torch.cuda.stream(torch.cuda.Stream(device)) if cuda else contextlib.nullcontext():
            worst = (0.0, "")
            for direction in (0, 1):
                given = inputs(*SHAPE, device, dtype, seed=direction)
                before = sum(triton_loops.LAUNCHES.values())
                got = kernels(**given)
                if sum(triton_loops.LAUNCHES.values()) == before:
                    raise RuntimeError("no kernel ran")
                found = difference(got, loop(**given))
                worst = max(worst, found)
            if cuda:
                torch.cuda.current_stream().synchronize()
        outcome["difference"], outcome["output"] = worst
    except BaseException as error:  # noqa: BLE001 (whatever stops it is the verdict)
        outcome["error"] = error
    finally:
        triton_loops._local.testing = None


def run(family: str, device: torch.device, dtype: torch.dtype) -> bool:
    """Whether ``family``'s kernels pass their self-test on ``device`` in ``dtype``; logged, and warned about
    where they do not."""
    outcome: dict = {}
    worker = threading.Thread(target=_work, args=(family, torch.device(device), dtype, outcome), daemon=True,
                              name=f"bru-kaldi self-test {family}")
    start = time.perf_counter()
    worker.start()
    worker.join(DEADLINE)
    seconds = time.perf_counter() - start
    T, B, H = SHAPE
    what = f"the Triton kernels {family} on {device} {str(dtype).replace('torch.', '')}"
    size = f"T={T} B={B} H={H}, two directions"
    if worker.is_alive():
        reason = f"they had not finished after {DEADLINE:.0f} s"
    elif "error" in outcome:
        reason = f"they failed: {outcome['error']!r}"[:500]
    elif not outcome["difference"] <= TOLERANCE[dtype]:
        reason = (f"they differ from the TorchScript loop by {outcome['difference']:.1e} of its scale in output "
                  f"{outcome['output']!r} (tolerance {TOLERANCE[dtype]:.0e})")
    else:
        log.info("%s passed their self-test (%s; largest difference %.1e of the TorchScript loop's scale; %.1f s): "
                 "layers that use them run them", what, size, outcome["difference"], seconds)
        return True
    message = f"{what} failed their self-test ({size}): {reason}; layers that use them run the TorchScript loops"
    log.warning("%s", message)
    warnings.warn(message + " (slower, same results)")
    return False


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dtypes", nargs="+", default=["float32"], choices=["float32", "float64"])
    parser.add_argument("--families", nargs="+", default=FAMILIES, choices=FAMILIES)
    parser.add_argument("--smoke", action="store_true",
                        help="on the CPU through Triton's interpreter, T=3 B=2 H=5 (numbers meaningless)")
    args = parser.parse_args(argv)
    global SHAPE
    if args.smoke:
        os.environ["BRU_KALDI_TRITON"] = "interpret"  # CPU tensors through the interpreter
        SHAPE, device = (3, 2, 5), torch.device("cpu")
    elif not torch.cuda.is_available():
        parser.error("the self-test needs a GPU (or --smoke)")
    else:
        device = torch.device("cuda", torch.cuda.current_device())
        print(f"{torch.cuda.get_device_name(device)}, torch {torch.__version__}", flush=True)
    failed = [(family, dtype) for dtype in args.dtypes for family in args.families
              if not run(family, device, getattr(torch, dtype))]
    print(f"self-test: {len(args.families) * len(args.dtypes) - len(failed)} passed, {len(failed)} failed"
          + (f": {failed}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S", stream=sys.stdout)
    sys.exit(main())

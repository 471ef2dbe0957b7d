"""The LF-MMI forward-backward of GPU outputs as one Triton kernel: what
:func:`bru_kaldi.chain.objective.forward_backward` computes (its docstring has the maths), for CUDA tensors.

Why. GPU outputs went to the C++ op on the host cores (copied there, the posteriors copied back): 58 % of
a training step on an H200, against a target of 20 %; the loop of torch ops on the GPU took 97 % (its ~20
small ops a frame, each a launch).

How. One program per sequence, the graph's states across its threads, the whole sequence in one launch
(Kaldi's CUDA kernels, ``chain-kernels.cu``, also give each thread a state, with a launch per frame):

* forward, frame ``t``: each thread sums, for its states ``j``, the arcs *into* them,
  ``alpha_t[j] = sum over arcs i -> j of alpha_{t-1}[i] * w * e[t - 1, pdf]``: the arcs arranged by
  destination (a CSR table, built per call with torch ops), no atomics, so the sums are deterministic;
  then the frame's window, the leak and the normalisation by ``z_t`` (sums over the program). The
  alphas of every boundary are kept for the backward pass, ``(T + 1) x S`` doubles a sequence;
* backward, frame ``t`` down to 1: each thread sums the arcs *out of* its states ``i``,
  ``beta_{t-1}[i] = sum over arcs i -> j of w * e[t - 1, pdf] * after[j] / z_t`` (``after = (L beta_t) *
  window``), the arcs arranged by source, then pdf; each run of one pdf's arcs adds its posterior
  ``alpha_{t-1}[i] * sum w e after[j] / z_t`` with one atomic add, since several states share a pdf (as
  Kaldi does): the posteriors' last bits may change from run to run;
* the phases of a frame are separated by the block's barrier (the state vectors live in global memory,
  in the caches, and a thread reads other threads' states). No program waits for another: the kernel
  has no grid barrier and cannot hang.

The arithmetic is in double for float32 and float64 outputs alike, as the C++ op's: the per-frame
``exp(x - max_p x)`` is computed by torch in the outputs' dtype and widened in the kernel, the graph's
weights are cast to the outputs' dtype first. The results agree with the C++ op to rounding.

``BRU_KALDI_TRITON`` (:mod:`models.fast.triton_loops`) switches it, as the recurrences' kernels: ``auto``
(default) for CUDA outputs of float32 and float64 (a kernel that cannot run is warned about once, and that
device and dtype go to the C++ op from then on), ``1`` (raise where it cannot run), ``interpret`` (CPU
tensors too, through Triton's interpreter: how the tests check it without a GPU), ``0`` (never).

>>> import torch
>>> from bru_kaldi.chain.graph import ChainGraph
>>> g = ChainGraph.from_arcs(1, [(0, 0, 0, 0.5), (0, 0, 1, 0.5)])
>>> forward_backward(torch.zeros(1, 3, 2), torch.tensor([3]), g.expand(1), 0.0) is None  # a CPU tensor
True
"""

from __future__ import annotations

import warnings
from typing import Optional

import torch

from bru_kaldi.chain.graph import GraphBatch
from models.fast import triton_loops

try:
    import triton.language as tl
except ImportError:  # pragma: no cover - Triton is in requirements.txt; without it the C++ op runs
    tl = None

_kernels: dict = {}  # interpret (bool) -> the kernel
_broken: dict = {}  # (device type, dtype) -> the error that stopped the kernel there

if tl is not None:

    def _kernel_source(e, lengths, in_ptr, in_src, in_pdf, in_w, in_max, out_ptr, out_dst, out_pdf, out_w, out_max,
                       initial, final, windows, leaky, alphas, norms, betas, posteriors, logprob,
                       T, P, S, window_frames, graph_stride, arc_stride, window_stride,
                       HAS_WINDOWS: tl.constexpr, BLOCK_S: tl.constexpr):
        """Program ``b``: sequence ``b`` of ``e`` ``(B, T, P)`` (``exp(x - max)``) over its ``lengths[b]``
        frames, on graph row ``b * graph_stride`` of the tables (0: one graph for all): ``in_ptr``,
        ``out_ptr`` ``(G, S + 1)`` row starts of the arcs into and out of each state, ``in_src``, ``in_pdf``,
        ``in_w`` and ``out_dst``, ``out_pdf``, ``out_w`` ``(G, A)`` the arcs in those orders (``arc_stride``
        ``A`` or 0), ``in_max``, ``out_max`` ``(G,)`` the most arcs a state has; ``initial``, ``final``
        ``(G, S)``, ``windows`` ``(B, T', S)`` (``window_stride`` ``T' S`` or 0), ``leaky`` ``(1,)`` double.
        Writes ``alphas`` ``(B, T + 1, S)``, ``norms`` ``(B, T + 1)``, ``betas`` ``(B, 2, S)`` (scratch),
        adds into ``posteriors`` ``(B, T, P)`` (zeros) and writes ``logprob`` ``(B,)`` without the shifts, all
        double."""
        b = tl.program_id(0)
        n = tl.load(lengths + b)
        g = b * graph_stride
        states = tl.arange(0, BLOCK_S)
        c = tl.load(leaky)
        e_b, alpha_b, post_b = e + b * T * P, alphas + b * (T + 1) * S, posteriors + b * T * P
        pi_g, final_g, window_b = initial + g * S, final + g * S, windows + b * window_stride
        in_g, out_g = in_ptr + g * (S + 1), out_ptr + g * (S + 1)
        in_src_g, in_pdf_g, in_w_g = in_src + g * arc_stride, in_pdf + g * arc_stride, in_w + g * arc_stride
        out_dst_g, out_pdf_g, out_w_g = out_dst + g * arc_stride, out_pdf + g * arc_stride, out_w + g * arc_stride
        most_in, most_out = tl.load(in_max + g), tl.load(out_max + g)
        # (tl.zeros and tl.sum are jit functions of Triton's own, which its interpreter does not run: sums are
        # tl.reduce of its addition, which the interpreter knows)
        nothing = tl.full([BLOCK_S], 0.0, tl.float64)
        total = tl.reduce(nothing, 0, tl.standard._sum_combine)

        # forward: boundary 0 is pi, boundary t follows frame t - 1; each leaked, then normalised
        for t in range(0, n + 1):
            tl.debug_barrier()  # alphas[t - 1] written by every thread
            alpha = alpha_b + t * S
            z = tl.reduce(nothing, 0, tl.standard._sum_combine)
            for s0 in range(0, S, BLOCK_S):
                j = s0 + states
                ok = j < S
                if t == 0:
                    value = tl.load(pi_g + j, mask=ok, other=0.0).to(tl.float64)
                else:
                    start = tl.load(in_g + j, mask=ok, other=0)
                    end = tl.load(in_g + j + 1, mask=ok, other=0)
                    value = nothing
                    for k in range(0, most_in):  # the arcs into j
                        arc = start + k
                        live = ok & (arc < end)
                        i = tl.load(in_src_g + arc, mask=live, other=0)
                        p = tl.load(in_pdf_g + arc, mask=live, other=0)
                        weight = tl.load(in_w_g + arc, mask=live, other=0.0)
                        emitted = tl.load(e_b + (t - 1) * P + p, mask=live, other=0.0).to(tl.float64)
                        value += tl.load(alpha_b + (t - 1) * S + i, mask=live, other=0.0) * weight * emitted
                    if HAS_WINDOWS:  # past a numerator's frames no state is open
                        value *= tl.load(window_b + (t - 1) * S + j, mask=ok & (states * 0 + t <= window_frames),
                                         other=0.0).to(tl.float64)
                tl.store(alpha + j, value, mask=ok)
                z += tl.reduce(value, 0, tl.standard._sum_combine)
            if c != 0.0:  # the leak: alpha + c * sum(alpha) * pi, and its sum
                tl.debug_barrier()
                leak = c * z
                z = tl.reduce(nothing, 0, tl.standard._sum_combine)
                for s0 in range(0, S, BLOCK_S):
                    j = s0 + states
                    ok = j < S
                    value = (tl.load(alpha + j, mask=ok, other=0.0)
                             + leak * tl.load(pi_g + j, mask=ok, other=0.0).to(tl.float64))
                    tl.store(alpha + j, value, mask=ok)
                    z += tl.reduce(value, 0, tl.standard._sum_combine)
            tl.debug_barrier()
            divisor = tl.where(z > 0.0, z, 1.0)  # a dead sequence: zeros, not NaN
            for s0 in range(0, S, BLOCK_S):
                j = s0 + states
                ok = j < S
                tl.store(alpha + j, tl.load(alpha + j, mask=ok, other=0.0) / divisor, mask=ok)
            tl.store(norms + b * (T + 1) + t, z)
            total += tl.log(z)

        # backward: beta_t scaled so that alphas[t] . beta_t = 1, two rows used in turn
        tl.debug_barrier()
        last = tl.reduce(nothing, 0, tl.standard._sum_combine)
        for s0 in range(0, S, BLOCK_S):
            j = s0 + states
            ok = j < S
            last += tl.reduce(tl.load(alpha_b + n * S + j, mask=ok, other=0.0)
                           * tl.load(final_g + j, mask=ok, other=0.0).to(tl.float64), 0, tl.standard._sum_combine)
        tl.store(logprob + b, total + tl.log(last))
        divisor = tl.where(last > 0.0, last, 1.0)
        for s0 in range(0, S, BLOCK_S):
            j = s0 + states
            ok = j < S
            tl.store(betas + (b * 2 + n % 2) * S + j,
                     tl.load(final_g + j, mask=ok, other=0.0).to(tl.float64) / divisor, mask=ok)
        for step in range(0, n):
            t = n - step
            tl.debug_barrier()  # beta_t written by every thread
            beta = betas + (b * 2 + t % 2) * S
            earlier = betas + (b * 2 + (t - 1) % 2) * S
            leak = tl.reduce(nothing, 0, tl.standard._sum_combine)
            if c != 0.0:  # L beta = beta + c * (pi . beta)
                for s0 in range(0, S, BLOCK_S):
                    j = s0 + states
                    ok = j < S
                    leak += tl.reduce(tl.load(pi_g + j, mask=ok, other=0.0).to(tl.float64)
                                   * tl.load(beta + j, mask=ok, other=0.0), 0, tl.standard._sum_combine)
                leak = c * leak
            z = tl.load(norms + b * (T + 1) + t)
            divisor = tl.where(z > 0.0, z, 1.0)
            for s0 in range(0, S, BLOCK_S):
                i = s0 + states
                ok = i < S
                start = tl.load(out_g + i, mask=ok, other=0)
                end = tl.load(out_g + i + 1, mask=ok, other=0)
                alpha = tl.load(alpha_b + (t - 1) * S + i, mask=ok, other=0.0)
                total_out = nothing
                run = nothing  # the arcs of one pdf so far
                for k in range(0, most_out):  # the arcs out of i, by pdf
                    arc = start + k
                    live = ok & (arc < end)
                    j = tl.load(out_dst_g + arc, mask=live, other=0)
                    p = tl.load(out_pdf_g + arc, mask=live, other=0)
                    after = tl.load(beta + j, mask=live, other=0.0) + leak
                    if HAS_WINDOWS:  # (the frame's test as a block: the interpreter mishandles a scalar one)
                        after *= tl.load(window_b + (t - 1) * S + j, mask=live & (states * 0 + t <= window_frames),
                                         other=0.0).to(tl.float64)
                    q = (tl.load(out_w_g + arc, mask=live, other=0.0)
                         * tl.load(e_b + (t - 1) * P + p, mask=live, other=0.0).to(tl.float64) * after)
                    total_out += q
                    run += q
                    following = tl.load(out_pdf_g + arc + 1, mask=live & (arc + 1 < end), other=-1)
                    ends = live & (following != p)  # the run's last arc: its posterior, once
                    tl.atomic_add(post_b + (t - 1) * P + p, alpha * run / divisor, mask=ends & (alpha > 0.0),
                                  sem="relaxed")
                    run = tl.where(ends, 0.0, run)
                tl.store(earlier + i, total_out / divisor, mask=ok)


def _kernel(interpret: bool):
    if interpret not in _kernels:
        if interpret:
            from triton.runtime.interpreter import InterpretedFunction

            _kernels[True] = InterpretedFunction(_kernel_source)
        else:
            import triton

            _kernels[False] = triton.jit(_kernel_source)
    return _kernels[interpret]


def _arranged(state: torch.Tensor, key: torch.Tensor, real: torch.Tensor, num_states: int):
    """Arcs ``(G, A)`` arranged by ``key`` (stable), those not ``real`` last: ``(order (G, A), row starts
    (G, S + 1) of each ``state``'s arcs, the most arcs of a state (G,))``."""
    order = torch.argsort(torch.where(real, key, key.new_tensor(torch.iinfo(torch.int64).max)), dim=1, stable=True)
    counts = torch.zeros(state.shape[0], num_states + 1, dtype=torch.int64, device=state.device)
    counts.scatter_add_(1, torch.where(real, state, num_states), torch.ones_like(state))
    starts = torch.zeros_like(counts)
    torch.cumsum(counts[:, :num_states], dim=1, out=starts[:, 1:])
    most = counts[:, :num_states].amax(1) if num_states else counts[:, 0]
    return order, starts, most


def _tables(graphs: GraphBatch, num_pdfs: int, dtype: torch.dtype, device: torch.device) -> dict:
    """The kernel's graph arguments: the arcs arranged by destination and by (source, pdf), arcs of weight 0
    (a batch's padding) left out, the weights in ``dtype`` then double; one row for a shared graph
    (:meth:`~bru_kaldi.chain.graph.ChainGraph.expand`'s stride-0 views), else one a sequence."""
    shared = all(getattr(graphs, name).stride(0) == 0 for name in ("src", "dst", "pdf", "weight", "initial", "final"))
    rows = 1 if shared else graphs.batch_size
    src, dst, pdf = (getattr(graphs, name)[:rows] for name in ("src", "dst", "pdf"))
    weight = graphs.weight[:rows].to(dtype).double()
    real = weight != 0
    S = graphs.num_states
    into, in_starts, in_most = _arranged(dst, dst, real, S)
    out_of, out_starts, out_most = _arranged(src, src * (num_pdfs + 1) + pdf, real, S)
    tables = dict(in_ptr=in_starts, in_src=src.gather(1, into), in_pdf=pdf.gather(1, into),
                  in_w=weight.gather(1, into), in_max=in_most, out_ptr=out_starts, out_dst=dst.gather(1, out_of),
                  out_pdf=pdf.gather(1, out_of), out_w=weight.gather(1, out_of), out_max=out_most,
                  initial=graphs.initial[:rows].to(dtype).double(), final=graphs.final[:rows].to(dtype).double())
    tables = {name: (t.to(torch.int32) if not t.is_floating_point() else t).to(device).contiguous()
              for name, t in tables.items()}
    return dict(tables, graph_stride=0 if shared else 1, arc_stride=src.shape[1])


def forward_backward(nnet_output: torch.Tensor, lengths: torch.Tensor, graphs: GraphBatch,
                     leaky_coefficient: float) -> Optional[tuple[torch.Tensor, torch.Tensor]]:
    """``(logprob (B,), posteriors (B, T, P))`` in the outputs' dtype, as
    :func:`bru_kaldi.chain.objective.forward_backward` returns them, or ``None`` where the kernel does not
    serve these outputs (the caller runs the C++ op or its torch loop). The arguments are the caller's,
    checked there: ``nnet_output`` ``(B, T, P)``, ``lengths`` ``(B,)`` int64 on its device, ``graphs`` ``B``
    graphs, ``leaky_coefficient >= 0``."""
    interpret = triton_loops.wanted(nnet_output)
    if interpret is None or (nnet_output.device.type, nnet_output.dtype) in _broken:
        return None
    result = []
    launch = lambda: result.append(_run(_kernel(interpret), nnet_output.detach(), lengths, graphs,  # noqa: E731
                                        leaky_coefficient, interpret))
    return result[0] if triton_loops.attempt(nnet_output, launch, give_up=_give_up) else None


def _give_up(example: torch.Tensor, error: Exception) -> None:
    """The kernel failed on ``example``'s device and dtype: raise outside ``auto`` mode, else warn once and
    leave that device and dtype to the host's C++ op."""
    device, dtype = example.device.type, example.dtype
    if triton_loops.mode() != "auto":
        raise RuntimeError(f"BRU_KALDI_TRITON={triton_loops.mode()} but the LF-MMI Triton kernel could not run on "
                           f"{device} {dtype}: {error!r}") from error
    _broken[device, dtype] = error
    warnings.warn(f"the LF-MMI Triton kernel could not run on {device} {dtype}, so the forward-backward there runs "
                  f"on the host (slower, same results): {error!r}. Set BRU_KALDI_TRITON=0 to silence this.")


def _run(kernel, x: torch.Tensor, lengths: torch.Tensor, graphs: GraphBatch, leaky: float, interpret: bool):
    batch, frames, pdfs = x.shape
    device, dtype = x.device, x.dtype
    valid = torch.arange(frames, device=device)[None, :] < lengths[:, None]
    if pdfs:  # the per-frame shift of the module docstring (0 on padding, which the kernel never reads)
        shift = torch.where(valid, x.max(dim=2).values, torch.zeros((), dtype=dtype, device=device))
    else:
        shift = x.new_zeros(batch, frames)
    emitted = torch.exp(x - shift[..., None]).contiguous()  # (B, T, P), in the outputs' dtype
    S = graphs.num_states
    tables = _tables(graphs, pdfs, dtype, device)
    if graphs.windows is not None:
        windows = graphs.windows.to(device, dtype)
        window_stride = 0 if windows.stride(0) == 0 else windows.shape[1] * S
        windows, window_frames = windows[: 1 if window_stride == 0 else batch].contiguous(), windows.shape[1]
    else:
        windows, window_stride, window_frames = x.new_zeros(1), 0, 0
    alphas = torch.empty(batch, frames + 1, S, dtype=torch.float64, device=device)
    norms = torch.empty(batch, frames + 1, dtype=torch.float64, device=device)
    betas = torch.empty(batch, 2, S, dtype=torch.float64, device=device)
    posteriors = torch.zeros(batch, frames, pdfs, dtype=torch.float64, device=device)
    logprob = torch.empty(batch, dtype=torch.float64, device=device)
    block = min(max(triton_loops._next_power_of_2(S), 32), 1024)
    arrays = [emitted, alphas, posteriors, windows, *(t for t in tables.values() if isinstance(t, torch.Tensor))]
    if not triton_loops.offsets_fit([t.numel() for t in arrays], block + 1):
        raise triton_loops.Refused("offsets", f"a batch of {batch} x {frames} frames, {pdfs} pdfs and {S} states is "
                                              f"too large for the LF-MMI kernel's int32 offsets")
    if batch:
        meta = {} if interpret else {"num_warps": max(1, min(8, block // 32)), **triton_loops.COMPILE_OPTIONS}
        t = tables
        with triton_loops.on_device(device):
            kernel[(batch,)](emitted, lengths.to(torch.int32).contiguous(), t["in_ptr"], t["in_src"], t["in_pdf"],
                             t["in_w"], t["in_max"], t["out_ptr"], t["out_dst"], t["out_pdf"], t["out_w"],
                             t["out_max"], t["initial"], t["final"], windows,
                             torch.tensor([float(leaky)], dtype=torch.float64, device=device), alphas, norms, betas,
                             posteriors, logprob, frames, pdfs, S, window_frames, t["graph_stride"],
                             t["arc_stride"], window_stride, HAS_WINDOWS=graphs.windows is not None, BLOCK_S=block,
                             **meta)
    return (logprob + shift.double().sum(1)).to(dtype), posteriors.to(dtype)

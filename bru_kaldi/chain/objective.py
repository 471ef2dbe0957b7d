"""The LF-MMI objective: forward-backward over a batch of chain graphs, and the loss with its gradient.

What is computed. For one utterance of ``T`` frames with network outputs ``x[t, p]``, let ``e[t, p] =
exp(x[t, p])``, ``M_t`` the ``S x S`` matrix of frame ``t`` (1-based) with ``M_t[i, j] = sum over arcs i -> j
of weight * e[t - 1, pdf]``, ``pi`` the initial and ``f`` the final weights of the graph (row and column
vectors), ``c`` the leaky-HMM coefficient and ``L = I + c * 1 pi`` (so ``(v L)[j] = v[j] + c * sum(v) *
pi[j]``). The probability is

    P = pi L M_1 L M_2 L ... M_T L f

and :func:`forward_backward` returns ``log P`` and the posteriors ``gamma[t, p] = d log P / d x[t, p]``
(the expected number of arcs with pdf ``p`` at frame ``t``; each frame's sum is 1).

The leaky HMM, as Kaldi's ``DenominatorComputation`` defines it: after every frame boundary, the ``T + 1``
of them from before the first frame to after the last, the forward vector ``alpha`` (its sum ``s``) becomes
``alpha + c * s * pi``: any path may leave its state and restart from a state drawn from the initial
distribution, with weight ``c`` on the leak (a path that leaks to its own state is counted apart from the one
that stays). The backward vector ``beta`` gets the transposed step, ``beta + c * (pi . beta)``. With ``c = 0``
(the numerator) ``L = I``. The final weights multiply the vector after the last leak; Kaldi's denominator
has ``f = 1`` (:func:`~bru_kaldi.chain.graph.denominator_graph`), and then ``P`` is Kaldi's total
probability.

How. In the probability domain, as Kaldi: per frame the outputs are shifted by their maximum ``m_t`` over
pdfs before ``exp`` (exact: ``sum_t m_t`` is added back to ``log P``; Kaldi instead limits the outputs to
``[-30, 30]``), and after each boundary ``t`` the forward vector is divided by its sum ``z_t`` (after the
leak), so ``log P = sum_t m_t + sum_{t=0..T} log z_t + log(alpha_T . f)``. The backward vectors are scaled
by the same ``z_t``, which makes ``alpha_t . beta_t = 1`` at every boundary and the posteriors of frame
``t - 1`` simply ``alpha_{t-1}[src] * weight * e[t - 1, pdf] * (beta_t L)[dst] / z_t``, summed per pdf.
Frames at or after an utterance's length leave the vectors unchanged: padding (even NaN) has no effect,
and its posteriors and gradients are 0. A graph that has no path of an utterance's length gives ``log P =
-inf`` and zero posteriors.

Where. Two implementations of this one recursion. Outputs of float32 or float64 go to a C++ op
(``csrc/forward_backward.cpp``, built on first use, :mod:`bru_kaldi.chain.native`): one thread per
utterance, a plain loop over its frames and arcs, in double precision. It runs on the CPU also for GPU
outputs, which are copied to the host and whose posteriors are copied back. Everything else (other dtypes,
``BRU_KALDI_NATIVE=0``, or no C++ compiler under the default ``auto``) runs a loop over frames of torch ops
batched over utterances, in the outputs' dtype, on the outputs' device (CPU or GPU): arcs are gathered and
summed with ``gather`` / ``scatter_add_``, padding frames are replaced by zeros before anything. That loop
spends most of its time launching small ops, on a GPU as on a CPU, hence the C++ one; the tests hold the
two to each other and to a sum over every path, on a GPU too. On a GPU a Triton kernel
(:mod:`bru_kaldi.chain.triton_fb`: one program a sequence, the states across its threads) runs first, for
float32 and float64 outputs, and these two only where it does not (``BRU_KALDI_TRITON``).

The objective (:func:`lfmmi_loss`, Kaldi's ``ComputeChainObjfAndDeriv`` and ``nnet3-chain-train``): per
utterance ``log P_num - log P_den``, whose gradient with respect to ``x`` is ``gamma_num - gamma_den``;
:class:`ChainObjective` hands that back from a hand-written backward instead of differentiating the
recursion.

>>> import math
>>> from bru_kaldi.chain.graph import ChainGraph
>>> g = ChainGraph.from_arcs(1, [(0, 0, 0, 0.5), (0, 0, 1, 0.5)])  # any pdf, each with probability 0.5
>>> logprob, post = forward_backward(torch.zeros(1, 3, 2), torch.tensor([3]), g.expand(1))
>>> round(float(logprob), 4) == round(3 * math.log(0.5 + 0.5), 4), post[0, 0].tolist()
(True, [0.5, 0.5])
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Sequence, Union

import torch

from bru_kaldi.chain import native, triton_fb
from bru_kaldi.chain.graph import ChainGraph, GraphBatch

Graphs = Union[GraphBatch, Sequence[ChainGraph]]


def _leak_forward(alpha: torch.Tensor, initial: torch.Tensor, leaky: float) -> torch.Tensor:
    """``alpha L``: ``alpha + c * sum(alpha) * pi``, per row. ``(B, S)``."""
    return alpha + leaky * alpha.sum(1, keepdim=True) * initial if leaky else alpha


def _leak_backward(beta: torch.Tensor, initial: torch.Tensor, leaky: float) -> torch.Tensor:
    """``L beta``: ``beta + c * (pi . beta)``, per row. ``(B, S)``."""
    return beta + leaky * (beta * initial).sum(1, keepdim=True) if leaky else beta


def _safe(z: torch.Tensor) -> torch.Tensor:
    """Normalisers with 0 (no path) replaced by 1, so that a dead utterance gives zeros, not NaN."""
    return torch.where(z > 0, z, torch.ones_like(z))


def _valid_frames(nnet_output: torch.Tensor, lengths) -> tuple[torch.Tensor, torch.Tensor]:
    """``lengths`` as int64 on the outputs' device, checked, and the ``(B, T)`` mask of real frames."""
    if nnet_output.dim() != 3 or not nnet_output.is_floating_point():
        raise ValueError(f"nnet_output must be a float (B, T, P) tensor, not {nnet_output.dtype} "
                         f"{tuple(nnet_output.shape)}")
    batch, frames, _ = nnet_output.shape
    lengths = torch.as_tensor(lengths, dtype=torch.int64, device=nnet_output.device)
    if lengths.shape != (batch,):
        raise ValueError(f"lengths must have shape ({batch},), not {tuple(lengths.shape)}")
    if batch and (int(lengths.min()) < 0 or int(lengths.max()) > frames):
        raise ValueError(f"lengths must lie in [0, {frames}]: {lengths.tolist()}")
    return lengths, torch.arange(frames, device=nnet_output.device)[None, :] < lengths[:, None]


def forward_backward(nnet_output: torch.Tensor, lengths, graphs: GraphBatch,
                     leaky_coefficient: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """``log P`` and the pdf posteriors of each utterance on its own graph (see the module's docstring).

    ``nnet_output``: ``(B, T, P)`` float; ``lengths``: ``(B,)`` ints in ``[0, T]``; ``graphs``: a
    :class:`~bru_kaldi.chain.graph.GraphBatch` of ``B`` graphs (its weights are cast to the outputs' dtype
    and device); ``leaky_coefficient``: ``c >= 0``. Returns ``logprob`` ``(B,)`` and ``posteriors``
    ``(B, T, P)``, both without autograd history, in the outputs' dtype.

    >>> from bru_kaldi.chain.graph import ChainGraph
    >>> g = ChainGraph.from_arcs(2, [(0, 1, 0, 1.0), (1, 1, 1, 1.0)])  # pdf 0 then pdf 1 forever
    >>> logprob, post = forward_backward(torch.zeros(1, 3, 2), [3], g.expand(1))
    >>> float(logprob), post[0].tolist()
    (0.0, [[1.0, 0.0], [0.0, 1.0], [0.0, 1.0]])
    """
    if leaky_coefficient < 0:
        raise ValueError(f"leaky_coefficient must be >= 0, not {leaky_coefficient}")
    lengths, valid = _valid_frames(nnet_output, lengths)
    batch, frames, pdfs = nnet_output.shape
    if graphs.batch_size != batch:
        raise ValueError(f"{graphs.batch_size} graphs for a batch of {batch} utterances")
    if graphs.pdf.numel() and int(graphs.pdf.max()) >= pdfs:
        raise ValueError(f"the graphs use pdf {int(graphs.pdf.max())}, the outputs have {pdfs} pdfs")
    if nnet_output.is_cuda:  # one Triton kernel on the GPU, where it runs (bru_kaldi.chain.triton_fb)
        result = triton_fb.forward_backward(nnet_output, lengths, graphs, leaky_coefficient)
        if result is not None:
            return result
    ops = native.native_ops(nnet_output.detach().new_empty(0, device="cpu"))
    if ops is not None:
        # GPU outputs too: the C++ op on the host's cores, the outputs copied there and the posteriors back
        # (a batch's (B, T, P) each way, about 1 MB on the built-in corpus). On an H200 the torch loop took
        # 337 ms for a batch of 8 x 288 frames, 96 % of a training step, for the launches of its ~20 small
        # ops a frame; the C++ op does that batch in 19-28 ms on one core of a 2-core AMD EPYC.
        # The graphs as they are (the op casts their weights itself): a denominator expanded to the batch
        # stays a stride-0 view, read once, where a cast here would copy it B times
        g = graphs.to("cpu")
        with torch.no_grad():
            logprob, posteriors = ops.forward_backward(nnet_output.detach().cpu(), lengths.cpu(), g.src, g.dst, g.pdf,
                                                       g.weight, g.initial, g.final, g.windows,
                                                       float(leaky_coefficient))
        return logprob.to(nnet_output.device), posteriors.to(nnet_output.device)
    return _torch_forward_backward(nnet_output, valid, graphs, leaky_coefficient)


def _torch_forward_backward(nnet_output: torch.Tensor, valid: torch.Tensor, graphs: GraphBatch,
                            leaky_coefficient: float) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`forward_backward` as a loop over frames of torch ops batched over utterances (any device and
    dtype), on checked arguments: ``valid`` is the ``(B, T)`` mask of real frames."""
    batch, frames, pdfs = nnet_output.shape
    g = graphs.to(nnet_output.device, nnet_output.dtype)
    windows = g.windows  # (B, T', S): the states open after each frame; past T' none (a numerator's length)
    if windows is not None and windows.shape[1] < frames:
        windows = torch.cat([windows, windows.new_zeros(batch, frames - windows.shape[1], g.num_states)], dim=1)
    with torch.no_grad():
        x = torch.where(valid[..., None], nnet_output.detach(), torch.zeros((), dtype=nnet_output.dtype,
                                                                           device=nnet_output.device))
        shift = x.max(dim=2).values if pdfs else torch.zeros_like(x[..., 0])  # (B, T), 0 on padding
        emission = torch.exp(x - shift[..., None])

        # forward: alphas[t] is alpha after boundary t (leak included), normalised to sum 1
        alpha = _leak_forward(g.initial, g.initial, leaky_coefficient)
        z = alpha.sum(1)
        norms = [z]
        alphas = [alpha / _safe(z)[:, None]]
        for t in range(1, frames + 1):
            live = valid[:, t - 1]
            previous = alphas[-1]
            arcs = previous.gather(1, g.src) * g.weight * emission[:, t - 1].gather(1, g.pdf)
            alpha = torch.zeros_like(previous).scatter_add_(1, g.dst, arcs)
            if windows is not None:
                alpha = alpha * windows[:, t - 1]
            alpha = _leak_forward(alpha, g.initial, leaky_coefficient)
            z = torch.where(live, alpha.sum(1), torch.ones_like(z))
            norms.append(z)
            alphas.append(torch.where(live[:, None], alpha / _safe(z)[:, None], previous))
        norms = torch.stack(norms)  # (T + 1, B); 1 after the end of an utterance
        last = (alphas[-1] * g.final).sum(1)
        logprob = torch.log(norms).sum(0) + torch.log(last) + shift.sum(1)

        # backward: beta is scaled so that alphas[t] . beta = 1; the posteriors of frame t - 1 use beta_t
        beta = g.final / _safe(last)[:, None]
        posteriors = torch.zeros_like(x)
        for t in range(frames, 0, -1):
            live = valid[:, t - 1]
            after = _leak_backward(beta, g.initial, leaky_coefficient)
            if windows is not None:
                after = after * windows[:, t - 1]
            arcs_back = (g.weight * emission[:, t - 1].gather(1, g.pdf) * after.gather(1, g.dst)
                         / _safe(norms[t])[:, None])
            from_alpha = alphas[t - 1].gather(1, g.src)
            arc_posteriors = torch.where(from_alpha > 0, from_alpha * arcs_back, torch.zeros_like(arcs_back))
            frame_posteriors = torch.zeros_like(posteriors[:, 0]).scatter_add_(1, g.pdf, arc_posteriors)
            posteriors[:, t - 1] = torch.where(live[:, None], frame_posteriors, torch.zeros_like(frame_posteriors))
            beta = torch.where(live[:, None], torch.zeros_like(beta).scatter_add_(1, g.src, arcs_back), beta)
    return logprob, posteriors


def denominator_forward_backward(nnet_output: torch.Tensor, lengths, graph: ChainGraph,
                                 leaky_coefficient: float = 1e-5) -> tuple[torch.Tensor, torch.Tensor]:
    """The denominator: every utterance on the one ``graph``, with the leaky HMM (``c``, Kaldi's
    ``--leaky-hmm-coefficient``, whose default is ``1e-5``; Kaldi's recipes use 0.1). Shapes as
    :func:`forward_backward`: ``(B, T, P)``, ``(B,)`` -> ``(B,)``, ``(B, T, P)``.

    >>> from bru_kaldi.chain.graph import denominator_graph
    >>> g = denominator_graph(1, [(0, 0, 0, 1.0), (0, 0, 1, 1.0)])
    >>> logprob, post = denominator_forward_backward(torch.zeros(2, 2, 2, dtype=torch.float64), [2, 1], g,
    ...                                             leaky_coefficient=0.0)
    >>> [round(v, 6) for v in logprob.tolist()], post[1].tolist()  # log(2 ** 2), log(2 ** 1): paths of weight 1
    ([1.386294, 0.693147], [[0.5, 0.5], [0.0, 0.0]])
    """
    return forward_backward(nnet_output, lengths, graph.expand(nnet_output.shape[0]), leaky_coefficient)


def _as_batch(graphs: Graphs) -> GraphBatch:
    return graphs if isinstance(graphs, GraphBatch) else ChainGraph.batch(list(graphs))


def numerator_forward_backward(nnet_output: torch.Tensor, lengths,
                               graphs: Graphs) -> tuple[torch.Tensor, torch.Tensor]:
    """The numerator: utterance ``b`` on its own graph ``graphs[b]`` (a list of
    :class:`~bru_kaldi.chain.graph.ChainGraph`, padded here, or a ready
    :class:`~bru_kaldi.chain.graph.GraphBatch`), by the same recursion without the leaky HMM. Shapes as
    :func:`forward_backward`.

    >>> from bru_kaldi.chain.graph import ChainGraph
    >>> one_path = ChainGraph.from_arcs(3, [(0, 1, 1, 1.0), (1, 2, 0, 1.0)], final=[0, 0, 1])  # pdf 1, then pdf 0
    >>> x = torch.tensor([[[0.0, 1.0], [2.0, 0.0]]])
    >>> logprob, post = numerator_forward_backward(x, [2], [one_path])
    >>> float(logprob), post[0].tolist()  # the one path: x[0, 1] + x[1, 0]
    (3.0, [[0.0, 1.0], [1.0, 0.0]])
    """
    return forward_backward(nnet_output, lengths, _as_batch(graphs), 0.0)


class ChainObjective(torch.autograd.Function):
    """``log P_num - log P_den`` per utterance ``(B,)``, and the numerator posteriors ``(B, T, P)``
    (without gradient), from ``(nnet_output (B, T, P), lengths (B,), num_graphs: GraphBatch, den_graph:
    ChainGraph, leaky_coefficient)``. An utterance whose numerator has no path (``log P_num = -inf``) gets
    objective 0 and no gradient: it is left out, as Kaldi's ``chain-get-supervision`` refuses it.

    The backward is written by hand, as Kaldi's: the gradient of ``log P`` with respect to ``x[t, p]`` is
    the posterior of pdf ``p`` at frame ``t``, so the forward keeps ``gamma_num - gamma_den`` and the backward
    returns it times the incoming gradient of each utterance; nothing is differentiated through the
    recursion (whose memory would be ``T`` times the graph's).

    >>> from bru_kaldi.chain.graph import denominator_graph, ChainGraph
    >>> den = denominator_graph(1, [(0, 0, 0, 1.0), (0, 0, 1, 1.0)])
    >>> num = ChainGraph.from_arcs(3, [(0, 1, 0, 1.0), (1, 2, 1, 1.0)], final=[0, 0, 1])  # pdf 0, then pdf 1
    >>> x = torch.zeros(1, 2, 2, requires_grad=True)
    >>> objf, num_post = ChainObjective.apply(x, [2], ChainGraph.batch([num]), den, 0.0)
    >>> objf.sum().backward(); x.grad[0].tolist()
    [[0.5, -0.5], [-0.5, 0.5]]
    """

    @staticmethod
    def forward(ctx, nnet_output, lengths, num_graphs, den_graph, leaky_coefficient):
        num_logprob, num_posteriors = numerator_forward_backward(nnet_output, lengths, num_graphs)
        den_logprob, den_posteriors = denominator_forward_backward(nnet_output, lengths, den_graph,
                                                                   leaky_coefficient)
        alive = torch.isfinite(num_logprob)
        difference = torch.where(alive[:, None, None], num_posteriors - den_posteriors,
                                 torch.zeros_like(num_posteriors))
        ctx.save_for_backward(difference)
        ctx.mark_non_differentiable(num_posteriors)
        return torch.where(alive, num_logprob - den_logprob, torch.zeros_like(num_logprob)), num_posteriors

    @staticmethod
    def backward(ctx, grad_objf, grad_num_posteriors):
        (difference,) = ctx.saved_tensors
        return grad_objf[:, None, None] * difference, None, None, None, None


@dataclass
class LFMMIResult:
    """What :func:`lfmmi_loss` returns: ``loss``, the scalar tensor to minimise, and the per-frame
    numbers Kaldi logs (floats, divided by ``num_frames``): ``objf`` (``sum_b log P_num - log P_den``,
    Kaldi's "log-probability per frame"), ``l2_term`` (``-output_l2 / 2 * sum x ** 2``), ``xent_objf`` (the
    xent head's ``sum num_post * log_softmax``, the negative cross-entropy; 0 without a head); ``num_frames``,
    the frames of the utterances that count; ``dropped``, the batch rows left out (a numerator without a
    path: their frames count nowhere)."""

    loss: torch.Tensor
    objf: float
    l2_term: float
    xent_objf: float
    num_frames: int
    dropped: list = field(default_factory=list)


def lfmmi_loss(nnet_output: torch.Tensor, lengths, num_graphs: Graphs, den_graph: ChainGraph,
               leaky_coefficient: float = 0.1, xent_output: Optional[torch.Tensor] = None,
               xent_regularize: float = 0.1, output_l2: float = 0.0) -> LFMMIResult:
    """The LF-MMI loss of a batch, as ``nnet3-chain-train`` computes its objective and derivatives.

    ``nnet_output``: ``(B, T, P)``, the chain head's outputs (log-scores, no softmax); ``lengths``: ``(B,)``;
    ``num_graphs``: ``B`` numerator graphs (or a padded ``GraphBatch``); ``den_graph``: the denominator;
    ``xent_output``: ``(B, T, P)`` or ``None``, the cross-entropy head's logits (``log_softmax`` is applied
    here; Kaldi's head ends in a log-softmax layer). With ``F = sum(lengths)`` frames:

        objective = sum_b (log P_num[b] - log P_den[b])          (chain: gradient gamma_num - gamma_den)
                    - output_l2 / 2 * sum_{b, t < len_b} ||x[b, t]||^2      (Kaldi's --l2-regularize)
                    + xent_regularize * sum_{b, t, p} gamma_num[b, t, p] * log_softmax(xent_output)[b, t, p]
        loss = -objective / F

    The cross-entropy term trains the xent head towards the numerator posteriors, which are constants there
    (Kaldi copies them into the xent head's derivative): it sends no gradient into ``nnet_output``. So,
    with a xent head, the gradient for ``nnet_output`` is deliberately not the derivative of ``loss`` (whose
    value does move with ``nnet_output`` through ``gamma_num``): it is ``-(gamma_num - gamma_den) / F`` plus
    the L2 term's ``output_l2 * x / F``, as Kaldi's.

    >>> import math
    >>> from bru_kaldi.chain.graph import ChainGraph, denominator_graph
    >>> den = denominator_graph(1, [(0, 0, 0, 1.0), (0, 0, 1, 1.0)])
    >>> num = ChainGraph.from_arcs(3, [(0, 1, 0, 1.0), (1, 2, 1, 1.0)], final=[0, 0, 1])
    >>> result = lfmmi_loss(torch.zeros(1, 2, 2), [2], [num], den, leaky_coefficient=0.0)
    >>> round(result.objf, 6) == round(-math.log(2), 6), float(result.loss) == -result.objf
    (True, True)
    """
    lengths, valid = _valid_frames(nnet_output, lengths)
    objf, num_posteriors = ChainObjective.apply(nnet_output, lengths, _as_batch(num_graphs), den_graph,
                                                leaky_coefficient)
    dropped = (num_posteriors.sum((1, 2)) == 0) & (lengths > 0)  # no numerator path: no posteriors at all
    if bool(dropped.any()):
        valid = valid & ~dropped[:, None]
    num_frames = int(valid.sum())
    zero = torch.zeros((), dtype=nnet_output.dtype, device=nnet_output.device)
    total = objf.sum()
    l2_term = zero
    if output_l2:
        l2_term = -0.5 * output_l2 * torch.where(valid[..., None], nnet_output, zero).pow(2).sum()
        total = total + l2_term
    xent_objf = zero
    if xent_output is not None:
        if xent_output.shape != nnet_output.shape:
            raise ValueError(f"xent_output has shape {tuple(xent_output.shape)}, nnet_output "
                             f"{tuple(nnet_output.shape)}")
        log_probs = torch.log_softmax(torch.where(valid[..., None], xent_output, zero), dim=2)
        xent_objf = (num_posteriors * log_probs).sum()
        total = total + xent_regularize * xent_objf
    per_frame = 1.0 / max(num_frames, 1)
    return LFMMIResult(loss=-total * per_frame, objf=float(objf.detach().sum()) * per_frame,
                       l2_term=float(l2_term.detach()) * per_frame, xent_objf=float(xent_objf.detach()) * per_frame,
                       num_frames=num_frames, dropped=dropped.nonzero().flatten().tolist())

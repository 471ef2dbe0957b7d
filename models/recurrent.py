"""Machinery shared by every recurrent unit: one place for each idea.

A unit is a small :class:`Cell` that reads like its paper (``step`` is the
recursion at one time step, ``finish`` an optional backward recursion).
:class:`RecurrentLayer` wraps one cell per direction and owns everything else:
input dropout, the input projection ``W x_t + b`` for all frames at once, its
normalisation, bidirection by reversing each sequence within its own length,
and the masking of padded frames. Long because that machinery is one contract (shapes, lengths,
directions, the fast path's hand-off) that every unit relies on, and splitting it would split the contract.

Layout: batch-first, ``x`` is ``(B, T, F)``, ``lengths`` is ``(B,)``, outputs are
``(B, T, H)`` per direction, concatenated to ``(B, T, 2H)`` when bidirectional.
"""

from __future__ import annotations

import math
from typing import Callable, Optional, Sequence

import torch
from torch import nn
from torch.nn import functional as F

from models.fast.products import linear
from models.norm import InputNorm, make_norm

State = tuple[torch.Tensor, ...]


# --------------------------------------------------------------------------- inputs and padding
def check_inputs(x: torch.Tensor, lengths, input_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Validate a batch and return ``(lengths, mask)``.

    Args:
        x: ``(B, T, F)`` float tensor.
        lengths: ``(B,)`` integers in ``[1, T]`` (tensor or sequence).
        input_size: the ``F`` the layer was built for.

    Returns:
        ``lengths`` as a LongTensor on ``x.device`` and a boolean ``(B, T)`` mask of real frames.
    """
    if not torch.is_tensor(x) or x.dim() != 3:
        shape = tuple(x.shape) if torch.is_tensor(x) else type(x).__name__
        raise ValueError(f"expected input of shape (batch, time, {input_size}), got {shape}")
    if x.size(2) != input_size:
        raise ValueError(f"expected {input_size} input features in the last dimension, got shape {tuple(x.shape)}")
    if not x.is_floating_point():
        raise ValueError(f"expected a floating-point input, got {x.dtype}")
    lengths = torch.as_tensor(lengths, device=x.device)
    if lengths.dim() != 1 or lengths.numel() != x.size(0):
        raise ValueError(f"expected lengths of shape ({x.size(0)},), one per sequence, got {tuple(lengths.shape)}")
    if lengths.is_floating_point() or lengths.dtype == torch.bool:
        raise ValueError(f"expected integer lengths, got {lengths.dtype}")
    lengths = lengths.long()
    if len(lengths) and (int(lengths.min()) < 1 or int(lengths.max()) > x.size(1)):
        raise ValueError(
            f"expected every length in [1, {x.size(1)}] (the padded time dimension), got {lengths.tolist()}"
        )
    mask = torch.arange(x.size(1), device=x.device) < lengths[:, None]  # (B, T)
    return lengths, mask


def _full_lengths(x: torch.Tensor) -> torch.Tensor:
    """``(B,)`` lengths of a batch ``(B, T, ...)`` without padding: a chunk of a stream."""
    return torch.full((x.size(0),), x.size(1), dtype=torch.long, device=x.device)


def has_padding(lengths: torch.Tensor, steps: int) -> bool:
    """Whether a batch of ``lengths`` padded to ``steps`` frames has padded frames at all. A batch
    without them (common with length-sorted batches) skips the masks: each is a pass over every
    activation forward and again backward."""
    return bool(len(lengths)) and int(lengths.min()) < steps


def _zero_tails(frames: torch.Tensor, lengths: list[int]) -> torch.Tensor:
    for b, n in enumerate(lengths):
        if n < frames.size(0):
            frames[n:, b] = 0.0
    return frames


class _ZeroPadding(torch.autograd.Function):
    """A copy of time-major ``x`` ``(T, B, ...)`` whose padded frames are 0; the same for its gradient.

    ``masked_fill`` with a ``(T, B, 1)`` mask broadcast over the features took 2.0 ms for a
    ``(400, 8, 512)`` batch on the CPU (torch 2.13), five times a copy; padding lies at the end of each
    sequence, so a copy and one fill of each sequence's tail do the same in 0.4 ms.
    """

    @staticmethod
    def forward(ctx, x, lengths):
        ctx.lengths = lengths
        return _zero_tails(x.clone(), lengths)

    @staticmethod
    def backward(ctx, grad):
        return _zero_tails(grad.clone(), ctx.lengths), None


def zero_padding(x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """``x`` ``(T, B, ...)``, time-major, with frames ``t >= lengths[b]`` of each sequence set to 0 (not in place).

    >>> zero_padding(torch.ones(3, 2, 1), torch.tensor([3, 1]))[..., 0]
    tensor([[1., 1.],
            [1., 0.],
            [1., 0.]])
    """
    return _ZeroPadding.apply(x, lengths.tolist())


class _PermuteFrames(torch.autograd.Function):
    """``frames.index_select(0, index)`` for an ``index`` that is its own inverse: backward selects the
    gradient the same way (autograd's own backward would scatter-add into zeros, about twice the cost)."""

    @staticmethod
    def forward(ctx, frames, index):
        ctx.save_for_backward(index)
        return frames.index_select(0, index)

    @staticmethod
    def backward(ctx, grad):
        (index,) = ctx.saved_tensors
        return grad.index_select(0, index), None


class _MergeDirections(torch.autograd.Function):
    """``cat([forward, backward.index_select(0, index)], -1)`` on flat frames ``(N, H)`` in one pass, for an
    ``index`` that is its own inverse (the reversal that puts the backward direction back in time order).

    Backward hands each direction a contiguous gradient, which the C++ kernels need anyway: reversing
    and concatenating separately cost a second ``(N, 2H)`` buffer forward and a copy backward.
    """

    @staticmethod
    def forward(ctx, forward_frames, backward_frames, index):
        ctx.save_for_backward(index)
        H = forward_frames.size(-1)
        merged = forward_frames.new_empty(forward_frames.size(0), 2 * H)
        merged[:, :H] = forward_frames
        # out[index[i]] = src[i] is out[j] = src[index[j]] for a self-inverse index
        merged[:, H:].index_copy_(0, index, backward_frames)
        return merged

    @staticmethod
    def backward(ctx, grad):
        (index,) = ctx.saved_tensors
        H = grad.size(-1) // 2
        return grad[:, :H].contiguous(), grad[:, H:].index_select(0, index), None


def _reversal_index(lengths: torch.Tensor, T: int, time_dim: int) -> torch.Tensor:
    """Flat frame numbers, in the order of a ``(B, T)`` (``time_dim=1``) or ``(T, B)`` (``time_dim=0``)
    array, of the frame that lands at each place when every sequence is reversed within its length."""
    B = lengths.numel()
    t = torch.arange(T, device=lengths.device)
    source = torch.where(t < lengths[:, None], lengths[:, None] - 1 - t, t)  # (B, T): the frame that lands at t
    b = torch.arange(B, device=lengths.device)[:, None]
    index = b * T + source if time_dim == 1 else (source * B + b).t()
    return index.reshape(-1)


def reverse_padded(x: torch.Tensor, lengths: torch.Tensor, time_dim: int = 1) -> torch.Tensor:
    """Reverse each sequence of ``x`` ``(B, T, ...)`` (``time_dim=0``: ``(T, B, ...)``) within its own
    length; padding stays in place.

    Applying it twice gives back ``x``. Frames move whole (one index per frame, not per value).

    >>> x = torch.arange(6.).view(2, 3, 1)
    >>> reverse_padded(x, torch.tensor([3, 2]))[..., 0]
    tensor([[2., 1., 0.],
            [4., 3., 5.]])
    """
    index = _reversal_index(lengths, x.size(time_dim), time_dim)
    frames = _PermuteFrames.apply(x.reshape(index.numel(), -1), index)
    return frames.view(x.shape)


def merge_directions(forward_out: torch.Tensor, backward_out: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """``cat([forward_out, reverse_padded(backward_out, lengths, 0)], -1)`` for time-major ``(T, B, H)``
    outputs, in one pass: the backward direction ran over reversed sequences.

    >>> f, b = torch.zeros(3, 1, 1), torch.arange(3.).view(3, 1, 1)
    >>> merge_directions(f, b, torch.tensor([2]))[:, 0, 1]
    tensor([1., 0., 2.])
    """
    T, B, H = forward_out.shape
    index = _reversal_index(lengths, T, time_dim=0)
    merged = _MergeDirections.apply(forward_out.reshape(T * B, H), backward_out.reshape(T * B, H), index)
    return merged.view(T, B, 2 * H)


def backward_scan(step: Callable[[int, State], State], last: State, lengths: torch.Tensor) -> State:
    """Run a backward (smoothing) recursion that starts at each sequence's own last real frame.

    ``last`` holds, for every frame, the value the recursion takes at a sequence's last frame
    (e.g. ``gamma_T = alpha_T``); tensors are ``(B, T, H)``. ``step(t, next_values)`` returns the
    values at frame ``t`` from those at ``t + 1``. Frames at or after ``lengths - 1`` keep ``last``,
    so a padded batch gives each sequence exactly what it would get alone.
    """
    T = last[0].size(1)
    current = tuple(v[:, T - 1] for v in last)
    outputs = [current]
    for t in range(T - 2, -1, -1):
        candidate = step(t, current)
        at_end = (lengths - 1 <= t)[:, None]  # (B, 1): frame t is the last real frame or padding
        current = tuple(torch.where(at_end, v[:, t], c) for v, c in zip(last, candidate))
        outputs.append(current)
    outputs.reverse()
    return tuple(torch.stack(v, dim=1) for v in zip(*outputs))


def orthogonal_blocks_(weight: torch.Tensor, hidden_size: int) -> None:
    """Orthogonal initialisation of each ``(H, H)`` block of a recurrent matrix ``(G*H, H)``."""
    with torch.no_grad():
        for block in weight.split(hidden_size, dim=0):
            nn.init.orthogonal_(block)


# --------------------------------------------------------------------------- cells
class Cell(nn.Module):
    """One direction of a recurrent unit.

    Subclasses set ``num_gates`` (the input projection is ``num_gates * H`` wide) and define
    ``initial_state`` and ``step``; units with a backward recursion also define ``finish``.
    The time loop is written once, here.
    """

    num_gates = 1
    # True when the unit computes probabilities that `posteriors()` can return.
    has_posteriors = False
    # "fast": the cell's fast path where it has one, else the reference loop; see set_implementation.
    implementation = "fast"
    # Option settings besides the defaults (keyword arguments of __init__) that the tests sweep over.
    variants: tuple[dict, ...] = ()
    # True when a stack's first layer alone takes the options (keyword arguments of __init__) a config sets and
    # the later layers keep their defaults (fusionrnn: the microphones its first layer's input holds).
    options_first_layer_only = False
    # Whether the output at frame t depends on the frames up to t only, so that a sequence can be run
    # chunk by chunk (:meth:`stream`): a unit with a backward recursion in ``finish`` is not.
    causal = True

    def __init__(self, hidden_size: int):
        super().__init__()
        self.hidden_size = hidden_size

    @classmethod
    def smallest_input(cls, options: dict) -> int:
        """An input width a layer of this cell with ``options`` (keyword arguments of ``__init__``) reads."""
        return 1

    def initial_state(self, proj: torch.Tensor) -> State:
        raise NotImplementedError

    def step(self, proj_t: torch.Tensor, state: State) -> tuple[State, State]:
        """One time step: ``proj_t`` is ``(B, G*H)``; returns ``(emitted, new_state)``."""
        raise NotImplementedError

    def finish(self, proj: torch.Tensor, emitted: State, lengths: torch.Tensor):
        """Turn the stacked emissions ``(B, T, H)`` into ``(output, probabilities or None)``."""
        return emitted[0], None

    def probabilities(self, output: torch.Tensor, probabilities: Optional[torch.Tensor]) -> torch.Tensor:
        """What ``posteriors()`` returns, from the two results of :meth:`finish`. A unit whose
        probabilities follow from its output in one pass leaves them ``None`` there and forms them here,
        only when asked: training never pays for them."""
        return probabilities

    def forward(self, proj: torch.Tensor, lengths: torch.Tensor):
        if self.implementation == "fast":
            result = self.fast_forward(proj, lengths)
            if result is not None:
                return result
        return self.reference_forward(proj, lengths)

    def fast_forward(self, proj: torch.Tensor, lengths: torch.Tensor):
        """The same function as :meth:`reference_forward` with a hand-written backward pass
        (``models/fast/``), or ``None`` where this cell or its options have none."""
        return None

    def reference_forward(self, proj: torch.Tensor, lengths: torch.Tensor):
        """The straightforward time loop with autograd: the reference the fast paths are tested against."""
        stacked, _ = self.scan(proj, self.initial_state(proj))
        return self.finish(proj, stacked, lengths)

    def scan(self, proj: torch.Tensor, state: State) -> tuple[State, State]:
        """The forward recursion over ``proj`` ``(B, T, G*H)`` from ``state``: the emissions stacked over
        time, ``(B, T, ...)`` each, and the state after the last frame."""
        emitted = []
        for t in range(proj.size(1)):
            out, state = self.step(proj[:, t], state)
            emitted.append(out)
        return tuple(torch.stack(e, dim=1) for e in zip(*emitted)), state

    def stream(self, proj: torch.Tensor, state: Optional[State]):
        """One chunk of sequences run chunk by chunk: ``proj`` ``(B, T, G*H)`` follows the chunk that left
        ``state`` (``None``: the sequences start here). Returns ``((output, probabilities), state)``, the
        output being what :meth:`forward` gives for these frames of the whole sequences. The reference
        loop runs (the fast paths start from the initial state); a unit that is not :attr:`causal` is refused.
        """
        if not self.causal:
            raise ValueError(f"{type(self).__name__} ({self.extra_repr()}) has a backward recursion: each output "
                             "depends on the frames after it, so it cannot run chunk by chunk")
        stacked, state = self.scan(proj, self.initial_state(proj) if state is None else state)
        return self.finish(proj, stacked, _full_lengths(proj)), state

    def extra_repr(self) -> str:
        return f"hidden_size={self.hidden_size}"


class RecurrentMatrixCell(Cell):
    """A cell with one recurrent matrix ``U`` of shape ``(G*H, H)``, orthogonally initialised per gate."""

    recurrent_bias = False

    def __init__(self, hidden_size: int):
        super().__init__(hidden_size)
        self.recurrent = nn.Linear(hidden_size, self.num_gates * hidden_size, bias=self.recurrent_bias)
        orthogonal_blocks_(self.recurrent.weight, hidden_size)

    def initial_state(self, proj):
        return (proj.new_zeros(proj.size(0), self.hidden_size),)


IMPLEMENTATIONS = ("fast", "reference")


def set_implementation(module: nn.Module, implementation: str) -> nn.Module:
    """Make every cell in ``module`` run its fast path (``"fast"``, the default) or the reference loop."""
    if implementation not in IMPLEMENTATIONS:
        raise ValueError(f"implementation must be one of {IMPLEMENTATIONS}, got {implementation!r}")
    for cell in module.modules():
        if isinstance(cell, Cell):
            cell.implementation = implementation
    return module


# --------------------------------------------------------------------------- layers
class RecurrentLayer(nn.Module):
    """A layer of recurrent units: dropout, projection, norm, one cell per direction.

    Args:
        cell_factory: builds one :class:`Cell` (called once per direction: untied weights).
        input_size: ``F``.
        hidden_size: ``H``.
        bidirectional: add a second cell reading each sequence reversed within its length.
        dropout: inverted dropout on the input, one mask per sequence shared over time.
        norm: ``None``, ``"batch"`` or ``"layer"`` on the feed-forward projections ``W x_t``
            (statistics over real frames only).

    Shapes: ``x`` ``(B, T, F)``, ``lengths`` ``(B,)`` -> ``(B, T, H)`` or ``(B, T, 2H)``.
    Padded output frames are zero.
    """

    def __init__(
        self,
        cell_factory: Callable[[], Cell],
        input_size: int,
        hidden_size: int,
        bidirectional: bool = False,
        dropout: float = 0.0,
        norm: Optional[str] = None,
    ):
        super().__init__()
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout}")
        if input_size < 1 or hidden_size < 1:
            raise ValueError(f"input_size and hidden_size must be positive, got {input_size} and {hidden_size}")
        self.input_size, self.hidden_size = input_size, hidden_size
        self.bidirectional, self.dropout = bool(bidirectional), float(dropout)
        self.num_directions = 2 if bidirectional else 1
        self.cells = nn.ModuleList(cell_factory() for _ in range(self.num_directions))
        width = self.num_directions * self.cells[0].num_gates * hidden_size
        # A norm has its own shift, which makes a projection bias redundant.
        self.proj = nn.Linear(input_size, width, bias=norm is None)
        self.norm = make_norm(norm, width, hidden_size)
        self.output_size = self.num_directions * hidden_size

    def forward(self, x: torch.Tensor, lengths) -> torch.Tensor:
        return self._run(x, lengths, posteriors=False)

    def stream(self, x: torch.Tensor, state=None) -> tuple[torch.Tensor, object]:
        """One chunk ``x`` ``(B, T, F)`` of sequences run chunk by chunk, in evaluation: ``state`` is what the
        previous chunk returned (``None`` for the first). Returns ``(B, T, H)``, the frames :meth:`forward`
        gives over the whole sequences, and the state for the next chunk. A bidirectional layer is refused.

        >>> import models
        >>> layer = models.build("libru", 3, 4).eval()
        >>> x = torch.randn(1, 6, 3)
        >>> first, state = layer.stream(x[:, :4])
        >>> second, _ = layer.stream(x[:, 4:], state)
        >>> torch.allclose(torch.cat([first, second], 1), layer(x, [6]), atol=1e-6)
        True
        """
        if self.training:
            raise ValueError("a layer streams in evaluation mode only (dropout and batch statistics would differ "
                             "from chunk to chunk)")
        if self.bidirectional:
            raise ValueError(f"a bidirectional {type(self.cells[0]).__name__} layer reads each sequence from its "
                             "end: it cannot run chunk by chunk")
        states = [state]
        out = self._run(x, _full_lengths(x), posteriors=False, states=states)
        return out, states[0]

    def posteriors(self, x: torch.Tensor, lengths) -> torch.Tensor:
        """The probabilities the unit computes (``h``, ``alpha`` or ``gamma``), ``(B, T, D*H)``."""
        if not self.cells[0].has_posteriors:
            raise TypeError(f"{type(self.cells[0]).__name__} computes no probabilities")
        return self._run(x, lengths, posteriors=True)

    def _run(self, x: torch.Tensor, lengths, posteriors: bool, states: Optional[list] = None):
        """The output or (``posteriors``) the probabilities: only the one asked for is reordered and
        concatenated. ``states``: one per direction, the cells run from them (:meth:`Cell.stream`) and
        they are replaced by the states after the last frame."""
        lengths, mask = check_inputs(x, lengths, self.input_size)
        if self.training and self.dropout > 0:
            keep = x.new_empty(x.size(0), 1, x.size(2)).bernoulli_(1 - self.dropout)  # (B, 1, F): one mask per sequence
            x = x * keep.div_(1 - self.dropout)  # scaled while small: one pass over x
        # Time-major inside, (T, B, ...): the fast paths run over time-major frames, so that a cell
        # gets contiguous memory without a copy, and the layer returns a (B, T, ...) view of
        # time-major memory, which the next layer's projection reads as it is.
        D, x = self.num_directions, x.transpose(0, 1).contiguous()  # (T, B, F): F is small, the copy cheap
        padded = has_padding(lengths, x.size(0))
        # The backward direction reads each sequence reversed within its length. Where the input is
        # narrower than a direction's projections (a first layer), the input is reversed and each
        # direction has its own product; otherwise both directions share one product, whose wider
        # rows keep the CPU's GEMM faster (models.fast.products), and the backward direction's columns
        # are reversed. Reversal only reorders real frames, so the norm's per-column statistics over
        # real frames are the same either way.
        real = mask.t() if padded else None  # (T, B)
        if D == 2 and self.input_size < self.proj.out_features // 2:
            weights = self.proj.weight.chunk(2)
            biases = self.proj.bias.chunk(2) if self.proj.bias is not None else (None, None)
            projs = [linear(reverse_padded(x, lengths, time_dim=0) if d else x, weights[d], biases[d]) for d in (0, 1)]
        else:
            projs = [linear(x, self.proj.weight, self.proj.bias)]  # (T, B, D*G*H)
        parts = len(projs)
        if self.norm is not None:
            projs = [self.norm(p, real, part=(d, parts)) for d, p in enumerate(projs)]
        if padded and not getattr(self.norm, "zeroes_padding", False):  # batch norm writes padding as 0 itself
            projs = [zero_padding(p, lengths) for p in projs]  # padding never reaches a recursion
        if D > parts:  # one product for both directions: split it, reverse the backward one's columns
            forward_part, backward_part = projs[0].chunk(2, dim=-1)
            projs = [forward_part, reverse_padded(backward_part, lengths, time_dim=0)]
        outputs = []
        for d, (cell, p) in enumerate(zip(self.cells, projs)):
            if states is None:
                out, prob = cell(p.transpose(0, 1), lengths)
            else:
                (out, prob), states[d] = cell.stream(p.transpose(0, 1), states[d])
            outputs.append((cell.probabilities(out, prob) if posteriors else out).transpose(0, 1))  # (T, B, H)
        out = outputs[0] if D == 1 else merge_directions(*outputs, lengths)
        if padded:
            out = zero_padding(out, lengths)
        return out.transpose(0, 1)

    def extra_repr(self) -> str:
        return f"bidirectional={self.bidirectional}, dropout={self.dropout}"


class RecurrentStack(nn.Module):
    """Layers applied in order; each takes the previous one's output.

    ``input_norm`` (``None``, ``"batch"``, ``"layer"``, ``"layer+batch"``: :class:`models.norm.InputNorm`)
    normalises the stack's input features before the first layer, batch-norm statistics over real frames.

    Shapes: ``x`` ``(B, T, F)``, ``lengths`` ``(B,)`` -> ``(B, T, layers[-1].output_size)``.

    >>> import models
    >>> stack = models.build_stack(["ligru", "ubru"], 40, [8, 6], bidirectional=[True, False])
    >>> stack(torch.randn(2, 5, 40), torch.tensor([5, 3])).shape
    torch.Size([2, 5, 6])
    """

    def __init__(self, layers: Sequence[nn.Module], input_norm: Optional[str] = None):
        super().__init__()
        if not layers:
            raise ValueError("a stack needs at least one layer")
        self.layers = nn.ModuleList(layers)
        self.input_size = layers[0].input_size
        self.output_size = layers[-1].output_size
        self.input_norm = None if input_norm is None else InputNorm(self.input_size, input_norm)

    def forward(self, x: torch.Tensor, lengths) -> torch.Tensor:
        if self.input_norm is not None:
            lengths, mask = check_inputs(x, lengths, self.input_size)
            x = self.input_norm(x, mask if has_padding(lengths, x.size(1)) else None)
        for layer in self.layers:
            x = layer(x, lengths)
        return x

    def stream(self, x: torch.Tensor, states: Optional[list] = None) -> tuple[torch.Tensor, list]:
        """One chunk ``(B, T, F)`` of sequences run chunk by chunk (see :meth:`RecurrentLayer.stream`):
        ``states``, one per layer, as the previous chunk returned them (``None`` for the first)."""
        states = list(states) if states is not None else [None] * len(self.layers)
        if self.input_norm is not None:  # frame by frame in evaluation: running statistics
            x = self.input_norm(x)
        for k, layer in enumerate(self.layers):
            x, states[k] = layer.stream(x, states[k])
        return x, states


def logit(p: float) -> float:
    """log(p / (1 - p)) for a Python float, used to initialise parameters stored as logits."""
    return math.log(p) - math.log1p(-p)


def log_sigmoid_pair(a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(log sigma(a), log(1 - sigma(a)))`` without forming ``1 - sigma(a)`` by subtraction.

    log sigma(a) = -softplus(-a) and log(1 - sigma(a)) = -softplus(a): both stay finite where sigma(a)
    rounds to 0 or 1, so neither log ever sees a 0.
    """
    return -F.softplus(-a), -F.softplus(a)


def per_layer(name: str, value, count: int) -> list:
    """``value`` for each of ``count`` layers: one value (or a one-item list) for all of them, or a list
    with one per layer. The one place where per-layer options are expanded, for ``models.build_stack``,
    ``models.build_conv_stack`` and for the configs (``bru_kaldi.network``).

    >>> per_layer("dropout", 0.2, 3), per_layer("dropout", [0.2], 2), per_layer("norm", [None, "batch"], 2)
    ([0.2, 0.2, 0.2], [0.2, 0.2], [None, 'batch'])
    """
    values = list(value) if isinstance(value, (list, tuple)) else [value]
    if len(values) == 1:
        values = values * count
    if len(values) != count:
        raise ValueError(f"{name}: expected 1 or {count} values (one per layer), got {len(values)}: {values}")
    return values

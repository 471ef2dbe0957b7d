"""The acoustic model: recurrent stacks, a senone (pdf) output, and an optional monophone output."""

from __future__ import annotations

from typing import Optional, Sequence, Union

import torch
from torch import nn

from models.fast.products import linear
from models.recurrent import RecurrentStack


class AcousticModel(nn.Module):
    """Stacks of recurrent layers applied in order, then linear outputs over senones (and monophones).

    The monophone head is the auxiliary task of pytorch-kaldi's multi-task recipes: it shares every
    recurrent layer and only adds its own output layer. ``xent_head`` adds a second senone output layer,
    ``"xent"``: the cross-entropy regularisation of LF-MMI training, whose own output (``"senone"``) is
    not a distribution over senones. ``mse_stack = k`` also returns the output of
    ``stacks[k]`` as ``"mse"``, what pytorch-kaldi's ``mse(out, fea)`` compares with a feature stream.
    ``num_senones = 0`` leaves the senone output out (an autoencoder trained by its mse alone), and
    ``feature_stack = k`` returns the output of ``stacks[k]`` as ``"features"`` (its code, what forward writes).

    ``frame_subsampling_factor = f`` gives the outputs at ``1 / f`` of the input's frame rate, as Kaldi's chain
    models (``f = 3``): output frame ``t`` is input frame ``f t + frame_shift`` (``forward``'s argument, ``0 <=
    frame_shift < f``: training shifts it from one pass over the data to the next), ``ceil((T - frame_shift) /
    f)`` of them (:meth:`output_lengths`). ``frame_subsampling = "output"`` runs the stacks at the full rate
    and keeps every ``f``-th output frame; ``"splice"`` puts ``f`` consecutive input frames side by side (the
    first stack's input is ``f`` times as wide; a last, partial group is completed with zeros) and runs the
    stacks at ``1 / f`` of the rate, ``f`` times fewer recurrent steps.

    By default each stack reads the one before (the first, ``x``) and the outputs read the last. ``sources``
    wires a graph instead (pytorch-kaldi's ``concatenate`` of streams and of architectures' outputs): one list
    per stack, then one for the output layers, of what each reads, concatenated per frame in that order:
    ``slice(a, b)``, columns of ``x`` (a feature stream), or ``j``, the output of stack ``j`` (before it); the
    model's ``input_size`` (the width of ``x``) is then given.

    Shapes: ``x`` ``(B, T, F)``, ``lengths`` ``(B,)`` -> dict of logits, ``"senone"`` ``(B, T, num_senones)``
    and, when ``num_mono`` is set, ``"mono"`` ``(B, T, num_mono)``; with ``mse_stack``, ``"mse"``
    ``(B, T, stacks[mse_stack].output_size)``.

    >>> import models
    >>> stack = models.build_stack("libru", 13, [8, 8])
    >>> net = AcousticModel([stack], num_senones=20, num_mono=5)
    >>> out = net(torch.randn(2, 7, 13), torch.tensor([7, 4]))
    >>> out["senone"].shape, out["mono"].shape
    (torch.Size([2, 7, 20]), torch.Size([2, 7, 5]))
    >>> a, b = models.build_stack("mlp", 10, [4]), models.build_stack("gru", 3, [5])  # x: 10 then 3 columns
    >>> c = models.build_stack("mlp", 9, [6])  # reads a and b
    >>> net = AcousticModel([a, b, c], 20, sources=[[slice(0, 10)], [slice(10, 13)], [0, 1], [2]], input_size=13)
    >>> net(torch.randn(2, 7, 13), torch.tensor([7, 4]))["senone"].shape
    torch.Size([2, 7, 20])
    >>> net = AcousticModel([models.build_stack("gru", 39, [8])], 20, frame_subsampling_factor=3,
    ...                     frame_subsampling="splice")  # 3 frames of 13 side by side
    >>> net(torch.randn(2, 7, 13), torch.tensor([7, 4]), frame_shift=1)["senone"].shape, net.input_size
    (torch.Size([2, 2, 20]), 13)
    >>> enc, dec = models.build_stack("mlp", 13, [4]), models.build_stack("mlp", 4, [13])  # an autoencoder
    >>> out = AcousticModel([enc, dec], 0, mse_stack=1, feature_stack=0)(torch.randn(2, 7, 13), torch.tensor([7, 4]))
    >>> sorted(out), out["features"].shape
    (['features', 'mse'], torch.Size([2, 7, 4]))
    """

    def __init__(self, stacks: Sequence[RecurrentStack], num_senones: int, num_mono: Optional[int] = None,
                 mse_stack: Optional[int] = None, xent_head: bool = False,
                 sources: Optional[Sequence[Sequence[Union[int, slice]]]] = None, input_size: Optional[int] = None,
                 feature_stack: Optional[int] = None, frame_subsampling_factor: int = 1,
                 frame_subsampling: str = "output"):
        super().__init__()
        if frame_subsampling_factor < 1 or frame_subsampling not in ("output", "splice"):
            raise ValueError(f"frame_subsampling_factor must be >= 1 and frame_subsampling output or splice, got "
                             f"{frame_subsampling_factor} and {frame_subsampling!r}")
        splice = frame_subsampling_factor > 1 and frame_subsampling == "splice"
        if splice and (sources is not None or stacks[0].input_size % frame_subsampling_factor):
            raise ValueError(f"frame_subsampling = splice needs the default wiring (no sources) and a first stack "
                             f"whose input size, {stacks[0].input_size}, is {frame_subsampling_factor} frames' worth")
        if frame_subsampling_factor > 1 and (mse_stack is not None or feature_stack is not None):
            raise ValueError("frame subsampling is for the senone outputs of a chain model: no mse or features output")
        self.frame_subsampling_factor, self.splice = frame_subsampling_factor, splice
        if not stacks:
            raise ValueError("an acoustic model needs at least one stack of layers")
        if mse_stack is not None and not 0 <= mse_stack < len(stacks):
            raise ValueError(f"mse_stack must index one of the {len(stacks)} stacks, got {mse_stack}")
        if feature_stack is not None and not 0 <= feature_stack < len(stacks):
            raise ValueError(f"feature_stack must index one of the {len(stacks)} stacks, got {feature_stack}")
        if not num_senones and (num_mono or xent_head or mse_stack is None):
            raise ValueError("a model without a senone output (num_senones = 0) is trained by its mse output alone")
        self.mse_stack, self.feature_stack = mse_stack, feature_stack
        if sources is None:
            for before, after in zip(stacks, stacks[1:]):
                if before.output_size != after.input_size:
                    raise ValueError(f"a stack of output size {before.output_size} feeds one of input size {after.input_size}")
            width = stacks[-1].output_size
            self.input_size = stacks[0].input_size // (frame_subsampling_factor if splice else 1)
        else:
            if input_size is None or len(sources) != len(stacks) + 1:
                raise ValueError(f"sources needs input_size and one list per stack and one for the outputs "
                                 f"({len(stacks) + 1}), got {len(sources)}")
            self.input_size = input_size
            widths = [self._width(items, k, stacks, input_size) for k, items in enumerate(sources)]
            for k, stack in enumerate(stacks):
                if widths[k] != stack.input_size:
                    raise ValueError(f"stack {k} has input size {stack.input_size} but reads {widths[k]} values "
                                     f"per frame ({list(sources[k])})")
            width = widths[-1]
        self.sources = None if sources is None else [list(items) for items in sources]
        self.stacks = nn.ModuleList(stacks)
        self.senone = nn.Linear(width, num_senones) if num_senones else None
        self.mono = nn.Linear(width, num_mono) if num_mono else None
        self.xent = nn.Linear(width, num_senones) if xent_head else None

    @staticmethod
    def _width(items, k: int, stacks, input_size: int) -> int:
        """Values per frame of what reader ``k`` (a stack, or ``len(stacks)``: the outputs) concatenates."""
        if not items:
            raise ValueError(f"reader {k} of the sources reads nothing")
        width = 0
        for item in items:
            if isinstance(item, slice):
                if not 0 <= item.start < item.stop <= input_size or item.step not in (None, 1):
                    raise ValueError(f"reader {k}: columns {item} are not a range of the {input_size} of the input")
                width += item.stop - item.start
            elif isinstance(item, int) and 0 <= item < k:
                width += stacks[item].output_size
            else:
                raise ValueError(f"reader {k}: {item!r} is neither a slice of the input nor a stack before it")
        return width

    @staticmethod
    def _gather(x: torch.Tensor, outs: list, items) -> torch.Tensor:
        parts = [x[..., item] if isinstance(item, slice) else outs[item] for item in items]
        return parts[0] if len(parts) == 1 else torch.cat(parts, dim=-1)

    def output_lengths(self, lengths: torch.Tensor, frame_shift: int = 0) -> torch.Tensor:
        """``(B,)`` output frames of utterances of ``lengths`` input frames: ``ceil((T - frame_shift) / f)``.

        >>> import models
        >>> AcousticModel([models.build_stack("gru", 4, [3])], 5, frame_subsampling_factor=3).output_lengths(
        ...     torch.tensor([7, 6, 1]), frame_shift=1).tolist()
        [2, 2, 0]
        """
        f = self.frame_subsampling_factor
        return torch.div(lengths - frame_shift + f - 1, f, rounding_mode="floor").clamp(min=0)

    def forward(self, x: torch.Tensor, lengths, frame_shift: int = 0) -> dict[str, torch.Tensor]:
        f = self.frame_subsampling_factor
        if not 0 <= frame_shift < f:
            raise ValueError(f"frame_shift must lie in [0, {f}), got {frame_shift}")
        if self.splice:  # (B, T, F) -> (B, T', f F): frames f t + shift .. f t + shift + f - 1 side by side
            x = x[:, frame_shift:]
            frames = -(-x.shape[1] // f)
            x = torch.nn.functional.pad(x, (0, 0, 0, frames * f - x.shape[1])).reshape(x.shape[0], frames, -1)
            lengths = self.output_lengths(torch.as_tensor(lengths), frame_shift)
        kept = slice(frame_shift, None, f) if f > 1 and not self.splice else slice(None)
        return self._outputs(x, lambda index, stack, inputs: stack(inputs, lengths), kept)

    def stream(self, x: torch.Tensor, states: Optional[list] = None) -> tuple[dict[str, torch.Tensor], list]:
        """One chunk ``x`` ``(B, T, F)`` of sequences run chunk by chunk, in evaluation: the outputs
        :meth:`forward` gives for these frames of the whole sequences, and the states (one per stack) to
        pass with the next chunk (``None`` for the first). Each stack carries its layers' recurrent states;
        a stack that reads the future (bidirectional, a backward recursion) raises ``ValueError``. The outputs
        are those of every frame: with frame subsampling (``frame_subsampling = "output"``), the caller keeps
        every ``f``-th, counting from the sequence's first frame; a model of spliced frames does not stream.

        >>> import models
        >>> net = AcousticModel([models.build_stack("libru", 13, [8, 8])], num_senones=20).eval()
        >>> x = torch.randn(1, 9, 13)
        >>> first, states = net.stream(x[:, :5])
        >>> second, _ = net.stream(x[:, 5:], states)
        >>> torch.allclose(torch.cat([first["senone"], second["senone"]], 1), net(x, [9])["senone"], atol=1e-5)
        True
        """
        if self.splice:
            raise ValueError("a model trained on spliced frames (frame_subsampling = splice) does not stream: its "
                             "outputs need whole groups of frames")
        states = list(states) if states is not None else [None] * len(self.stacks)

        def run(index, stack, inputs):
            out, states[index] = stack.stream(inputs, states[index])
            return out

        return self._outputs(x, run, slice(None)), states

    def _outputs(self, x: torch.Tensor, run, kept: slice) -> dict[str, torch.Tensor]:
        """The outputs, each stack run by ``run(index, stack, inputs)`` (on whole sequences or on a chunk), the
        heads on the output frames ``kept`` of the last stack's (every frame, or every f-th from the shift)."""
        out, outs = {}, []
        for index, stack in enumerate(self.stacks):
            if self.sources is None:
                outs.append(run(index, stack, outs[-1] if outs else x))
            else:
                outs.append(run(index, stack, self._gather(x, outs, self.sources[index])))
            if index == self.mse_stack:
                out["mse"] = outs[-1]
            if index == self.feature_stack:
                out["features"] = outs[-1]
        if self.senone is None:
            return out
        x = outs[-1] if self.sources is None else self._gather(x, outs, self.sources[-1])
        x = x[:, kept]  # (B, T, H) -> (B, T', H): with frame subsampling, every f-th frame from the shift
        # The heads' products in aligned rows on the CPU (models.fast.products): their input gradient is
        # as wide as the last layer, 1100 floats for 550 units both ways, the width that slows GEMM.
        out["senone"] = linear(x, self.senone.weight, self.senone.bias)
        if self.mono is not None:
            out["mono"] = linear(x, self.mono.weight, self.mono.bias)
        if self.xent is not None:
            out["xent"] = linear(x, self.xent.weight, self.xent.bias)
        return out

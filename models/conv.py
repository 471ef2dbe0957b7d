"""Frame-wise convolutional stacks: pytorch-kaldi's ``CNN`` and ``SincNet`` architectures.

Neither is a recurrence. Each frame's input vector (a spliced context window of features, or a window
of raw samples) is read as a one-channel 1-D signal of ``F`` values, and every layer computes, in
pytorch-kaldi's order (its neural_networks.py ``CNN.forward``)::

    conv1d (valid, stride 1) -> max-pool (width P, stride P) -> layer norm | batch norm | none
    -> activation -> dropout

The last layer's ``(C, L)`` map is flattened channel-major (``c * L + l``) into the frame's output. A
layer maps length ``L_in`` to ``floor((L_in - K + 1) / P)``. ``SincNet``'s first layer is a bank of
band-pass filters (:class:`SincConv`, Ravanelli & Bengio, "Speaker recognition from raw waveform with
SincNet", SLT 2018, eq. 3-5) whose two cut-offs are the only weights; the layers after it are plain
convolutions.

Norms, as pytorch-kaldi computes them: ``layer`` is its ``LayerNorm([C, L])``, which normalises each
channel over its ``L`` positions (mean, *unbiased* std + 1e-6) with a gain and shift per ``(c, l)``
(:class:`ChannelLayerNorm`); ``batch`` normalises each channel over every real frame and position
(:class:`models.norm.MaskedBatchNorm`, eps 1e-5: pytorch-kaldi passes the pooled length as
``BatchNorm1d``'s second positional argument, which is its eps; cfg/README.md says so).

Only real frames are computed: padded frames are left out (batch-norm statistics included) and come
out as zeros. Layout: ``x`` ``(B, T, F)``, ``lengths`` ``(B,)`` -> ``(B, T, C_last * L_last)``.

>>> stack = build_conv_stack("cnn", 40, [4, 3], kernel_sizes=[5, 3], pool_sizes=[2, 1], norm="layer")
>>> [layer.output_length for layer in stack.layers], stack.output_size
([18, 16], 48)
>>> stack(torch.randn(2, 5, 40), torch.tensor([5, 3])).shape
torch.Size([2, 5, 48])
"""

from __future__ import annotations

import inspect
import math
from typing import Optional, Sequence, Union

import torch
from torch import nn
from torch.nn import functional as F

from models.gated import ACTIVATIONS
from models.norm import INPUT_NORMS, InputNorm, MaskedBatchNorm
from models.recurrent import check_inputs, has_padding, per_layer

CONV_UNITS = ("cnn", "sincnet")
CONV_NORMS = (None, "batch", "layer")
# input: inverted dropout on each layer's input, one mask per sequence (as the recurrent layers);
# output: pytorch-kaldi's nn.Dropout after each layer's activation, per value of each frame, inverted
CONV_DROPOUT_PLACES = ("input", "output")


def mel(hz):
    """The mel scale pytorch-kaldi's SincConv spaces its filters on: ``2595 log10(1 + hz / 700)``."""
    return 2595.0 * math.log10(1.0 + hz / 700.0)


def mel_to_hz(m):
    """The inverse of :func:`mel`."""
    return 700.0 * (10.0 ** (m / 2595.0) - 1.0)


class SincConv(nn.Module):
    """A bank of learned band-pass sinc filters applied to a one-channel signal (no bias, valid, stride 1).

    Filter ``c`` passes ``[f1, f2]`` (in cycles per sample, SincNet eq. 3-5)::

        f1 = min_low_hz / sr + |low_c|,   f2 = f1 + min_band_hz / sr + |band_c|
        g[n] = 2 f2 sinc(2 pi f2 n) - 2 f1 sinc(2 pi f1 n),   n = -(K-1)/2 .. (K-1)/2,  sinc(x) = sin(x) / x
        h[n] = g[n] / max_n g[n] * hamming[n]

    ``low`` and ``band`` ``(C,)`` are the only weights; they start with the cut-offs of ``C`` bands equally
    spaced on the mel scale from 30 Hz to ``sr / 2 - (min_low_hz + min_band_hz)``. The window is the
    symmetric Hamming window ``0.54 - 0.46 cos(2 pi i / (K - 1))``. An even ``kernel_size`` becomes
    ``kernel_size + 1`` (the filters are symmetric about their centre tap), as pytorch-kaldi's.
    This is pytorch-kaldi's ``SincConv`` (what its ``SincNet`` uses), not ``SincConv_fast``, whose weights are
    in Hz and whose filters are scaled otherwise.

    Shapes: ``(N, 1, L)`` -> ``(N, C, L - K + 1)``.

    >>> sinc = SincConv(8, 33, sample_rate=16000)
    >>> sinc.filters().shape, sinc(torch.randn(2, 1, 100)).shape
    (torch.Size([8, 1, 33]), torch.Size([2, 8, 68]))
    """

    def __init__(self, out_channels: int, kernel_size: int, sample_rate: float = 16000, min_low_hz: float = 50,
                 min_band_hz: float = 50):
        super().__init__()
        if out_channels < 1 or kernel_size < 1:
            raise ValueError(f"out_channels and kernel_size must be positive, got {out_channels} and {kernel_size}")
        if sample_rate <= 0 or min_low_hz < 0 or min_band_hz < 0:
            raise ValueError(f"sample_rate must be positive and min_low_hz, min_band_hz >= 0, got {sample_rate}, "
                             f"{min_low_hz}, {min_band_hz}")
        top = sample_rate / 2 - (min_low_hz + min_band_hz)
        if top <= 30:
            raise ValueError(f"sample_rate / 2 - (min_low_hz + min_band_hz) = {top} Hz leaves no band above 30 Hz "
                             f"for the filters' initial cut-offs")
        self.out_channels = out_channels
        self.kernel_size = kernel_size + 1 if kernel_size % 2 == 0 else kernel_size
        self.sample_rate, self.min_low_hz, self.min_band_hz = float(sample_rate), float(min_low_hz), float(min_band_hz)
        step = (mel(top) - mel(30.0)) / out_channels
        edges = torch.tensor([mel_to_hz(mel(30.0) + i * step) for i in range(out_channels + 1)], dtype=torch.float64)
        edges = edges / self.sample_rate  # cycles per sample
        self.low = nn.Parameter(edges[:-1].to(torch.get_default_dtype()))
        self.band = nn.Parameter(edges.diff().to(torch.get_default_dtype()))

    def cutoffs(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(f1, f2)``, each ``(C,)``, in cycles per sample."""
        f1 = self.min_low_hz / self.sample_rate + self.low.abs()
        return f1, f1 + self.min_band_hz / self.sample_rate + self.band.abs()

    def filters(self) -> torch.Tensor:
        """The filters ``h``, ``(C, 1, K)``."""
        f1, f2 = self.cutoffs()
        # the taps and the window in the weights' own precision (K values: no buffer to keep in step)
        taps = torch.arange(1, (self.kernel_size - 1) // 2 + 1, dtype=f1.dtype, device=f1.device)
        window = torch.hamming_window(self.kernel_size, periodic=False, dtype=f1.dtype, device=f1.device)
        # 2 f sinc(2 pi f n) = sin(2 pi f n) / (pi n) for n != 0, and 2 f at n = 0; one side, then mirrored,
        # so that no tap divides 0 by 0
        side = (torch.sin(2 * math.pi * f2[:, None] * taps) - torch.sin(2 * math.pi * f1[:, None] * taps)) / (math.pi * taps)
        centre = (2 * (f2 - f1))[:, None]
        band = torch.cat([side.flip(1), centre, side], dim=1)  # (C, K)
        band = band / band.max(dim=1, keepdim=True).values
        return (band * window).unsqueeze(1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.conv1d(x, self.filters().to(x.dtype))

    def extra_repr(self) -> str:
        return (f"{self.out_channels}, kernel_size={self.kernel_size}, sample_rate={self.sample_rate:g}, "
                f"min_low_hz={self.min_low_hz:g}, min_band_hz={self.min_band_hz:g}")


class ChannelLayerNorm(nn.Module):
    """pytorch-kaldi's ``LayerNorm([C, L])`` of a convolution's output: each channel normalised over its
    ``L`` positions, ``gamma (x - mean) / (std + 1e-6) + beta`` with the *unbiased* std and ``gamma``,
    ``beta`` of shape ``(C, L)``.

    Shapes: ``(N, C, L)``, ``L >= 2`` -> ``(N, C, L)``.

    >>> ChannelLayerNorm(3, 5)(torch.randn(2, 3, 5)).shape
    torch.Size([2, 3, 5])
    """

    def __init__(self, channels: int, length: int, eps: float = 1e-6):
        super().__init__()
        if length < 2:
            raise ValueError(f"a layer norm over {length} position has no unbiased standard deviation; "
                             f"it needs an output length of at least 2")
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(channels, length))
        self.bias = nn.Parameter(torch.zeros(channels, length))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mean = x.mean(-1, keepdim=True)
        return self.weight * (x - mean) / (x.std(-1, keepdim=True) + self.eps) + self.bias


class ConvLayer(nn.Module):
    """One layer: convolution (``torch.nn.Conv1d`` with bias, or :class:`SincConv`), max-pool, norm,
    activation, dropout (see the module docstring).

    ``input_size`` / ``output_size`` are the flattened widths ``C_in * L_in`` / ``C * L``.

    Shapes: ``x`` ``(N, C_in, L_in)`` frames, ``seq`` ``(N,)`` the sequence of each frame (for the
    ``input`` dropout's one mask per sequence) -> ``(N, C, L)``.

    >>> layer = ConvLayer(1, 20, 4, 5, pool_size=2, norm="batch")
    >>> layer(torch.randn(6, 1, 20), torch.zeros(6, dtype=torch.long)).shape
    torch.Size([6, 4, 8])
    """

    def __init__(self, in_channels: int, in_length: int, filters: int, kernel_size: int, pool_size: int = 1,
                 norm: Optional[str] = None, activation: str = "relu", dropout: float = 0.0,
                 dropout_at: str = "output", sinc: Optional[dict] = None):
        super().__init__()
        if filters < 1 or kernel_size < 1 or pool_size < 1:
            raise ValueError(f"filters, kernel_size and pool_size must be positive, got {filters}, {kernel_size}, {pool_size}")
        if norm not in CONV_NORMS:
            raise ValueError(f"norm must be one of {CONV_NORMS}, got {norm!r}")
        if activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {sorted(ACTIVATIONS)}, got {activation!r}")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout}")
        if dropout_at not in CONV_DROPOUT_PLACES:
            raise ValueError(f"dropout_at must be one of {CONV_DROPOUT_PLACES}, got {dropout_at!r}")
        if sinc is not None:
            if in_channels != 1:
                raise ValueError(f"a sinc layer reads one channel, got {in_channels}")
            self.conv = SincConv(filters, kernel_size, **sinc)
            kernel_size = self.conv.kernel_size  # made odd
        else:
            self.conv = nn.Conv1d(in_channels, filters, kernel_size)  # torch's initialisation, as pytorch-kaldi
        conv_length = in_length - kernel_size + 1
        if conv_length // pool_size < 1:
            raise ValueError(f"an input of {in_length} values per channel is too short for kernel_size {kernel_size} "
                             f"and pool_size {pool_size} (it needs at least {kernel_size + pool_size - 1})")
        self.in_channels, self.in_length = in_channels, in_length
        self.channels, self.output_length = filters, conv_length // pool_size
        self.input_size, self.output_size = in_channels * in_length, filters * self.output_length
        self.pool_size, self.norm_kind, self.activation = pool_size, norm, activation
        self.dropout, self.dropout_at = float(dropout), dropout_at
        self.norm = (ChannelLayerNorm(filters, self.output_length) if norm == "layer"
                     else MaskedBatchNorm(filters, momentum=0.05) if norm == "batch" else None)

    def forward(self, x: torch.Tensor, seq: torch.Tensor) -> torch.Tensor:
        if self.training and self.dropout > 0 and self.dropout_at == "input":
            keep = x.new_empty(int(seq.max()) + 1, *x.shape[1:]).bernoulli_(1 - self.dropout)  # (B, C_in, L_in)
            x = x * keep[seq] / (1 - self.dropout)
        h = self.conv(x)  # (N, C, L_in - K + 1)
        if self.pool_size > 1:
            h = F.max_pool1d(h, self.pool_size)  # (N, C, L): floor, the tail that fills no window is dropped
        if self.norm_kind == "layer":
            h = self.norm(h)
        elif self.norm_kind == "batch":
            h = self.norm(h.transpose(1, 2)).transpose(1, 2)  # (N, L, C): statistics per channel over N and L
        h = ACTIVATIONS[self.activation](h)
        if self.dropout_at == "output":
            h = F.dropout(h, self.dropout, self.training)
        return h

    def extra_repr(self) -> str:
        return (f"length {self.in_length} -> {self.output_length}, pool_size={self.pool_size}, norm={self.norm_kind}, "
                f"activation={self.activation}, dropout={self.dropout} at {self.dropout_at}")


class ConvStack(nn.Module):
    """Frame-wise convolutional layers over each frame's ``F`` values (one channel), flattened.

    ``input_norm`` (``None``, ``"batch"``, ``"layer"``, ``"layer+batch"``: :class:`models.norm.InputNorm`)
    normalises each frame's input first, as pytorch-kaldi's ``cnn_use_laynorm_inp`` / ``_batchnorm_inp``.

    Shapes: ``x`` ``(B, T, F)``, ``lengths`` ``(B,)`` -> ``(B, T, output_size)``, zeros on padded frames.

    >>> stack = ConvStack([ConvLayer(1, 12, 2, 3)], input_norm="layer")
    >>> stack(torch.randn(2, 4, 12), torch.tensor([4, 1]))[1, 1:].abs().sum().item()
    0.0
    """

    def __init__(self, layers: Sequence[ConvLayer], input_norm: Optional[str] = None):
        super().__init__()
        if not layers:
            raise ValueError("a stack needs at least one layer")
        if input_norm not in INPUT_NORMS:
            raise ValueError(f"input_norm must be one of {INPUT_NORMS}, got {input_norm!r}")
        if layers[0].in_channels != 1:
            raise ValueError(f"the first layer reads each frame as one channel, got in_channels={layers[0].in_channels}")
        for before, after in zip(layers, layers[1:]):
            if (before.channels, before.output_length) != (after.in_channels, after.in_length):
                raise ValueError(f"a layer with output (channels, length) ({before.channels}, {before.output_length}) "
                                 f"feeds one that reads ({after.in_channels}, {after.in_length})")
        self.layers = nn.ModuleList(layers)
        self.input_size = layers[0].in_length
        self.output_size = layers[-1].output_size
        self.input_norm = None if input_norm is None else InputNorm(self.input_size, input_norm)

    def forward(self, x: torch.Tensor, lengths) -> torch.Tensor:
        lengths, mask = check_inputs(x, lengths, self.input_size)
        B, T, _ = x.shape
        padded = has_padding(lengths, T)
        # the real frames only, (N, F): padding costs no work and never enters a batch-norm statistic
        frames = x[mask] if padded else x.reshape(B * T, -1)
        seq = torch.arange(B, device=x.device).repeat_interleave(lengths if padded else torch.full_like(lengths, T))
        if self.input_norm is not None:
            frames = self.input_norm(frames)
        h = frames.unsqueeze(1)  # (N, 1, F): each frame a one-channel signal
        for layer in self.layers:
            h = layer(h, seq)
        h = h.flatten(1)  # (N, C * L), channel-major, as pytorch-kaldi's x.view(batch, -1)
        if not padded:
            return h.view(B, T, -1)
        return h.new_zeros(B, T, h.size(1)).masked_scatter(mask[..., None], h)

    def stream(self, x: torch.Tensor, state=None):
        """One chunk ``(B, T, F)`` of a stream: frame-wise, so nothing is carried (``state`` stays ``None``)."""
        if self.training:
            raise ValueError("a stack streams in evaluation mode only")
        return self(x, torch.full((x.size(0),), x.size(1), device=x.device)), None


# What build_conv_stack takes that every layer has (as a recurrent stack's layers): not a unit's option.
LAYER_PARAMETERS = ("dropout", "norm", "dropout_at", "input_norm")


def build_conv_stack(
    unit: str,
    input_size: int,
    sizes: Sequence[int],
    *,
    kernel_sizes: Union[int, Sequence[int]],
    pool_sizes: Union[int, Sequence[int]] = 1,
    dropout: Union[float, Sequence[float]] = 0.0,
    norm: Union[Optional[str], Sequence[Optional[str]]] = None,
    activation: Union[str, Sequence[str]] = "relu",
    dropout_at: str = "output",
    input_norm: Optional[str] = None,
    **sinc,
) -> ConvStack:
    """A ``cnn`` or ``sincnet`` stack over frames of ``input_size`` values: ``sizes`` filters per layer, and
    per layer (one value for all, or one each) ``kernel_sizes``, ``pool_sizes``, ``dropout``, ``norm``
    (``None``, ``"batch"``, ``"layer"``), ``activation`` (a name of ``models.gated.ACTIVATIONS``).
    ``sincnet``'s first layer is a :class:`SincConv`, and ``sinc`` its keyword arguments (``sample_rate``,
    ``min_low_hz``, ``min_band_hz`` in Hz); ``cnn`` takes none. :func:`conv_options` lists each unit's options.

    Shapes: ``(B, T, input_size)`` -> ``(B, T, output_size)``.

    >>> stack = build_conv_stack("sincnet", 400, [8, 4], kernel_sizes=[51, 5], pool_sizes=3, norm="layer")
    >>> stack.output_size, type(stack.layers[0].conv).__name__
    (148, 'SincConv')
    """
    if unit not in CONV_UNITS:
        raise ValueError(f"unknown convolutional unit {unit!r}; expected one of {', '.join(CONV_UNITS)}")
    wrong = sorted(set(sinc) - set(first_layer_options(unit)))
    if wrong:
        raise TypeError(f"{unit} takes no option {', '.join(wrong)}; its options: {', '.join(conv_options(unit))}")
    count = len(sizes)
    if count == 0:
        raise ValueError("sizes must name at least one layer (filters per layer)")
    kernels = per_layer("kernel_sizes", kernel_sizes, count)
    pools = per_layer("pool_sizes", pool_sizes, count)
    for name, widths in (("kernel_sizes", kernels), ("pool_sizes", pools)):
        if any(width < 1 for width in widths):
            raise ValueError(f"{name}: expected positive widths, got {widths}")
    dropouts = per_layer("dropout", dropout, count)
    norms = per_layer("norm", norm, count)
    activations = per_layer("activation", activation, count)
    channels, length, layers = 1, input_size, []
    for i in range(count):
        first_sinc = sinc if unit == "sincnet" and i == 0 else None
        try:
            layer = ConvLayer(channels, length, sizes[i], kernels[i], pools[i], norms[i], activations[i], dropouts[i],
                              dropout_at, first_sinc)
        except ValueError as error:
            raise ValueError(f"layer {i + 1} of {count}: {error}") from None
        layers.append(layer)
        channels, length = layer.channels, layer.output_length
    return ConvStack(layers, input_norm)


def conv_options(unit: str) -> dict[str, inspect.Parameter]:
    """The options of ``unit`` (``cnn`` or ``sincnet``) as the code declares them, name -> ``inspect.Parameter``:
    the keyword-only parameters of :func:`build_conv_stack` that are not every layer's (:data:`LAYER_PARAMETERS`),
    and for ``sincnet`` those of :class:`SincConv` after ``kernel_size`` (its first layer's only).

    >>> list(conv_options("cnn")), list(conv_options("sincnet"))[3:]
    (['kernel_sizes', 'pool_sizes', 'activation'], ['sample_rate', 'min_low_hz', 'min_band_hz'])
    """
    if unit not in CONV_UNITS:
        raise ValueError(f"unknown convolutional unit {unit!r}; expected one of {', '.join(CONV_UNITS)}")
    stack = inspect.signature(build_conv_stack, eval_str=True).parameters.values()
    options = {p.name: p for p in stack if p.kind is p.KEYWORD_ONLY and p.name not in LAYER_PARAMETERS}
    if unit == "sincnet":
        options.update(first_layer_options(unit))
    return options


def first_layer_options(unit: str) -> dict[str, inspect.Parameter]:
    """The options of ``unit`` that only its first layer takes: ``sincnet``'s :class:`SincConv` parameters."""
    if unit != "sincnet":
        return {}
    sinc = inspect.signature(SincConv.__init__, eval_str=True).parameters.values()
    return {p.name: p for p in sinc if p.name not in ("self", "out_channels", "kernel_size")}


def smallest_input(layers: Sequence[dict]) -> int:
    """An input width that a stack of ``len(layers)`` layers with these options (``kernel_sizes`` and
    ``pool_sizes`` per layer, one dict each) reads: from 2 values at the last layer's output (what a layer norm
    needs), back through each layer; for the check of a config's architectures before any data is read."""
    width = 2
    for options in reversed(layers):
        kernel, pool = options.get("kernel_sizes", 1), options.get("pool_sizes", 1)
        width = width * max(pool, 1) + max(kernel, 1)  # one more than needed: an even sinc kernel grows by one
    return width


__all__ = ["CONV_UNITS", "ChannelLayerNorm", "ConvLayer", "ConvStack", "SincConv", "build_conv_stack", "conv_options"]

"""``torch.nn.GRU`` / ``torch.nn.LSTM`` (cuDNN on GPUs, oneDNN on CPUs) behind our layer interface.

They are the speed baselines: same inputs, lengths and dropout as every other layer, but the
projection is fused inside the vendor kernel, so normalising the projections is not possible.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from models.recurrent import check_inputs


class VendorRNN(nn.Module):
    """A single ``nn.GRU`` or ``nn.LSTM`` layer taking ``(x, lengths)``.

    Shapes: ``x`` ``(B, T, F)``, ``lengths`` ``(B,)`` -> ``(B, T, H)`` or ``(B, T, 2H)``; padded frames are 0.

    >>> import models
    >>> models.build("cudnn_lstm", 3, 4, bidirectional=True)(torch.randn(2, 5, 3), [5, 2]).shape
    torch.Size([2, 5, 8])
    """

    KINDS = {"gru": nn.GRU, "lstm": nn.LSTM}

    def __init__(self, kind: str, input_size: int, hidden_size: int, bidirectional: bool = False,
                 dropout: float = 0.0, norm=None):
        super().__init__()
        if norm is not None:
            raise ValueError(f"cudnn_{kind} fuses its input projection: norm must be None, got {norm!r}")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout}")
        self.input_size, self.hidden_size = input_size, hidden_size
        self.dropout, self.bidirectional = float(dropout), bool(bidirectional)
        self.rnn = self.KINDS[kind](input_size, hidden_size, batch_first=True, bidirectional=bidirectional)
        for name, weight in self.rnn.named_parameters():
            if name.startswith("weight_hh"):
                for block in weight.data.split(hidden_size, dim=0):
                    nn.init.orthogonal_(block)
        self.output_size = hidden_size * (2 if bidirectional else 1)

    def forward(self, x: torch.Tensor, lengths) -> torch.Tensor:
        lengths, _ = check_inputs(x, lengths, self.input_size)
        if self.training and self.dropout > 0:
            keep = x.new_empty(x.size(0), 1, x.size(2)).bernoulli_(1 - self.dropout)  # one mask per sequence
            x = x * keep / (1 - self.dropout)
        packed = pack_padded_sequence(x, lengths.cpu(), batch_first=True, enforce_sorted=False)
        out, _ = self.rnn(packed)
        out, _ = pad_packed_sequence(out, batch_first=True, total_length=x.size(1))
        return out

    def stream(self, x: torch.Tensor, state=None):
        """One chunk ``(B, T, F)`` of sequences run chunk by chunk, in evaluation (as
        ``RecurrentLayer.stream``): ``state`` is the vendor's ``h`` (``(h, c)`` for the LSTM), or ``None``."""
        if self.training or self.bidirectional:
            raise ValueError(f"cudnn_{type(self.rnn).__name__.lower()} streams unidirectional and in evaluation only")
        return self.rnn(x, state)

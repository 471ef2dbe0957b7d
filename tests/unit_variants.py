"""Every unit and variant the tests sweep over, and small helpers shared by the model tests."""

import torch

import models

VARIANTS = [
    ("bru", {}),
    ("bru", {"form": "prob"}),
    ("libru", {}),
    ("libru", {"form": "prob"}),
    ("ubru", {}),
    ("ubru", {"backward": "kalman"}),
    ("ubru", {"backward": "hmm"}),
    ("ubru_tpami", {}),
    ("ubru_tpami", {"backward": "unit"}),
    ("ubru_tpami", {"input_gate": False}),
    ("lbru", {}),
    ("lbru", {"backward": "layer"}),
    ("lbru", {"input_gate": False}),
    ("ligru", {}),
    ("gru", {}),
    ("lstm", {}),
    ("mgu", {}),
    ("rnn", {}),
    ("rnn", {"activation": "relu"}),
    ("mlp", {}),
    ("cudnn_gru", {}),
    ("cudnn_lstm", {}),
]


def variant_id(variant):
    unit, options = variant
    return "-".join([unit] + [f"{k}={v}" for k, v in options.items()])


def directions(unit):
    return [False] if unit == "mlp" else [False, True]


def randomise_(layer, scale=0.5, seed=0):
    """Move every parameter away from its initial value, so that tests see all of them at work."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in layer.parameters():
            p.add_(torch.randn(p.shape, generator=generator, dtype=p.dtype) * scale)
    return layer


def make_layer(unit, options, input_size=3, hidden_size=4, bidirectional=False, dtype=torch.float32, seed=0):
    torch.manual_seed(seed)
    layer = models.build(unit, input_size, hidden_size, bidirectional=bidirectional, **options)
    return randomise_(layer.to(dtype), seed=seed).eval()

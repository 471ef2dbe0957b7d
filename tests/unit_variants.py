"""Every unit and variant the tests sweep over, and small helpers shared by the model tests."""

import torch

import models

# Every unit of the registry with its defaults and the settings its cell lists in `variants`: a new
# unit is swept by every test that uses this list without being named here.
VARIANTS = models.variants()


def has_fast_path(unit, options):
    """Whether the layer of ``unit`` with ``options`` runs a fast path (else the reference loop)."""
    if unit.startswith("cudnn_"):
        return False
    layer = models.build(unit, 3, 4, **options)
    return layer.cells[0].fast_forward(torch.zeros(1, 2, layer.proj.out_features), torch.tensor([2])) is not None


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


def copy_torch_rnn_weights_(ours, reference):
    """Give our ``gru``/``lstm`` layer the weights of a one-layer ``torch.nn.GRU``/``nn.LSTM`` (the same
    gate order and biases), direction by direction."""
    directions = ["", "_reverse"][:len(ours.cells)]
    with torch.no_grad():
        ours.proj.weight.copy_(torch.cat([getattr(reference, f"weight_ih_l0{d}") for d in directions]))
        ours.proj.bias.copy_(torch.cat([getattr(reference, f"bias_ih_l0{d}") for d in directions]))
        for cell, d in zip(ours.cells, directions):
            cell.recurrent.weight.copy_(getattr(reference, f"weight_hh_l0{d}"))
            cell.recurrent.bias.copy_(getattr(reference, f"bias_hh_l0{d}"))

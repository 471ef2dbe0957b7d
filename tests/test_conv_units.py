"""The frame-wise convolutional stacks (``models.conv``: ``cnn``, ``sincnet``, pytorch-kaldi's ``CNN`` and ``SincNet``):
against a float64 NumPy transcription of pytorch-kaldi's maths (direct convolution sums, max-pooling, its
per-channel layer norm, batch norm, hand-built sinc filters with NumPy's own sinc and Hamming window),
float64 gradcheck, padded frames; then the translation of its three TIMIT configs' architecture sections
(paraphrased here) and one CNN-on-fbank config trained and decoded on the tiny corpus.
"""

import re

import numpy as np
import pytest
import torch

from bru_kaldi.config import ConfigError, parse_config, parse_config_text
from bru_kaldi.network import build_model
from bru_kaldi.pytorch_kaldi.architectures import translate_architecture
from models.conv import ConvStack, SincConv, build_conv_stack
from tests.test_pytorch_kaldi_cfg import config, env, head, write  # noqa: F401 (env is a fixture)
from tests.test_run_exp import run


# --------------------------------------------------------------------------- the NumPy reference
def np_conv(x, w, b):
    """Valid cross-correlation, as a sum per output value: x (N, Ci, L), w (C, Ci, K), b (C,) or None."""
    N, Ci, L = x.shape
    C, _, K = w.shape
    out = np.zeros((N, C, L - K + 1))
    for n in range(N):
        for c in range(C):
            for j in range(L - K + 1):
                out[n, c, j] = sum(x[n, i, j + k] * w[c, i, k] for i in range(Ci) for k in range(K))
                out[n, c, j] += 0.0 if b is None else b[c]
    return out


def np_pool(h, p):
    L = h.shape[2] // p
    return np.stack([h[:, :, j * p:(j + 1) * p].max(axis=2) for j in range(L)], axis=2)


def np_layer_norm(h, gamma, beta):
    """pytorch-kaldi's LayerNorm([C, L]): per (frame, channel) over the L positions, unbiased std + 1e-6."""
    L = h.shape[-1]
    mean = h.sum(-1, keepdims=True) / L
    std = np.sqrt(((h - mean) ** 2).sum(-1, keepdims=True) / (L - 1))
    return gamma * (h - mean) / (std + 1e-6) + beta


def np_batch_norm(h, w, b, eps=1e-5):
    """Per channel over every frame and position, biased variance (training mode)."""
    mean = h.mean(axis=(0, 2), keepdims=True)
    var = ((h - mean) ** 2).mean(axis=(0, 2), keepdims=True)
    return w[None, :, None] * (h - mean) / np.sqrt(var + eps) + b[None, :, None]


NP_ACT = {"relu": lambda v: np.maximum(v, 0), "tanh": np.tanh, "linear": lambda v: v,
          "leaky_relu": lambda v: np.where(v > 0, v, 0.2 * v), "sigmoid": lambda v: 1 / (1 + np.exp(-v))}


def np_sinc_filters(low, band, K, fs, min_low, min_band):
    """SincNet eq. 3-5 with NumPy's sinc (sin(pi x) / (pi x)) and symmetric Hamming window."""
    n = np.arange(K) - (K - 1) / 2
    f1 = min_low / fs + np.abs(low)
    f2 = f1 + min_band / fs + np.abs(band)
    g = 2 * f2[:, None] * np.sinc(2 * f2[:, None] * n) - 2 * f1[:, None] * np.sinc(2 * f1[:, None] * n)
    return (g / g.max(axis=1, keepdims=True) * np.hamming(K))[:, None, :]


def np_stack(stack: ConvStack, frames: np.ndarray) -> np.ndarray:
    """The reference forward of ``stack`` on frames (N, F), with the module's own weights, in float64."""
    def p(t):
        return t.detach().double().numpy()
    h = frames
    if stack.input_norm is not None:
        norm = stack.input_norm.layer
        mean = h.mean(-1, keepdims=True)
        std = np.sqrt(((h - mean) ** 2).sum(-1, keepdims=True) / (h.shape[-1] - 1))
        h = p(norm.weight) * (h - mean) / (std + 1e-6) + p(norm.bias)
    h = h[:, None, :]
    for layer in stack.layers:
        if isinstance(layer.conv, SincConv):
            c = layer.conv
            w = np_sinc_filters(p(c.low), p(c.band), c.kernel_size, c.sample_rate, c.min_low_hz, c.min_band_hz)
            h = np_conv(h, w, None)
        else:
            h = np_conv(h, p(layer.conv.weight), p(layer.conv.bias))
        h = np_pool(h, layer.pool_size)
        if layer.norm_kind == "layer":
            h = np_layer_norm(h, p(layer.norm.weight), p(layer.norm.bias))
        elif layer.norm_kind == "batch":
            h = np_batch_norm(h, p(layer.norm.weight), p(layer.norm.bias))
        h = NP_ACT[layer.activation](h)
    return h.reshape(h.shape[0], -1)  # channel-major, as pytorch-kaldi's view(batch, -1)


def randomise(stack, seed=0):
    """Norm gains and shifts away from 1 and 0, so that a swapped or missing one shows."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in stack.named_parameters():
            if "norm" in name:
                param.copy_(torch.rand(param.shape, generator=g, dtype=param.dtype) + 0.5 if name.endswith("weight")
                            else torch.randn(param.shape, generator=g, dtype=param.dtype) * 0.3)
    return stack


STACKS = {
    "cnn, layer norms, pooling": dict(unit="cnn", F=24, sizes=[3, 2], kernel_sizes=[4, 3], pool_sizes=[2, 1],
                                      norm="layer", activation=["relu", "tanh"], input_norm="layer"),
    "cnn, batch norm, leaky": dict(unit="cnn", F=20, sizes=[2, 3], kernel_sizes=[3, 2], pool_sizes=[3, 2],
                                   norm=["batch", None], activation="leaky_relu"),
    "sincnet": dict(unit="sincnet", F=40, sizes=[4, 2], kernel_sizes=[9, 3], pool_sizes=[2, 2], norm="layer",
                    activation="relu", sample_rate=8000, min_low_hz=40, min_band_hz=60),
}


def make(spec, dtype=torch.float64, **extra):
    spec = dict(spec, **extra)
    unit, F = spec.pop("unit"), spec.pop("F")
    torch.manual_seed(3)
    return randomise(build_conv_stack(unit, F, spec.pop("sizes"), **spec)).to(dtype), F


@pytest.mark.parametrize("name", sorted(STACKS))
def test_stack_matches_the_numpy_reference_on_real_frames(name):
    stack, F = make(STACKS[name])
    stack.train()  # batch norm with this batch's statistics; no dropout
    torch.manual_seed(1)
    x, lengths = torch.randn(3, 4, F, dtype=torch.float64), torch.tensor([4, 2, 3])
    x[1, 2:] = 1e3  # padding that would show in a batch-norm statistic or an output
    out = stack(x, lengths)
    mask = torch.arange(4)[None, :] < lengths[:, None]
    want = np_stack(stack, x[mask].numpy())
    np.testing.assert_allclose(out[mask].detach().numpy(), want, rtol=1e-9, atol=1e-9)
    assert (out[~mask] == 0).all()
    assert out.shape == (3, 4, stack.output_size)


def test_sinc_filters_and_their_initial_mel_spaced_cutoffs():
    fs, C, K = 16000, 6, 16  # an even width: pytorch-kaldi's SincConv makes it odd
    sinc = SincConv(C, K, sample_rate=fs, min_low_hz=50, min_band_hz=50).double()
    assert sinc.kernel_size == 17
    def to_mel(hz):
        return 2595 * np.log10(1 + hz / 700)
    edges = 700 * (10 ** (np.linspace(to_mel(30), to_mel(fs / 2 - 100), C + 1) / 2595) - 1)
    np.testing.assert_allclose(sinc.low.detach().numpy() * fs, edges[:-1], rtol=1e-6)
    np.testing.assert_allclose(sinc.band.detach().numpy() * fs, np.diff(edges), rtol=1e-6)
    with torch.no_grad():  # a negative weight counts by its magnitude
        sinc.low[0] = -sinc.low[0]
    want = np_sinc_filters(sinc.low.detach().numpy(), sinc.band.detach().numpy(), 17, fs, 50, 50)
    np.testing.assert_allclose(sinc.filters().detach().numpy(), want, rtol=1e-10, atol=1e-12)
    assert np.allclose(want[:, 0, 8], np.hamming(17)[8])  # each filter's peak is its centre tap, scaled to 1


@pytest.mark.parametrize("name", sorted(STACKS))
def test_gradcheck_inputs_and_every_parameter(name):
    stack, F = make(STACKS[name])
    stack.train()
    names = [n for n, _ in stack.named_parameters()]
    params = [p.detach().clone().requires_grad_() for _, p in stack.named_parameters()]
    torch.manual_seed(2)
    x = torch.randn(2, 2, F, dtype=torch.float64, requires_grad=True)
    lengths = torch.tensor([2, 1])  # three real frames (batch norm needs two), one padded

    def f(x, *params):
        return torch.func.functional_call(stack, dict(zip(names, params)), (x, lengths))

    assert torch.autograd.gradcheck(f, (x, *params), eps=1e-6, atol=1e-5, fast_mode=True)


def test_padded_frames_have_no_influence_and_get_no_gradient():
    stack, F = make(STACKS["cnn, batch norm, leaky"])
    stack.train()
    torch.manual_seed(4)
    x = torch.randn(2, 5, F, dtype=torch.float64, requires_grad=True)
    lengths = torch.tensor([5, 2])
    out = stack(x, lengths)
    y = x.detach().clone()
    y[1, 2:] = torch.randn(3, F, dtype=torch.float64) * 50
    assert torch.equal(stack(y, lengths), out)
    out.sum().backward()
    assert (x.grad[1, 2:] == 0).all() and (x.grad[1, :2] != 0).any()


def test_dropout_places():
    """output: after each activation, per value; input: one mask per sequence on each layer's input."""
    x = torch.randn(1, 1, 30).expand(2, 6, 30).contiguous()  # every frame the same
    lengths = torch.tensor([6, 6])
    torch.manual_seed(0)
    inp = build_conv_stack("cnn", 30, [4], kernel_sizes=1, activation="linear", dropout=0.5, dropout_at="input").train()
    out = inp(x, lengths)
    assert torch.equal(out[0, 0], out[0, 5]) and torch.equal(out[1, 0], out[1, 3]), "one mask per sequence"
    assert not torch.equal(out[0, 0], out[1, 0]), "each sequence its own mask"
    torch.manual_seed(0)
    outp = build_conv_stack("cnn", 30, [4], kernel_sizes=1, activation="linear", dropout=0.5).train()
    out = outp(x, lengths)
    zero = (out == 0).float().mean().item()
    assert 0.35 < zero < 0.65 and not torch.equal(out[0, 0], out[0, 1]), "per value of each frame"
    kept = out[out != 0]
    full = outp.eval()(x, lengths)
    assert torch.allclose(kept, 2 * full[out != 0]), "inverted: kept values scaled by 1 / (1 - p)"


def test_bad_shapes_are_refused_naming_the_layer():
    with pytest.raises(ValueError, match=r"layer 2 of 2: an input of 5 values .* too short for kernel_size 6"):
        build_conv_stack("cnn", 12, [2, 2], kernel_sizes=[3, 6], pool_sizes=[2, 1])
    with pytest.raises(ValueError, match="kernel_sizes: expected 1 or 2 values"):
        build_conv_stack("cnn", 12, [2, 2], kernel_sizes=[3, 3, 3])
    with pytest.raises(ValueError, match="at least 2"):
        build_conv_stack("cnn", 12, [2], kernel_sizes=[12], norm="layer")


# --------------------------------------------------------------------------- pytorch-kaldi's configs, paraphrased
COMMON = {"arch_proto": "proto/X.proto", "arch_library": "neural_networks", "arch_pretrain_file": "none",
          "arch_freeze": "False", "arch_seq_model": "False", "arch_halving_factor": "0.5",
          "arch_improvement_threshold": "0.001"}
SGD = {"arch_opt": "sgd", "opt_momentum": "0.0", "opt_weight_decay": "0.0", "opt_dampening": "0.0", "opt_nesterov": "False"}
RMS = {"arch_opt": "rmsprop", "opt_momentum": "0.0", "opt_alpha": "0.95", "opt_eps": "1e-8", "opt_centered": "False",
       "opt_weight_decay": "0.0"}
# TIMIT_CNN_fbank's convolution: three layers of 80, 60, 60 filters of widths 10, 3, 3, pooled by 3, 2, 1, layer
# norms, relu, dropout 0.15, SGD at 0.08
CNN_FBANK = dict(COMMON, arch_name="CNN_layers", arch_class="CNN", cnn_n_filt="80,60,60", cnn_len_filt="10,3,3",
                 cnn_max_pool_len="3,2,1", cnn_use_laynorm_inp="False", cnn_use_batchnorm_inp="False",
                 cnn_use_laynorm="True,True,True", cnn_use_batchnorm="False,False,False", cnn_act="relu,relu,relu",
                 cnn_drop="0.15,0.15,0.15", arch_lr="0.08", **SGD)
# TIMIT_CNN_raw and TIMIT_SincNet_raw share this front end: a SincNet of 128 sinc filters of 129 taps, then three
# convolutions, on 3200 samples of 16 kHz audio per frame, the input layer-normalised, RMSprop at 0.0008
SINC_RAW = dict(COMMON, arch_name="CNN_layers", arch_class="SincNet", sinc_n_filt="128,60,60,60",
                sinc_len_filt="129,5,5,3", sinc_max_pool_len="3,3,3,2", sinc_use_laynorm_inp="True",
                sinc_use_batchnorm_inp="False", sinc_use_laynorm="True,True,True,True",
                sinc_use_batchnorm="False,False,False,False", sinc_act="relu,relu,relu,relu",
                sinc_drop="0.15,0.15,0.15,0.15", sinc_sample_rate="16000", sinc_min_low_hz="50", sinc_min_band_hz="50",
                arch_lr="0.0008", **RMS)


def native(translated_options: dict, stack="CNN_layers") -> str:
    body = "\n".join(f"{k} = {v}" for k, v in translated_options.items())
    return ("[exp]\nout_folder = exp/x\n[dataset1]\ndata_name = train\nfea = fea_name=raw\n    fea_lst=x.scp\n"
            f"[data_use]\ntrain_with = train\nvalid_with = train\n[architecture1]\n{body}\n[model]\nstack = {stack}\n")


@pytest.mark.parametrize("options, width, layers, out", [
    # 40 fbank values x 11 frames: (440 - 10 + 1) // 3 = 143, (143 - 3 + 1) // 2 = 70, 70 - 3 + 1 = 68
    (CNN_FBANK, 440, [(80, 10, 3, 143), (60, 3, 2, 70), (60, 3, 1, 68)], 60 * 68),
    # 3200 samples: 1024, 340, 112, 55
    (SINC_RAW, 3200, [(128, 129, 3, 1024), (60, 5, 3, 340), (60, 5, 3, 112), (60, 3, 2, 55)], 60 * 55),
])
def test_the_translated_front_ends_are_pytorch_kaldis(options, width, layers, out):
    translated = translate_architecture({k.lower(): v for k, v in options.items()}, "X.cfg [architecture1]")
    assert not translated.problems and translated.seq_model is False
    cfg = parse_config_text(native(translated.options))
    arch = cfg.architectures[0]
    assert arch.dropout_at == "inside" and arch.norm_momentum == 0.05 and set(arch.dropout) == {0.15}
    model, groups = build_model(cfg, input_dim=width, num_pdfs=7, num_mono=None)
    stack = model.stacks[0]
    got = [(layer.channels, layer.conv.kernel_size if isinstance(layer.conv, SincConv) else layer.conv.kernel_size[0],
            layer.pool_size, layer.output_length) for layer in stack.layers]
    assert got == layers and stack.output_size == out
    assert all(layer.norm_kind == "layer" and layer.activation == "relu" and layer.dropout == 0.15
               and layer.dropout_at == "output" for layer in stack.layers)
    sinc = options is SINC_RAW
    assert isinstance(stack.layers[0].conv, SincConv) == sinc
    assert (stack.input_norm is not None and stack.input_norm.kind == "layer") == sinc
    if sinc:
        c = stack.layers[0].conv
        assert (c.sample_rate, c.min_low_hz, c.min_band_hz) == (16000, 50, 50)
        assert arch.arch_opt == "rmsprop" and arch.opt_bias_correction is False and arch.arch_lr == 0.0008
    else:
        assert arch.arch_opt == "sgd" and arch.arch_lr == 0.08


@pytest.mark.parametrize("change, expected", [
    ({"arch_seq_model": "True"}, "arch_seq_model = True: arch_class CNN is frame-wise"),
    ({"cnn_sample_rate": "16000"}, "cnn_sample_rate: not an option of arch_class CNN"),
    ({"cnn_use_batchnorm": "True,False,True"}, "both on one layer"),
    ({"cnn_act": "relu,softmax,relu"}, "softmax is not an activation of a hidden layer"),
    ({"cnn_len_filt": "10,3"}, "cnn_len_filt: expected 1 or 3 values"),
])
def test_cnn_options_we_cannot_honour_are_refused(change, expected):
    options = dict({k.lower(): v for k, v in CNN_FBANK.items()}, **change)
    problems = translate_architecture(options, "X.cfg [architecture1]").problems
    assert any(expected in p and "X.cfg [architecture1]" in p for p in problems), problems


def test_sincnet_needs_its_frequencies_and_batch_norm_is_noted():
    options = {k.lower(): v for k, v in SINC_RAW.items() if k != "sinc_min_band_hz"}
    assert any("sinc_min_band_hz = : expected a whole number of Hz" in p
               for p in translate_architecture(options, "X.cfg [architecture1]").problems)
    options = dict({k.lower(): v for k, v in SINC_RAW.items()}, sinc_use_laynorm="False", sinc_use_batchnorm="True")
    translated = translate_architecture(options, "X.cfg [architecture1]")
    assert translated.options["norm"] == "batch,batch,batch,batch" and "eps" in " ".join(translated.notes)


@pytest.mark.parametrize("lines, expected", [
    ("unit = lstm\nsizes = 4\nkernel_sizes = 3", "unit lstm takes no kernel_sizes option (units that do: cnn, sincnet)"),
    ("unit = cnn\nsizes = 4\nkernel_sizes = 3\nsample_rate = 8000", "takes no sample_rate option (units that do: sincnet)"),
    ("unit = cnn\nsizes = 4", "kernel_sizes is required"),
    ("unit = cnn\nsizes = 4\nkernel_sizes = 0", "kernel_sizes: expected positive widths"),
    ("unit = sincnet\nsizes = 4\nkernel_sizes = 3\nmin_low_hz = -1", "min_low_hz, min_band_hz >= 0, got 16000, -1.0, 50"),
    ("unit = sincnet\nsizes = 4,4\nkernel_sizes = 3\nsample_rate = 8000,16000", "sample_rate takes one value, its first layer's"),
])
def test_native_options_are_checked_naming_the_option(lines, expected):
    text = native({"arch_name": "a"}, stack="a").replace("arch_name = a\n", f"arch_name = a\n{lines}\n")
    with pytest.raises(ConfigError, match=re.escape(expected)):
        build_model(parse_config_text(text), input_dim=64, num_pdfs=5, num_mono=None)


# --------------------------------------------------------------------------- end to end
def cnn_fbank(cw=5):
    """TIMIT_CNN_fbank's layout on the tiny corpus (small sizes): a CNN on the spliced fbank, an MLP on it,
    its last layer the senone output."""
    lines = ["[architecture1]"] + [f"{k} = {v}" for k, v in dict(
        CNN_FBANK, cnn_n_filt="6,4,4", arch_lr="0.02").items()]
    mlp = head(2, "MLP_layers", "lab_cd", "0.02").replace("dnn_lay = N_out_lab_cd", "dnn_lay = 32,N_out_lab_cd") \
        .replace("dnn_drop = 0.0", "dnn_drop = 0.15,0.0").replace("dnn_use_batchnorm = False", "dnn_use_batchnorm = True,False") \
        .replace("dnn_use_laynorm = False", "dnn_use_laynorm = False,False").replace("dnn_act = softmax", "dnn_act = relu,softmax")
    model = ("\n[model]\nmodel_proto = proto/model.proto\nmodel = out_dnn1=compute(CNN_layers,fbank)\n"
             "\tout_dnn2=compute(MLP_layers,out_dnn1)\n\tloss_final=cost_nll(out_dnn2,lab_cd)\n"
             "\terr_final=cost_err(out_dnn2,lab_cd)\n")
    return config("\n" + "\n".join(lines) + "\n" + mlp, model, batch="128", cw=cw)


def test_cnn_on_fbank_trains_and_decodes_on_the_tiny_corpus(env, tmp_path):
    path = write(tmp_path, "CNN_fbank", cnn_fbank())
    cfg = parse_config(path)
    assert cfg.architecture("CNN_layers").unit == "cnn" and cfg.batches.batch_unit == "frames"
    run(env, tmp_path / "exp", config=path)
    res = (tmp_path / "exp" / "res.res").read_text()
    assert re.search(r"^test: %WER \d+\.\d\d \[ \d+ / \d+, ", res, flags=re.M), res
    assert re.search(r"^dev: %WER ", res, flags=re.M)
    weights = torch.load(tmp_path / "exp" / "final.pt", map_location="cpu", weights_only=True)["model"]
    assert weights["stacks.0.layers.0.conv.weight"].shape == (6, 1, 10)  # 11 frames x 40 fbank read as one signal
    assert weights["stacks.0.layers.2.norm.weight"].shape == (4, 68)


def test_progressive_dropout_reaches_the_conv_layers():
    """cnn_drop = 0.1*1|0.3*1 (pytorch-kaldi's per-epoch values): epoch 2's rate replaces epoch 1's in every layer."""
    from bru_kaldi.network import set_epoch_dropout

    options = dict({k.lower(): v for k, v in CNN_FBANK.items()}, cnn_drop="0.1*1|0.3*1")
    translated = translate_architecture(options, "X.cfg [architecture1]")
    assert not translated.problems and translated.options["dropout_schedule"] == "0.1*1|0.3*1,0.1*1|0.3*1,0.1*1|0.3*1"
    cfg = parse_config_text(native(translated.options).replace("[exp]\n", "[exp]\nn_epochs_tr = 2\n"))
    model, _ = build_model(cfg, input_dim=440, num_pdfs=7, num_mono=None)
    assert [layer.dropout for layer in model.stacks[0].layers] == [0.1] * 3
    set_epoch_dropout(model, cfg, 1)
    assert [layer.dropout for layer in model.stacks[0].layers] == [0.3] * 3

"""The ``fusionrnn`` unit (models.fusion) and pytorch-kaldi's ``fusionRNN_jit`` translated to it.

The references are written from pytorch-kaldi's neural_networks.py (``FusionLinearConv``: a
``Conv1d(1, H, kernel=f, stride=f)`` over the concatenated microphones, its activation, then a sum or mean
over them; ``liGRU_layer``: batch norm of each gate's input, ``h = z h + (1 - z) ReLU(.)``), in float64
NumPy, and share no code with ``models``. The generic unit tests (tests/test_units.py, test_fast_recurrences.py,
test_unit_equations.py) sweep the unit with one microphone; here several microphones, batch norm in training,
both directions and the inner dropout.
"""

import numpy as np
import pytest
import torch
from torch.func import functional_call

import models
from bru_kaldi import pytorch_kaldi
from bru_kaldi.config import parse_config
from bru_kaldi.network import build_model
from models.fusion import SharedMicrophoneLinear
from tests.test_pytorch_kaldi_cfg import HEAD, LAB_CD, OPT, TAIL, USE, head, write
from tests.test_run_exp import run
from tests.unit_variants import randomise_


def sig(a):
    return 1.0 / (1.0 + np.exp(-a))


ACTS = {"prelu": lambda a, s: np.where(a > 0, a, s * a), "relu": lambda a, s: np.maximum(a, 0),
        "tanh": lambda a, s: np.tanh(a), "leaky_relu": lambda a, s: np.where(a > 0, a, 0.01 * a),
        "linear": lambda a, s: a}


def reference_direction(xs, W, b, slopes, Uz_pk, Uh, gamma, beta, mics, act, reduce):
    """One direction of pytorch-kaldi's liGRU_layer with fusion, in training mode, over sequences ``xs`` (each
    ``(T_i, M*f)``, real frames only). Batch-norm statistics over every frame of every sequence (biased
    variance, eps 1e-5). ``Uz_pk`` is pytorch-kaldi's update-gate matrix (its gate weighs h_{t-1})."""
    H = Uh.shape[0]
    fused = []  # per sequence (T_i, 2, H)
    for x in xs:
        frames = []
        for xt in x:
            gate_inputs = []
            for g in range(2):
                # Conv1d(1, H, kernel=f, stride=f): output position m reads microphone m's f values
                per_mic = [ACTS[act](W[g * H:(g + 1) * H] @ xm + b[g * H:(g + 1) * H], slopes[g])
                           for xm in np.split(xt, mics)]
                gate_inputs.append(np.mean(per_mic, 0) if reduce == "mean" else np.sum(per_mic, 0))
            frames.append(gate_inputs)
        fused.append(np.array(frames))
    every = np.concatenate(fused)  # (N, 2, H)
    mean, var = every.mean(0), every.var(0)
    outs = []
    for f in fused:
        normed = (f - mean) / np.sqrt(var + 1e-5) * gamma.reshape(2, H) + beta.reshape(2, H)
        h, out = np.zeros(H), []
        for wz, wh in normed:
            z = sig(wz + Uz_pk @ h)
            h = z * h + (1 - z) * np.maximum(wh + Uh @ h, 0)
            out.append(h)
        outs.append(np.array(out))
    return outs


def numpy_of(t):
    return t.detach().double().numpy()


@pytest.mark.parametrize("act, reduce", [("prelu", "sum"), ("tanh", "mean"), ("leaky_relu", "sum")])
def test_layer_with_batch_norm_in_training_equals_pytorch_kaldis_maths(act, reduce):
    """Three microphones of 2 values, bidirectional, batch norm with statistics over the real frames of a
    padded batch, against the reference per direction (the backward one on each sequence reversed)."""
    M, f, H, lengths = 3, 2, 4, [6, 4, 1]
    torch.manual_seed(0)
    layer = randomise_(models.build("fusionrnn", M * f, H, mics=M, fusion_act=act, fusion_reduce=reduce,
                                    norm="batch", bidirectional=True).double(), seed=2).train()
    x = torch.randn(len(lengths), max(lengths), M * f, dtype=torch.float64) * 2
    out = numpy_of(layer(x, lengths))
    W, b = numpy_of(layer.proj.shared_weight), numpy_of(layer.proj.shared_bias)
    for d, cell in enumerate(layer.cells):
        U = numpy_of(cell.recurrent.weight)
        slopes = numpy_of(cell.slope).ravel() if cell.slope is not None else (None, None)
        xs = [x[i, :n].numpy()[::-1] if d else x[i, :n].numpy() for i, n in enumerate(lengths)]
        expected = reference_direction(xs, W[d * 2 * H:(d + 1) * 2 * H], b[d * 2 * H:(d + 1) * 2 * H], slopes,
                                       -U[:H], U[H:], numpy_of(cell.norm.weight), numpy_of(cell.norm.bias), M, act,
                                       reduce)
        for i, n in enumerate(lengths):
            got = out[i, :n, d * H:(d + 1) * H]
            np.testing.assert_allclose(got[::-1] if d else got, expected[i], rtol=1e-9, atol=1e-10)
    assert (out[1, 4:] == 0).all() and (out[2, 1:] == 0).all()


def test_projection_is_pytorch_kaldis_shared_convolution():
    """The layer's projection equals Conv1d(1, H, kernel=f, stride=f) on the concatenated microphones (what
    FusionLinearConv runs), one output position per microphone, with the same weights for every microphone."""
    M, f, R = 4, 3, 5
    proj = SharedMicrophoneLinear(M, f, R, R).double()
    conv = torch.nn.Conv1d(1, R, kernel_size=f, stride=f).double()
    with torch.no_grad():
        conv.weight.copy_(proj.shared_weight[:, None, :])
        conv.bias.copy_(proj.shared_bias)
    x = torch.randn(7, M * f, dtype=torch.float64)
    by_conv = conv(x[:, None, :])  # (N, R, M)
    torch.testing.assert_close(proj(x).view(7, M, R), by_conv.transpose(1, 2), rtol=0, atol=1e-13)


def test_gradcheck_with_microphones_norm_and_both_directions():
    torch.manual_seed(1)
    layer = randomise_(models.build("fusionrnn", 4, 3, mics=2, fusion_act="prelu", norm="batch",
                                    bidirectional=True).double(), seed=3).train()
    names = [name for name, _ in layer.named_parameters()]
    assert "cells.0.slope" in names and "proj.shared_weight" in names
    x = torch.randn(2, 4, 4, dtype=torch.float64, requires_grad=True)

    def f(x, *params):
        return functional_call(layer, dict(zip(names, params)), (x, [4, 3]))

    params = tuple(p.detach().clone().requires_grad_() for p in layer.parameters())
    assert torch.autograd.gradcheck(f, (x, *params), eps=1e-6, atol=1e-6, rtol=1e-4)


def test_inner_dropout_is_inverted_as_torchs_dropout():
    """liGRU_layer drops its candidate with torch's Dropout on ones: m / (1 - p) in training, 1 in evaluation."""
    layer = models.build("fusionrnn", 4, 3, mics=2, fusion_act="relu")
    cell = layer.cells[0]
    cell.inner_dropout = 0.25
    x, lengths = torch.randn(2, 5, 4), [5, 5]
    masks = cell.initial_state(torch.zeros(64, 5, 6))[-1].unique().tolist()
    assert masks == [0.0, pytest.approx(1 / 0.75)]
    layer.eval()
    plain = models.build("fusionrnn", 4, 3, mics=2, fusion_act="relu").eval()
    plain.load_state_dict(layer.state_dict())
    torch.testing.assert_close(layer(x, lengths), plain(x, lengths))


@pytest.mark.parametrize("kwargs, message", [
    (dict(input_size=7, mics=2), "not 2 microphones"), (dict(mics=0), "mics must be"),
    (dict(fusion_act="softmax"), "fusion_act must be"), (dict(fusion_reduce="max"), "fusion_reduce must be")])
def test_bad_options_are_refused(kwargs, message):
    input_size = kwargs.pop("input_size", 4)
    with pytest.raises(ValueError, match=message):
        models.build("fusionrnn", input_size, 3, **kwargs)


# pytorch-kaldi's DIRHA_fusionRNN_MFCC_6ch.cfg [architecture1], paraphrased: other sizes, mean, three layers
FUSION_ARCH = """
[architecture1]
arch_name = fusionRNN
arch_proto = proto/fusionRNN.proto
arch_library = neural_networks
arch_class = fusionRNN_jit
arch_pretrain_file = none
arch_freeze = False
arch_seq_model = True
fusionRNN_lay = {lay}
fusionRNN_drop = 0.1,0.1,0.1
fusionRNN_bidir = True
fusionRNN_act = {act}
fusionRNN_do_fusion = True
fusionRNN_fusion_layer_size = {total}
fusionRNN_number_of_mic = 2
fusionRNN_fusion_act = {fusion_act}
fusionRNN_fusion_reduce = {reduce}
arch_lr = 0.004
arch_halving_factor = 0.5
arch_improvement_threshold = 0.001
""" + OPT["rmsprop"] + head(2, "MLP_layers", "lab_cd", "0.004") + """
[model]
model_proto = proto/model.proto
model = conc1=concatenate(mic1,mic2)
\tout_dnn1=compute(fusionRNN,conc1)
\tout_dnn2=compute(MLP_layers,out_dnn1)
\tloss_final=cost_nll(out_dnn2,lab_cd)
\terr_final=cost_err(out_dnn2,lab_cd)
"""
# two "microphones" of 13 values: the tiny corpus's MFCCs, with and without CMVN
MICS = """
[dataset{n}]
data_name = {split}
fea = fea_name=mic1
\tfea_lst=$MINI_TIMIT/data/{split}/feats_mfcc.scp
\tfea_opts=apply-cmvn --utt2spk=ark:$MINI_TIMIT/data/{split}/utt2spk scp:$MINI_TIMIT/data/{split}/cmvn_mfcc.scp ark:- ark:- |
\tcw_left=0
\tcw_right=0

\tfea_name=mic2
\tfea_lst=$MINI_TIMIT/data/{split}/feats_mfcc.scp
\tfea_opts=add-deltas --delta-order=0 ark:- ark:- |
\tcw_left=0
\tcw_right=0
""" + LAB_CD + """N_chunks = 1
"""


def fusion_config(lay="8,8,8", act="relu,relu,relu", total="12", fusion_act="prelu", reduce="mean"):
    datasets = "".join(MICS.format(n=i, split=s) for i, s in enumerate(("train", "dev", "test"), 1))
    return (HEAD.format(epochs=1) + datasets + USE.format(batch="4", maxlen="1000", increase="False")
            + FUSION_ARCH.format(lay=lay, act=act, total=total, fusion_act=fusion_act, reduce=reduce)
            + TAIL.format(out="out_dnn2", decode="True"))


@pytest.fixture
def env(tiny_corpus, tmp_path, monkeypatch):
    monkeypatch.setenv("MINI_TIMIT", str(tiny_corpus.root))
    monkeypatch.setenv("BRU_TEST_EXP", str(tmp_path / "exp"))
    return tiny_corpus


def test_the_architecture_is_the_one_fusionRNN_jit_builds(env, tmp_path):
    """Three bidirectional liGRU layers: the first fuses 2 microphones into 12 / 2 = 6 units; every layer has
    fusionRNN_lay's first size after it, fusionRNN_drop's first rate on its candidate and batch norm (0.05);
    fusionRNN_act (not read by pytorch-kaldi) is noted, not applied."""
    path = write(tmp_path, "fusion", fusion_config(lay="8,10,10", act="prelu"))
    config = parse_config(path)
    model, _ = build_model(config, input_dim=26, num_pdfs=31, num_mono=None)
    layers = model.stacks[0].layers
    assert [(l.input_size, l.hidden_size, l.bidirectional) for l in layers] == [(26, 6, True), (12, 8, True), (16, 8, True)]
    assert [(l.cells[0].mics, l.cells[0].fusion_act, l.cells[0].fusion_reduce) for l in layers] == \
        [(2, "prelu", "mean"), (1, "linear", "sum"), (1, "linear", "sum")]
    for layer in layers:
        assert layer.dropout == 0.0 and all(c.inner_dropout == pytest.approx(0.1) for c in layer.cells)
        assert all(c.norm.momentum == 0.05 for c in layer.cells) and layer.norm is None
    notes = "\n".join(pytorch_kaldi.translate(path.read_text(), source=str(path))[1])
    assert "fusionRNN_act = prelu" in notes and "fusionRNN_lay" in notes and "share one set of weights" in notes


@pytest.mark.parametrize("change, message", [
    (dict(fusion_act="swish"), "fusionRNN_fusion_act = swish"), (dict(reduce="max"), "fusionRNN_fusion_reduce = max"),
    (dict(total="x"), "fusionRNN_fusion_layer_size = x")])
def test_options_fusionRNN_jit_would_misread_are_refused(change, message, env, tmp_path):
    result = run(env, tmp_path / "exp", "--convert", config=write(tmp_path, "bad", fusion_config(**change)),
                 expect=1)
    assert message in result.stderr


def test_the_parts_are_not_classes(env, tmp_path):
    text = fusion_config().replace("arch_class = fusionRNN_jit", "arch_class = liGRU_layer")
    result = run(env, tmp_path / "exp", "--convert", config=write(tmp_path, "part", text), expect=1)
    assert "write arch_class = fusionRNN_jit" in result.stderr


def test_two_microphones_train_and_decode_end_to_end(env, tmp_path):
    run(env, tmp_path / "exp", config=write(tmp_path, "fusion", fusion_config()))
    res = (tmp_path / "exp" / "res.res").read_text()
    assert "test: %WER" in res and "dev: %WER" in res

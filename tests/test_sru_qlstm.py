"""SRU and quaternion LSTM beyond the generic unit tests: the Hamilton product against its hand-expanded
real block matrix, the options the generic sweep cannot take (sru's identity highway and low-rank
products, which differ between one- and two-direction layers), the translation of pytorch-kaldi's
``SRU`` / ``QLSTM`` sections, and an SRU-on-fbank config run end to end on the tiny corpus."""

import re

import numpy as np
import pytest
import torch

import models
from bru_kaldi.pytorch_kaldi.architectures import translate_architecture
from models.quaternion import QuaternionLinear, hamilton_matrix
from tests.test_pytorch_kaldi_cfg import DATASET, HEAD, MULTITASK, TAIL, USE, env, head, write  # noqa: F401 (env: a fixture)
from tests.test_run_exp import run
from tests.test_unit_equations import quaternion_product, reference_sru
from tests.unit_variants import make_layer


def test_hamilton_matrix_is_the_hand_expanded_block_matrix():
    a, b, c, d = 0.5, -1.25, 2.0, 3.5  # W = a + b i + c j + d k
    expected = torch.tensor([[a, -b, -c, -d],
                             [b, a, -d, c],
                             [c, d, a, -b],
                             [d, -c, b, a]], dtype=torch.float64)
    w = torch.tensor([a, b, c, d], dtype=torch.float64).view(4, 1, 1)
    assert torch.equal(hamilton_matrix(w, 4, 4), expected)
    # and W (x) q is the Hamilton product, e.g. i j = k, j i = -k
    i, j = torch.tensor([0.0, 1, 0, 0]), torch.tensor([0.0, 0, 1, 0])
    assert hamilton_matrix(i.view(4, 1, 1), 4, 4) @ j == pytest.approx([0, 0, 0, 1])
    assert hamilton_matrix(j.view(4, 1, 1), 4, 4) @ i == pytest.approx([0, 0, 0, -1])
    q = np.array([0.3, -0.7, 1.1, 0.2])
    got = hamilton_matrix(torch.tensor([a, b, c, d], dtype=torch.float64).view(4, 1, 1), 4, 4).numpy() @ q
    np.testing.assert_allclose(got, quaternion_product(np.array([a, b, c, d]), q), rtol=1e-12)


def test_quaternion_linear_has_a_quarter_of_the_weights_and_pads_odd_sizes():
    q = QuaternionLinear(8, 12)
    assert q.components.numel() == 8 * 12 // 4 and q.weight.shape == (12, 8)
    odd = QuaternionLinear(5, 3)  # 2 input quaternions (the last padded with zeros), 1 output quaternion cut to 3
    full = hamilton_matrix(odd.components[0], 4, 8)
    torch.testing.assert_close(odd.weight, full[:3, :5])


@pytest.mark.parametrize("options, input_size", [({"highway": "auto"}, 5), ({"highway": "auto", "rescale": False}, 5),
                                                 ({"projection_size": 2}, 6), ({"highway": "auto"}, 3)])
def test_sru_highway_and_low_rank_products_match_the_equations(options, input_size):
    layer = make_layer("sru", options, input_size=input_size, hidden_size=5, dtype=torch.float64, seed=3)
    assert layer.proj.identity == (options.get("highway") == "auto" and input_size == 5)
    assert (layer.proj.down is not None) == ("projection_size" in options)
    x = np.random.default_rng(1).normal(size=(9, input_size))
    got = layer(torch.from_numpy(x)[None], [9])[0].detach().numpy()
    np.testing.assert_allclose(got, reference_sru(x, layer), rtol=1e-9, atol=1e-10)


def test_sru_bidirectional_identity_highway_gives_each_direction_its_half():
    layer = make_layer("sru", {"highway": "auto", "highway_bias": -1.0}, input_size=8, hidden_size=4,
                       bidirectional=True, dtype=torch.float64)
    scale = np.sqrt(1 + 2 * np.exp(-1.0))
    w = layer.proj.weight.detach().view(2, 4, 4, 8)  # (direction, [u, f, r, x'], H, F)
    torch.testing.assert_close(w[0, 3], scale * torch.eye(4, 8, dtype=torch.float64))
    torch.testing.assert_close(w[1, 3], scale * torch.cat([torch.zeros(4, 4), torch.eye(4)], 1).double())


@pytest.mark.parametrize("unit, options, sizes", [("sru", {"highway": "auto", "projection_size": 1}, (3, 3)),
                                                  ("sru", {"state_dropout": 0.3}, (2, 3)),
                                                  ("qlstm", {}, (8, 4))])
def test_gradcheck_of_the_options_the_sweep_leaves_out(unit, options, sizes):
    layer = make_layer(unit, options, input_size=sizes[0], hidden_size=sizes[1], dtype=torch.float64, seed=2)
    x = torch.randn(2, 4, sizes[0], dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x: layer(x, [4, 2]), (x,), eps=1e-6, atol=1e-6)


def test_sru_state_dropout_is_one_inverted_mask_per_sequence_in_training_only():
    layer = models.build("sru", 3, 6, state_dropout=0.5, skip=False).double()
    layer.cells[0].recurrent_weight.data.zero_()
    x = torch.randn(1, 5, 3, dtype=torch.float64)
    evaluation = layer.eval()(x, [5])
    torch.manual_seed(0)
    dropped = layer.train()(x, [5])
    ratio = dropped / evaluation
    kept = ratio[0, 0] != 0
    assert 0 < kept.sum() < 6
    torch.testing.assert_close(ratio[0][:, kept], torch.full((5, int(kept.sum())), 2.0, dtype=torch.float64))
    assert (dropped[0][:, ~kept] == 0).all()


SRU_SECTION = {"arch_name": "SRU_layers", "arch_proto": "proto/SRU.proto", "arch_library": "neural_networks",
               "arch_class": "SRU", "arch_pretrain_file": "none", "arch_freeze": "False", "arch_seq_model": "True",
               "sru_hidden_size": "16", "sru_num_layers": "2", "sru_dropout": "0.1", "sru_rnn_dropout": "0.2",
               "sru_use_tanh": "False", "sru_use_relu": "False", "sru_use_selu": "True", "sru_weight_norm": "False",
               "sru_layer_norm": "False", "sru_bidirectional": "True", "sru_is_input_normalized": "False",
               "sru_has_skip_term": "True", "sru_rescale": "True", "sru_highway_bias": "-1", "sru_n_proj": "8",
               "arch_lr": "0.001", "arch_halving_factor": "0.5", "arch_improvement_threshold": "0.001",
               "arch_opt": "adam", "opt_betas": "0.9,0.999", "opt_eps": "1e-8", "opt_weight_decay": "1e-7",
               "opt_amsgrad": "False"}


def test_sru_section_translates_every_proto_option():
    t = translate_architecture(dict(SRU_SECTION), "x.cfg [architecture1]")
    assert not t.problems
    o = t.options
    assert (o["unit"], o["sizes"], o["bidirectional"], o["dropout"], o["dropout_at"]) == ("sru", "16,16", "True", "0.2", "input")
    assert o["state_dropout"] == "0.1,0.0", "sru drops g(c) in every layer but the last"
    assert (o["activation"], o["highway_bias"], o["projection_size"], o["highway"]) == ("selu", "-1", "8", "auto")
    assert (o["skip"], o["rescale"]) == ("True", "True")


@pytest.mark.parametrize("option, says", [("sru_weight_norm", "sru_weight_norm = True"),
                                          ("sru_layer_norm", "sru_layer_norm = True"),
                                          ("sru_is_input_normalized", "sru_is_input_normalized = True"),
                                          ("sru_use_tanh", "sru_use_tanh/sru_use_selu: more than one activation")])
def test_sru_options_without_an_equivalent_are_refused_by_name(option, says):
    t = translate_architecture(dict(SRU_SECTION, **{option: "True"}), "x.cfg [architecture1]")
    assert len(t.problems) == 1 and t.problems[0].startswith(f"x.cfg [architecture1] {says}")


QLSTM_SECTION = {"arch_name": "QLSTM", "arch_proto": "proto/QLSTM.proto", "arch_library": "quaternion_neural_networks",
                 "arch_class": "QLSTM", "arch_pretrain_file": "none", "arch_freeze": "False", "arch_seq_model": "True",
                 "lstm_lay": "512,512", "lstm_drop": "0.2,0.2", "lstm_bidir": "True", "lstm_act": "tanh,tanh",
                 "quaternion_init": "quaternion", "autograd": "False", "arch_lr": "0.0016", "arch_opt": "rmsprop",
                 "opt_momentum": "0.0", "opt_alpha": "0.95", "opt_eps": "1e-8", "opt_centered": "False",
                 "opt_weight_decay": "0.0"}


def test_qlstm_section_translates_and_refuses_sizes_that_are_not_quaternions():
    t = translate_architecture(dict(QLSTM_SECTION), "d.cfg [architecture1]")
    assert not t.problems
    o = t.options
    assert (o["unit"], o["sizes"], o["dropout"], o["dropout_at"], o["activation"]) == ("qlstm", "512,512", "0.2,0.2", "inside", "tanh")
    bad = translate_architecture(dict(QLSTM_SECTION, lstm_lay="512,510"), "d.cfg [architecture1]")
    assert bad.problems == ["d.cfg [architecture1] lstm_lay: 510 is not a multiple of 4 (a layer is made of quaternions; "
                            "pytorch-kaldi fails on it at the first batch)"]
    unknown = translate_architecture(dict(QLSTM_SECTION, lstm_foo="1"), "d.cfg [architecture1]")
    assert any("lstm_foo: not an option of arch_class QLSTM" in p for p in unknown.problems)


SRU_ARCH = """
[architecture1]
arch_name = SRU_layers
arch_proto = proto/SRU.proto
arch_library = neural_networks
arch_class = SRU
arch_pretrain_file = none
arch_freeze = False
arch_seq_model = True
sru_hidden_size = 12
sru_num_layers = 2
sru_dropout = 0.1
sru_rnn_dropout = 0.1
sru_use_tanh = False
sru_use_relu = False
sru_use_selu = False
sru_weight_norm = False
sru_layer_norm = False
sru_bidirectional = True
sru_is_input_normalized = False
sru_has_skip_term = True
sru_rescale = True
sru_highway_bias = -1
sru_n_proj = 8
arch_lr = 0.001
arch_halving_factor = 0.5
arch_improvement_threshold = 0.001
arch_opt = adam
opt_betas = 0.9,0.999
opt_eps = 1e-8
opt_weight_decay = 1e-7
opt_amsgrad = False
"""


def test_sru_on_fbank_trains_and_decodes(env, tmp_path):
    """pytorch-kaldi's TIMIT_SRU_fbank.cfg, smaller, paths on the tiny corpus: one epoch, forward, decode.
    Its second layer reads 2 x 12 = its own output width: the identity highway; its first a learned one."""
    datasets = "".join(DATASET.format(n=i, split=s, cw=0, chunks=2 if s == "train" else 1)
                       for i, s in enumerate(("train", "dev", "test"), 1))
    text = (HEAD.format(epochs=1) + datasets + USE.format(batch="4", maxlen="1000", increase="True") + SRU_ARCH
            + head(2, "MLP_cd", "lab_cd", "0.001") + head(3, "MLP_mono", "lab_mono", "0.001")
            + MULTITASK.format(trunk="SRU_layers", inp="fbank", weight="1.0") + TAIL.format(out="out_dnn2", decode="True"))
    run(env, tmp_path / "exp", config=write(tmp_path, "SRU_fbank", text))
    res = (tmp_path / "exp" / "res.res").read_text()
    assert re.search(r"^test: %WER \d+\.\d\d ", res, flags=re.M)
    state = torch.load(tmp_path / "exp" / "final.pt", map_location="cpu", weights_only=True)["model"]
    first, second = (k for k in state if k.endswith("proj.learned_weight"))
    assert state[first].shape[0] == 2 * 4 * 12 and state[second].shape[0] == 2 * 3 * 12  # learned / identity x'

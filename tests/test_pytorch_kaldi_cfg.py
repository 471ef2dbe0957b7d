"""pytorch-kaldi's config format as an input: configs written here in its vocabulary (every construct of
its TIMIT baselines: [cfg_proto], the machinery options, multi-stream datasets, LSTM / GRU / liGRU / RNN /
MLP classes, N_out_lab_cd / N_out_lab_mono output MLPs with their own learning rates, the monophone
multitask through mult_constant and sum, progressive values, the length curriculum, frame batches)
are translated, built and run on the tests' tiny corpus. Then, one block each, the forms of its other
configs: the DIRHA baselines' hard-wrapped lines, [exp] pretrain_file, LSTM_cudnn, per-layer activations
and leaky_relu, three streams joined two at a time, output layers of a written number of classes with a
counts file, and architectures' outputs concatenated. Long because each form is checked against what
pytorch-kaldi means and run end to end on the same corpus, with the helpers the blocks share.

The expected networks are derived from pytorch-kaldi's neural_networks.py and core.py, stated in
``EXPECTED`` below: per layer the unit, size, direction, where dropout sits (pytorch-kaldi drops the
candidate of LSTM/GRU/liGRU/RNN and the output of an MLP layer: our "inside"), the norm and its
momentum (nn.BatchNorm1d(momentum=0.05) everywhere in pytorch-kaldi), and per architecture its rate.
"""

import re
from pathlib import Path

import pytest
import torch

from bru_kaldi import pytorch_kaldi
from bru_kaldi.config import ConfigError, parse_config, parse_config_text
from bru_kaldi.network import build_model, trained_architectures
from bru_kaldi.schedules import epoch_values
from models.norm import MaskedBatchNorm
from tests.test_run_exp import run

HEAD = """[cfg_proto]
cfg_proto = proto/global.proto
cfg_proto_chunk = proto/global_chunk.proto

[exp]
cmd =
run_nn_script = run_nn
out_folder = $BRU_TEST_EXP
seed = 3
use_cuda = False
multi_gpu = False
save_gpumem = False
N_epochs_tr = {epochs}
"""
# the senone labels of the tiny corpus (pdf-ids of its monophone alignments), one part of a [datasetN]
LAB_CD = """lab = lab_name=lab_cd
\tlab_folder=$MINI_TIMIT/exp/mono_ali_{split}
\tlab_opts=ali-to-pdf
\tlab_count_file=auto
\tlab_data_folder=$MINI_TIMIT/data/{split}/
\tlab_graph=$MINI_TIMIT/exp/mono/graph
"""
DATASET = """
[dataset{n}]
data_name = {split}
fea = fea_name=fbank
\tfea_lst=$MINI_TIMIT/data/{split}/feats.scp
\tfea_opts=apply-cmvn --utt2spk=ark:$MINI_TIMIT/data/{split}/utt2spk scp:$MINI_TIMIT/data/{split}/cmvn.scp ark:- ark:- | add-deltas --delta-order=0 ark:- ark:- |
\tcw_left={cw}
\tcw_right={cw}

\tfea_name=mfcc
\tfea_lst=$MINI_TIMIT/data/{split}/feats_mfcc.scp
\tfea_opts=apply-cmvn --utt2spk=ark:$MINI_TIMIT/data/{split}/utt2spk scp:$MINI_TIMIT/data/{split}/cmvn_mfcc.scp ark:- ark:- |
\tcw_left=0
\tcw_right=0
""" + LAB_CD + """
\tlab_name=lab_mono
\tlab_folder=$MINI_TIMIT/exp/mono_ali_{split}
\tlab_opts=ali-to-phones --per-frame=true
\tlab_count_file=none
\tlab_data_folder=$MINI_TIMIT/data/{split}/
\tlab_graph=$MINI_TIMIT/exp/mono/graph
N_chunks = {chunks}
"""
USE = """
[data_use]
train_with = train
valid_with = dev
forward_with = test

[batches]
batch_size_train = {batch}
max_seq_length_train = {maxlen}
increase_seq_length_train = {increase}
start_seq_len_train = 50
multply_factor_seq_len_train = 2
batch_size_valid = 8
max_seq_length_valid = 1000
"""
OPT = {"rmsprop": "arch_opt = rmsprop\nopt_momentum = 0.0\nopt_alpha = 0.95\nopt_eps = 1e-8\nopt_centered = False\nopt_weight_decay = 0.0\n",
       "sgd": "arch_opt = sgd\nopt_momentum = 0.0\nopt_weight_decay = 0.0\nopt_dampening = 0.0\nopt_nesterov = False\n"}


def arch(n, name, klass, prefix, lay, drop, bn, ln, act, lr, seq, opt="rmsprop", bidir=None):
    lines = [f"[architecture{n}]", f"arch_name = {name}", f"arch_proto = proto/{klass}.proto", "arch_library = neural_networks",
             f"arch_class = {klass}", "arch_pretrain_file = none", "arch_freeze = False", f"arch_seq_model = {seq}",
             f"{prefix}_lay = {lay}", f"{prefix}_drop = {drop}", f"{prefix}_use_laynorm_inp = False",
             f"{prefix}_use_batchnorm_inp = False", f"{prefix}_use_batchnorm = {bn}", f"{prefix}_use_laynorm = {ln}",
             f"{prefix}_act = {act}"]
    if bidir is not None:
        lines += [f"{prefix}_bidir = {bidir}", f"{prefix}_orthinit = True"]
    lines += [f"arch_lr = {lr}", "arch_halving_factor = 0.5", "arch_improvement_threshold = 0.001"]
    return "\n" + "\n".join(lines) + "\n" + OPT[opt]


def head(n, name, label, lr):
    return arch(n, name, "MLP", "dnn", f"N_out_{label}", "0.0", "False", "False", "softmax", lr, "False")


MULTITASK = """
[model]
model_proto = proto/model.proto
model = out_dnn1=compute({trunk},{inp})
\tout_dnn2=compute(MLP_cd,out_dnn1)
\tout_dnn3=compute(MLP_mono,out_dnn1)
\tloss_mono=cost_nll(out_dnn3,lab_mono)
\tloss_mono_w=mult_constant(loss_mono,{weight})
\tloss_cd=cost_nll(out_dnn2,lab_cd)
\tloss_final=sum(loss_cd,loss_mono_w)
\terr_final=cost_err(out_dnn2,lab_cd)
"""
TAIL = """
[forward]
forward_out = {out}
normalize_posteriors = True
normalize_with_counts_from = lab_cd
save_out_file = False
require_decoding = {decode}

[decoding]
decoding_script_folder = kaldi_decoding_scripts/
decoding_script = decode_dnn.sh
decoding_proto = proto/decoding.proto
min_active = 200
max_active = 7000
max_mem = 50000000
beam = 13.0
latbeam = 8.0
acwt = 0.2
max_arcs = -1
skip_scoring = false
scoring_script = local/score.sh
scoring_opts = "--min-lmwt 4 --max-lmwt 6"
norm_vars = False
"""


def config(trunk_arch, model, epochs=1, batch="4", maxlen="1000", increase="False", cw=0, chunks=2, out="out_dnn2",
           decode="True", extra=""):
    datasets = "".join(DATASET.format(n=i, split=s, cw=cw, chunks=chunks if s == "train" else 1)
                       for i, s in enumerate(("train", "dev", "test"), 1))
    return (HEAD.format(epochs=epochs) + datasets + USE.format(batch=batch, maxlen=maxlen, increase=increase)
            + trunk_arch + extra + model + TAIL.format(out=out, decode=decode))


HEADS = head(2, "MLP_cd", "lab_cd", "0.003") + head(3, "MLP_mono", "lab_mono", "0.001")
CONFIGS = {
    # liGRU, bidirectional, progressive rate and batch size, the length curriculum, monophone weight 0.5
    "liGRU": config(arch(1, "liGRU_layers", "liGRU", "ligru", "12,10", "0.2,0.1", "True,False", "False", "relu,relu",
                         "0.004*1|0.002*1", "True", bidir="True") + HEADS,
                    MULTITASK.format(trunk="liGRU_layers", inp="fbank", weight="0.5"), epochs=2, batch="4*1|2",
                    maxlen="1000*1|80*1", increase="True", decode="False"),
    # LSTM, unidirectional, layer norm on the second layer, decoded to a %WER line
    "LSTM": config(arch(1, "LSTM_layers", "LSTM", "lstm", "10,8", "0.2", "True,False", "False,True", "tanh", "0.0016",
                        "True", bidir="False") + HEADS,
                   MULTITASK.format(trunk="LSTM_layers", inp="fbank", weight="1.0")),
    # GRU and RNN: built and checked, not run (their time loops are the slow ones)
    "GRU": config(arch(1, "GRU_layers", "GRU", "gru", "8,8,8", "0.2", "True", "False", "tanh", "0.0004", "True",
                       bidir="True") + HEADS, MULTITASK.format(trunk="GRU_layers", inp="fbank", weight="1.0")),
    "RNN": config(arch(1, "RNN_layers", "RNN", "rnn", "8", "0.1", "False", "False", "relu", "0.0004", "True",
                       bidir="True") + HEADS, MULTITASK.format(trunk="RNN_layers", inp="fbank", weight="1.0")),
    # MLP with a context window, its own output layer in the same architecture (TIMIT_MLP_mfcc_basic's
    # layout), SGD, two streams concatenated, frame batches
    "MLP": config(arch(1, "MLP_layers1", "MLP", "dnn", "16,16,N_out_lab_cd", "0.15,0.15,0.0", "True,True,False",
                       "False", "relu,relu,softmax", "0.08", "False", opt="sgd"),
                  "\n[model]\nmodel_proto = proto/model.proto\nmodel = conc1=concatenate(fbank,mfcc)\n"
                  "\tout_dnn1=compute(MLP_layers1,conc1)\n\tloss_final=cost_nll(out_dnn1,lab_cd)\n"
                  "\terr_final=cost_err(out_dnn1,lab_cd)\n", batch="64", cw=2, out="out_dnn1"),
}

# What pytorch-kaldi builds for each config (neural_networks.py: LSTM / GRU / liGRU / RNN drop the
# candidate with one mask per sequence, MLP drops each layer's output; BatchNorm1d(momentum=0.05)):
# per layer (unit, size, bidirectional, dropout, norm), the rate of each architecture at epoch 1, the
# heads and the architecture that trains each, the monophone weight, the batch unit.
EXPECTED = {
    "liGRU": dict(layers=[("ligru", 12, True, 0.2, "batch"), ("ligru", 10, True, 0.1, None)],
                  lrs={"liGRU_layers": 0.004, "MLP_cd": 0.003, "MLP_mono": 0.001}, mono=0.5, unit="utterances",
                  inputs=["fbank"]),
    "LSTM": dict(layers=[("lstm", 10, False, 0.2, "batch"), ("lstm", 8, False, 0.2, "layer")],
                 lrs={"LSTM_layers": 0.0016, "MLP_cd": 0.003, "MLP_mono": 0.001}, mono=1.0, unit="utterances",
                 inputs=["fbank"]),
    "GRU": dict(layers=[("gru", 8, True, 0.2, "batch")] * 3, lrs={"GRU_layers": 0.0004, "MLP_cd": 0.003, "MLP_mono": 0.001},
                mono=1.0, unit="utterances", inputs=["fbank"]),
    "RNN": dict(layers=[("rnn", 8, True, 0.1, None)], lrs={"RNN_layers": 0.0004, "MLP_cd": 0.003, "MLP_mono": 0.001},
                mono=1.0, unit="utterances", inputs=["fbank"]),
    "MLP": dict(layers=[("mlp", 16, False, 0.15, "batch"), ("mlp", 16, False, 0.15, "batch")],
                lrs={"MLP_layers1": 0.08}, mono=None, unit="frames", inputs=["fbank", "mfcc"]),
}
CELL = {"ligru": "LiGRUCell", "lstm": "LSTMCell", "gru": "GRUCell", "rnn": "RNNCell", "mlp": "MLPCell"}


def write(tmp_path, name, text):
    path = tmp_path / f"{name}.cfg"
    path.write_text(text)
    return path


@pytest.fixture
def env(tiny_corpus, tmp_path, monkeypatch):
    monkeypatch.setenv("MINI_TIMIT", str(tiny_corpus.root))
    monkeypatch.setenv("BRU_TEST_EXP", str(tmp_path / "exp"))
    return tiny_corpus


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_the_network_is_the_one_pytorch_kaldi_builds(name, env, tmp_path):
    config = parse_config(write(tmp_path, name, CONFIGS[name]))
    want = EXPECTED[name]
    model, groups = build_model(config, input_dim=5, num_pdfs=31, num_mono=7 if want["mono"] else None)
    layers = [layer for stack in model.stacks for layer in stack.layers]
    assert len(layers) == len(want["layers"])
    for layer, (unit, size, bidir, drop, norm) in zip(layers, want["layers"]):
        assert type(layer.cells[0]).__name__ == CELL[unit]
        assert layer.hidden_size == size and layer.bidirectional == bidir
        assert layer.dropout == 0.0, "pytorch-kaldi drops inside the layer, never its input"
        assert all(cell.inner_dropout == pytest.approx(drop) for cell in layer.cells)
        norms = [m for m in layer.modules() if isinstance(m, MaskedBatchNorm)]
        if norm == "batch":
            assert norms and all(m.momentum == 0.05 for m in norms)
        else:
            assert not norms and (layer.norm is None) == (norm is None)
    assert model.senone.out_features == 31
    assert (model.mono.out_features if model.mono is not None else None) == (7 if want["mono"] else None)
    archs = trained_architectures(config)
    assert {a.arch_name: a.arch_lr for a in archs} == pytest.approx(want["lrs"])
    # each output layer trains with its own architecture's optimiser (and rate)
    owner = {id(p): a.arch_name for a, group in zip(archs, groups) for p in group}
    senone_owner = "MLP_cd" if "MLP_cd" in want["lrs"] else "MLP_layers1"
    assert {owner[id(p)] for p in model.senone.parameters()} == {senone_owner}
    if want["mono"]:
        assert {owner[id(p)] for p in model.mono.parameters()} == {"MLP_mono"}
        assert config.model.mono_weight == want["mono"] and config.model.mono_lab == "lab_mono"
    assert config.batches.batch_unit == want["unit"] and config.model.inputs == want["inputs"]
    assert all(a.opt_bias_correction is False for a in archs if a.arch_opt == "rmsprop"), "torch's plain RMSprop"


def test_progressive_values_and_the_length_curriculum(env, tmp_path):
    config = parse_config(write(tmp_path, "liGRU", CONFIGS["liGRU"]))
    # pytorch-kaldi: 50 frames in epoch 1, then min(50 * 2, max_seq_length_train of epoch 1 = 1000)
    assert [epoch_values(config, e) for e in range(2)] == [{"batch_size": 4, "max_seq_length": 50},
                                                          {"batch_size": 2, "max_seq_length": 100}]
    assert config.architecture("liGRU_layers").arch_lr_schedule == "0.004*1|0.002*1"
    assert config.batches.long_utterances == "cut"
    # scoring_opts --min-lmwt 4 --max-lmwt 6: the acoustic scales 1/6, 1/5, 1/4
    assert config.decoding.acwt_sweep == pytest.approx([1 / 6, 1 / 5, 1 / 4], abs=1e-3)
    assert config.data_use.forward_with == ["dev", "test"]


def test_liGRU_multitask_runs_with_its_schedules(env, tmp_path):
    """Two epochs: the rates are the progressive ones (no halving), the batch size and length change."""
    path = write(tmp_path, "liGRU", CONFIGS["liGRU"])
    result = run(env, tmp_path / "exp", "--stop-stage", "train", config=path)
    lines = [line for line in (tmp_path / "exp" / "res.res").read_text().splitlines() if line.startswith("epoch=")]
    assert len(lines) == 2
    assert "lr_liGRU_layers=0.004 " in lines[0] and "lr_liGRU_layers=0.002 " in lines[1]
    assert "lr_MLP_mono=0.001 " in lines[1] or "lr_MLP_mono=0.0005 " in lines[1]
    log = (tmp_path / "exp" / "log.txt").read_text()
    assert "pytorch-kaldi [exp] use_cuda" in log and "untied weights" in log and "1 - z" in log
    assert log.count("untied weights") == 1, "each difference is said once"
    assert result.returncode == 0


@pytest.mark.parametrize("name", ["LSTM", "MLP"])
def test_runs_end_to_end_to_a_wer_line(name, env, tmp_path):
    run(env, tmp_path / "exp", config=write(tmp_path, name, CONFIGS[name]))
    res = (tmp_path / "exp" / "res.res").read_text()
    assert re.search(r"^test: %WER \d+\.\d\d \[ \d+ / \d+, ", res, flags=re.M), res
    assert re.search(r"^dev: %WER ", res, flags=re.M), "the scale is chosen on the validation set"
    if name == "MLP":
        assert "batch_size_train counts frames" in (tmp_path / "exp" / "log.txt").read_text()


def test_convert_prints_a_native_config_that_reads_the_same(env, tmp_path):
    path = write(tmp_path, "LSTM", CONFIGS["LSTM"])
    result = run(env, tmp_path / "exp", "--convert", config=path)
    native = result.stdout
    assert "\n[cfg_proto]" not in native and "arch_class" not in native and "unit = lstm" in native
    assert "# pytorch-kaldi [exp] cmd:" in native
    assert parse_config_text(native, source="x").model == parse_config(path).model


def test_option_names_are_case_insensitive(env, tmp_path):
    text = CONFIGS["RNN"].replace("N_epochs_tr = 1", "n_EPOCHS_TR = 3").replace("arch_lr = 0.0004", "Arch_LR = 0.0004")
    assert parse_config(write(tmp_path, "RNN", text)).exp.n_epochs_tr == 3


def test_every_unsupported_item_is_listed_in_one_error(env, tmp_path):
    text = (CONFIGS["liGRU"].replace("arch_class = liGRU", "arch_class = QRNN")
            .replace("dnn_use_batchnorm_inp = False", "dnn_use_batchnorm_inp = True", 1)
            .replace("opt_weight_decay = 0.0\n\n[model]", "opt_weight_decay = 0.0\nopt_amsgrad = True\n\n[model]")
            .replace("\terr_final=", "\tx=avg(out_dnn2,out_dnn3)\n\terr_final=")
            .replace("[data_use]", "[optimization]\nlr = 1\n\n[data_use]"))
    with pytest.raises(ConfigError) as error:
        parse_config(write(tmp_path, "bad", text))
    message = str(error.value)
    for expected in ("arch_class = QRNN: no equivalent here", "dnn_use_batchnorm_inp = True", "opt_amsgrad",
                     "x=avg(...): not supported", "unknown section [optimization]"):
        assert expected in message, message
    assert "bad.cfg" in message and "[architecture1]" in message


def test_a_half_migrated_config_is_refused(env, tmp_path):
    """pytorch-kaldi's option names in our vocabulary's sections are not silently ignored."""
    text = CONFIGS["LSTM"].replace("lstm_lay = 10,8", "lstm_lay = 10,8\nsizes = 64")
    with pytest.raises(ConfigError, match=r"sizes: not an option of arch_class LSTM"):
        parse_config(write(tmp_path, "half", text))


def test_detection():
    assert pytorch_kaldi.is_pytorch_kaldi("[architecture1]\narch_class = LSTM\n")
    assert not pytorch_kaldi.is_pytorch_kaldi(Path("tests/data/tiny_liBRU.cfg").read_text())


def test_res_res_reads_by_name_and_converts_to_pytorch_kaldis_positional_lines(tmp_path):
    """pytorch-kaldi's utils.export_loss_acc_to_txt splits an epoch line on spaces and reads the training
    loss and error at positions 2 and 3, the first validation set's at 5 and 6 (error = 1 - accuracy)."""
    from bru_kaldi.experiment import pytorch_kaldi_epoch_lines, read_res

    res = tmp_path / "res.res"
    res.write_text("".join(
        f"epoch={e:03d} train_loss={3 - e / 10:.4f} train_err={0.6 - e / 100:.4f} dev_loss={2.5 - e / 10:.4f} "
        f"dev_err={0.5 - e / 100:.4f} lr_a=0.0004 lr_b=0.0002 time={10.0 * e:.1f}s\n" for e in range(1, 12))
        + "dev: %WER 31.00 [ 31 / 100, 1 ins, 10 del, 20 sub ] acwt=0.2\n")
    epochs, decodes = read_res(res)
    assert len(epochs) == 11 and epochs[10]["lr_b"] == "0.0002" and decodes["dev"].startswith("%WER 31.00")
    lines = pytorch_kaldi_epoch_lines(res, train_name="TIMIT_tr", dev_name="TIMIT_dev")
    assert lines[0].startswith("ep=00 tr=['TIMIT_tr'] ") and lines[10].startswith("ep=10 ")  # from 0, two digits
    for e, line in enumerate(lines, 1):
        fields = line.split(" ")
        assert float(fields[2].split("=")[1]) == pytest.approx(3 - e / 10, abs=5e-4)
        assert float(fields[3].split("=")[1]) == pytest.approx(0.6 - e / 100, abs=5e-4)
        assert float(fields[5].split("=")[1]) == pytest.approx(2.5 - e / 10, abs=5e-4)
        assert float(fields[6].split("=")[1]) == pytest.approx(0.5 - e / 100, abs=5e-4)
        assert fields[7:9] == ["lr_a=0.0004", "lr_b=0.0002"] and fields[-1] == f"time(s)={10 * e}"
    res.write_text("epoch=001 train_loss=1\nnot a result line\n")
    with pytest.raises(ValueError, match=r"res.res, line 2: expected an epoch line"):
        read_res(res)


@pytest.mark.parametrize("name, options, kind", [("LSTM", ["lstm_use_batchnorm_inp"], "batch"),
                                                  ("MLP", ["dnn_use_laynorm_inp"], "layer"),
                                                  ("LSTM", ["lstm_use_laynorm_inp", "lstm_use_batchnorm_inp"], "layer+batch")],
                         ids=["lstm-batchnorm", "mlp-laynorm", "lstm-both"])
def test_input_norms_convert_and_train(name, options, kind, env, tmp_path):
    """``<p>_use_batchnorm_inp`` / ``<p>_use_laynorm_inp = True`` become ``input_norm`` (both: layer norm first,
    pytorch-kaldi's order), a norm of the architecture's input before its first layer (batch norm with
    pytorch-kaldi's momentum 0.05); the config converts and trains an epoch on the tiny corpus, and the
    trained weights hold the norm's parameters."""
    text = CONFIGS[name]
    for option in options:
        assert f"{option} = False" in text
        text = text.replace(f"{option} = False", f"{option} = True", 1)
    path = write(tmp_path, name, text)
    converted = run(env, tmp_path / "exp", "--convert", config=path).stdout
    assert f"\ninput_norm = {kind}\n" in converted, converted
    config = parse_config(path)
    model, _ = build_model(config, input_dim=5, num_pdfs=31, num_mono=7 if name == "LSTM" else None)
    norm = model.stacks[0].input_norm
    assert norm is not None and norm.kind == kind
    assert (norm.batch is not None) == ("batch" in kind) and (norm.layer is not None) == ("layer" in kind)
    if norm.batch is not None:
        assert norm.batch.momentum == 0.05
    assert all(stack.input_norm is None for stack in model.stacks[1:])
    run(env, tmp_path / "exp", "--stop-stage", "train", config=path)
    assert len([line for line in (tmp_path / "exp" / "res.res").read_text().splitlines() if line.startswith("epoch=")]) == 1
    trained = torch.load(tmp_path / "exp" / "final.pt", map_location="cpu", weights_only=True)["model"]
    for part in ("layer", "batch"):
        keys = [k for k in trained if k.startswith(f"stacks.0.input_norm.{part}.")]
        assert bool(keys) == (part in kind), keys
    if "batch" in kind:  # the running statistics moved away from their start (0, 1)
        assert trained["stacks.0.input_norm.batch.running_mean"].abs().max() > 0


def test_an_input_norm_on_an_output_layer_alone_is_refused(env, tmp_path):
    text = CONFIGS["LSTM"]
    start = text.index("arch_name = MLP_cd")
    text = text[:start] + text[start:].replace("dnn_use_batchnorm_inp = False", "dnn_use_batchnorm_inp = True", 1)
    with pytest.raises(ConfigError, match=r"\[architecture2\] dnn_use_laynorm_inp / dnn_use_batchnorm_inp = True: an "
                                          r"architecture that is an output layer alone \(N_out_lab_cd\)"):
        parse_config(write(tmp_path, "head", text))


# pytorch-kaldi's joint training (cfg/TIMIT_baselines/TIMIT_rev/TIMIT_joint_training_liGRU_fbank.cfg): a
# front end regresses a second feature stream (there the clean fbank, here the MFCCs) through a linear MLP,
# whose mse joins the senone and monophone costs, and the recogniser reads the front end's output.
JOINT_MODEL = """
[model]
model_proto = proto/model.proto
model = out_dnn1=compute(liGRU_SE,fbank)
\tout_dnn_SE=compute(MLP_SE,out_dnn1)
\tout_dnn2=compute(liGRU_SR,out_dnn_SE)
\tout_dnn3=compute(MLP_cd,out_dnn2)
\tout_dnn4=compute(MLP_mono,out_dnn2)
\tloss_mono=cost_nll(out_dnn4,lab_mono)
\tloss_mono_w=mult_constant(loss_mono,1.0)
\tloss_se={mse}
\tloss_se_w=mult_constant(loss_se,{weight})
\tloss_cd=cost_nll(out_dnn3,lab_cd)
\tloss_sum1=sum(loss_cd,loss_mono_w)
\tloss_final=sum(loss_sum1,loss_se_w)
\terr_final=cost_err(out_dnn3,lab_cd)
"""
JOINT_ARCHS = (arch(1, "liGRU_SE", "liGRU", "ligru", "8", "0.1", "True", "False", "relu", "0.002", "True", bidir="True")
               + arch(2, "MLP_SE", "MLP", "dnn", "13", "0.0", "False", "False", "linear", "0.002", "False")
               + arch(3, "liGRU_SR", "liGRU", "ligru", "8", "0.1", "True", "False", "relu", "0.002", "True", bidir="True")
               + head(4, "MLP_cd", "lab_cd", "0.003") + head(5, "MLP_mono", "lab_mono", "0.001"))


def joint(mse="mse(out_dnn_SE,mfcc)", weight="0.5", model=JOINT_MODEL):
    return config(JOINT_ARCHS, model.format(mse=mse, weight=weight), out="out_dnn3")


def test_mse_translates_to_an_auxiliary_term_of_the_chain(env, tmp_path):
    """``mse(out, fea)`` weighted by ``mult_constant`` and summed into ``loss_final``: the architecture whose
    output it compares (in the stack, not fed by the target stream), the stream and the weight; the model
    returns that architecture's output, whose size must be the stream's; either operand order."""
    for mse in ("mse(out_dnn_SE,mfcc)", "mse(mfcc,out_dnn_SE)"):
        config = parse_config(write(tmp_path, "joint", joint(mse=mse)))
        m = config.model
        assert (m.mse_arch, m.mse_target, m.mse_weight) == ("MLP_SE", "mfcc", 0.5)
        assert m.stack == ["liGRU_SE", "MLP_SE", "liGRU_SR"] and m.inputs == ["fbank"]
        assert (m.mono_lab, m.mono_weight, m.senone_lab) == ("lab_mono", 1.0, "lab_cd")
        assert config.architecture("MLP_SE").unit_options == {"activation": "linear"} and config.architecture("MLP_SE").sizes == [13]
    assert "mse averages the squared error over real frames only" in " ".join(config.notes)
    model, _ = build_model(config, input_dim=5, num_pdfs=31, num_mono=7, mse_dim=13)
    model.eval()
    x, lengths = torch.randn(2, 6, 5), torch.tensor([6, 4])
    out = model(x, lengths)
    front_end = model.stacks[1](model.stacks[0](x, lengths), lengths)
    assert out["mse"].shape == (2, 6, 13)
    torch.testing.assert_close(out["mse"], front_end, rtol=0, atol=0)
    assert torch.all(front_end[1, 4:] == 0) and (front_end < 0).any(), "linear: negative values, padding zero"
    with pytest.raises(ConfigError, match=r"mse_arch = MLP_SE: its output has 13 values per frame, the feature "
                                          r"stream mse_target = mfcc it is compared with has 40"):
        build_model(config, input_dim=5, num_pdfs=31, num_mono=7, mse_dim=40)


def test_an_mse_on_a_side_branch_is_computed_off_the_way_to_the_senone_output(env, tmp_path):
    """``out_side = compute(MLP_side, out_dnn1)`` compared with a stream: MLP_side reads liGRU_SE's output and
    joins the stack, and the senone output still reads liGRU_SR's output alone."""
    archs = JOINT_ARCHS + arch(6, "MLP_side", "MLP", "dnn", "13", "0.0", "False", "False", "linear", "0.002", "False")
    text = config(archs, SIDE_BRANCH.format(mse="mse(out_side,mfcc)", weight="0.5"), out="out_dnn3")
    parsed = parse_config(write(tmp_path, "side", text))
    assert parsed.model.mse_arch == "MLP_side" and "MLP_side" in parsed.model.stack
    model, _ = build_model(parsed, input_dim=5, num_pdfs=31, num_mono=7, mse_dim=13)
    model.eval()
    x, lengths = torch.randn(2, 6, 5), torch.tensor([6, 4])
    out = model(x, lengths)
    stack = parsed.model.stack
    trunk = model.stacks[stack.index("liGRU_SE")](x, lengths)
    torch.testing.assert_close(out["mse"], model.stacks[stack.index("MLP_side")](trunk, lengths), rtol=0, atol=0)
    recognition = model.stacks[stack.index("liGRU_SR")](model.stacks[stack.index("MLP_SE")](trunk, lengths), lengths)
    torch.testing.assert_close(out["senone"], model.senone(recognition), rtol=1e-6, atol=1e-6)


def test_the_mse_term_is_pytorch_kaldis_on_real_frames():
    """The loss is sum(CE_cd) + w_mono sum(CE_mono) + w sum over real frames of mean over values of
    (out - target)^2, over the frames of the batch: per frame pytorch-kaldi's loss_final, mean((out - fea)^2)
    for the mse; garbage in the padding (output and target) changes nothing and gets no gradient."""
    from bru_kaldi.batching import IGNORE
    from bru_kaldi.config import Model
    from bru_kaldi.training import batch_loss

    generator = torch.Generator().manual_seed(0)
    B, T, D = 2, 5, 3
    lengths = torch.tensor([5, 2])
    real = torch.arange(T) < lengths[:, None]
    labels = {name: torch.randint(0, n, (B, T), generator=generator).masked_fill(~real, IGNORE)
              for name, n in (("lab_cd", 7), ("lab_mono", 4))}
    out = {"senone": torch.randn(B, T, 7, generator=generator, dtype=torch.float64),
           "mono": torch.randn(B, T, 4, generator=generator, dtype=torch.float64),
           "mse": torch.randn(B, T, D, generator=generator, dtype=torch.float64, requires_grad=True)}
    target = torch.randn(B, T, D, generator=generator, dtype=torch.float64)
    target[~real] = 1e3
    model = Model(senone_lab="lab_cd", mono_lab="lab_mono", mono_weight=0.3, mse_arch="A", mse_target="f", mse_weight=0.5)
    loss, (loss_sum, errors, frames) = batch_loss(out, labels, model, global_frames=7, target=target)
    ce = lambda logits, lab: torch.nn.functional.cross_entropy(logits[real], lab[real], reduction="sum")  # noqa: E731
    squared = sum(((out["mse"][b, :n] - target[b, :n]) ** 2).mean(-1).sum() for b, n in enumerate(lengths.tolist()))
    expected = (ce(out["senone"], labels["lab_cd"]) + 0.3 * ce(out["mono"], labels["lab_mono"]) + 0.5 * squared) / 7
    torch.testing.assert_close(loss.double(), expected, rtol=1e-6, atol=0)
    assert frames == 7 and loss_sum == pytest.approx(float(ce(out["senone"], labels["lab_cd"])), rel=1e-6)
    loss.backward()
    assert torch.all(out["mse"].grad[~real] == 0) and torch.all(out["mse"].grad[real] != 0)
    torch.testing.assert_close(out["mse"].grad[real], (0.5 * 2 * (out["mse"] - target) / (D * 7))[real].detach().float(),
                               rtol=1e-5, atol=1e-9, check_dtype=False)
    with pytest.raises(ValueError, match=r"mse output \(\[model\] mse_arch\) but the batch no mse_target features"):
        batch_loss(out, labels, model, global_frames=7)


def test_joint_training_with_mse_runs_end_to_end(env, tmp_path):
    """The joint-training config converts, trains an epoch (the target stream read beside the input, not
    fed to the network), writes log-likelihoods of the input alone and decodes to a %WER line."""
    import data_io
    from bru_kaldi.training import feature_columns

    path = write(tmp_path, "joint", joint())
    converted = run(env, tmp_path / "exp", "--convert", config=path).stdout
    for line in ("mse_arch = MLP_SE", "mse_target = mfcc", "mse_weight = 0.5", "activation = linear", "inputs = fbank"):
        assert f"\n{line}\n" in converted, converted
    config = parse_config(path)
    train = data_io.Corpus(data_io.dataset_for(config, "train", with_labels=True))
    assert [s.fea_name for s in train.spec.fea] == ["fbank", "mfcc"]
    assert feature_columns(config.model, train.sources) == (40, slice(40, 53))
    test = data_io.dataset_for(config, "test", with_labels=False)
    assert [s.fea_name for s in test.fea] == ["fbank"], "forward reads the inputs only"
    run(env, tmp_path / "exp", config=path)
    res = (tmp_path / "exp" / "res.res").read_text()
    assert len([line for line in res.splitlines() if line.startswith("epoch=")]) == 1
    assert re.search(r"^test: %WER \d+\.\d\d ", res, flags=re.M), res
    trained = torch.load(tmp_path / "exp" / "final.pt", map_location="cpu", weights_only=True)
    assert trained["input_dim"] == 40 and trained["model"]["stacks.1.layers.0.proj.weight"].shape[0] == 13
    log = (tmp_path / "exp" / "log.txt").read_text()
    assert "mse averages the squared error over real frames only" in log


SIDE_BRANCH = JOINT_MODEL.replace("\tout_dnn2=", "\tout_side=compute(MLP_side,out_dnn1)\n\tout_dnn2=")
SECOND_MSE = JOINT_MODEL.replace("\tloss_final=sum(loss_sum1,loss_se_w)", "\tloss_x=mse(out_dnn1,fbank)\n"
                                 "\tloss_y=sum(loss_se_w,loss_x)\n\tloss_final=sum(loss_sum1,loss_y)")


@pytest.mark.parametrize("model, expected", [
    (joint(mse="mse(out_dnn1,out_dnn_SE)"), r"mse\(out_dnn1,out_dnn_SE\): expected one feature stream \(the target: "
                                             r"fbank, mfcc\) and one output of an architecture, got no feature streams"),
    (joint(mse="mse(fbank,mfcc)"), r"mse\(fbank,mfcc\): expected one feature stream .* got two feature streams"),
    (joint(mse="mse(out_dnn3,mfcc)"), r"out_dnn3 is the senone output, a softmax; expected the output of one of "
                                      r"liGRU_SE, MLP_SE, liGRU_SR"),
    (joint(model=SECOND_MSE), r"mse\(out_dnn1,fbank\): a second mse term \(the first compares MLP_SE\); only one "
                              r"is supported"),
], ids=["two-outputs", "two-streams", "senone-output", "second-mse"])
def test_mse_forms_we_cannot_build_are_refused_with_what_is_expected(model, expected, env, tmp_path):
    with pytest.raises(ConfigError, match=expected):
        parse_config(write(tmp_path, "bad", model))


def test_an_autoencoder_is_refused_naming_what_is_missing(env, tmp_path):
    """pytorch-kaldi's TIMIT_MLP_fbank_autoencoder: loss_final is an mse alone, forward_out the code; decoding the
    code is refused (tests/test_pytorch_kaldi_model_forms.py runs it as pytorch-kaldi does, undecoded)."""
    model = ("\n[model]\nmodel_proto = proto/model.proto\nmodel = enc_out=compute(MLP_encoder,fbank)\n"
             "\tdec_out=compute(MLP_decoder,enc_out)\n\tloss_final=mse(dec_out,fbank)\n\terr_final=cost_err(dec_out,lab_cd)\n")
    archs = (arch(1, "MLP_encoder", "MLP", "dnn", "16", "0.0", "False", "False", "relu", "0.08", "False", opt="sgd")
             + arch(2, "MLP_decoder", "MLP", "dnn", "40", "0.0", "False", "False", "linear", "0.08", "False", opt="sgd"))
    with pytest.raises(ConfigError) as error:
        parse_config(write(tmp_path, "autoencoder", config(archs, model, out="enc_out")))
    message = str(error.value)
    assert "features_arch = MLP_encoder: forward writes that architecture's output, not log-likelihoods: set " \
           "[forward] normalize_posteriors = False and require_decoding = False" in message, message


# pytorch-kaldi's DIRHA baselines (DIRHA_GRU_fmllr, DIRHA_MLP_fmllr, DIRHA_liGRU_fmllr) and
# TIMIT_liGRU_fmllr_lr_schedule were saved with their long fea_opts lines hard-wrapped at a fixed width: the
# rest of a line went to the next one as it was, in column 0 (or with the space the break fell on). Each form
# below is one of theirs; they also write "fea:fea_name=" and "[exp] pretrain_file=none".
def hard_wrap(text, anchor, before):
    """``text`` with the first line matching regex ``anchor`` broken right before the last ``before`` on it, the
    rest of the line starting the next one, as an editor wrapping at a fixed width leaves it."""
    lines = text.split("\n")
    i = next(i for i, line in enumerate(lines) if re.search(anchor, line))
    cut = lines[i].rindex(before)
    lines[i:i + 1] = [lines[i][:cut], lines[i][cut:]]
    return "\n".join(lines)


def dirha_like(text):
    text = text.replace("fea = fea_name=", "fea:fea_name=").replace("lab = lab_name=", "lab:lab_name=")
    text = text.replace("[exp]\n", "[exp]\npretrain_file=none\n", 1)
    text = hard_wrap(text, r"data/train/cmvn\.scp", "- ark:- | add-deltas")  # "...ark:" / "- ark:- | add-deltas ..."
    text = hard_wrap(text, r"^- ark:- \| add-deltas", "as --delta-order")  # "... add-delt" / "as --delta-order=0 ..."
    text = hard_wrap(text, r"data/dev/cmvn\.scp", ":- ark:- | add-deltas")  # "...ark" / ":- ark:- | ..."
    text = hard_wrap(text, r"data/test/cmvn\.scp", "ark:- | add-deltas")  # "...ark:- " / "ark:- | ...": an option "ark"
    text = hard_wrap(text, r"^ark:- \| add-deltas", " --delta-order")  # "... add-deltas" / " --delta-order=0 ...": indented
    return hard_wrap(text, r"data/train/cmvn_mfcc\.scp", "|")  # "...ark:- " / "|"


@pytest.mark.parametrize("name", ["MLP", "liGRU"])
def test_hard_wrapped_lines_are_joined_back(name, env, tmp_path):
    """The wrapped config is recognised as pytorch-kaldi's (its own configparser refuses it) and reads exactly
    as the unwrapped one; the note names the lines joined."""
    import configparser

    wrapped = dirha_like(CONFIGS[name])
    assert wrapped.count("\n") == CONFIGS[name].count("\n") + 7
    assert "\n|\n" in wrapped and "\n:- ark:- |" in wrapped and "\n --delta-order=0" in wrapped and "\nas --delta" in wrapped
    with pytest.raises(configparser.Error):  # as pytorch-kaldi reads it
        configparser.ConfigParser().read_string(wrapped)
    assert pytorch_kaldi.is_pytorch_kaldi(wrapped)
    config, plain = parse_config(write(tmp_path, "dirha", wrapped)), parse_config(write(tmp_path, "plain", CONFIGS[name]))
    assert config.datasets == plain.datasets and config.model == plain.model
    assert config.architectures == plain.architectures
    lines = [n + 1 for n, line in enumerate(wrapped.split("\n")) if line.startswith(("- ark", "as --", ":- ark", "ark:- |", " --d", "|"))]
    assert len(lines) == 6
    assert any(f"line(s) {', '.join(map(str, lines))} start with no key of [datasetN]: the rest of a hard-wrapped line" in n
               for n in config.notes)
    assert any("pytorch-kaldi [exp] pretrain_file = none: not read by pytorch-kaldi either" in n for n in config.notes)


def test_a_hard_wrapped_config_runs_end_to_end(env, tmp_path):
    """DIRHA_MLP_fmllr's form: an MLP on spliced frames, its fea_opts wrapped in every way, decoded to a %WER line."""
    run(env, tmp_path / "exp", config=write(tmp_path, "dirha", dirha_like(CONFIGS["MLP"])))
    assert re.search(r"^test: %WER \d+\.\d\d ", (tmp_path / "exp" / "res.res").read_text(), flags=re.M)


def test_detection_reads_lines_not_a_parse():
    assert pytorch_kaldi.is_pytorch_kaldi("[cfg_proto]\ncfg_proto=proto/global.proto\n|\n")
    assert pytorch_kaldi.is_pytorch_kaldi("[model]\nmodel:out=compute(A,fbank)\n")
    assert not pytorch_kaldi.is_pytorch_kaldi("[model]\nstack = a\nmono_lab = none\n[architecture1]\nunit = mlp\n")


def test_exp_pretrain_file(env, tmp_path):
    """pytorch-kaldi reads [exp] pretrain_file nowhere (TIMIT_RNN_* have it): none is accepted, with a note,
    and changes nothing; a path is refused rather than silently not loaded."""
    text = CONFIGS["RNN"].replace("[exp]\n", "[exp]\npretrain_file = none\n", 1)
    assert pytorch_kaldi.translate(text)[0] == pytorch_kaldi.translate(CONFIGS["RNN"])[0]
    assert "pytorch-kaldi [exp] pretrain_file = none: not read by pytorch-kaldi either; nothing to load" in pytorch_kaldi.translate(text)[1]
    with pytest.raises(ConfigError, match=r"rnn.cfg \[exp\] pretrain_file = exp/x/final.pkl: pytorch-kaldi ignores this "
                                          r"option .* set it to none"):
        parse_config(write(tmp_path, "rnn", text.replace("pretrain_file = none", "pretrain_file = exp/x/final.pkl")))


# pytorch-kaldi's TIMIT_LSTM_fmllr_cudnn: its LSTM_cudnn class is one torch.nn.LSTM of num_layers layers
# (proto/LSTM_cudnn.proto's options), dropout between the layers.
def cudnn_arch(bias="True", batch_first="True", dropout="0.2", klass="LSTM_cudnn"):
    return (f"\n[architecture1]\narch_name = {klass}_layers\narch_proto = proto/{klass}.proto\narch_library = neural_networks\n"
            f"arch_class = {klass}\narch_pretrain_file = none\narch_freeze = False\narch_seq_model = True\nhidden_size=6\n"
            f"num_layers=3\nbias={bias}\nbatch_first={batch_first}\ndropout={dropout}\nbidirectional=True\narch_lr = 0.0016\n"
            "arch_halving_factor = 0.5\narch_improvement_threshold = 0.001\n" + OPT["rmsprop"])


def cudnn(klass="LSTM_cudnn", **options):
    return config(cudnn_arch(klass=klass, **options) + HEADS, MULTITASK.format(trunk=f"{klass}_layers", inp="fbank", weight="1.0"))


def test_lstm_cudnn_is_torch_lstm_with_its_layers(env, tmp_path):
    """LSTM_cudnn -> our cudnn_lstm, one layer per num_layers; torch's dropout on every layer's output but the
    last is our dropout on every layer's input but the first. In evaluation the stack computes what
    pytorch-kaldi's nn.LSTM(F, 6, num_layers=3, bidirectional=True) computes with the same weights."""
    path = write(tmp_path, "cudnn", cudnn())
    native = run(env, tmp_path / "exp", "--convert", config=path).stdout
    for line in ("unit = cudnn_lstm", "sizes = 6,6,6", "dropout = 0.0,0.2,0.2", "bidirectional = True", "inputs = fbank"):
        assert f"\n{line}\n" in native, native
    assert "LSTM_cudnn / GRU_cudnn dropout draws one mask per sequence" in native
    config = parse_config(path)
    model, _ = build_model(config, input_dim=5, num_pdfs=31, num_mono=7)
    layers = model.stacks[0].layers
    assert [type(layer).__name__ for layer in layers] == ["VendorRNN"] * 3
    assert [layer.dropout for layer in layers] == pytest.approx([0.0, 0.2, 0.2])
    theirs = torch.nn.LSTM(5, 6, num_layers=3, bidirectional=True)  # time-major, as pytorch-kaldi feeds it
    with torch.no_grad():
        for k, layer in enumerate(layers):
            for name, weight in layer.rnn.named_parameters():  # weight_ih_l0(_reverse) ... of a one-layer LSTM
                getattr(theirs, name.replace("_l0", f"_l{k}")).copy_(weight)
    model.eval()
    x = torch.randn(2, 9, 5)
    ours = model.stacks[0](x, torch.tensor([9, 9]))
    torch.testing.assert_close(ours, theirs(x.transpose(0, 1))[0].transpose(0, 1), rtol=1e-5, atol=1e-6)
    run(env, tmp_path / "exp", "--stop-stage", "train", config=path)
    assert len([line for line in (tmp_path / "exp" / "res.res").read_text().splitlines() if line.startswith("epoch=")]) == 1


def test_gru_cudnn_maps_to_cudnn_gru(env, tmp_path):
    config = parse_config(write(tmp_path, "gru", cudnn(klass="GRU_cudnn")))
    arch = config.architecture("GRU_cudnn_layers")
    assert (arch.unit, arch.sizes, arch.dropout, arch.bidirectional) == ("cudnn_gru", [6, 6, 6], [0.0, 0.2, 0.2], [True])


@pytest.mark.parametrize("options, expected", [
    ({"bias": "False"}, r"\[architecture1\] bias = False: our cudnn_lstm layers always have biases"),
    ({"batch_first": "False"}, r"\[architecture1\] batch_first = False: in pytorch-kaldi's LSTM_cudnn it only turns off "
                               r"the orthogonal initialisation"),
    ({"dropout": "0.2*2|0.1"}, r"\[architecture1\] dropout = 0.2\*2\|0.1: per-epoch dropout rates"),
], ids=["no-bias", "time-major", "dropout-schedule"])
def test_lstm_cudnn_options_we_cannot_honour_are_refused(options, expected, env, tmp_path):
    with pytest.raises(ConfigError, match=expected):
        parse_config(write(tmp_path, "cudnn", cudnn(**options)))


def test_per_layer_activations_and_leaky_relu(env, tmp_path):
    """dnn_act one per layer (TIMIT_MLP_fbank_autoencoder's relu,linear), leaky_relu with pytorch-kaldi's slope
    0.2 (its act_fun: nn.LeakyReLU(0.2)) and elu; softmax only on an output layer."""
    mlp = arch(1, "MLP_layers1", "MLP", "dnn", "16,16,12,N_out_lab_cd", "0.0", "False", "False",
               "relu,leaky_relu,linear,softmax", "0.08", "False", opt="sgd")
    text = config(mlp, "\n[model]\nmodel_proto = proto/model.proto\nmodel = out_dnn1=compute(MLP_layers1,fbank)\n"
                       "\tloss_final=cost_nll(out_dnn1,lab_cd)\n\terr_final=cost_err(out_dnn1,lab_cd)\n", out="out_dnn1")
    path = write(tmp_path, "acts", text)
    assert "\nactivation = relu,leaky_relu,linear\n" in pytorch_kaldi.translate(text)[0]
    config_ = parse_config(path)
    model, _ = build_model(config_, input_dim=5, num_pdfs=31, num_mono=None)
    x = torch.tensor([-1.0, 0.0, 2.0])
    for layer, want in zip(model.stacks[0].layers, ([0.0, 0.0, 2.0], [-0.2, 0.0, 2.0], [-1.0, 0.0, 2.0])):
        assert layer.cells[0].activation(x).tolist() == pytest.approx(want)
    with pytest.raises(ConfigError, match=r"dnn_act: expected 1 or 4 values \(one per layer\), got 2"):
        parse_config(write(tmp_path, "two", text.replace("relu,leaky_relu,linear,softmax", "relu,softmax")))
    with pytest.raises(ConfigError, match=r"dnn_act = relu,softmax,linear,softmax: softmax is not an activation of a "
                                          r"hidden layer \(expected one of tanh, relu, sigmoid, softplus, linear, leaky_relu, elu"):
        parse_config(write(tmp_path, "soft", text.replace("relu,leaky_relu,linear,softmax", "relu,softmax,linear,softmax")))
    elu = parse_config(write(tmp_path, "elu", text.replace("relu,leaky_relu,linear,softmax", "elu,elu,elu,softmax")))
    assert build_model(elu, 5, 31, None)[0].stacks[0].layers[0].cells[0].activation(torch.tensor([-1.0])).item() == \
        pytest.approx(-0.6321206)  # exp(-1) - 1


# pytorch-kaldi's TIMIT_mfcc_fbank_fmllr_liGRU_best: three streams joined two at a time (mfcc, fbank, then fmllr),
# leaky_relu MLPs around a bidirectional liGRU, senone and monophone outputs on the last MLP. The third stream is
# here the fbank features again under the name fmllr.
def three_streams(text):
    return re.sub(r"(\tfea_lst=\$MINI_TIMIT/data/(\w+)/feats_mfcc\.scp\n.*\n\tcw_left=0\n\tcw_right=0\n)",
                  lambda m: m.group(1) + f"\n\tfea_name=fmllr\n\tfea_lst=$MINI_TIMIT/data/{m.group(2)}/feats.scp\n"
                                         "\tfea_opts=add-deltas --delta-order=0 ark:- ark:- |\n\tcw_left=0\n\tcw_right=0\n", text)


BEST_MODEL = """
[model]
model_proto = proto/model.proto
model = conc1=concatenate(mfcc,fbank)
\tconc2=concatenate(conc1,fmllr)
\tout_dnn1=compute(MLP_layers_first,conc2)
\tout_dnn2=compute(liGRU_layers,out_dnn1)
\tout_dnn3=compute(MLP_layers_second,out_dnn2)
\tout_dnn4=compute(MLP_layers_last,out_dnn3)
\tout_dnn5=compute(MLP_layers_last2,out_dnn3)
\tloss_mono=cost_nll(out_dnn5,lab_mono)
\tloss_mono_w=mult_constant(loss_mono,1.0)
\tloss_cd=cost_nll(out_dnn4,lab_cd)
\tloss_final=sum(loss_cd,loss_mono_w)
\terr_final=cost_err(out_dnn4,lab_cd)
"""
BEST_ARCHS = (arch(1, "MLP_layers_first", "MLP", "dnn", "16", "0.15", "True", "False", "leaky_relu", "0.0004", "False")
              + arch(2, "liGRU_layers", "liGRU", "ligru", "8,8", "0.2,0.2", "True,True", "False,False", "relu,relu",
                     "0.0004", "True", bidir="True")
              + arch(3, "MLP_layers_second", "MLP", "dnn", "16", "0.15", "True", "False", "leaky_relu", "0.0004", "False")
              + head(4, "MLP_layers_last", "lab_cd", "0.0004") + head(5, "MLP_layers_last2", "lab_mono", "0.0004"))


def test_three_streams_joined_two_at_a_time_run_end_to_end(env, tmp_path):
    """conc2=concatenate(concatenate(mfcc,fbank),fmllr) is [model] inputs = mfcc,fbank,fmllr, read and joined
    per frame in that order (pytorch-kaldi's torch.cat order); the network reads the 13 + 40 + 40 values;
    trained and decoded to a %WER line."""
    import data_io

    path = write(tmp_path, "best", three_streams(config(BEST_ARCHS, BEST_MODEL, out="out_dnn4", increase="True")))
    config_ = parse_config(path)
    m = config_.model
    assert m.inputs == ["mfcc", "fbank", "fmllr"]
    assert m.stack == ["MLP_layers_first", "liGRU_layers", "MLP_layers_second"]
    assert (m.senone_arch, m.mono_arch, m.mono_lab) == ("MLP_layers_last", "MLP_layers_last2", "lab_mono")
    assert all(not config_.architecture(name).inputs for name in m.stack), "a chain: each reads the one before"
    assert config_.architecture("MLP_layers_first").unit_options == {"activation": "leaky_relu"}
    spec = data_io.dataset_for(config_, "train", with_labels=True)
    assert [s.fea_name for s in spec.fea] == ["mfcc", "fbank", "fmllr"]
    assert [s.dim for s in data_io.Corpus(spec).sources] == [13, 40, 40]
    model, _ = build_model(config_, input_dim=93, num_pdfs=31, num_mono=7)
    assert model.stacks[0].layers[0].proj.in_features == 93 and model.stacks[0].layers[0].cells[0].activation(
        torch.tensor([-1.0])).item() == pytest.approx(-0.2)
    run(env, tmp_path / "exp", config=path)
    assert re.search(r"^test: %WER \d+\.\d\d ", (tmp_path / "exp" / "res.res").read_text(), flags=re.M)


# pytorch-kaldi's TIMIT_MLP_fbank_prod: output layers with the number of classes written out (dnn_lay = 1880 and 48,
# TIMIT's pdfs and phones, where N_out_lab_cd / N_out_lab_mono would take them from the alignments), and
# normalize_with_counts_from naming a counts file instead of a label stream.
def prod(senone, mono, counts="lab_cd"):
    archs = (arch(1, "MLP_layers1", "MLP", "dnn", "16,16", "0.15", "True", "False", "relu", "0.08", "False", opt="sgd")
             + arch(2, "MLP_layers2", "MLP", "dnn", str(senone), "0.0", "False", "False", "softmax", "0.0004", "False")
             + arch(3, "MLP_layers3", "MLP", "dnn", str(mono), "0.0", "False", "False", "softmax", "0.0004", "False"))
    model = MULTITASK.format(trunk="MLP_layers1", inp="fbank", weight="1.0").replace("MLP_cd", "MLP_layers2").replace(
        "MLP_mono", "MLP_layers3")
    return config(archs, model, batch="64").replace("normalize_with_counts_from = lab_cd", f"normalize_with_counts_from = {counts}")


def label_dims(config_):
    import data_io

    return data_io.Corpus(data_io.dataset_for(config_, "train", with_labels=True)).label_dims


def test_literal_output_sizes_are_checked_against_the_labels(env, tmp_path):
    """Accepted when the number is the labels': the pdfs; for per-frame phones pytorch-kaldi's N_out_lab_mono
    (hmm-info's number of phones, ids from 1) or ours (one more). Otherwise the run stops with an error naming
    the config, section, option and both numbers, once the labels are read."""
    dims = label_dims(parse_config(write(tmp_path, "lstm", CONFIGS["LSTM"])))
    pdfs, classes = dims["lab_cd"], dims["lab_mono"]
    path = write(tmp_path, "prod", prod(pdfs, classes - 1))
    config_ = parse_config(path)
    assert (config_.model.senone_size, config_.model.mono_size) == (pdfs, classes - 1)
    assert (config_.model.senone_arch, config_.model.mono_arch, config_.model.stack) == ("MLP_layers2", "MLP_layers3", ["MLP_layers1"])
    assert config_.origins == {"senone_size": f"{path} [architecture2] dnn_lay", "mono_size": f"{path} [architecture3] dnn_lay"}
    for mono in (classes - 1, classes):
        model, _ = build_model(parse_config(write(tmp_path, "prod", prod(pdfs, mono))), 40, pdfs, classes)
        assert (model.senone.out_features, model.mono.out_features) == (pdfs, classes)
    with pytest.raises(ConfigError, match=rf"prod.cfg \[architecture2\] dnn_lay: an output layer of {pdfs} classes for the "
                                          rf"label stream lab_cd, whose alignments have {pdfs + 1} pdfs: expected {pdfs + 1}"):
        build_model(config_, 40, pdfs + 1, classes)
    with pytest.raises(ConfigError, match=rf"\[architecture3\] dnn_lay: an output layer of {classes - 1} classes for the label "
                                          rf"stream lab_mono, whose alignments have {classes} phones \(ids 1 to {classes}; "
                                          rf"our output has {classes + 1} classes\): expected {classes} or {classes + 1}"):
        build_model(config_, 40, pdfs, classes + 1)
    wrong = write(tmp_path, "wrong", prod(1880, classes - 1))
    result = run(env, tmp_path / "exp_wrong", "--stop-stage", "train", config=wrong, expect=1)
    assert f"wrong.cfg [architecture2] dnn_lay: an output layer of 1880 classes for the label stream lab_cd, whose " \
           f"alignments have {pdfs} pdfs: expected {pdfs}" in result.stderr, result.stderr


def test_literal_sizes_and_a_counts_file_run_end_to_end(env, tmp_path):
    """TIMIT_MLP_fbank_prod's form on the tiny corpus: its priors from the counts file it names (here uniform)."""
    dims = label_dims(parse_config(write(tmp_path, "lstm", CONFIGS["LSTM"])))
    counts = tmp_path / "ali_train_pdf.counts"
    counts.write_text("[ " + " ".join(["5"] * dims["lab_cd"]) + " ]\n")
    path = write(tmp_path, "prod", prod(dims["lab_cd"], dims["lab_mono"] - 1, counts=counts))
    native = run(env, tmp_path / "exp", "--convert", config=path).stdout
    assert f"\n    lab_count_file={counts}\n" in native and "\nnormalize_with_counts_from = lab_cd\n" in native
    assert native.count(f"lab_count_file={counts}") == 1, "the training set's senone labels only"
    run(env, tmp_path / "exp", config=path)
    from bru_kaldi.posteriors import read_counts

    assert read_counts(str(tmp_path / "exp" / "pdf_counts")).tolist() == [5.0] * dims["lab_cd"]
    assert re.search(r"^test: %WER \d+\.\d\d ", (tmp_path / "exp" / "res.res").read_text(), flags=re.M)


def test_joint_training_with_a_literal_monophone_size(env, tmp_path):
    """TIMIT_joint_training_liGRU_fbank's monophone output: dnn_lay = 48 (TIMIT's phones), with softmax."""
    archs = JOINT_ARCHS.replace("dnn_lay = N_out_lab_mono", "dnn_lay = 48")
    config_ = parse_config(write(tmp_path, "joint", config(archs, JOINT_MODEL.format(mse="mse(out_dnn_SE,mfcc)", weight="1.0"),
                                                          out="out_dnn3")))
    assert (config_.model.mono_size, config_.model.mono_arch, config_.model.mse_arch) == (48, "MLP_mono", "MLP_SE")
    build_model(config_, 40, 31, 49, mse_dim=13)
    with pytest.raises(ConfigError, match=r"joint.cfg \[architecture5\] dnn_lay: an output layer of 48 classes .* 40 phones"):
        build_model(config_, 40, 31, 41, mse_dim=13)


# Architectures' outputs joined by concatenate and read by a further architecture, which pytorch-kaldi's model=
# allows: two branches on two streams, a recurrent layer on both, the output layers on it and on one branch again.
BRANCHES_MODEL = """
[model]
model_proto = proto/model.proto
model = out_a=compute(MLP_a,fbank)
\tout_b=compute(MLP_b,mfcc)
\tconc1=concatenate(out_a,out_b)
\tout_c=compute(LSTM_c,conc1)
\tconc2=concatenate(out_c,out_a)
\tout_dnn2=compute(MLP_cd,conc2)
\tout_dnn3=compute(MLP_mono,conc2)
\tloss_mono=cost_nll(out_dnn3,lab_mono)
\tloss_mono_w=mult_constant(loss_mono,0.5)
\tloss_cd=cost_nll(out_dnn2,lab_cd)
\tloss_final=sum(loss_cd,loss_mono_w)
\terr_final=cost_err(out_dnn2,lab_cd)
"""
BRANCHES = config(arch(1, "MLP_a", "MLP", "dnn", "6", "0.0", "False", "False", "relu", "0.002", "False")
                  + arch(4, "MLP_b", "MLP", "dnn", "4", "0.0", "False", "False", "tanh", "0.002", "False")
                  + arch(5, "LSTM_c", "LSTM", "lstm", "5", "0.0", "False", "False", "tanh", "0.002", "True", bidir="False")
                  + HEADS, BRANCHES_MODEL)


def test_concatenated_outputs_feed_a_further_architecture(env, tmp_path):
    """Each architecture reads what pytorch-kaldi's program gives it, joined in its order (our [architectureN]
    inputs, where it is not the one before it); the model computes exactly that graph."""
    path = write(tmp_path, "branches", BRANCHES)
    config_ = parse_config(path)
    m = config_.model
    assert m.stack == ["MLP_a", "MLP_b", "LSTM_c"] and m.inputs == ["fbank", "mfcc"]
    assert {name: config_.architecture(name).inputs for name in ("MLP_a", "MLP_b", "LSTM_c", "MLP_cd", "MLP_mono")} == {
        "MLP_a": ["fbank"], "MLP_b": ["mfcc"], "LSTM_c": ["MLP_a", "MLP_b"], "MLP_cd": ["LSTM_c", "MLP_a"], "MLP_mono": []}
    assert (m.senone_arch, m.mono_arch, m.mono_weight) == ("MLP_cd", "MLP_mono", 0.5)
    model, _ = build_model(config_, input_dim=53, num_pdfs=31, num_mono=7, stream_dims={"fbank": 40, "mfcc": 13})
    model.eval()
    x, lengths = torch.randn(2, 6, 53), torch.tensor([6, 3])
    a, b, c = model.stacks
    out_a = a(x[..., :40], lengths)
    out_c = c(torch.cat([out_a, b(x[..., 40:], lengths)], -1), lengths)
    trunk = torch.cat([out_c, out_a], -1)
    got = model(x, lengths)
    torch.testing.assert_close(got["senone"], torch.nn.functional.linear(trunk, model.senone.weight, model.senone.bias))
    torch.testing.assert_close(got["mono"], torch.nn.functional.linear(trunk, model.mono.weight, model.mono.bias))
    with pytest.raises(ConfigError, match=r"\[architecture arch_name=MLP_a\] inputs = fbank: which columns of the input "
                                          r"hold each stream is not known here"):
        build_model(config_, input_dim=53, num_pdfs=31, num_mono=7)
    run(env, tmp_path / "exp", config=path)  # the forward pass reads the streams' widths from final.pt
    assert re.search(r"^test: %WER \d+\.\d\d ", (tmp_path / "exp" / "res.res").read_text(), flags=re.M)


@pytest.mark.parametrize("model, expected", [
    (BRANCHES_MODEL.replace("out_b=compute(MLP_b,mfcc)", "out_b=compute(MLP_a,mfcc)"),
     r"MLP_a is computed twice \(two compute\(MLP_a,...\) lines\): one architecture applied to two inputs shares its "
     r"weights in pytorch-kaldi, which we do not support"),
    (BRANCHES_MODEL.replace("conc1=concatenate(out_a,out_b)", "conc1=concatenate(out_a,out_x)"),
     r"'out_x' is neither a feature stream \(fbank, mfcc\) nor compute\(\) / concatenate\(\) of feature streams and "
     r"architectures' outputs"),
    (BRANCHES_MODEL.replace("out_dnn2=compute(MLP_cd,conc2)", "out_dnn2=compute(MLP_cd,conc0)\n\tconc0=concatenate(mfcc,fbank)"),
     r"no layers between the features and the senone output"),
], ids=["shared-weights", "unknown-variable", "no-layers"])
def test_graphs_we_cannot_build_are_refused(model, expected, env, tmp_path):
    text = BRANCHES.replace(BRANCHES_MODEL, model)
    with pytest.raises(ConfigError, match=expected):
        parse_config(write(tmp_path, "bad", text))

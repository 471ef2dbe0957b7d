"""Config parsing: typed values, validation messages, overrides, variables, the resolved copy."""

import dataclasses
from pathlib import Path

import pytest

from bru_kaldi.config import ConfigError, parse_config, parse_config_text, parse_overrides, write_resolved

ROOT = Path(__file__).resolve().parents[1]

BASE = """
[exp]
out_folder = $BRU_TEST_EXP/demo
seed = 7
n_epochs_tr = 3

[dataset1]
data_name = train
fea = fea_name=fbank
    fea_lst=data/train/feats.scp
    fea_opts=apply-cmvn --utt2spk=ark:data/train/utt2spk ark:data/train/cmvn.scp ark:- ark:- |
    cw_left=2
    cw_right=2
    fea_name=mfcc
    fea_lst=data/train/mfcc.scp
lab = lab_name=lab_cd
    lab_folder=exp/mono_ali_train
    lab_opts=ali-to-pdf
    lab_name=lab_mono
    lab_folder=exp/mono_ali_train
    lab_opts=ali-to-phones --per-frame=true
n_chunks = 2

[data_use]
train_with = train
valid_with = train
forward_with = train

[architecture1]
arch_name = rec
unit = ligru
sizes = 16,16
dropout = 0.2
norm = batch
bidirectional = True,False
arch_opt = adam

[architecture2]
arch_name = top
unit = ubru
sizes = 8
backward = kalman

[model]
stack = rec,top
inputs = fbank,mfcc
senone_lab = lab_cd
mono_lab = lab_mono
mono_weight = 0.5

[decoding]
acwt_sweep = 0.1, 0.2 0.3
"""


@pytest.fixture(autouse=True)
def exp_root(monkeypatch, tmp_path):
    monkeypatch.setenv("BRU_TEST_EXP", str(tmp_path))
    return tmp_path


def checked(cfg):
    """As run_exp.py does after parsing: the models check the architectures and expand per-layer lists."""
    from bru_kaldi.network import check_architectures

    check_architectures(cfg)
    return cfg


def test_values_are_typed_and_lists_filled_per_layer(exp_root):
    cfg = parse_config_text(BASE)
    assert cfg.architectures[0].dropout == [0.2]  # as written, until the models check it
    checked(cfg)
    assert cfg.exp.out_folder == f"{exp_root}/demo"
    assert cfg.exp.seed == 7
    rec, top = cfg.architectures
    assert rec.sizes == [16, 16] and rec.dropout == [0.2, 0.2] and rec.norm == ["batch", "batch"]
    assert rec.bidirectional == [True, False]
    assert top.norm == [None] and top.unit_options == {"backward": "kalman"}  # read by the unit
    fbank, mfcc = cfg.datasets[0].fea
    assert (fbank.cw_left, fbank.cw_right, mfcc.cw_left) == (2, 2, 0)
    assert fbank.fea_opts.endswith("ark:- ark:- |")
    assert [s.lab_opts for s in cfg.datasets[0].lab] == ["ali-to-pdf", "ali-to-phones --per-frame=true"]
    assert cfg.decoding.acwt_sweep == [0.1, 0.2, 0.3]
    assert cfg.model.mono_weight == 0.5


def test_unit_options_reach_the_units():
    """Set options reach ``models.build`` typed as the unit declares them; unset ones ("none") leave the unit's
    own defaults."""
    import models
    from bru_kaldi.network import layer_options

    cfg = parse_config_text(BASE.replace("backward = kalman", "backward = kalman\nrho0 = 0.25\ntau11 = 0.75\ntau01 = none"))
    rec, top = cfg.architectures
    assert layer_options(top) == [{"backward": "kalman", "rho0": 0.25, "tau11": 0.75}]
    layer = models.build(top.unit, 3, top.sizes[0], **layer_options(top)[0])
    assert layer.cells[0].rho0.tolist() == pytest.approx([0.25] * 8)
    assert layer.cells[0].tau01.tolist() == pytest.approx([0.1] * 8)  # the unit's default
    assert layer_options(rec) == [{}, {}]
    lbru = parse_config_text(BASE.replace("unit = ligru", "unit = lbru\ninput_gate = False")).architectures[0]
    assert layer_options(lbru) == [{"input_gate": False}] * 2
    assert models.build("lbru", 3, 4, **layer_options(lbru)[0]).cells[0].input_gate is False
    # one value per layer, "default" keeping the unit's; a first-layer option for the first layer alone
    rnn = parse_config_text(BASE.replace("unit = ligru", "unit = rnn\nactivation = default,relu")).architectures[0]
    assert layer_options(rnn) == [{}, {"activation": "relu"}]
    fusion = parse_config_text(BASE.replace("unit = ligru", "unit = fusionrnn\nmics = 2")).architectures[0]
    assert layer_options(fusion) == [{"mics": 2}, {}]


@pytest.mark.parametrize(
    "edit, message",
    [
        (("unit = ligru", "unit = lgru"), r"\[architecture arch_name=rec\]: unknown unit 'lgru' \(did you mean 'ligru'\?\)"),
        (("backward = kalman", "backward = kalmann"), r"arch_name=top\]: backward must be one of"),
        (("backward = kalman", "backward = kalman\ntau11 = 1.5"), r"tau11 must be a probability in \(0, 1\), got 1.5"),
        (("backward = kalman", "backward = kalman\ninput_gate = False"),
         r"unit ubru takes no input_gate option \(units that do: lbru, ubru_tpami\)"),
        (("unit = ligru", "unit = ligru\nrho0 = 0.3"), r"unit ligru takes no rho0 option \(units that do: ubru\)"),
        (("stack = rec,top", "stack = rec,top,rec"), r"\[model\] stack: an architecture appears twice"),
        (("bidirectional = True,False", "bidirectional = True,False,True"),
         r"arch_name=rec\]: bidirectional: expected 1 or 2 values \(one per layer\), got 3"),
        (("norm = batch", "norm = group"), r"arch_name=rec\]: norm must be one of"),
        (("dropout = 0.2", "dropout = 1.5"), r"arch_name=rec\]: dropout must be in \[0, 1\)"),
        (("unit = ligru", "unit = mlp\nactivation = relu,tanh,relu"),
         r"arch_name=rec\]: activation: expected 1 or 2 values \(one per layer\), got 3"),
        (("unit = ligru", "unit = rnn\nactivation = relu,swish"), r"arch_name=rec\]: activation must be one of .*got 'swish'"),
        (("unit = ligru", "unit = ligru\narch_lrr = 0.1"),
         r"arch_name=rec\]: architecture rec: unknown option 'arch_lrr' \(did you mean 'arch_lr'\?\)"),
        (("backward = kalman", "backward = kalman\nrho0 = half"), r"architecture top option rho0: expected a number, got 'half'"),
        (("unit = ligru", "unit = fusionrnn\nmics = 2,2"), r"architecture rec: mics takes one value, its first layer's"),
        (("unit = ligru", "unit = lbru\ndropout_at = inside"), r"unit lbru has no candidate state to drop \(units that do: "
                                                                r"ligru, gru, lstm, rnn, mlp, qlstm, fusionrnn, cnn, sincnet\)"),
    ],
)
def test_units_and_their_options_are_checked_before_anything_runs(edit, message):
    """A config parses without the models; run_exp then checks every unit and its options."""
    from bru_kaldi.network import check_architectures

    old, new = edit
    assert old in BASE
    cfg = parse_config_text(BASE.replace(old, new, 1))
    with pytest.raises(ConfigError, match=message):
        check_architectures(cfg)


def test_checking_the_architectures_leaves_the_seeded_initial_weights_alone():
    """run_exp seeds, then builds the model (which checks the architectures first): the check builds
    throwaway layers, and must not draw from the random state that the real weights come from."""
    import torch

    import models
    from bru_kaldi.network import build_model, check_architectures

    cfg = checked(parse_config_text(BASE))
    torch.manual_seed(3)
    expected, size = [], 13
    for a in cfg.architectures:
        options = {"backward": "kalman"} if a.unit == "ubru" else {}
        expected.append(models.build_stack(a.unit, size, a.sizes, dropout=a.dropout, norm=a.norm,
                                           bidirectional=a.bidirectional, options=options))
        size = expected[-1].output_size
    torch.manual_seed(3)
    check_architectures(cfg)
    model, _ = build_model(cfg, 13, 20, None)
    for stack, reference in zip(model.stacks, expected):
        for (name, got), want in zip(stack.state_dict().items(), reference.state_dict().values()):
            assert torch.equal(got, want), name


def test_reading_a_config_needs_neither_torch_nor_the_models():
    """The config module and its imports load with torch (and so the models) made unimportable."""
    import subprocess
    import sys

    code = ("import sys; sys.modules['torch'] = None; sys.modules['models'] = None\n"
            "from bru_kaldi.config import parse_config\n"
            "cfg = parse_config('cfg/MINI_liBRU.cfg')\n"
            "print(cfg.architectures[0].unit, 'torch' in sys.modules and sys.modules['torch'] is not None)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["libru", "False"]


def test_overrides_replace_values():
    overrides = parse_overrides(["--exp,seed=99", "--architecture1,sizes=4,4,4", "--architecture1,bidirectional=True"])
    cfg = checked(parse_config_text(BASE, overrides))
    assert cfg.exp.seed == 99 and cfg.architectures[0].sizes == [4, 4, 4]
    assert cfg.architectures[0].bidirectional == [True, True, True]


@pytest.mark.parametrize(
    "edit, message",
    [
        (("[exp]", "[exp]\nsed = 3"), r"\[exp\]: unknown option 'sed' \(did you mean 'seed'\?\)"),
        (("[decoding]", "[decodng]"), r"unknown section 'decodng' \(did you mean 'decoding'\?\)"),
        (("seed = 7", "seed = seven"), r"\[exp\] option seed: expected an integer, got 'seven'"),
        (("arch_opt = adam", "arch_opt = adamw"), r"option arch_opt: 'adamw' is not accepted \(did you mean 'adam'\?\); expected one of sgd, adam"),
        (("bidirectional = True,False", "bidirectional = maybe"), "expected a boolean"),
        (("stack = rec,top", "stack = rec,tpo"), r"unknown architecture in stack 'tpo' \(did you mean 'top'\?\)"),
        (("valid_with = train", "valid_with = dev"), r"unknown dataset for valid_with 'dev'"),
        (("inputs = fbank,mfcc", "inputs = fbank,plp"), "unknown feature stream in inputs 'plp'"),
        (("backward = kalman", "backward = kalman\ninputs = rec,plp"),
         r"\[architecture arch_name=top\] inputs: 'plp' is neither a stream of \[model\] inputs \(fbank, mfcc\) nor an "
         r"architecture before it in \[model\] stack \(rec\)"),
        (("arch_opt = adam", "arch_opt = adam\ninputs = top"), r"arch_name=rec\] inputs: 'top' is neither .* \(none\)"),
        (("mono_weight = 0.5", "mono_weight = 0.5\nmono_size = -1"), r"\[model\] mono_size: expected a number of classes"),
        (("ark:- ark:- |", "ark:- ark:- | add-deltas --delta-ordr=2 ark:- ark:- |"),
         r"dataset train stream fbank: fea_opts add-deltas: unsupported options"),
        (("n_chunks = 2", "n_chunks = 2\n[batches]\nmax_missing_fraction = 5"), r"\[batches\] max_missing_fraction: expected a fraction in \[0, 1\], got 5"),
        (("    cw_left=2", "    cw_lft=2"), r"unknown option 'cw_lft' \(did you mean 'cw_left'\?\)"),
        (("out_folder = $BRU_TEST_EXP/demo", "out_folder = $BRU_NOT_SET/demo"), r"environment variable \$BRU_NOT_SET is not set"),
        (("[decoding]", "[decoding]\nscoring = timt"), r"\[decoding\] scoring: scoring 'timt' \(did you mean 'timit'\?\)"),
    ],
)
def test_bad_configs_name_section_option_and_expectation(edit, message):
    old, new = edit
    assert old in BASE
    with pytest.raises(ConfigError, match=message):
        parse_config_text(BASE.replace(old, new, 1))


def test_bad_override_syntax_and_section():
    with pytest.raises(ConfigError, match="expected --section,option=value"):
        parse_overrides(["--exp.seed=3"])
    with pytest.raises(ConfigError, match="unknown section 'exq'"):
        parse_config_text(BASE, parse_overrides(["--exq,seed=3"]))


def test_missing_file_is_an_error(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        parse_config(tmp_path / "nope.cfg")


def test_resolved_config_reads_back_identically(tmp_path):
    cfg = checked(parse_config_text(BASE))
    path = tmp_path / "config.resolved.cfg"
    write_resolved(cfg, path)
    again = checked(parse_config(path))
    for name in ("exp", "data_use", "batches", "model", "forward", "decoding"):
        assert getattr(again, name) == getattr(cfg, name), name
    assert again.architectures == cfg.architectures
    assert [dataclasses.asdict(d) for d in again.datasets] == [dataclasses.asdict(d) for d in cfg.datasets]


def test_empty_variable_is_named_as_empty(monkeypatch):
    monkeypatch.setenv("BRU_EMPTY", "")
    with pytest.raises(ConfigError, match=r"environment variable \$BRU_EMPTY is empty"):
        parse_config_text(BASE.replace("$BRU_TEST_EXP/demo", "$BRU_EMPTY/demo"))


def test_batches_checks_reach_the_loader():
    from data_io import loader_options

    cfg = parse_config_text(BASE.replace("n_chunks = 2", "n_chunks = 2\n[batches]\nmax_missing_fraction = 0.2\nlength_tolerance = 3"))
    for purpose in ("train", "valid", "forward"):
        options = loader_options(cfg, purpose)
        assert (options.max_missing_fraction, options.length_tolerance) == (0.2, 3), purpose

"""Fuzzing the readers a user's files go through: the config parser, the Kaldi table readers and the
TransitionModel reader. Whatever the input, the only exception that may escape is the documented one
(ConfigError, KaldiIOError), with a message; never a traceback from deep inside a parser."""

import struct
import tempfile
from pathlib import Path

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bru_kaldi.config import ConfigError, parse_config_text
from bru_kaldi.kaldi.tables import KaldiIOError, ScpTable, read_int_vectors, read_matrices
from bru_kaldi.kaldi.transition_model import TransitionModel, read_transition_model, standard_topology_text

FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

VALID = """[exp]
out_folder = exp/fuzz
seed = 3
[dataset1]
data_name = train
fea = fea_name=fbank
    fea_lst=data/train/feats.scp
    fea_opts=cmvn=speaker delta_order=2
lab = lab_name=lab_cd
    lab_folder=exp/ali
[data_use]
train_with = train
valid_with = train
forward_with = train
[architecture1]
arch_name = rnn
unit = libru
sizes = 8,8
dropout = 0.1
arch_lr = 0.002
[model]
stack = rnn
inputs = fbank
[decoding]
acwt_sweep = 0.1,0.2
"""

LINES = VALID.splitlines()
NASTY = st.sampled_from(["", "=", "[", "]", "[exp", "x = ", " = y", "sizes = -1", "sizes = a,b", "seed = 1e9",
                         "arch_lr = 0", "arch_lr = nan", "dropout = 2", "fea_opts=cmvn=what", "stack = rnn,rnn",
                         "$UNSET_FUZZ_VARIABLE", "${X:-", "n_chunks = 0", "norm = batch,layer,none,batch",
                         "acwt_sweep = ,,", "[architecture0]", "[dataset]", "\t\tfea_lst=", "unit = lbru",
                         "train_with = nowhere", "\x00", "é", "%(x)s", "N_epochs_tr = 3"])


def parse_only_config_errors(text: str) -> None:
    try:
        parse_config_text(text, source="fuzz.cfg")
    except ConfigError as error:
        assert str(error)


@FUZZ
@given(st.text(max_size=400))
def test_fuzz_config_parser_on_any_text(text):
    parse_only_config_errors(text)


@FUZZ
@given(st.lists(st.tuples(st.integers(0, len(LINES)), NASTY, st.booleans()), min_size=1, max_size=6))
def test_fuzz_config_parser_on_damaged_configs(edits):
    lines = list(LINES)
    for position, line, replace in edits:
        position = min(position, len(lines) - 1 if replace else len(lines))
        if replace:
            lines[position] = line
        else:
            lines.insert(position, line)
    parse_only_config_errors("\n".join(lines))


def test_a_config_with_several_problems_names_them_all():
    broken = (VALID.replace("seed = 3", "seed = three").replace("arch_lr = 0.002", "arch_lr = 0")
              .replace("train_with = train", "train_with = nowhere") + "[decodng]\nbeam = 3\n")
    try:
        parse_config_text(broken, source="broken.cfg")
    except ConfigError as error:
        message = str(error)
    else:
        raise AssertionError("accepted")
    assert message.startswith("broken.cfg: 4 problems:")
    for part in ("option seed: expected an integer, got 'three'", "arch_lr: expected a positive learning rate",
                 "unknown dataset for train_with 'nowhere'", "unknown section 'decodng'"):
        assert part in message, part


def _matrix_ark() -> bytes:
    import kaldiio

    with tempfile.TemporaryDirectory() as d:
        kaldiio.save_ark(f"{d}/a.ark", {"u1": np.ones((3, 2), np.float32), "u2": np.zeros((2, 2), np.float32)})
        kaldiio.save_ark(f"{d}/b.ark", {"u3": np.ones((4, 3), np.float32)}, compression_method=2)
        return Path(f"{d}/a.ark").read_bytes() + Path(f"{d}/b.ark").read_bytes()


ARK = _matrix_ark()
ALI = b"".join(key + b" \x00B\x04" + struct.pack("<i", n) + b"".join(b"\x04" + struct.pack("<i", v) for v in range(1, n + 1))
               for key, n in ((b"u1", 3), (b"u2", 5)))


def damaged(data: bytes):
    """The bytes cut, with some flipped, or with random bytes inserted."""
    return st.tuples(st.integers(0, len(data)), st.lists(st.tuples(st.integers(0, max(len(data) - 1, 0)),
                                                                   st.integers(0, 255)), max_size=6),
                     st.binary(max_size=12), st.integers(0, len(data))).map(
        lambda args: _damage(data, *args))


def _damage(data, cut, flips, insert, at):
    out = bytearray(data[:cut] if cut else data)
    for position, value in flips:
        if position < len(out):
            out[position] = value
    return bytes(out[:at]) + insert + bytes(out[at:])


@FUZZ
@given(st.one_of(st.binary(max_size=300), damaged(ARK)))
def test_fuzz_matrix_archives(data):
    with tempfile.TemporaryDirectory() as d:
        Path(f"{d}/x.ark").write_bytes(data)
        try:
            for _, matrix in read_matrices(f"ark:{d}/x.ark"):
                assert matrix.ndim == 2 and np.isfinite(matrix).all()
        except KaldiIOError as error:
            assert str(error)


@FUZZ
@given(st.one_of(st.binary(max_size=200), damaged(ALI)))
def test_fuzz_alignment_archives(data):
    with tempfile.TemporaryDirectory() as d:
        Path(f"{d}/ali.1").write_bytes(data)
        try:
            for _, vector in read_int_vectors(f"ark:{d}/ali.1"):
                assert vector.ndim == 1
        except KaldiIOError as error:
            assert str(error)


@FUZZ
@given(st.text(max_size=200))
def test_fuzz_scp_files(text):
    with tempfile.TemporaryDirectory() as d:
        Path(f"{d}/x.ark").write_bytes(ARK)
        Path(f"{d}/x.scp").write_text(text.replace("ARK", f"{d}/x.ark"))
        try:
            table = ScpTable(f"{d}/x.scp")
            list(table.load(table.keys))
        except KaldiIOError as error:
            assert str(error)


def _model_bytes(binary: bool) -> bytes:
    import kaldi_hmm_gmm as khg

    topo = khg.HmmTopology()
    topo.read(standard_topology_text(nonsilence_phones=[2, 3], silence_phones=[1]))
    ctx = khg.monophone_context_dependency(topo.phones, topo.get_phone_to_num_pdf_classes())
    tm = TransitionModel.from_kaldi_text(str(khg.TransitionModel(ctx, topo)))
    return tm.to_kaldi_binary() if binary else tm.to_kaldi_text().encode()


MODELS = [_model_bytes(True), _model_bytes(False)]


@FUZZ
@given(st.one_of(st.binary(max_size=200), damaged(MODELS[0]), damaged(MODELS[1])))
def test_fuzz_transition_models(data):
    with tempfile.TemporaryDirectory() as d:
        Path(f"{d}/final.mdl").write_bytes(data)
        try:
            tm = read_transition_model(f"{d}/final.mdl")
            assert tm.num_transition_ids >= 0
        except KaldiIOError as error:
            assert str(error)

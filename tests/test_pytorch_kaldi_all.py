"""pytorch-kaldi's own configs, all 37 of its ``cfg/``, on the tiny corpus (opt-in: the files are never copied here).

Set ``PYTORCH_KALDI_CFG`` to pytorch-kaldi's ``cfg/`` folder (a clone of github.com/mravanelli/pytorch-kaldi;
these are the files at its commit 9773257) to run::

    PYTORCH_KALDI_CFG=~/pytorch-kaldi/cfg python -m pytest tests/test_pytorch_kaldi_all.py

Without it every test here is skipped, with the reason in pytest's summary. For each config:

- ``run_exp.py X.cfg --convert`` accepts the file exactly as pytorch-kaldi ships it;
- the file with its paths pointed at the tiny corpus (:func:`point_at_corpus`, which changes nothing else but
  sizes: layers of 128 units or more cut to 24, one epoch, progressive values cut to that epoch, literal output sizes
  set to the tiny corpus's numbers of pdfs and phones) trains one epoch, forwards and decodes, and ``res.res``
  has a ``%WER`` line for every forward set that has labels (the autoencoder's config asks for no decoding: it
  forwards its codes, and nothing is decoded).

Streams are matched by name: ``fbank`` and ``fmllr`` read the corpus's fbank features (it has no fMLLR),
``mfcc`` its MFCCs, ``raw`` its 200 ms windows of samples, ``mfccLA1``-``mfccLA6`` (DIRHA's microphones) its
six simulated microphones (``recipes/mini_timit/local/extra_streams.py``). Datasets are matched by role:
``train_with`` reads train, ``valid_with`` dev, every other dataset test.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from bru_kaldi import pytorch_kaldi
from tests.test_run_exp import run

FOLDER = os.environ.get("PYTORCH_KALDI_CFG", "")
pytestmark = pytest.mark.skipif(not FOLDER, reason="pytorch-kaldi's configs not given: set PYTORCH_KALDI_CFG to its "
                                                   "cfg/ folder to run all 37 (tests/test_pytorch_kaldi_all.py)")

# The 37 files of pytorch-kaldi's cfg/ (commit 9773257d4c4edb8bd9a2dcd8c81afa2a4ab9da07).
CONFIGS = (
    "DIRHA_baselines/DIRHA_GRU_fmllr.cfg", "DIRHA_baselines/DIRHA_MLP_fmllr.cfg", "DIRHA_baselines/DIRHA_QLSTM_MFCC.cfg",
    "DIRHA_baselines/DIRHA_fusionRNN_MFCC_6ch.cfg", "DIRHA_baselines/DIRHA_liGRU_fmllr.cfg",
    "Librispeech_baselines/libri_GRU_fmllr.cfg", "Librispeech_baselines/libri_LSTM_fmllr.cfg",
    "Librispeech_baselines/libri_MLP_fmllr.cfg", "Librispeech_baselines/libri_RNN_fmllr.cfg",
    "Librispeech_baselines/libri_liGRU_fmllr.cfg",
    "TIMIT_baselines/TIMIT_CNN_fbank.cfg", "TIMIT_baselines/TIMIT_CNN_raw.cfg", "TIMIT_baselines/TIMIT_GRU_fbank.cfg",
    "TIMIT_baselines/TIMIT_GRU_fmllr.cfg", "TIMIT_baselines/TIMIT_GRU_mfcc.cfg", "TIMIT_baselines/TIMIT_LSTM_fbank.cfg",
    "TIMIT_baselines/TIMIT_LSTM_fmllr.cfg", "TIMIT_baselines/TIMIT_LSTM_fmllr_cudnn.cfg",
    "TIMIT_baselines/TIMIT_LSTM_mfcc.cfg", "TIMIT_baselines/TIMIT_MLP_fbank.cfg",
    "TIMIT_baselines/TIMIT_MLP_fbank_autoencoder.cfg", "TIMIT_baselines/TIMIT_MLP_fbank_prod.cfg",
    "TIMIT_baselines/TIMIT_MLP_fmllr.cfg", "TIMIT_baselines/TIMIT_MLP_mfcc.cfg", "TIMIT_baselines/TIMIT_MLP_mfcc_basic.cfg",
    "TIMIT_baselines/TIMIT_MLP_mfcc_basic_flex.cfg", "TIMIT_baselines/TIMIT_RNN_fbank.cfg",
    "TIMIT_baselines/TIMIT_RNN_fmllr.cfg", "TIMIT_baselines/TIMIT_RNN_mfcc.cfg", "TIMIT_baselines/TIMIT_SRU_fbank.cfg",
    "TIMIT_baselines/TIMIT_SincNet_raw.cfg", "TIMIT_baselines/TIMIT_liGRU_fbank.cfg",
    "TIMIT_baselines/TIMIT_liGRU_fmllr.cfg", "TIMIT_baselines/TIMIT_liGRU_fmllr_lr_schedule.cfg",
    "TIMIT_baselines/TIMIT_liGRU_mfcc.cfg", "TIMIT_baselines/TIMIT_mfcc_fbank_fmllr_liGRU_best.cfg",
    "TIMIT_baselines/TIMIT_rev/TIMIT_joint_training_liGRU_fbank.cfg",
)
# Options whose numbers are layer widths: those of SHRINK_FROM units or more become MAX_WIDTH (24 divides by the
# quaternion's 4 and by DIRHA's 6 microphones; smaller numbers may be a feature's width, as the 40 of an
# autoencoder's code, and stay; so does the last width of a linear layer, the autoencoder's 440 reconstructed
# features). The last width of a softmax layer is a number of classes: TIMIT's pdfs
# (1880 or 1973, by Kaldi version) or its 48 phones (at most PHONES_UP_TO), set to the tiny corpus's.
WIDTHS = re.compile(r"^\s*(\w+)_lay\s*=|^\s*(hidden_size|\w+_hidden_size|\w+_n_proj|\w+_n_filt|\w+_fusion_layer_size)\s*=", re.I)
MAX_WIDTH, SHRINK_FROM, PHONES_UP_TO = 24, 128, 64


def _stream_files(name: str) -> tuple[str, str]:
    """(features, CMVN statistics) of the corpus's stream standing in for pytorch-kaldi's stream ``name``."""
    mic = re.fullmatch(r"mfccLA(\d)", name)
    if mic:
        return f"feats_mfcc_mic{mic[1]}.scp", f"cmvn_mfcc_mic{mic[1]}.scp"
    if name == "raw":
        return "feats_raw.scp", ""
    if "mfcc" in name.lower():
        return "feats_mfcc.scp", "cmvn_mfcc.scp"
    return "feats.scp", "cmvn.scp"


def _schedule(value: str) -> str:
    """A progressive value cut to the one epoch: ``0.08*12|0.04*12`` -> ``0.08*1``, per comma-separated layer."""
    return ",".join(part.split("|")[0].split("*")[0] + "*1" if "*" in part else part for part in value.split(","))


def point_at_corpus(text: str, root: Path, out: Path, pdfs: int, phones: int, counts: Path) -> str:
    """pytorch-kaldi config ``text`` with its data paths on the corpus at ``root``, its output in ``out`` and
    its sizes shrunk (see the module's docstring); its options, sections and model otherwise as written.
    ``counts``: the pdf counts file that a ``normalize_with_counts_from`` path becomes. Lines hard-wrapped in
    the middle of an option (the DIRHA configs') are joined first, as the conversion joins them."""
    text = pytorch_kaldi.unwrap(text)[0]
    roles = {}
    for role, split in (("train_with", "train"), ("valid_with", "dev"), ("forward_with", "test")):
        found = re.search(rf"^\s*{role}\s*=\s*(.+)$", text, flags=re.M)
        for name in (found[1].split(",") if found else []):
            roles.setdefault(name.strip(), split)
    acts, section = {}, ""  # (section, prefix) -> its <prefix>_act
    for line in text.splitlines():
        if line.startswith("["):
            section = line.strip()
        elif re.match(r"\s*\w+_act\s*=", line):
            name, _, value = line.partition("=")
            acts[(section, name.strip().lower()[:-4])] = value.strip()
    lines, split, stream, section = [], "test", "", ""
    for line in text.splitlines():
        if line.startswith("["):
            section = line.strip()
        # a block's first line carries its opening: "fea = fea_name=x", "fea:fea_name=x", "lab = lab_name=y"
        opening = re.match(r"\s*(fea|lab)\s*[=:]\s*", line, flags=re.I)
        head = opening[0] if opening else line[: len(line) - len(line.lstrip())]
        key, _, value = line[len(head):].partition("=") if opening else line.partition("=")
        option = key.strip().lower() if "=" in line else ""
        indent = head if opening else key[: len(key) - len(key.lstrip())]
        if option == "data_name":
            split = roles.get(value.strip(), "test")
        elif option == "fea_name":
            stream = value.strip()
        elif option == "fea_lst":
            line = f"{head}fea_lst={root}/data/{split}/{_stream_files(stream)[0]}"
        elif option == "fea_opts":
            cmvn = _stream_files(stream)[1]
            opts = ""
            if "apply-cmvn" in value and cmvn:
                opts = f"apply-cmvn --utt2spk=ark:{root}/data/{split}/utt2spk scp:{root}/data/{split}/{cmvn} ark:- ark:- |"
            deltas = re.search(r"add-deltas[^|]*(\||$)", value)
            if deltas:
                opts += " " + deltas[0]
            line = f"{head}fea_opts={opts.strip()}"
        elif option == "lab_folder":
            line = f"{head}lab_folder={root}/exp/mono_ali_{split}"
        elif option == "lab_data_folder":
            line = f"{head}lab_data_folder={root}/data/{split}/"
        elif option == "lab_graph":
            line = f"{head}lab_graph={root}/exp/mono/graph"
        elif option == "normalize_with_counts_from" and "/" in value:
            line = f"{indent}normalize_with_counts_from = {counts}"
        elif option == "out_folder":
            line = f"{indent}out_folder = {out}"
        elif option == "n_epochs_tr":
            line = f"{indent}N_epochs_tr = 1"
        elif option in ("use_cuda", "multi_gpu"):
            line = f"{indent}{key.strip()} = False"
        elif WIDTHS.match(line):
            prefix = WIDTHS.match(line)[1]
            last_act = acts.get((section, (prefix or "").lower()), "").split(",")[-1].strip()
            softmax, linear = last_act == "softmax", last_act == "linear"
            sizes = [v.strip() for v in value.split(",")]
            for i, v in enumerate(sizes):
                if v.isdigit() and softmax and i == len(sizes) - 1:
                    sizes[i] = str(phones if int(v) <= PHONES_UP_TO else pdfs)
                elif v.isdigit() and int(v) >= SHRINK_FROM and not (linear and i == len(sizes) - 1):
                    sizes[i] = str(MAX_WIDTH)
            line = f"{key}= {','.join(sizes)}"
        elif "*" in value and "|" in value or re.fullmatch(r"[\d.e-]+\*\d+", value.strip()):
            line = f"{key}= {_schedule(value.strip())}"
        lines.append(line)
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="module")
def corpus(tiny_extra_streams):
    return tiny_extra_streams


def test_the_folder_holds_the_37_configs():
    found = sorted(str(p.relative_to(FOLDER)) for p in Path(FOLDER).rglob("*.cfg"))
    assert found == sorted(CONFIGS), f"pytorch-kaldi's cfg/ has changed: {set(found) ^ set(CONFIGS)}"


def test_the_mapping_table_names_every_option_they_use():
    """cfg/README.md's table of pytorch-kaldi's options names each option of the 37 files, written out or in
    its prefix form (``<p>_lay`` for ``lstm_lay``, ``gru_lay``...; ``<c>_N_filt`` for ``cnn_N_filt``, ``sinc_N_filt``)."""
    readme = (Path(__file__).resolve().parents[1] / "cfg" / "README.md").read_text()
    table = readme[readme.index("## pytorch-kaldi's own configs"):readme.index("\n## ", readme.index("## pytorch-kaldi's own configs") + 3)]
    used = {}
    for name in CONFIGS:
        section = ""
        for line in pytorch_kaldi.unwrap((Path(FOLDER) / name).read_text())[0].splitlines():
            if line.startswith("["):
                section = line.strip()
            elif section != "[model]" or re.match(r"\s*model(_proto)?\s*[=:]", line):  # not the model's variables
                option = re.match(r"\s*(?:(?:fea|lab)\s*[=:]\s*)?([A-Za-z_]\w*)\s*[=:]", line)
                if option:
                    used.setdefault(option[1], name)
    forms = {"lstm": "<p>", "gru": "<p>", "ligru": "<p>", "rnn": "<p>", "dnn": "<p>", "cnn": "<c>", "sinc": "<c>"}
    missing = []
    for option, where in sorted(used.items()):
        prefix, _, rest = option.partition("_")
        written = [option] + ([f"{forms[prefix.lower()]}_{rest}"] if prefix.lower() in forms else [])
        if not any(re.search(rf"(?<![\w<>]){re.escape(w)}(?!\w)", table, flags=re.I) for w in written):
            missing.append(f"{option} ({where})")
    assert len(used) > 150 and not missing, f"not in cfg/README.md's table: {missing}"


@pytest.mark.parametrize("name", CONFIGS)
def test_converts_as_shipped(name, tiny_corpus, tmp_path):
    result = run(tiny_corpus, tmp_path / "exp", "--convert", config=Path(FOLDER) / name)
    assert "[architecture1]" in result.stdout and "arch_class" not in result.stdout


@pytest.mark.parametrize("name", CONFIGS)
def test_trains_one_epoch_and_decodes(name, corpus, tmp_path):
    import numpy as np

    from bru_kaldi.kaldi.alignments import read_alignments
    from bru_kaldi.kaldi.transition_model import read_transition_model
    from bru_kaldi.posteriors import write_counts

    model = read_transition_model(corpus.model)
    counts = np.zeros(model.num_pdfs)
    for _, ali in read_alignments(str(corpus.root / "exp" / "mono_ali_train")):
        counts += np.bincount(model.ali_to_pdf(ali), minlength=model.num_pdfs)
    write_counts(str(tmp_path / "ali_train_pdf.counts"), counts)
    text = point_at_corpus((Path(FOLDER) / name).read_text(), corpus.root, tmp_path / "exp", model.num_pdfs,
                           model.num_phones, tmp_path / "ali_train_pdf.counts")
    path = tmp_path / Path(name).name
    path.write_text(text)
    run(corpus, tmp_path / "exp", config=path, timeout=1200)  # SincNet on 3200 samples a frame: minutes
    res = (tmp_path / "exp" / "res.res").read_text()
    assert len(re.findall(r"^epoch=", res, flags=re.M)) == 1, res
    if re.search(r"^\s*require_decoding\s*=\s*False", text, flags=re.M | re.I):  # the autoencoder's: it writes codes
        assert not list((tmp_path / "exp").glob("decode_*")), "decoded what the config asked not to"
        return
    forward = re.search(r"^\s*forward_with\s*=\s*(.+)$", text, flags=re.M)[1]
    labelled = [n.strip() for n in forward.split(",") if not re.search(
        rf"data_name\s*=\s*{re.escape(n.strip())}\s*\n(?:(?!\[).*\n)*?\s*lab\s*[=:]\s*lab_name\s*=\s*none", text)]
    for name_ in labelled:
        assert re.search(rf"^{re.escape(name_)}: %WER \d+\.\d\d ", res, flags=re.M), res

"""Broken input files, each damaged the way disks, copies and hand edits damage them: run_exp.py stops
with one error naming the file and the utterance (or field), exit status 1, and writes no result.

Each case damages a private copy of the tests' tiny corpus, then runs run_exp.main in this process
(training only: every one of these is found before or while the data is first read)."""

import gzip
import logging
import shutil
from pathlib import Path

import numpy as np
import pytest

import run_exp

ROOT = Path(__file__).resolve().parents[1]
CFG = ROOT / "tests" / "data" / "tiny_liBRU.cfg"


@pytest.fixture
def corpus(tiny_corpus, tmp_path):
    """A copy of the tiny corpus whose scp files point into the copy."""
    root = tmp_path / "corpus"
    shutil.copytree(tiny_corpus.root, root, symlinks=True)
    for scp in root.rglob("*.scp"):
        scp.write_text(scp.read_text().replace(str(tiny_corpus.root), str(root)))
    return root


def run(corpus: Path, tmp_path: Path, monkeypatch, *overrides) -> tuple[int, str]:
    monkeypatch.setenv("MINI_TIMIT", str(corpus))
    monkeypatch.setenv("BRU_TEST_EXP", str(tmp_path / "exp"))
    code = run_exp.main([str(CFG), "--stop-stage", "train", "--exp,n_epochs_tr=1", *overrides])
    logging.shutdown()
    log = tmp_path / "exp" / "log.txt"
    return code, log.read_text() if log.is_file() else ""


def first_entry(scp: Path) -> tuple[str, Path, int]:
    key, location = scp.read_text().splitlines()[0].split(" ", 1)
    path, offset = location.rsplit(":", 1)
    return key, Path(path), int(offset)


def expect_error(code, log, tmp_path, *named):
    assert code == 1, log
    errors = [line for line in log.splitlines() if " error: " in line]
    assert len(errors) == 1, log
    for name in named:
        assert str(name) in errors[0], (name, errors[0])
    assert not (tmp_path / "exp" / "final.pt").exists()


def test_corrupt_feature_archive_truncated(corpus, tmp_path, monkeypatch):
    key, ark, _ = first_entry(corpus / "data" / "train" / "feats.scp")
    data = ark.read_bytes()
    ark.write_bytes(data[: len(data) // 3])
    code, log = run(corpus, tmp_path, monkeypatch)
    expect_error(code, log, tmp_path, ark.name)


def test_corrupt_feature_entry_bytes(corpus, tmp_path, monkeypatch):
    key, ark, offset = first_entry(corpus / "data" / "train" / "feats.scp")
    data = bytearray(ark.read_bytes())
    data[offset:offset + 4] = b"XXXX"  # the binary header of its matrix
    ark.write_bytes(bytes(data))
    code, log = run(corpus, tmp_path, monkeypatch)
    expect_error(code, log, tmp_path, ark.name, key)


def test_corrupt_scp_offset(corpus, tmp_path, monkeypatch):
    scp = corpus / "data" / "train" / "feats.scp"
    key, ark, offset = first_entry(scp)
    lines = scp.read_text().splitlines()
    lines[0] = f"{key} {ark}:{offset + 7}"
    scp.write_text("\n".join(lines) + "\n")
    code, log = run(corpus, tmp_path, monkeypatch)
    expect_error(code, log, tmp_path, key)


def test_corrupt_feature_dimension_differs_between_utterances(corpus, tmp_path, monkeypatch):
    scp = corpus / "data" / "train" / "feats.scp"
    mfcc = (corpus / "data" / "train" / "feats_mfcc.scp").read_text().splitlines()
    lines = scp.read_text().splitlines()
    lines[1] = mfcc[1]  # 13 MFCCs where 40 fbank are expected
    scp.write_text("\n".join(lines) + "\n")
    code, log = run(corpus, tmp_path, monkeypatch)
    expect_error(code, log, tmp_path, "feats.scp", "different dimensions")


def test_corrupt_alignments_of_unknown_utterances_and_lengths(corpus, tmp_path, monkeypatch):
    import kaldiio

    ali_dir = corpus / "exp" / "mono_ali_train"
    ali = dict(kaldiio.load_ark(gzip.open(ali_dir / "ali.1.gz")))
    key = sorted(ali)[0]
    ali[key] = ali[key][:-5]  # five frames short of its features
    with gzip.open(ali_dir / "ali.1.gz", "wb") as f:
        kaldiio.save_ark(f, ali)
    code, log = run(corpus, tmp_path, monkeypatch)
    expect_error(code, log, tmp_path, key, "frames")


def test_corrupt_gzipped_alignments(corpus, tmp_path, monkeypatch):
    ali = corpus / "exp" / "mono_ali_train" / "ali.2.gz"
    data = ali.read_bytes()
    ali.write_bytes(data[: len(data) // 2])
    code, log = run(corpus, tmp_path, monkeypatch)
    expect_error(code, log, tmp_path, "ali.2.gz")


@pytest.mark.parametrize("damage", ["truncated", "not_kaldi", "other_model"])
def test_corrupt_final_mdl(corpus, tmp_path, monkeypatch, damage):
    model = corpus / "exp" / "mono_ali_train" / "final.mdl"
    if damage == "truncated":
        model.write_bytes(model.read_bytes()[:200])
    elif damage == "not_kaldi":
        model.write_text("this is not a Kaldi model\n")
    else:  # a model with fewer transition-ids than the alignments use
        from bru_kaldi.kaldi.transition_model import standard_topology_text, write_transition_model
        import kaldi_hmm_gmm as khg

        topo = khg.HmmTopology()
        topo.read(standard_topology_text(nonsilence_phones=[2, 3], silence_phones=[1]))
        ctx = khg.monophone_context_dependency(topo.phones, topo.get_phone_to_num_pdf_classes())
        write_transition_model(khg.TransitionModel(ctx, topo), model)
    code, log = run(corpus, tmp_path, monkeypatch)
    expect_error(code, log, tmp_path, "final.mdl")


def test_corrupt_empty_dataset(corpus, tmp_path, monkeypatch):
    (corpus / "data" / "train" / "feats.scp").write_text("")
    code, log = run(corpus, tmp_path, monkeypatch)
    expect_error(code, log, tmp_path, "feats.scp")


def test_corrupt_nan_features(corpus, tmp_path, monkeypatch):
    import kaldiio

    scp = corpus / "data" / "train" / "feats.scp"
    key, _, _ = first_entry(scp)
    table = kaldiio.load_scp(str(scp))
    feats = np.array(table[key])
    feats[3, 5] = np.nan
    bad = corpus / "data" / "train" / "bad.ark"
    kaldiio.save_ark(str(bad), {key: feats}, scp=str(corpus / "data" / "train" / "bad.scp"))
    lines = scp.read_text().splitlines()
    lines[0] = (corpus / "data" / "train" / "bad.scp").read_text().strip()
    scp.write_text("\n".join(lines) + "\n")
    code, log = run(corpus, tmp_path, monkeypatch)
    expect_error(code, log, tmp_path, key, "NaN")


def test_corrupt_names_with_spaces_and_quotes_are_read(corpus, tmp_path, monkeypatch):
    """Not damage: Kaldi allows any character but a newline in an scp's file name."""
    odd = corpus / "data" / "train" / "a dir with 'quotes' and spaces"
    scp = corpus / "data" / "train" / "feats.scp"
    source = (corpus / "data" / "train" / "data")
    shutil.copytree(source, odd)
    scp.write_text(scp.read_text().replace(f"{source}/", f"{odd}/"))
    code, log = run(corpus, tmp_path, monkeypatch)
    assert code == 0, log
    assert (tmp_path / "exp" / "final.pt").exists()

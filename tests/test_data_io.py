"""Kaldi archives in and out (kaldiio and kaldi-native-io as the writers Kaldi would be), pipes,
errors, atomic writing, and the feature transforms against kaldi-native-fbank."""

import doctest
import gzip

import kaldi_native_fbank as knf
import kaldi_native_io as knio
import kaldiio
import numpy as np
import pytest

from bru_kaldi.kaldi import alignments
from bru_kaldi import batching
import data_io
from bru_kaldi import feature_transforms
from bru_kaldi.kaldi import tables as kaldi_tables
from bru_kaldi.kaldi import transition_model
from data_io import (ArkWriter, KaldiIOError, LoglikeWriter, ScpTable, log_priors, read_counts, read_int_vectors,
                     read_matrices, write_counts)
from bru_kaldi.feature_transforms import (FeatureOptions, add_deltas, apply_cmvn, compute_cmvn_stats, parse_fea_opts,
                                splice)

RNG = np.random.default_rng(0)


def matrices(count=4, dim=5):
    return {f"utt{i}": (RNG.standard_normal((7 + 3 * i, dim)) * 4 + i).astype(np.float32) for i in range(count)}


@pytest.mark.parametrize("module", [kaldi_tables, feature_transforms, transition_model, alignments, batching])
def test_doctests_of_the_modules_data_io_uses(module):
    # pytest.ini collects doctests from data_io.py only; these modules are part of it
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0


# --------------------------------------------------------------------------- reading archives
@pytest.mark.parametrize("writer", ["kaldiio", "kaldi-native-io"])
def test_float_matrices_round_trip_with_scp_offsets(tmp_path, writer):
    mats = matrices()
    ark, scp = tmp_path / "f.ark", tmp_path / "f.scp"
    if writer == "kaldiio":
        kaldiio.save_ark(str(ark), mats, scp=str(scp))
    else:
        with knio.FloatMatrixWriter(f"ark,scp:{ark},{scp}") as w:
            for k, m in mats.items():
                w.write(k, m)
    offsets = [int(line.rsplit(":", 1)[1]) for line in scp.read_text().splitlines()]
    assert offsets[0] == len("utt0 ") and offsets == sorted(offsets)
    for spec in (f"scp:{scp}", f"ark:{ark}", str(ark), f"ark:cat {ark} |"):
        got = dict(read_matrices(spec))
        assert list(got) == list(mats)
        for k in mats:
            np.testing.assert_array_equal(got[k], mats[k])
    table = ScpTable(str(scp))
    assert table.shapes() == {k: m.shape for k, m in mats.items()}
    np.testing.assert_array_equal(dict(table.load(["utt2"]))["utt2"], mats["utt2"])


@pytest.mark.parametrize("method", [1, 2, 3, 5])
def test_compressed_matrices_match_kaldis_decompression(tmp_path, method):
    mats = matrices(dim=13)
    with knio.CompressedMatrixWriter(f"ark,scp:{tmp_path}/c.ark,{tmp_path}/c.scp") as w:
        for k, m in mats.items():
            w.write(k, m, knio.CompressionMethod(method))
    reader = knio.RandomAccessFloatMatrixReader(f"scp:{tmp_path}/c.scp")
    got = dict(read_matrices(f"scp:{tmp_path}/c.scp"))
    assert ScpTable(f"{tmp_path}/c.scp").shapes() == {k: m.shape for k, m in mats.items()}
    for k, m in mats.items():
        np.testing.assert_allclose(got[k], np.array(reader[k]), atol=1e-5)  # Kaldi's own decompression
        assert np.abs(got[k] - m).max() < 0.2  # and lossy only within the compression's precision
    kaldiio.save_ark(f"{tmp_path}/k.ark", mats, scp=f"{tmp_path}/k.scp", compression_method=method)
    for k, m in dict(read_matrices(f"scp:{tmp_path}/k.scp")).items():
        assert np.abs(m - mats[k]).max() < 0.2


@pytest.mark.parametrize("writer", ["kaldiio", "kaldi-native-io", "kaldi-native-io-text"])
def test_int_vectors_round_trip_gzipped(tmp_path, writer):
    vectors = {f"u{i}": RNG.integers(1, 500, size=n).astype(np.int32) for i, n in enumerate([5, 1, 0, 9])}
    path = tmp_path / "ali.1.gz"
    if writer == "kaldiio":
        with kaldiio.WriteHelper(f"ark:| gzip -c > {path}") as w:
            for k, v in vectors.items():
                w(k, v)
    else:
        text = ",t" if writer.endswith("text") else ""
        with knio.Int32VectorWriter(f"ark{text}:| gzip -c > {path}") as w:
            for k, v in vectors.items():
                w.write(k, v.tolist())
    for spec in (str(path), f"ark:gunzip -c {path} |"):
        got = list(read_int_vectors(spec))
        assert [k for k, _ in got] == list(vectors)
        for (_, v), want in zip(got, vectors.values()):
            assert v.dtype == np.int32 and v.tolist() == want.tolist()


# --------------------------------------------------------------------------- pipes and errors
def test_failing_pipelines_raise_with_their_status(tmp_path):
    kaldiio.save_ark(str(tmp_path / "f.ark"), matrices())
    with pytest.raises(KaldiIOError, match=r"(?s)exited with status 3.*boom"):
        list(read_matrices(f"ark:cat {tmp_path}/f.ark; echo boom >&2; exit 3 |"))  # after good output
    with pytest.raises(KaldiIOError, match="exited with status 1"):
        list(read_matrices(f"ark:cat {tmp_path}/missing.ark | cat |"))  # pipefail: the first command failed
    with pytest.raises(KaldiIOError, match=r"(?s)unreadable archive after utterance 'utt0'.*exited with status 2"):
        list(read_matrices(f"ark:head -c 200 {tmp_path}/f.ark; exit 2 |"))  # cut inside utt1, then failed
    with pytest.raises(KaldiIOError, match="status 127"):
        list(read_int_vectors("ark:ali-to-pdf-not-installed final.mdl ark:- ark:- |"))
    keys = [k for k, _ in zip(range(2), read_matrices(f"ark:cat {tmp_path}/f.ark |"))]  # stopping early is fine
    assert len(keys) == 2


def test_bad_data_names_the_file_and_the_utterance(tmp_path):
    bad = matrices()
    bad["utt2"][3, 1] = np.nan
    kaldiio.save_ark(str(tmp_path / "nan.ark"), bad, scp=str(tmp_path / "nan.scp"))
    with pytest.raises(KaldiIOError, match=r"nan\.scp: utterance 'utt2' has NaN or Inf values \(first at frame 3\)"):
        list(read_matrices(f"scp:{tmp_path}/nan.scp"))
    kaldiio.save_ark(str(tmp_path / "empty.ark"), {"u": np.zeros((0, 3), np.float32)}, scp=str(tmp_path / "empty.scp"))
    with pytest.raises(KaldiIOError, match="utterance 'u' is an empty matrix"):
        list(read_matrices(f"ark:{tmp_path}/empty.ark"))
    with pytest.raises(KaldiIOError, match="empty matrix"):
        ScpTable(str(tmp_path / "empty.scp")).shapes()
    kaldiio.save_ark(str(tmp_path / "good.ark"), matrices())
    data = (tmp_path / "good.ark").read_bytes()
    (tmp_path / "cut.ark").write_bytes(data[:len(data) - 10])
    with pytest.raises(KaldiIOError, match=r"cut\.ark: unreadable archive after utterance 'utt2'"):
        list(read_matrices(f"ark:{tmp_path}/cut.ark"))
    (tmp_path / "bad.scp").write_text(f"utt0 {tmp_path}/nowhere.ark:5\n")
    with pytest.raises(KaldiIOError, match=r"bad\.scp \(utterance 'utt0'.*cannot read"):
        list(read_matrices(f"scp:{tmp_path}/bad.scp"))
    (tmp_path / "dup.scp").write_text("a x.ark:1\na x.ark:9\n")
    with pytest.raises(KaldiIOError, match="line 2: utterance 'a' appears twice"):
        ScpTable(str(tmp_path / "dup.scp"))
    (tmp_path / "ali.1.gz").write_bytes(gzip.compress(b"u1 \0B\x04\x05\x00\x00\x00\x04\x01\x00\x00\x00"))
    with pytest.raises(KaldiIOError, match="utterance 'u1': truncated"):
        list(read_int_vectors(str(tmp_path / "ali.1.gz")))


# --------------------------------------------------------------------------- writing
def test_writer_is_atomic(tmp_path):
    ark, scp = tmp_path / "out.ark", tmp_path / "out.scp"
    with ArkWriter(str(ark), str(scp)) as w:
        w.write("old", np.zeros((2, 2)))
    before = ark.read_bytes()
    with pytest.raises(RuntimeError):
        with ArkWriter(str(ark), str(scp)) as w:
            w.write("new", np.ones((3, 2)))
            assert ark.read_bytes() == before  # nothing under the final name while writing
            raise RuntimeError("the forward pass failed")
    assert ark.read_bytes() == before and list(kaldiio.load_scp(str(scp))) == ["old"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.ark", "out.scp"]  # temporaries removed
    with pytest.raises(KaldiIOError, match="duplicate"):
        with ArkWriter(str(tmp_path / "d.ark")) as w:
            w.write("a", np.zeros((1, 1)))
            w.write("a", np.zeros((1, 1)))
    assert not (tmp_path / "d.ark").exists()


def test_loglikelihoods_are_read_by_kaldiio_and_kaldi_native_io(tmp_path):
    counts = np.array([10.0, 30.0, 60.0, 0.0])
    priors = log_priors(counts)
    post = {f"u{i}": np.log(RNG.dirichlet(np.ones(4), size=5 + i)).astype(np.float32) for i in range(3)}
    with LoglikeWriter(str(tmp_path / "ll.ark"), str(tmp_path / "ll.scp"), priors) as w:
        for k, p in post.items():
            w.write(k, p)
    reader = knio.RandomAccessFloatMatrixReader(f"scp:{tmp_path}/ll.scp")
    for k, p in post.items():
        expected = p - np.log(counts.clip(1e-10) / counts.sum()).astype(np.float32)
        np.testing.assert_allclose(np.array(reader[k])[:, :3], expected[:, :3], rtol=1e-6)
        np.testing.assert_allclose(kaldiio.load_scp(str(tmp_path / "ll.scp"))[k], np.array(reader[k]))
        never_seen = np.array(reader[k])[:, 3]  # hugely negative, so never chosen, yet finite (nnet1's floor)
        assert np.isfinite(never_seen).all() and (never_seen < -1e19).all()
    assert np.array(reader["u0"]).dtype == np.float32


def test_counts_files(tmp_path):
    write_counts(str(tmp_path / "counts"), np.array([3, 0, 7]))
    assert (tmp_path / "counts").read_text() == " [ 3 0 7 ]\n"  # analyze-counts --binary=false
    assert read_counts(str(tmp_path / "counts")).tolist() == [3, 0, 7]
    with knio.FloatVectorWriter(f"ark:{tmp_path}/v.ark") as w:
        w.write("x", np.array([1.0, 2.5], np.float32))
    (tmp_path / "binary").write_bytes((tmp_path / "v.ark").read_bytes()[2:])  # "x " key removed
    assert read_counts(str(tmp_path / "binary")).tolist() == [1.0, 2.5]


# --------------------------------------------------------------------------- feature transforms
def test_cmvn_deltas_and_splicing_agree_with_kaldi_native_fbank():
    feats = (RNG.standard_normal((83, 13)) * 3 + 7).astype(np.float32)
    stats = compute_cmvn_stats(feats)
    np.testing.assert_allclose(stats, knf.compute_cmvn_stats(feats), rtol=1e-12)
    speaker = knf.CmvnAccumulator(13)
    speaker.accumulate(feats)
    speaker.accumulate(feats[::2] * 0.5)
    for norm_vars in (False, True):
        opts = knf.CmvnOptions()
        opts.norm_vars = norm_vars
        np.testing.assert_allclose(apply_cmvn(feats, speaker.stats, True, norm_vars),
                                   knf.apply_cmvn(speaker.stats, opts, feats), atol=1e-5)
    for order in range(3):
        for window in (1, 2, 3):
            np.testing.assert_allclose(add_deltas(feats, order, window),
                                       knf.compute_deltas(knf.DeltaOptions(order=order, window=window), feats), atol=1e-5)
    for left, right in ((0, 0), (5, 5), (3, 0), (0, 2)):
        np.testing.assert_allclose(splice(feats, left, right),
                                   knf.splice_frames(feats, knf.SpliceOptions(left_context=left, right_context=right)), atol=1e-5)
    short = feats[:2]  # windows wider than the utterance replicate its edge frames
    np.testing.assert_allclose(add_deltas(short, 2, 2), knf.compute_deltas(knf.DeltaOptions(order=2, window=2), short), atol=1e-5)


def test_fea_opts_in_both_spellings():
    kaldi = parse_fea_opts("apply-cmvn --norm-vars=true --utt2spk=ark:d/utt2spk scp:d/cmvn.scp ark:- ark:- "
                           "| add-deltas --delta-order=1 --delta-window=3 ark:- ark:- |")
    assert kaldi == FeatureOptions("speaker", True, True, "scp:d/cmvn.scp", "d/utt2spk", 1, 3)
    assert parse_fea_opts("apply-cmvn ark:cmvn_utt.ark ark:- ark:-").cmvn == "utterance"
    assert parse_fea_opts("cmvn=speaker norm_vars=true delta_order=2") == FeatureOptions("speaker", norm_vars=True, delta_order=2)
    assert parse_fea_opts("") == FeatureOptions()
    with pytest.raises(ValueError, match="splice-feats is not one of"):
        parse_fea_opts("splice-feats --left-context=3 ark:- ark:-")
    with pytest.raises(ValueError, match="unknown option 'cmvm'"):
        parse_fea_opts("cmvm=speaker")
    with pytest.raises(ValueError, match="norm_vars=true needs norm_means"):
        parse_fea_opts("apply-cmvn --norm-means=false --norm-vars=true scp:c.scp ark:- ark:-")


def test_data_io_reexports_the_model_reader():
    assert data_io.read_transition_model is transition_model.read_transition_model
    assert data_io.KaldiIOError is kaldi_tables.KaldiIOError


def test_a_pdf_unseen_in_training_gets_kaldis_floored_prior_and_a_finite_loglikelihood(tmp_path):
    """As Kaldi nnet1's PdfPrior: log(count / total + 1e-20), and sqrt(FLT_MAX) under the 1e-10 floor, so
    that the pdf is never picked yet no score is infinite (an infinite one turns decoder sums into NaN)."""
    counts = np.array([30.0, 10.0, 0.0, 60.0])
    priors = log_priors(counts)
    np.testing.assert_allclose(priors[[0, 1, 3]], np.log([0.3, 0.1, 0.6]), rtol=1e-6)
    assert priors[2] == np.float32(np.sqrt(np.finfo(np.float32).max))
    with LoglikeWriter(str(tmp_path / "ll.ark"), str(tmp_path / "ll.scp"), priors) as writer:
        writer.write("u", np.log(np.full((5, 4), 0.25, dtype=np.float32)))
    loglikes = kaldiio.load_mat(str(tmp_path / "ll.ark") + ":2")
    assert np.isfinite(loglikes).all() and (loglikes[:, 2] < -1e18).all() and (loglikes[:, [0, 1, 3]] > -3).all()
    with pytest.raises(ValueError, match="positive total"):
        log_priors(np.zeros(3))

"""The GMM part of final.mdl (bru_kaldi.kaldi.gmm): Kaldi's own DiagGmm (through kaldi-hmm-gmm) as the
reference for the constants and likelihoods, an independent parser of Kaldi's binary layout, and the
built-in corpus's mono model as a whole (TransitionModel + AmDiagGmm)."""

import math
import struct

import numpy as np
import pytest

from bru_kaldi.kaldi.gmm import DiagGmms, GaussianStats, am_diag_gmm_binary, estimate_single_gaussians
from bru_kaldi.kaldi.transition_model import read_transition_model

RNG = np.random.default_rng(7)


class BinaryParser:
    """Kaldi's binary tokens, basic types, vectors and matrices, read as its Read functions do."""

    def __init__(self, data: bytes):
        self.data, self.pos = data, 0

    def token(self) -> str:
        end = self.data.index(b" ", self.pos)
        token, self.pos = self.data[self.pos:end].decode(), end + 1
        return token

    def int32(self) -> int:
        size, value = struct.unpack_from("<bi", self.data, self.pos)
        assert size == 4
        self.pos += 5
        return value

    def vector(self) -> np.ndarray:
        assert self.token() == "FV"
        n = self.int32()
        out = np.frombuffer(self.data, "<f4", n, self.pos)
        self.pos += 4 * n
        return out

    def matrix(self) -> np.ndarray:
        assert self.token() == "FM"
        rows, cols = self.int32(), self.int32()
        out = np.frombuffer(self.data, "<f4", rows * cols, self.pos).reshape(rows, cols)
        self.pos += 4 * rows * cols
        return out

    def am_diag_gmm(self) -> list[dict]:
        assert self.token() == "<DIMENSION>"
        dim = self.int32()
        assert self.token() == "<NUMPDFS>"
        pdfs = []
        for _ in range(self.int32()):
            assert self.token() == "<DiagGMM>"
            gmm = {}
            for name in ("<GCONSTS>", "<WEIGHTS>", "<MEANS_INVVARS>", "<INV_VARS>"):
                assert self.token() == name
                gmm[name] = self.vector() if name in ("<GCONSTS>", "<WEIGHTS>") else self.matrix()
            assert self.token() == "</DiagGMM>"
            assert gmm["<INV_VARS>"].shape[1] == dim
            pdfs.append(gmm)
        return pdfs


def kaldi_diag_gmm(means, variances, weights):
    import kaldi_hmm_gmm as khg

    gmm = khg.DiagGmm(*means.shape)
    gmm.set_weights(weights.astype(np.float32))
    gmm.set_invvars((1.0 / variances).astype(np.float32))
    gmm.set_means(means.astype(np.float32))
    gmm.compute_gconsts()
    return gmm


def test_gconsts_and_likelihoods_equal_kaldis_diag_gmm():
    means = RNG.normal(size=(3, 2, 5)).astype(np.float32)
    variances = RNG.uniform(0.2, 3.0, size=(3, 2, 5)).astype(np.float32)
    weights = np.array([[0.3, 0.7], [0.5, 0.5], [0.9, 0.1]], dtype=np.float32)
    ours = DiagGmms(means, variances, weights)
    frame = RNG.normal(size=5).astype(np.float32)
    for p in range(3):
        kaldi = kaldi_diag_gmm(means[p], variances[p], weights[p])
        np.testing.assert_allclose(ours.gconsts()[p], np.asarray(kaldi.gconsts).ravel(), rtol=1e-5)
        assert ours.log_likelihood(frame, p) == pytest.approx(kaldi.log_likelihood(frame), rel=1e-5)


def test_binary_layout_holds_what_kaldi_keeps_in_memory():
    means = RNG.normal(size=(4, 1, 3)).astype(np.float32)
    variances = RNG.uniform(0.5, 2.0, size=(4, 1, 3)).astype(np.float32)
    gmm = DiagGmms(means, variances, np.ones((4, 1), dtype=np.float32))
    parser = BinaryParser(am_diag_gmm_binary(gmm))
    pdfs = parser.am_diag_gmm()
    assert parser.pos == len(parser.data) and len(pdfs) == 4
    for p, got in enumerate(pdfs):
        np.testing.assert_allclose(got["<INV_VARS>"], 1 / variances[p], rtol=1e-6)
        np.testing.assert_allclose(got["<MEANS_INVVARS>"], means[p] / variances[p], rtol=1e-6)
        np.testing.assert_array_equal(got["<WEIGHTS>"], [1.0])
        expected = -0.5 * (3 * math.log(2 * math.pi) + np.log(variances[p].astype(np.float64)).sum()
                           + (means[p].astype(np.float64) ** 2 / variances[p]).sum())
        assert got["<GCONSTS>"][0] == pytest.approx(expected, rel=1e-6)


def test_estimate_is_each_pdfs_mean_and_variance_floored_and_falls_back_for_rare_pdfs():
    feats = np.concatenate([RNG.normal(5.0, 2.0, size=(400, 2)), RNG.normal(-1.0, 1e-4, size=(50, 2)),
                            RNG.normal(0.0, 1.0, size=(4, 2))])
    pdfs = np.array([0] * 400 + [1] * 50 + [2] * 4)
    gmm = estimate_single_gaussians(feats, pdfs, num_pdfs=4)
    np.testing.assert_allclose(gmm.means[0, 0], feats[:400].mean(0), rtol=1e-5)
    np.testing.assert_allclose(gmm.variances[0, 0], feats[:400].var(0), rtol=1e-5)
    floor = np.maximum(1e-3, 1e-2 * feats.var(0))
    np.testing.assert_allclose(gmm.variances[1, 0], floor, rtol=1e-5)  # almost constant: floored
    for rare in (2, 3):  # 4 frames and none: the global Gaussian
        np.testing.assert_allclose(gmm.means[rare, 0], feats.mean(0), rtol=1e-5)
        np.testing.assert_allclose(gmm.variances[rare, 0], feats.var(0), rtol=1e-5)
    stats = GaussianStats(4, 2)  # an utterance at a time: the same
    for chunk in np.array_split(np.arange(len(pdfs)), 5):
        stats.add(feats[chunk], pdfs[chunk])
    np.testing.assert_allclose(stats.estimate().means, gmm.means, rtol=1e-6)
    with pytest.raises(ValueError, match=r"utt7: pdf-ids must be in \[0, 4\)"):
        stats.add(feats[:1], np.array([4]), source="utt7")


def test_mono_final_mdl_is_a_transition_model_followed_by_a_gmm_that_recognises_frames(tiny_corpus):
    """The corpus's exp/mono/final.mdl: our reader still reads its TransitionModel; the bytes after it
    are an AmDiagGmm over the pdfs (dimension: fbank + deltas); its Gaussians pick each training frame's
    own pdf far above chance."""
    from bru_kaldi.feature_transforms import add_deltas, apply_cmvn
    from bru_kaldi.kaldi.alignments import read_alignments
    from bru_kaldi.kaldi.tables import read_matrices
    from recipes.mini_timit.local.layout import read_table

    path = tiny_corpus.root / "exp" / "mono" / "final.mdl"
    tm = read_transition_model(path)
    data = path.read_bytes()
    parser = BinaryParser(data)
    parser.pos = len(tm.to_kaldi_binary())
    pdfs = parser.am_diag_gmm()
    assert parser.pos == len(data) and len(pdfs) == tm.num_pdfs
    dim = pdfs[0]["<INV_VARS>"].shape[1]
    inv_vars = np.stack([p["<INV_VARS>"][0] for p in pdfs]).astype(np.float64)
    means = np.stack([p["<MEANS_INVVARS>"][0] for p in pdfs]) / inv_vars
    gconsts = np.array([p["<GCONSTS>"][0] for p in pdfs])

    train = tiny_corpus.root / "data" / "train"
    utt2spk, ali = read_table(train / "utt2spk"), dict(read_alignments(str(tiny_corpus.root / "exp" / "mono_ali_train")))
    cmvn = dict(read_matrices(f"scp:{train / 'cmvn.scp'}", dtype=np.float64))
    correct = total = 0
    for utt, feats in read_matrices(f"scp:{train / 'feats.scp'}"):
        frames = add_deltas(apply_cmvn(feats, cmvn[utt2spk[utt]]))
        assert frames.shape[1] == dim
        loglike = gconsts + frames @ (means * inv_vars).T - 0.5 * (frames ** 2) @ inv_vars.T  # Kaldi's form
        correct += int((loglike.argmax(1) == tm.ali_to_pdf(ali[utt])).sum())
        total += len(frames)
    assert correct / total > 5.0 / tm.num_pdfs, f"{correct}/{total} frames recognised, {tm.num_pdfs} pdfs"

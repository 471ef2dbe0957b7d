"""Against real Kaldi: Kaldi reads what we write, and what we compute equals what Kaldi's binaries compute.

These tests run only where ``KALDI_ROOT`` names a Kaldi build (the README's "Testing against Kaldi": the
binaries of src/{bin,featbin,latbin,fstbin,gmmbin} are enough); elsewhere each is skipped, saying so.
On the tests' tiny built-in corpus:

* Kaldi reads our ``final.mdl``, ``tree``, alignments, feature and log-likelihood archives
  (``hmm-info``, ``gmm-info``, ``tree-info``, ``ali-to-pdf``, ``copy-feats``, ``copy-matrix``), and its
  ML update (``gmm-acc-stats-ali`` + ``gmm-est``) on our alignments gives back our mono GMM;
* our TransitionModel reader equals ``ali-to-pdf``, ``ali-to-phones`` and ``show-transitions``;
* our ``fea_opts`` CMVN, deltas and splicing equal ``apply-cmvn``, ``add-deltas``, ``splice-feats``, and the
  front end a data directory's ``conf/fbank.conf`` describes equals ``compute-fbank-feats --config`` (MFCC too);
* our scoring equals ``compute-wer``; our bootstrap has ``compute-wer-bootci``'s definition;
* ``decode_dnn.sh`` + ``score.sh`` run end to end, and the Python decoder's best path equals
  ``latgen-faster-mapped``'s at the same scale and beams.
"""

import os
import re
import subprocess
from pathlib import Path

import numpy as np
import pytest

from bru_kaldi import decoding, scoring
from bru_kaldi.comparison import statistics
from bru_kaldi.config import Decoding
from bru_kaldi.feature_transforms import add_deltas, apply_cmvn, splice
from bru_kaldi.kaldi.tables import read_matrices
from bru_kaldi.kaldi.transition_model import read_transition_model
from data_io import LoglikeWriter
from recipes.mini_timit.local.check import read_alignments

KALDI_ROOT = os.environ.get("KALDI_ROOT", "")
pytestmark = pytest.mark.skipif(not KALDI_ROOT or not Path(KALDI_ROOT, "src", "bin").is_dir(),
                                reason="KALDI_ROOT is not set to a Kaldi build: the tests against real Kaldi are skipped "
                                       "(README, 'Testing against Kaldi')")
SUBDIRS = ("bin", "featbin", "latbin", "fstbin", "gmmbin")


def kaldi(command: str, stdin: str | None = None) -> str:
    """Run a Kaldi command line (bash, pipefail) with Kaldi's binaries first on PATH; its stdout."""
    path = os.pathsep.join([*(str(Path(KALDI_ROOT, "src", d)) for d in SUBDIRS),
                            str(Path(KALDI_ROOT, "tools", "openfst", "bin")), os.environ["PATH"]])
    result = subprocess.run(["bash", "-o", "pipefail", "-c", command], capture_output=True, text=True, input=stdin,
                            env=dict(os.environ, PATH=path, LC_ALL="C"))
    assert result.returncode == 0, f"{command}\n{result.stderr[-3000:]}"
    return result.stdout


def text_matrices(text: str) -> dict[str, np.ndarray]:
    """``ark,t`` matrices: ``key [ rows ]``."""
    out = {}
    for key, body in re.findall(r"(\S+)\s+\[(.*?)\]", text, flags=re.S):
        out[key] = np.array([[float(v) for v in row.split()] for row in body.strip().splitlines()])
    return out


def text_vectors(text: str) -> dict[str, list[int]]:
    return {line.split()[0]: [int(v) for v in line.split()[1:]] for line in text.splitlines() if line.strip()}


# --------------------------------------------------------------------------- Kaldi reads what we write
def test_kaldi_reads_our_model_tree_and_alignments(tiny_corpus):
    model = tiny_corpus.model
    tm = read_transition_model(model)
    info = kaldi(f"hmm-info {model}")
    assert f"number of phones {tm.num_phones}" in info and f"number of pdfs {tm.num_pdfs}" in info
    assert f"number of transition-ids {tm.num_transition_ids}" in info
    assert "num-pdfs" in kaldi(f"tree-info {model.parent / 'tree'}")
    ali = tiny_corpus.ali("test")
    ours = read_alignments(ali)
    pdfs = text_vectors(kaldi(f"ali-to-pdf {ali / 'final.mdl'} 'ark:gunzip -c {ali}/ali.*.gz |' ark,t:-"))
    phones = text_vectors(kaldi(f"ali-to-phones --per-frame=true {ali / 'final.mdl'} 'ark:gunzip -c {ali}/ali.*.gz |' "
                                "ark,t:-"))
    assert pdfs.keys() == ours.keys()
    for utt, tids in ours.items():
        assert pdfs[utt] == tm.tid2pdf[tids].tolist()
        assert phones[utt] == tm.tid2phone[tids].tolist()


def kaldi_gmm_text(model: Path) -> tuple[np.ndarray, np.ndarray]:
    """``(means, variances)`` ``(P, D)`` of a one-Gaussian-per-pdf model, through ``gmm-copy --binary=false``."""
    text = kaldi(f"gmm-copy --binary=false {model} -")
    means_invvars = [np.array(m.split(), dtype=float) for m in re.findall(r"<MEANS_INVVARS>\s*\[(.*?)\]", text, re.S)]
    inv_vars = [np.array(m.split(), dtype=float) for m in re.findall(r"<INV_VARS>\s*\[(.*?)\]", text, re.S)]
    inv_vars = np.stack(inv_vars)
    return np.stack(means_invvars) / inv_vars, 1.0 / inv_vars


def test_kaldi_reads_our_gmm_and_its_ml_update_gives_it_back(tiny_corpus, tmp_path):
    """gmm-info reads the AmDiagGmm after the TransitionModel; Kaldi's own accumulation and update on our
    alignments and the features as align_si.sh prepares them (CMVN per speaker, deltas) give our means,
    and our variances wherever our relative floor (1 % of the global variance) did not raise them."""
    model, root = tiny_corpus.model, tiny_corpus.root
    tm = read_transition_model(model)
    info = kaldi(f"gmm-info {model}")
    assert f"number of pdfs {tm.num_pdfs}" in info and f"number of gaussians {tm.num_pdfs}" in info
    dim = int(re.search(r"feature dimension (\d+)", info).group(1))
    train, ali = root / "data" / "train", root / "exp" / "mono_ali_train"
    feats = (f"ark,s,cs:apply-cmvn --utt2spk=ark:{train}/utt2spk scp:{train}/cmvn.scp scp:{train}/feats.scp ark:- "
             "| add-deltas ark:- ark:- |")
    kaldi(f"gmm-acc-stats-ali {model} '{feats}' 'ark:gunzip -c {ali}/ali.*.gz |' {tmp_path}/acc")
    kaldi(f"gmm-est --min-gaussian-occupancy=10 {model} {tmp_path}/acc {tmp_path}/est.mdl")
    ours_mean, ours_var = kaldi_gmm_text(model)
    est_mean, est_var = kaldi_gmm_text(tmp_path / "est.mdl")
    assert ours_mean.shape == (tm.num_pdfs, dim)
    np.testing.assert_allclose(est_mean, ours_mean, rtol=1e-3, atol=1e-3)
    unfloored = ours_var > est_var * (1 + 1e-3)  # ours raised by the relative floor: Kaldi's only floor is 1e-3
    assert unfloored.mean() < 0.05, "most variances are not floored"
    np.testing.assert_allclose(est_var[~unfloored], ours_var[~unfloored], rtol=1e-3, atol=1e-4)


def check_against_show_transitions(model: Path, phones: Path) -> None:
    """Our TransitionModel reader gives every transition-id of ``model`` the pdf ``show-transitions`` shows."""
    tm = read_transition_model(model)
    shown = kaldi(f"show-transitions {phones} {model}")
    # "Transition-state N: phone = sil hmm-state = 0 pdf = 0" then " Transition-id = 1 p = 0.5 [self-loop]"
    checked = 0
    pdf = None
    for line in shown.splitlines():
        if m := re.match(r"Transition-state \d+: phone = (\S+) hmm-state = \d+ (?:forward-)?pdf = (\d+)", line):
            pdf = int(m.group(2))
        elif (m := re.match(r"\s*Transition-id = (\d+)", line)) and pdf is not None:
            tid = int(m.group(1))
            if "[self-loop]" not in line or "self-loop-pdf" not in shown:
                assert tm.tid2pdf[tid] == pdf, (tid, line)
            checked += 1
    assert checked == tm.num_transition_ids


def test_our_transition_model_equals_show_transitions(tiny_corpus):
    check_against_show_transitions(tiny_corpus.model, tiny_corpus.graph / "phones.txt")


def test_kaldi_reads_our_features_and_loglikelihoods(tiny_corpus, tmp_path):
    scp = tiny_corpus.feats("test")
    ours = dict(read_matrices(str(scp)))
    theirs = text_matrices(kaldi(f"copy-feats scp:{scp} ark,t:-"))
    assert ours.keys() == theirs.keys()
    for utt in ours:
        np.testing.assert_allclose(theirs[utt], ours[utt], atol=1e-4, rtol=1e-5)
    rng = np.random.default_rng(0)
    with LoglikeWriter(str(tmp_path / "ll.ark"), str(tmp_path / "ll.scp")) as writer:
        written = {f"u{i}": rng.normal(size=(5 + i, 7)).astype(np.float32) for i in range(3)}
        for utt, matrix in written.items():
            writer.write(utt, matrix)
    read = text_matrices(kaldi(f"copy-matrix scp:{tmp_path / 'll.scp'} ark,t:-"))
    for utt, matrix in written.items():
        np.testing.assert_allclose(read[utt], matrix, rtol=1e-5, atol=1e-5)


def test_openfst_reads_our_den_fst(tiny_corpus, tmp_path):
    """The LF-MMI denominator of the tiny corpus as den.fst: OpenFst's fstinfo (the OpenFst Kaldi builds
    with) reads it as a standard-arc vector acceptor without epsilons, with our states and arcs (and no
    more); fstprint's labels are our pdf-ids + 1."""
    from bru_kaldi.chain.den_graph import write_den_fst
    from bru_kaldi.chain.supervision import estimate_denominator

    graph = estimate_denominator(tiny_corpus.root / "exp" / "mono_ali_train", order=3)
    write_den_fst(graph, tmp_path / "den.fst")
    info = dict(re.findall(r"^(.+?)\s{2,}(\S+)$", kaldi(f"fstinfo {tmp_path / 'den.fst'}"), re.M))
    assert (info["fst type"], info["arc type"], info["acceptor"], info["input/output epsilons"]) == \
        ("vector", "standard", "y", "n")
    assert int(info["# of states"]) == graph.num_states and int(info["# of input/output epsilons"]) == 0
    assert int(info["# of arcs"]) == len(graph.src)  # state for state, arc for arc (its start state is ours)
    labels = {int(line.split()[2]) for line in kaldi(f"fstprint {tmp_path / 'den.fst'}").splitlines() if len(line.split()) >= 4}
    assert labels == {int(p) + 1 for p in graph.pdf}


# --------------------------------------------------------------------------- our computations equal Kaldi's
@pytest.mark.parametrize("kind", ["fbank", "mfcc"])
def test_the_front_end_of_a_conf_file_equals_compute_feats(kind, tiny_corpus):
    """What transcribe.py computes from a data directory's conf/<kind>.conf is compute-<kind>-feats' output."""
    from bru_kaldi.audio import read_wav
    from bru_kaldi.frontend import FrontEnd

    data = tiny_corpus.data("dev")
    theirs = text_matrices(kaldi(f"compute-{kind}-feats --config={data}/conf/{kind}.conf scp:{data}/wav.scp ark,t:-"))
    front_end = FrontEnd.from_conf(data / "conf" / f"{kind}.conf", kind)
    wavs = dict(line.split() for line in (data / "wav.scp").read_text().splitlines())
    assert set(theirs) == set(wavs)
    for utt, path in wavs.items():
        # float32 FFTs of two libraries: one cepstrum in thousands differs by 2e-3
        np.testing.assert_allclose(front_end.compute(read_wav(path, front_end.sample_rate)), theirs[utt],
                                   atol=5e-3, rtol=1e-4)


def test_cmvn_deltas_and_splicing_equal_kaldis(tiny_corpus):
    data = tiny_corpus.data("dev")
    theirs = text_matrices(kaldi(f"apply-cmvn --utt2spk=ark:{data}/utt2spk scp:{data}/cmvn.scp scp:{data}/feats.scp "
                                 "ark:- | add-deltas --delta-order=2 ark:- ark:- | "
                                 "splice-feats --left-context=2 --right-context=1 ark:- ark,t:-"))
    utt2spk = dict(line.split() for line in (data / "utt2spk").read_text().splitlines())
    stats = dict(read_matrices(f"scp:{data}/cmvn.scp", dtype=np.float64))
    for utt, feats in read_matrices(str(data / "feats.scp")):
        ours = splice(add_deltas(apply_cmvn(feats, stats[utt2spk[utt]]), 2, 2), 2, 1)
        np.testing.assert_allclose(ours, theirs[utt], atol=2e-4, rtol=1e-4)


def test_scoring_equals_compute_wer(tmp_path):
    rng = np.random.default_rng(1)
    vocabulary = [f"w{i}" for i in range(12)]
    refs = {f"u{i:02d}": list(rng.choice(vocabulary, rng.integers(1, 15))) for i in range(40)}
    hyps = {}
    for utt, ref in refs.items():
        hyp = [w for w in ref if rng.random() > 0.15]
        hyp = [str(rng.choice(vocabulary)) if rng.random() < 0.1 else w for w in hyp]
        hyps[utt] = hyp + list(rng.choice(vocabulary, rng.integers(0, 2)))
    scoring.write_text(refs, tmp_path / "ref")
    scoring.write_text(hyps, tmp_path / "hyp")
    theirs = kaldi(f"compute-wer --text --mode=present ark:{tmp_path / 'ref'} ark:{tmp_path / 'hyp'}")
    ours = scoring.score(refs, hyps, "plain").total.kaldi_line()
    assert ours in theirs, (ours, theirs)


def test_bootstrap_has_the_definition_of_compute_wer_bootci(tmp_path):
    """Same interval, within the noise of two different random draws. (Kaldi's "probability of Set2 improving
    Set1" is not ours: P(better) comes from the run-level test, bru_kaldi/comparison/statistics.py.)"""
    rng = np.random.default_rng(2)
    vocabulary = [f"w{i}" for i in range(20)]
    refs = {f"u{i:03d}": list(rng.choice(vocabulary, rng.integers(3, 20))) for i in range(150)}

    def noisy(rate):
        return {u: [str(rng.choice(vocabulary)) if rng.random() < rate else w for w in r] for u, r in refs.items()}

    hyp1, hyp2 = noisy(0.25), noisy(0.22)
    for name, table in (("ref", refs), ("hyp1", hyp1), ("hyp2", hyp2)):
        scoring.write_text(table, tmp_path / name)
    out = kaldi(f"compute-wer-bootci --replications=10000 ark:{tmp_path / 'ref'} ark:{tmp_path / 'hyp1'} "
                f"ark:{tmp_path / 'hyp2'}")
    # "Set1: %WER 17.47 95% Conf Interval [ 12.10, 22.84 ]" (the bootstrap mean +- 1.96 standard deviations)
    kaldi_mean, low, high = map(float, re.search(r"Set1: %WER ([\d.]+) 95% Conf Interval \[ ([-\d.]+), ([-\d.]+) \]",
                                                 out).groups())
    kaldi_half = (high - low) / 2
    s1 = scoring.score(refs, hyp1, "plain")
    utts = sorted(refs)
    lengths = np.array([s1.per_utterance[u].ref_len for u in utts])
    e1 = np.array([[s1.per_utterance[u].errors for u in utts]])
    iv = statistics.interval(e1, lengths)
    assert abs(100 * iv.mean - kaldi_mean) < 0.3 and abs(100 * iv.half_width - kaldi_half) < 0.3


# --------------------------------------------------------------------------- decoding
def oracle(tiny_corpus, tmp_path) -> Path:
    tm = read_transition_model(tiny_corpus.model)
    rng = np.random.default_rng(3)
    out = tmp_path / "forward_test"
    out.mkdir()
    with LoglikeWriter(str(out / "loglikes.ark"), str(out / "loglikes.scp")) as writer:
        for utt, ali in sorted(read_alignments(tiny_corpus.ali("test")).items()):
            loglikes = rng.normal(0, 1, (len(ali), tm.num_pdfs)).astype(np.float32)
            loglikes[np.arange(len(ali)), tm.tid2pdf[ali]] += 2.5  # right on average, often wrong per frame
            writer.write(utt, loglikes)
    return out / "loglikes.scp"


@pytest.mark.parametrize("task", ["phones", "words"])
def test_python_decoder_best_path_equals_latgen_faster_mapped(task, request, tmp_path):
    """Both tasks: the phone bigram graph, and the word task's trigram graph (word-position-dependent
    phones, optional silence; max-active 2000 as the MINIW configs decode it)."""
    corpus = request.getfixturevalue("tiny_corpus" if task == "phones" else "tiny_words")
    scp = oracle(corpus, tmp_path)
    graph, model, acwt = corpus.graph, corpus.model, 0.2
    max_active = 7000 if task == "phones" else 2000
    words = {int(i): w for w, i in (line.split() for line in (graph / "words.txt").read_text().splitlines())}
    best = kaldi(f"latgen-faster-mapped --beam=13 --max-active={max_active} --min-active=200 --lattice-beam=8 "
                 f"--acoustic-scale={acwt} --allow-partial=true {model} {graph / 'HCLG.fst'} scp:{scp} ark:- | "
                 f"lattice-scale --inv-acoustic-scale={round(1 / acwt)} ark:- ark:- | lattice-best-path ark:- ark,t:-")
    theirs = {u: [words[i] for i in ids] for u, ids in text_vectors(best).items()}
    tm = read_transition_model(model)
    g = decoding.load_graph(graph / "HCLG.fst")
    options = decoding.DecoderOptions(acoustic_scale=acwt, max_active=max_active)
    import kaldiio

    for utt, location in (line.split() for line in scp.read_text().splitlines()):
        result = decoding.decode(kaldiio.load_mat(location), g, tm.tid2pdf, options)
        assert [words[w] for w in result.words] == theirs.get(utt, []), utt


def test_decode_dnn_and_score_run_end_to_end(tiny_corpus, tmp_path):
    scp = oracle(tiny_corpus, tmp_path)
    job = decoding.DecodeJob("test", scp, tiny_corpus.graph, tiny_corpus.model, tiny_corpus.data("test") / "text",
                             tmp_path / "decode_kaldi")
    path = os.pathsep.join([*(str(Path(KALDI_ROOT, "src", d)) for d in SUBDIRS), os.environ["PATH"]])
    old = os.environ["PATH"]
    os.environ["PATH"] = path
    try:
        kaldi_result = decoding.decode_sets([job], Decoding(decoder="kaldi", scoring="timit", acwt=0.2, num_jobs=2),
                                            tune_on="test", log=lambda line: None)["test"]
    finally:
        os.environ["PATH"] = old
    python_job = decoding.DecodeJob("test", scp, tiny_corpus.graph, tiny_corpus.model,
                                    tiny_corpus.data("test") / "text", tmp_path / "decode_python")
    python_result = decoding.decode_sets([python_job], Decoding(decoder="python", scoring="timit", acwt=0.2,
                                                                acwt_sweep=[1 / w for w in range(1, 11)], num_jobs=2),
                                         tune_on="test", log=lambda line: None)["test"]
    assert kaldi_result.score is not None and (tmp_path / "decode_kaldi" / "scoring" / "summary.txt").is_file()
    # Kaldi rescores lattices made at acwt 0.2 for each LM weight; the Python decoder decodes again at each
    # scale 1 / LMWT. At the lattices' own scale (LMWT 5) the two are the same best paths, to the error.
    # Far from it they part: a lattice only holds paths within its beam at 0.2, so at LMWT 1 (scale 1)
    # Kaldi's grid misses paths that a search at scale 1 finds (measured: 16.9 % against 2.0 % here).
    def counts(summary, setting):
        line = next(line for line in summary.read_text().splitlines() if line.startswith(f"test {setting}:"))
        return re.search(r"\[ (\d+ / \d+, \d+ ins, \d+ del, \d+ sub) \]", line).group(1)

    kaldi_summary = tmp_path / "decode_kaldi" / "scoring" / "summary.txt"
    python_summary = tmp_path / "decode_python" / "scoring" / "summary.txt"
    assert counts(kaldi_summary, "lmwt=5 wip=0.0") == counts(python_summary, "acwt=0.2")
    assert python_result.score.total.rate <= kaldi_result.score.total.rate

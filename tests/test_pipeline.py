"""The chunked pipeline: batches against an independent computation, chunking per epoch, long and
missing utterances, length checks, errors from the background worker, bounded memory, priors."""

import logging
import threading
import time
import traceback
import tracemalloc
from concurrent.futures import ThreadPoolExecutor

import kaldi_native_fbank as knf
import kaldi_native_io as knio
import kaldiio
import numpy as np
import pytest
import torch

from bru_kaldi.batching import IGNORE, Prefetcher
from bru_kaldi.config import parse_config_text
from data_io import (Corpus, Dataset, FeatureStream, KaldiIOError, LabelStream, LoaderOptions, LoglikeWriter,
                     log_priors)
from tests.kaldi_fixtures import build_corpus
from bru_kaldi.training import frame_cross_entropy

MFCC_OPTS = "apply-cmvn --utt2spk=ark:{d}/utt2spk scp:{d}/cmvn.scp ark:- ark:- | add-deltas --delta-order=1 ark:- ark:- |"


@pytest.fixture(scope="module")
def kaldi(tmp_path_factory):
    return build_corpus(tmp_path_factory.mktemp("corpus"), num_utts=12)


def spec(kaldi, n_chunks=1, fea_lst=None, **lab):
    d = kaldi["data"]
    return Dataset("train", [
        FeatureStream("mfcc", fea_lst or f"{d}/feats.scp", MFCC_OPTS.format(d=d), cw_left=1, cw_right=1),
        FeatureStream("fbank", f"scp:{d}/fbank.scp", "cmvn=utterance norm_vars=true"),
    ], [LabelStream("lab_cd", str(kaldi["ali"]), **lab),
        LabelStream("lab_mono", str(kaldi["ali"]), "ali-to-phones --per-frame=true")], n_chunks)


def expected_features(kaldi, key):
    """The features of ``key`` computed with kaldi-native-io and kaldi-native-fbank alone."""
    d = kaldi["data"]
    # kaldi-native-io's arrays point into its reader: keep the reader alive until they are copied
    readers = [knio.RandomAccessFloatMatrixReader(f"scp:{d}/{name}.scp") for name in ("feats", "fbank")]
    stats_reader = knio.RandomAccessDoubleMatrixReader(f"scp:{d}/cmvn.scp")
    mfcc, fbank = (np.array(r[key]) for r in readers)
    stats = np.array(stats_reader[kaldi["utt2spk"][key]])
    mfcc = knf.apply_cmvn(stats, knf.CmvnOptions(), mfcc)
    mfcc = knf.compute_deltas(knf.DeltaOptions(order=1, window=2), mfcc)
    mfcc = knf.splice_frames(mfcc, knf.SpliceOptions(left_context=1, right_context=1))
    opts = knf.CmvnOptions()
    opts.norm_vars = True
    return np.concatenate([mfcc, knf.apply_cmvn(knf.compute_cmvn_stats(fbank), opts, fbank)], axis=1)


def test_batches_match_an_independent_computation(kaldi):
    corpus = Corpus(spec(kaldi, n_chunks=2), LoaderOptions(batch_size=5, shuffle=False))
    assert corpus.feature_dim == 13 * 2 * 3 + 5 and corpus.label_dims == {"lab_cd": 17, "lab_mono": 6}
    reference, seen = kaldi["khg"], []
    for batch in corpus.batches():
        B, T, F = batch.x.shape
        assert batch.lengths.dtype == torch.int64 and batch.mask.shape == (B, T) and F == corpus.feature_dim
        for b, key in enumerate(batch.keys):
            n = int(batch.lengths[b])
            ali = kaldi["ali_of"][key]
            assert n == len(ali) and batch.mask[b].sum() == n
            np.testing.assert_allclose(batch.x[b, :n].numpy(), expected_features(kaldi, key), atol=2e-5)
            assert (batch.x[b, n:] == 0).all()
            assert batch.labels["lab_cd"][b, :n].tolist() == [reference.transition_id_to_pdf(int(t)) for t in ali]
            assert batch.labels["lab_mono"][b, :n].tolist() == [reference.transition_id_to_phone(int(t)) for t in ali]
            assert (batch.labels["lab_cd"][b, n:] == IGNORE).all() and (batch.labels["lab_mono"][b, n:] == IGNORE).all()
            seen.append(key)
        # padding never reaches the loss or the error count
        loss_sum, errors, frames = frame_cross_entropy(torch.zeros(B, T, 17), batch.labels["lab_cd"])
        assert frames == int(batch.lengths.sum()) and abs(float(loss_sum) / frames - np.log(17)) < 1e-5
    assert sorted(seen) == kaldi["keys"]


def test_chunks_are_redrawn_every_epoch_from_the_seed(kaldi):
    options = LoaderOptions(batch_size=2, seed=7)
    corpus = Corpus(spec(kaldi, n_chunks=3), options)
    plans = [corpus.chunk_keys(epoch) for epoch in range(3)]
    for plan in plans:
        assert len(plan) == 3 and sorted(k for chunk in plan for k in chunk) == kaldi["keys"]
        frames = [sum(len(kaldi["ali_of"][k]) for k in chunk) for chunk in plan]
        assert max(frames) - min(frames) <= 2 * max(len(a) for a in kaldi["ali_of"].values())
    assert plans[0] != plans[1] != plans[2]
    again = Corpus(spec(kaldi, n_chunks=3), options)
    assert again.chunk_keys(1) == plans[1]
    assert [b.keys for b in again.batches(1)] == [b.keys for b in corpus.batches(1)]
    ordered = Corpus(spec(kaldi), LoaderOptions(batch_size=3, shuffle=False))
    lengths = [b.lengths.tolist() for b in ordered.batches()]
    assert all(max(a) <= min(b) for a, b in zip(lengths, lengths[1:]))  # length-sorted batches


@pytest.mark.parametrize("action", ["split", "drop"])
def test_long_utterances_are_split_or_dropped_and_counted(kaldi, action, caplog):
    limit = int(np.median([len(a) for a in kaldi["ali_of"].values()]))
    long = {k for k, a in kaldi["ali_of"].items() if len(a) > limit}
    with caplog.at_level(logging.INFO, logger="bru_kaldi.corpus"):
        corpus = Corpus(spec(kaldi), LoaderOptions(batch_size=4, max_seq_length=limit, long_utterances=action))
    assert corpus.report["long"] == len(long) and f"longer than max_seq_length={limit}" in caplog.text
    batches = list(corpus.batches())
    assert max(int(b.lengths.max()) for b in batches) <= limit
    keys = [k for b in batches for k in b.keys]
    if action == "split":
        assert sum(int(b.lengths.sum()) for b in batches) == sum(len(a) for a in kaldi["ali_of"].values())
        assert {k.split("#")[0] for k in keys} == set(kaldi["keys"])
    else:
        assert set(keys) == set(kaldi["keys"]) - long


def _subset_scp(kaldi, path, drop=(), extra=()):
    lines = (kaldi["data"] / "feats.scp").read_text().splitlines()
    kept = [line for line in lines if line.split()[0] not in drop]
    path.write_text("\n".join(kept + [f"{k} {kaldi['data']}/raw_mfcc.ark:{lines[0].split(':')[-1]}" for k in extra]) + "\n")
    return str(path)


def test_missing_utterances_are_skipped_and_counted_up_to_a_fraction(kaldi, tmp_path, caplog):
    gone = kaldi["keys"][3]
    scp = _subset_scp(kaldi, tmp_path / "feats.scp", drop=[gone])
    with caplog.at_level(logging.WARNING, logger="bru_kaldi.corpus"):
        corpus = Corpus(spec(kaldi, fea_lst=scp), LoaderOptions(max_missing_fraction=0.1, length_tolerance=10**6))
    assert gone not in corpus.keys and len(corpus) == 11
    assert corpus.report["skipped"] == {scp: 1} and f"'{gone}'" in caplog.text
    with pytest.raises(KaldiIOError, match=rf"1 of 12 utterances \(8\.3%\).*1 missing from {scp} \(e\.g\. '{gone}'\).*max_missing"):
        Corpus(spec(kaldi, fea_lst=scp), LoaderOptions(max_missing_fraction=0.05))


def test_length_mismatch_names_the_utterance_or_is_trimmed_within_tolerance(kaldi, tmp_path):
    key = kaldi["keys"][2]
    longer = dict(kaldiio.load_scp(str(kaldi["data"] / "feats.scp")))
    longer[key] = np.concatenate([longer[key], longer[key][:2]])
    kaldiio.save_ark(str(tmp_path / "f.ark"), longer, scp=str(tmp_path / "f.scp"))
    n = len(kaldi["ali_of"][key])
    with pytest.raises(KaldiIOError, match=rf"utterance '{key}' has {n + 2} frames in .*f\.scp, {n} frames in .*ali\.\d\.gz"):
        Corpus(spec(kaldi, fea_lst=str(tmp_path / "f.scp")))
    corpus = Corpus(spec(kaldi, fea_lst=str(tmp_path / "f.scp")), LoaderOptions(length_tolerance=2, batch_size=1))
    lengths = {b.keys[0]: int(b.lengths[0]) for b in corpus.batches()}
    assert lengths[key] == n


def test_nan_features_fail_with_file_and_utterance_from_the_background_loader(kaldi, tmp_path):
    mats = {k: np.array(m) for k, m in kaldiio.load_scp(str(kaldi["data"] / "feats.scp")).items()}
    bad = kaldi["keys"][-1]  # the last chunk: read in the background while the first is consumed
    mats[bad][1, 0] = np.inf
    kaldiio.save_ark(str(tmp_path / "f.ark"), mats, scp=str(tmp_path / "f.scp"))
    corpus = Corpus(spec(kaldi, n_chunks=3, fea_lst=str(tmp_path / "f.scp")), LoaderOptions(shuffle=False))
    consumed = []
    with pytest.raises(KaldiIOError, match=rf"f\.scp: utterance '{bad}' has NaN or Inf values"):
        for batch in corpus.batches():
            consumed.append(batch)
    assert consumed  # the error came while the pipeline was running, not at its start


def test_a_failing_worker_surfaces_at_once_with_its_traceback_and_never_hangs(kaldi):
    corpus = Corpus(spec(kaldi, n_chunks=2), LoaderOptions(batch_size=1, shuffle=False))
    first = corpus.chunk_keys()[0]
    load = corpus.load_chunk

    def broken_load_chunk(keys):
        if keys != first:
            raise OSError("disk on fire")
        return load(keys)

    corpus.load_chunk = broken_load_chunk
    consumed = []

    def consume():
        for batch in corpus.batches():
            consumed.append(batch.keys)
            time.sleep(0.05)  # a slow training step

    with ThreadPoolExecutor(1) as pool:
        future = pool.submit(consume)
        with pytest.raises(OSError, match="disk on fire") as raised:
            future.result(timeout=30)  # never hangs
    assert len(consumed) < len(first)  # raised during chunk 0, not after it
    text = "".join(traceback.format_exception(raised.value))
    assert "broken_load_chunk" in text and "background" in text  # the worker's own traceback and a note


def test_prefetcher_holds_at_most_two_items_and_stops_when_abandoned():
    alive, peak, lock = set(), [0], threading.Lock()

    class Item:
        def __init__(self, i):
            self.i = i
            with lock:
                alive.add(i)
                peak[0] = max(peak[0], len(alive))

        def __del__(self):
            with lock:
                alive.discard(self.i)

    def produce(i):
        time.sleep(0.002)  # loading takes time: the consumer has dropped its previous item by then
        return Item(i)

    prefetcher = Prefetcher(produce, 20, poll_seconds=0.05)
    for item in prefetcher:
        time.sleep(0.005)
        if item.i == 10:
            break
    del item
    assert peak[0] <= 2
    prefetcher._thread.join(timeout=5)
    assert not prefetcher._thread.is_alive()


def test_memory_is_bounded_by_the_chunk_not_the_corpus(tmp_path):
    rng = np.random.default_rng(3)
    mats = {f"utt{i:04d}": rng.standard_normal((int(rng.integers(60, 140)), 40)).astype(np.float32) for i in range(400)}
    kaldiio.save_ark(str(tmp_path / "f.ark"), mats, scp=str(tmp_path / "f.scp"))
    from tests.kaldi_fixtures import khg_model
    from bru_kaldi.kaldi.transition_model import write_transition_model
    ali = tmp_path / "ali"
    ali.mkdir()
    write_transition_model(khg_model(), ali / "final.mdl")
    kaldiio.save_ark(str(ali / "ali.1.gz.tmp"), {k: rng.integers(1, 43, len(m)).astype(np.int32) for k, m in mats.items()})
    (ali / "ali.1.gz").write_bytes(__import__("gzip").compress((ali / "ali.1.gz.tmp").read_bytes()))
    (ali / "ali.1.gz.tmp").unlink()
    n_chunks = 16
    corpus = Corpus(Dataset("big", [FeatureStream("f", str(tmp_path / "f.scp"), "cmvn=utterance")],
                                [LabelStream("lab", str(ali))], n_chunks), LoaderOptions(batch_size=4))
    corpus_bytes = sum(m.nbytes for m in mats.values())
    chunk_bytes = corpus_bytes / n_chunks
    del mats
    tracemalloc.start()
    frames = 0
    for batch in corpus.batches(epoch=0):
        frames += batch.num_frames
        del batch
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert frames == int(corpus.lengths.sum())
    assert corpus_bytes >= 10 * chunk_bytes
    assert peak > chunk_bytes  # numpy's buffers are traced: a chunk is in memory at least once
    assert peak < 4 * chunk_bytes, f"peak {peak / 1e6:.2f} MB for chunks of {chunk_bytes / 1e6:.2f} MB"


def test_dev_and_test_are_normalised_with_training_statistics(kaldi, tmp_path):
    train = Corpus(spec(kaldi, n_chunks=2), LoaderOptions(shuffle=False))
    norm = train.global_norm()
    frames = np.concatenate([u.feats for u in train.load_chunk(train.keys)])
    np.testing.assert_allclose(norm.mean, frames.mean(axis=0), atol=1e-4)  # real frames only
    np.testing.assert_allclose(norm.std, frames.std(axis=0), rtol=1e-4)
    dev_data = build_corpus(tmp_path, num_utts=6, seed=5)
    dev_options = LoaderOptions(shuffle=False, batch_size=1)
    raw = {b.keys[0]: b.x[0].numpy() for b in Corpus(spec(dev_data), dev_options).batches()}
    dev = Corpus(spec(dev_data), dev_options, norm=norm)
    for batch in dev.batches():
        np.testing.assert_allclose(batch.x[0].numpy(), (raw[batch.keys[0]] - norm.mean) / norm.std, atol=1e-5)
    with pytest.raises(ValueError, match="already normalised"):
        dev.global_norm()


def test_counts_for_priors(kaldi, tmp_path):
    corpus = Corpus(spec(kaldi))
    all_tids = np.concatenate(list(kaldi["ali_of"].values()))
    pdfs = [kaldi["khg"].transition_id_to_pdf(int(t)) for t in all_tids]
    assert corpus.counts("lab_cd").tolist() == np.bincount(pdfs, minlength=17).tolist()
    (tmp_path / "counts").write_text(" [ " + " ".join(["2"] * 17) + " ]\n")
    assert corpus.__class__(spec(kaldi, lab_count_file=str(tmp_path / "counts"))).counts("lab_cd").tolist() == [2.0] * 17
    assert corpus.__class__(spec(kaldi, lab_count_file="none")).counts("lab_cd") is None


def test_a_kaldi_pipeline_stream_gives_the_same_batches(kaldi):
    d = kaldi["data"]
    piped = Corpus(spec(kaldi, fea_lst=f"ark:copy() {{ cat \"$1\"; }}; copy {d}/raw_mfcc.ark |"), LoaderOptions(shuffle=False))
    plain = Corpus(spec(kaldi), LoaderOptions(shuffle=False))
    for a, b in zip(piped.batches(), plain.batches()):
        assert a.keys == b.keys and torch.equal(a.x, b.x)


def test_spec_from_the_config_parser(kaldi):
    d = kaldi["data"]
    cfg = parse_config_text(f"""
[exp]
out_folder = exp/x
[dataset1]
data_name = train
fea = fea_name=mfcc
    fea_lst={d}/feats.scp
    fea_opts={MFCC_OPTS.format(d=d)}
    cw_left=1
    cw_right=1
lab = lab_name=lab_cd
    lab_folder={kaldi['ali']}
n_chunks = 2
[data_use]
train_with = train
valid_with = train
forward_with = train
[architecture1]
arch_name = rnn
sizes = 8
[model]
stack = rnn
inputs = mfcc
""")
    dataset = cfg.dataset("train")
    assert dataset.fea[0] == FeatureStream("mfcc", f"{d}/feats.scp", MFCC_OPTS.format(d=d), 1, 1)
    assert dataset.lab[0].lab_folder == str(kaldi["ali"]) and dataset.n_chunks == 2
    assert Corpus(dataset).feature_dim == 78


def test_forward_pass_written_as_loglikelihoods(kaldi, tmp_path):
    corpus = Corpus(spec(kaldi), LoaderOptions(shuffle=False, batch_size=4))
    priors = log_priors(corpus.counts("lab_cd"))
    torch.manual_seed(0)
    net = torch.nn.Linear(corpus.feature_dim, 17)
    written = {}
    with LoglikeWriter(str(tmp_path / "ll.ark"), str(tmp_path / "ll.scp"), priors) as w:
        for batch in corpus.batches():
            out = torch.log_softmax(net(batch.x), dim=-1)
            w.write_batch(batch.keys, out, batch.lengths)
            written.update({k: out[i, :n].detach().numpy() for i, (k, n) in enumerate(zip(batch.keys, batch.lengths))})
    loaded = kaldiio.load_scp(str(tmp_path / "ll.scp"))
    assert sorted(loaded) == kaldi["keys"]
    for key, out in written.items():
        np.testing.assert_allclose(loaded[key], out - priors, rtol=1e-6)


def test_cmvn_stats_that_do_not_fit_are_refused_up_front(kaldi, tmp_path):
    with knio.DoubleMatrixWriter(f"ark,scp:{tmp_path}/cmvn.ark,{tmp_path}/cmvn.scp") as w:
        for speaker in sorted(set(kaldi["utt2spk"].values())):
            w.write(speaker, np.ones((2, 6)))  # stats of 5-dim features, for 13-dim MFCC
    stream = FeatureStream("mfcc", str(kaldi["data"] / "feats.scp"), f"cmvn=speaker cmvn_stats=scp:{tmp_path}/cmvn.scp")
    with pytest.raises(KaldiIOError, match=r"cmvn\.scp: CMVN stats of 'spk0' have shape \(2, 6\).*expected \(2, 14\)"):
        Corpus(Dataset("x", [stream]))
    bare = tmp_path / "bare"  # a data dir without cmvn.scp: per-speaker stats computed from the features
    bare.mkdir()
    for name in ("feats.scp", "utt2spk"):
        (bare / name).write_text((kaldi["data"] / name).read_text())
    computed = Corpus(Dataset("x", [FeatureStream("mfcc", str(bare / "feats.scp"), "cmvn=speaker")]))
    given = Corpus(Dataset("x", [FeatureStream("mfcc", str(kaldi["data"] / "feats.scp"), "cmvn=speaker")]))
    assert set(computed.sources[0].cmvn) == set(given.sources[0].cmvn) == {"spk0", "spk1", "spk2"}
    for speaker, stats in given.sources[0].cmvn.items():
        np.testing.assert_allclose(computed.sources[0].cmvn[speaker], stats, rtol=1e-9)


def test_the_built_in_corpus_reads_end_to_end(tiny_corpus):
    from data_io import read_alignments, read_transition_model

    ali = tiny_corpus.ali("train")
    spec = Dataset("train", [
        FeatureStream("fbank", str(tiny_corpus.feats("train")), "cmvn=speaker"),
        FeatureStream("mfcc", str(tiny_corpus.feats("train", "mfcc")),
                      f"cmvn=speaker cmvn_stats=scp:{tiny_corpus.cmvn('train', 'mfcc')} delta_order=2"),
    ], [LabelStream("lab_cd", str(ali)), LabelStream("lab_mono", str(ali), "ali-to-phones --per-frame=true")], 2)
    corpus = Corpus(spec, LoaderOptions(batch_size=4))
    tm = read_transition_model(ali / "final.mdl")
    alignments = dict(read_alignments(str(ali)))
    assert corpus.report["skipped"] == {} and sorted(corpus.keys) == sorted(alignments)
    assert corpus.feature_dim == 40 + 3 * 13 and corpus.label_dims == {"lab_cd": tm.num_pdfs, "lab_mono": tm.max_phone + 1}
    for batch in corpus.batches(epoch=3):
        for b, key in enumerate(batch.keys):
            n = int(batch.lengths[b])
            assert batch.labels["lab_cd"][b, :n].tolist() == tm.ali_to_pdf(alignments[key]).tolist()
            assert batch.labels["lab_mono"][b, :n].tolist() == tm.ali_to_phones_per_frame(alignments[key]).tolist()

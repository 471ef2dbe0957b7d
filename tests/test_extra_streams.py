"""The opt-in streams of the built-in corpus (recipes/mini_timit/local/extra_streams.py): the raw-waveform
frames of pytorch-kaldi's save_raw_fea.py and six simulated microphones' MFCC, read back by our loader."""

import json
import shutil

import numpy as np
import pytest

from bru_kaldi.config import FeatureStream
from bru_kaldi.feature_streams import FeatureSource
from bru_kaldi.kaldi.alignments import read_alignments
from bru_kaldi.kaldi.tables import read_matrices
from recipes.mini_timit.local import extra_streams as ex
from recipes.mini_timit.local.layout import SPLITS, read_table
from recipes.mini_timit.local.make_features import read_wav

TINY_SEED = 1  # tests/conftest.py builds the tiny corpus with it


def save_raw_fea_reference(signal: np.ndarray) -> np.ndarray:
    """float64 transcription of save_raw_fea.py's loop (sig_wlen 200 ms, lab_wlen 25 ms, shift 10 ms at
    16 kHz): int16-scale samples / 32768, then / their peak; frames while beg + 400 < N; each frame the
    3200 samples from centre - 1600, centre = beg + 199, zero-filled where they fall outside the signal."""
    signal = signal.astype(np.float64) / 32768
    signal = signal / np.max(np.abs(signal))
    rows, beg = [], 0
    while beg + 400 < len(signal):
        centre = beg + 400 // 2 - 1
        index = centre - 1600 + np.arange(3200)  # sample of each column, gathered (the code under test pads)
        inside = (index >= 0) & (index < len(signal))
        rows.append(np.where(inside, signal[np.clip(index, 0, len(signal) - 1)], 0.0))
        beg += 160
    return np.array(rows)


def load(fea_lst: str, fea_opts: str = "") -> dict[str, np.ndarray]:
    """Every utterance of a stream through our loader's reader, as a config's [datasetN] fea= would."""
    source = FeatureSource(FeatureStream("s", fea_lst, fea_opts, 0, 0))
    return source.load(sorted(source.shapes))


def data_dirs(corpus):
    return [d for d in sorted((corpus.root / "data").iterdir()) if (d / "utt2spk").is_file()]


# --------------------------------------------------------------------------- raw waveform
def test_raw_rows_are_save_raw_fea_frames(tiny_extra_streams):
    data = tiny_extra_streams.data("train")
    raw = load(str(data / "feats_raw.scp"))
    wavs = read_table(data / "wav.scp")
    for utt in sorted(raw)[:2]:
        samples = read_wav(wavs[utt])
        rows, reference = raw[utt], save_raw_fea_reference(samples)
        # pytorch-kaldi's strict `beg + 400 < N` drops Kaldi's last frame when N - 400 is a multiple of 160
        assert len(reference) in (len(rows), len(rows) - 1)
        np.testing.assert_allclose(rows[: len(reference)], reference, rtol=0, atol=1e-7)
        # a hand-checked frame: frame 10 starts at sample 1600, its column 1600 is sample 1600 + 199
        peak = np.abs(samples).max()
        np.testing.assert_array_equal(rows[10], (samples[199:3399] / peak).astype(np.float32))
        assert rows[10, 1600] == np.float32(samples[1799] / peak)
        # the edges: 1401 zeros before the first sample; the last frame runs past the end into zeros
        assert not rows[0, :1401].any() and rows[0, 1401] == np.float32(samples[0] / peak)
        start = 160 * (len(rows) - 1) - 1401
        np.testing.assert_array_equal(rows[-1, : len(samples) - start], (samples[start:] / peak).astype(np.float32))
        assert not rows[-1, len(samples) - start:].any()
        assert np.abs(rows).max() == 1.0


def test_raw_edge_cases_of_the_windowing():
    # a signal shorter than a window: zeros on both sides (save_raw_fea.py itself fails there)
    rows = ex.raw_frames(np.array([1.0, -2.0, 4.0]), 2)
    assert rows.shape == (2, 3200)
    assert rows[0, 1401:1404].tolist() == [0.25, -0.5, 1.0] and np.count_nonzero(rows[0]) == 3
    assert rows[1, 1401 - 160:1404 - 160].tolist() == [0.25, -0.5, 1.0] and np.count_nonzero(rows[1]) == 3
    assert [ex.kaldi_num_frames(n) for n in (399, 400, 559, 560)] == [0, 1, 1, 2]


def test_every_stream_has_the_alignments_frames(tiny_extra_streams):
    corpus = tiny_extra_streams
    lengths = {}
    for split in SPLITS:
        lengths.update({k: len(v) for k, v in read_alignments(str(corpus.ali(split)))})
    tables = ["feats_raw.scp"] + [f"feats_mfcc_mic{m}.scp" for m in range(1, 7)]
    for data in data_dirs(corpus):  # train dev test, dev_core and the word task's copies
        frames = {u: int(n) for u, n in read_table(data / "utt2num_frames").items()}
        assert all(frames[u] == lengths[u] for u in frames)
        for table in tables:
            shapes = FeatureSource(FeatureStream("s", str(data / table), "", 0, 0)).shapes
            assert {u: s[0] for u, s in shapes.items()} == frames, (data.name, table)
            assert {s[1] for s in shapes.values()} == {3200 if table == "feats_raw.scp" else 13}
        speakers = set(read_table(data / "spk2utt"))
        for m in range(1, 7):
            assert set(read_table(data / f"cmvn_mfcc_mic{m}.scp")) == speakers


# --------------------------------------------------------------------------- microphones
def test_microphones_differ_from_each_other_and_from_the_clean_features(tiny_extra_streams):
    data = tiny_extra_streams.data("dev")
    clean = load(str(data / "feats_mfcc.scp"))
    mics = [load(str(data / f"feats_mfcc_mic{m}.scp")) for m in range(1, 7)]
    streams = [clean] + mics

    def distance(a, b):  # mean absolute difference of the cepstra c1..c12 (c0 is the energy: level)
        return np.mean([np.abs(a[u][:, 1:] - b[u][:, 1:]).mean() for u in a])

    for i in range(len(streams)):
        for j in range(i + 1, len(streams)):
            assert distance(streams[i], streams[j]) > 1.0, (i, j)
    assert distance(clean, clean) == 0
    # not the noise alone: each microphone has its own room and channel, so they differ without noise too
    utt = sorted(clean)[0]
    samples = read_wav(read_table(data / "wav.scp")[utt])
    quiet = [{utt: clean[utt]}] + [
        {utt: ex.microphone_features(samples, ex.Microphone(m.room, m.channel, np.inf), None)}
        for m in ex.draw_microphones(TINY_SEED)]
    for i in range(len(quiet)):
        for j in range(i + 1, len(quiet)):
            assert distance(quiet[i], quiet[j]) > 1.0, (i, j)


def test_microphone_cmvn_stats_fit_their_features(tiny_extra_streams):
    data = tiny_extra_streams.data("train")
    stats = f"scp:{data}/cmvn_mfcc_mic3.scp"
    normed = load(str(data / "feats_mfcc_mic3.scp"), f"apply-cmvn --utt2spk=ark:{data}/utt2spk {stats} ark:- ark:- |")
    for spk, utts in read_table(data / "spk2utt").items():
        x = np.concatenate([normed[u] for u in utts.split()])
        np.testing.assert_allclose(x.mean(0), 0, atol=1e-3)


def test_microphones_are_deterministic_for_a_seed(tiny_extra_streams):
    data = tiny_extra_streams.data("test")
    utt = sorted(read_table(data / "utt2spk"))[1]
    samples = read_wav(read_table(data / "wav.scp")[utt])
    stored = load(str(data / "feats_mfcc_mic4.scp"))[utt]
    again = ex.microphone_features(samples, ex.draw_microphones(TINY_SEED)[3], ex.noise_rng(TINY_SEED, 4, utt))
    np.testing.assert_array_equal(stored, again)
    # microphone 4 is itself whatever the count; another seed gives another room, channel and noise
    assert all(np.array_equal(a, b) for a, b in zip(vars(ex.draw_microphones(1, 4)[3]).values(),
                                                     vars(ex.draw_microphones(1, 6)[3]).values()) if a is not None)
    other = ex.microphone_features(samples, ex.draw_microphones(TINY_SEED + 1)[3], ex.noise_rng(TINY_SEED + 1, 4, utt))
    assert np.abs(other - stored).mean() > 0.1
    # the room decays: its last tenth holds far less energy than its first
    room = ex.draw_microphones(TINY_SEED)[3].room
    tenth = len(room) // 10
    assert np.sum(room[-tenth:] ** 2) < 1e-3 * np.sum(room[:tenth] ** 2)


def test_a_delta_microphone_gives_back_the_clean_features(tiny_corpus, tmp_path):
    # only the tables the step reads: its archives go to tmp_path, the wavs are tiny_corpus's
    for data in data_dirs(tiny_corpus):
        (tmp_path / "data" / data.name).mkdir(parents=True)
        for table in ("wav.scp", "utt2spk", "spk2utt", "utt2num_frames"):
            shutil.copy(data / table, tmp_path / "data" / data.name / table)
    delta = ex.Microphone(np.ones(1), np.ones(1), np.inf)
    ex.build(tmp_path, mics=[delta], seed=TINY_SEED)
    for data in data_dirs(tiny_corpus):
        ours = tmp_path / "data" / data.name
        clean, mic = load(str(data / "feats_mfcc.scp")), load(str(ours / "feats_mfcc_mic1.scp"))
        assert clean.keys() == mic.keys()
        for utt in clean:
            np.testing.assert_array_equal(mic[utt], clean[utt])  # bit for bit: the same MFCC pipeline
        for spk in read_table(data / "spk2utt"):
            np.testing.assert_allclose(stats(ours / "cmvn_mfcc_mic1.scp")[spk], stats(data / "cmvn_mfcc.scp")[spk],
                                       rtol=1e-12)


def stats(scp) -> dict[str, np.ndarray]:
    """Kaldi CMVN statistics (2, D + 1) float64 per speaker."""
    return dict(read_matrices(f"scp:{scp}", dtype=np.float64))


# --------------------------------------------------------------------------- the command line
def test_command_line_refuses_and_skips(tiny_extra_streams, tmp_path, capsys):
    with pytest.raises(SystemExit):
        ex.main(["--mics", "7", str(tiny_extra_streams.root)])
    with pytest.raises(SystemExit):
        ex.main([str(tiny_extra_streams.root)])  # nothing asked
    with pytest.raises(SystemExit):
        ex.main(["--raw", str(tmp_path)])  # no corpus there
    assert "stage 2" in capsys.readouterr().err
    marker = tiny_extra_streams.root / "data" / ".done" / "extra.mics"
    assert json.loads(marker.read_text())["mics"] == 6
    ex.main(["--raw", "--mics", "6", str(tiny_extra_streams.root)])
    assert capsys.readouterr().out.count("complete, skipping") == 2

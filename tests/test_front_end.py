"""New audio into features as training's were: the front end described by Kaldi's conf files, audio files
read and checked, and the causal pieces a stream runs (online CMVN, deltas and splicing as frames arrive),
each against an independent reference."""

import io
import wave

import numpy as np
import pytest

from bru_kaldi import audio
from bru_kaldi.feature_transforms import OnlineCmvn, OnlineContext, add_deltas, apply_cmvn, compute_cmvn_stats, splice
from bru_kaldi.frontend import FrontEnd, FrontEndError, front_end_of
from bru_kaldi.kaldi.tables import read_matrices, read_text_table


# --------------------------------------------------------------------------- the front end
def test_the_recorded_front_end_computes_the_corpus_features_exactly(tiny_corpus):
    """What a data directory's conf/ says, computed from its WAV files, is its feats.scp and feats_mfcc.scp."""
    wavs = read_text_table(str(tiny_corpus.data("dev") / "wav.scp"))
    for kind, dim in (("fbank", 40), ("mfcc", 13)):
        front_end = front_end_of(str(tiny_corpus.feats("dev", kind)), dim)
        assert front_end.kind == kind and front_end.dim == dim
        for utt, feats in list(read_matrices(str(tiny_corpus.feats("dev", kind))))[:3]:
            ours = front_end.compute(audio.read_wav(wavs[utt], front_end.sample_rate))
            np.testing.assert_array_equal(ours, feats)


def test_a_conf_file_reads_back_and_leaves_the_rest_at_kaldis_defaults(tmp_path):
    fbank = FrontEnd("fbank", {"num-mel-bins": "40", "use-energy": "true", "frame-shift": "20"})
    fbank.write_conf(tmp_path / "fbank.conf")
    again = FrontEnd.from_conf(tmp_path / "fbank.conf", "fbank")
    assert again.options == fbank.options and again.source == str(tmp_path / "fbank.conf")
    assert again.dim == 41 and again.frame_shift == 0.02
    assert again.get("dither") == 1.0  # Kaldi's default, not kaldi-native-fbank's 3e-5
    assert again.knf_options().frame_opts.dither == 1.0 and FrontEnd("mfcc").dim == 13
    # Kaldi's syntax: a bare --flag is true, comments and blank lines are skipped, _ is -
    conf = FrontEnd.from_conf_text("# made by hand\n--use_energy\n\n--num-mel-bins=30 # fewer\n", "fbank")
    assert conf.options == {"use-energy": "true", "num-mel-bins": "30"} and conf.dim == 31


@pytest.mark.parametrize("text, message", [
    ("--vtln-warp=0.9\n", "--vtln-warp is not an option"),
    ("--snip-edges=yes\n", "expected true or false"),
    ("--num-mel-bins=forty\n", "expected int"),
    ("num-mel-bins=40\n", ":1: expected --name=value"),
])
def test_a_conf_file_it_cannot_follow_is_an_error_naming_it(text, message, tmp_path):
    (tmp_path / "fbank.conf").write_text(text)
    with pytest.raises(FrontEndError, match=message) as error:
        FrontEnd.from_conf(tmp_path / "fbank.conf", "fbank")
    assert str(tmp_path / "fbank.conf") in str(error.value)


def test_the_front_end_of_a_feature_list_is_found_as_kaldi_leaves_it(tmp_path):
    data = tmp_path / "data" / "train"
    (data / "conf").mkdir(parents=True)
    FrontEnd("fbank", {"num-mel-bins": "40"}).write_conf(data / "conf" / "fbank.conf")
    assert front_end_of(f"scp:{data}/feats.scp", 40).kind == "fbank"
    with pytest.raises(FrontEndError, match="features of 13 values, but .*fbank.conf makes 40"):
        front_end_of(str(data / "feats.scp"), 13)
    # both kinds in one directory: feats.scp is the one of its dimension, feats_mfcc.scp says its kind
    FrontEnd("mfcc", {"num-ceps": "13"}).write_conf(data / "conf" / "mfcc.conf")
    assert front_end_of(str(data / "feats.scp"), 40).kind == "fbank"
    assert front_end_of(str(data / "feats.scp"), 13).kind == "mfcc"
    assert front_end_of(str(data / "feats_mfcc.scp"), 13).kind == "mfcc"
    FrontEnd("mfcc", {"num-ceps": "40"}).write_conf(data / "conf" / "mfcc.conf")
    with pytest.raises(FrontEndError, match="fbank.conf and .*mfcc.conf both make frames of 40 values"):
        front_end_of(str(data / "feats.scp"), 40)
    with pytest.raises(FrontEndError, match="no .*conf/plp.conf"):
        front_end_of(str(data / "feats_plp.scp"), 13)
    with pytest.raises(FrontEndError, match="not an scp"):
        front_end_of("ark:copy-feats scp:x.scp ark:- |", 40)


# --------------------------------------------------------------------------- audio
def wav_bytes(samples: np.ndarray, rate: int = 16000, width: int = 2) -> bytes:
    """A WAV file of ``samples`` ``(N,)`` or ``(N, channels)`` on the int16 scale, written at ``width`` bytes."""
    samples = np.asarray(samples, dtype=np.float64)
    samples = samples.reshape(len(samples), -1 if samples.size else 1)
    if width == 1:
        data = (samples / 256 + 128).astype(np.uint8).tobytes()
    elif width == 2:
        data = samples.astype("<i2").tobytes()
    elif width == 3:
        data = b"".join(int(v * 256).to_bytes(3, "little", signed=True) for v in samples.reshape(-1))
    else:
        data = (samples * 65536).astype("<i4").tobytes()
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as w:
        w.setnchannels(samples.shape[1])
        w.setsampwidth(width)
        w.setframerate(rate)
        w.writeframes(data)
    return buffer.getvalue()


@pytest.mark.parametrize("width", [1, 2, 3, 4])
def test_every_integer_width_reads_on_the_int16_scale(width, tmp_path):
    samples = np.array([0, 256, -256, 32512, -32768, 1024], dtype=np.float32)  # exact at 8 bits too
    (tmp_path / "a.wav").write_bytes(wav_bytes(samples, width=width))
    np.testing.assert_array_equal(audio.read_wav(tmp_path / "a.wav", 16000), samples)


def test_a_channel_is_chosen_and_another_rate_resampled_and_said(tmp_path):
    rng = np.random.default_rng(0)
    left, right = rng.normal(0, 1000, 8000).round(), rng.normal(0, 1000, 8000).round()
    (tmp_path / "stereo.wav").write_bytes(wav_bytes(np.stack([left, right], axis=1)))
    with pytest.raises(audio.AudioError, match="stereo.wav: 2 channels; choose one with --channel"):
        audio.read_wav(tmp_path / "stereo.wav", 16000)
    np.testing.assert_array_equal(audio.read_wav(tmp_path / "stereo.wav", 16000, channel=1), right)
    with pytest.raises(audio.AudioError, match="no channel 2"):
        audio.read_wav(tmp_path / "stereo.wav", 16000, channel=2)
    said = []
    (tmp_path / "8k.wav").write_bytes(wav_bytes(left, rate=8000))
    resampled = audio.read_wav(tmp_path / "8k.wav", 16000, log=said.append)
    assert said == [f"{tmp_path / '8k.wav'}: resampled from 8000 Hz to 16000 Hz (soxr)"] and len(resampled) == 16000


@pytest.mark.parametrize("content, message", [
    (b"", "an empty file, not audio"),
    (b"0123456789" * 10, "not a WAV file"),
    (wav_bytes(np.ones(1000))[:30], "truncated WAV file .*header"),
    (wav_bytes(np.ones(1000))[:-200], "truncated WAV file: its header promises 1000 samples per channel, it holds 900"),
    (wav_bytes(np.ones(0)), "a WAV file without samples"),
])
def test_a_file_that_is_not_whole_audio_is_an_error_naming_it(content, message, tmp_path):
    (tmp_path / "bad.wav").write_bytes(content)
    with pytest.raises(audio.AudioError, match=message) as error:
        audio.read_wav(tmp_path / "bad.wav", 16000)
    assert str(error.value).startswith(str(tmp_path / "bad.wav"))


def test_raw_pcm_from_a_pipe_comes_in_chunks_of_the_asked_length():
    samples = np.arange(-5000, 5000, 3, dtype="<i2")
    chunks = list(audio.pcm_chunks(io.BytesIO(samples.tobytes() + b"\x01"), rate=1000, seconds=0.5))
    assert [len(c) for c in chunks[:-1]] == [500] * (len(chunks) - 1)
    np.testing.assert_array_equal(np.concatenate(chunks), samples)  # the odd byte at the end dropped


# --------------------------------------------------------------------------- causal CMVN, deltas and splicing
def brute_force_online_cmvn(feats, prior, window, global_frames, norm_vars):
    """Frame by frame from the definition: the stats of the last ``window`` frames up to t, topped up with
    ``min(window - n, global_frames)`` frames' worth of the prior, then Kaldi's ApplyCmvn."""
    out = []
    for t in range(len(feats)):
        part = feats[max(0, t - window + 1):t + 1]
        stats = compute_cmvn_stats(part)
        if len(part) < window:
            stats = stats + prior * (min(window - len(part), global_frames) / prior[0, -1])
        out.append(apply_cmvn(feats[t:t + 1], stats, True, norm_vars))
    return np.concatenate(out)


@pytest.mark.parametrize("norm_vars", [False, True])
def test_online_cmvn_is_kaldis_definition_and_the_same_in_chunks(norm_vars):
    rng = np.random.default_rng(1)
    feats = (rng.normal(size=(70, 3)) * [1, 5, 0.1] + [10, -3, 0]).astype(np.float32)
    prior = compute_cmvn_stats(rng.normal(size=(500, 3)) * 2 + 4)
    expected = brute_force_online_cmvn(feats, prior, window=25, global_frames=10, norm_vars=norm_vars)
    whole = OnlineCmvn(prior, cmn_window=25, global_frames=10, norm_vars=norm_vars)(feats)
    np.testing.assert_allclose(whole, expected, rtol=1e-5, atol=1e-5)
    cmvn = OnlineCmvn(prior, cmn_window=25, global_frames=10, norm_vars=norm_vars)
    chunked = np.concatenate([cmvn(feats[a:b]) for a, b in ((0, 1), (1, 24), (24, 26), (26, 70))])
    np.testing.assert_allclose(chunked, whole, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("order, window, left, right", [(0, 2, 0, 0), (0, 2, 2, 4), (2, 2, 1, 1), (1, 3, 0, 2)])
def test_deltas_and_splicing_as_frames_arrive_equal_the_whole_stream(order, window, left, right):
    rng = np.random.default_rng(2)
    feats = rng.normal(size=(23, 2)).astype(np.float32)
    expected = splice(add_deltas(feats, order, window), left, right)
    for cuts in ([23], [1, 1, 1, 20], [5, 0, 9, 9], [2] * 11 + [1]):
        context, pieces, start = OnlineContext(order, window, left, right), [], 0
        for i, size in enumerate(cuts):
            pieces.append(context.push(feats[start:start + size], final=i == len(cuts) - 1))
            start += size
            # nothing comes out before the frames its window reaches have arrived
            assert sum(len(p) for p in pieces) == (start if i == len(cuts) - 1 else max(0, start - context.lookahead))
        np.testing.assert_allclose(np.concatenate(pieces), expected, rtol=1e-6, atol=1e-6)
    assert OnlineContext(order, window, left, right).lookahead == order * window + right

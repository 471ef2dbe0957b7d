"""transcribe.py on a word model of the tiny corpus: its words are run_exp.py's own decode, streaming gives the
offline words with partial hypotheses on the way, and every bad input is refused, naming it, with nothing
written for it."""

import io
import json
import re
import shutil
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

import transcribe
from bru_kaldi import audio, decoding, scoring, streaming, transcription
from bru_kaldi.checkpoints import save_tensors
from bru_kaldi.config import parse_config
from bru_kaldi.kaldi.tables import read_matrices, read_text_table
from bru_kaldi.network import build_model
from tests.test_front_end import wav_bytes

pytestmark = pytest.mark.usefixtures("one_thread")  # a tiny model: a second thread only waits


def run(capsys, *args) -> tuple[int, str, str]:
    """``transcribe.py`` in this process: exit status, standard output, standard error."""
    code = transcribe.main([str(a) for a in args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def transcripts(out: str) -> dict[str, list[str]]:
    return {line.split()[0]: line.split()[1:] for line in out.splitlines()}


@pytest.fixture(scope="module")
def test_wavs(tiny_words) -> dict[str, str]:
    """utterance -> WAV file of the tiny corpus's test set."""
    return read_text_table(str(tiny_words.data("test") / "wav.scp"))


def copy_experiment(source: Path, target: Path) -> Path:
    """What transcribe.py reads of an experiment folder, copied (not its forward and decode outputs)."""
    shutil.copytree(source, target, ignore=shutil.ignore_patterns("forward_*", "decode_*", "checkpoint.pt", ".lock"))
    return target


def test_the_words_are_run_exps_own_decode_of_the_same_utterances(tiny_word_model, tiny_words, test_wavs, capsys):
    """With the test speakers' CMVN statistics (--cmvn-from their data folder) the audio takes training's
    path: the front end recorded in the folder, CMVN, splicing, the network, the chosen scale, the graph."""
    data = tiny_words.data("test")
    code, out, err = run(capsys, tiny_word_model, "--cmvn-from", data, *test_wavs.values())
    assert code == 0, err
    by_file = {path: utt for utt, path in test_wavs.items()}
    ours = {by_file[name]: words for name, words in transcripts(out).items()}
    theirs = scoring.read_text(tiny_word_model / "decode_test" / "text")
    assert ours == theirs and list(transcripts(out)) == list(test_wavs.values())  # in the order given
    refs = scoring.read_text(data / "text")
    assert sum(w in refs[u] for u, words in ours.items() for w in words) >= 3  # it decodes words, some right
    # a Kaldi wav.scp names each line by its utterance; the word timings are run_exp.py's too
    code, out, _ = run(capsys, tiny_word_model, "--cmvn-from", data, "--ctm", f"scp:{data / 'wav.scp'}")
    assert code == 0 and out == (tiny_word_model / "decode_test" / "ctm").read_text() != ""


def test_the_folder_records_the_front_end_and_the_global_cmvn_statistics(tiny_word_model, tiny_words):
    record = json.loads((tiny_word_model / "front_end.json").read_text())["streams"]
    assert [s["fea_name"] for s in record] == ["fbank"] and record[0]["front_end"]["kind"] == "fbank"
    assert (record[0]["cw_left"], record[0]["cw_right"], record[0]["fea_opts"]["cmvn"]) == (2, 4, "speaker")
    speakers = dict(read_matrices(str(tiny_words.cmvn("train")), dtype=np.float64))
    np.testing.assert_allclose(record[0]["global_cmvn"], sum(speakers.values()))
    choice = json.loads((tiny_word_model / "decoding.json").read_text())
    res = (tiny_word_model / "res.res").read_text()
    assert f"test: " in res and f"acwt={choice['acoustic_scale']:g} " in res and choice["tuned_on"] == "dev_core"


def long_file(test_wavs: dict[str, str], path: Path) -> float:
    """Three test utterances one after the other, as one file; returns its duration."""
    samples = np.concatenate([audio.read_wav(w, 16000) for w in list(test_wavs.values())[:3]])
    path.write_bytes(wav_bytes(samples))
    return len(samples) / 16000


def test_streaming_gives_the_offline_words_with_partial_hypotheses_before_the_end(tiny_word_model, test_wavs,
                                                                                  tmp_path, capsys):
    duration = long_file(test_wavs, tmp_path / "long.wav")
    files = [*list(test_wavs.values())[:3], tmp_path / "long.wav"]
    code, offline, err = run(capsys, tiny_word_model, *files)  # the default normalisation: sliding CMVN
    assert code == 0, err
    code, online, err = run(capsys, tiny_word_model, "--streaming", *files)
    assert code == 0, err
    assert online == offline and all(transcripts(offline).values())
    partial = [float(t) for t in re.findall(rf"{tmp_path / 'long.wav'} \((\d+\.\d+) s\): \S", err)]
    assert partial and min(partial) < duration - 1.0, err
    assert re.search(r"real-time factor \d\.\d+ .* word latency .* median -?\d\.\d\d s", err), err
    assert "lookahead 4 frames (40 ms)" in err  # cw_right = 4 of MINIW_liBRU
    # word timings of the streaming best path: its words, in order, each within the file
    code, ctm, _ = run(capsys, tiny_word_model, "--ctm", "--streaming", tmp_path / "long.wav")
    rows = [row.split() for row in ctm.splitlines()]
    assert code == 0 and [row[4] for row in rows] == transcripts(offline)[str(tmp_path / "long.wav")]
    ends = [float(row[2]) + float(row[3]) for row in rows]
    assert ends == sorted(ends) and ends[-1] <= duration + 0.01


def test_streaming_decodes_the_frames_a_subsampled_output_keeps(tiny_word_model, test_wavs):
    """A model whose output is taken every third frame ([model] frame_subsampling_factor = 3, read from the
    network): chunks of any length keep input frames 0, 3, 6 ... of the whole file."""
    trained = transcription.load(tiny_word_model)
    assert trained.subsampling == 1 and trained.frame_shift == pytest.approx(0.01)
    trained.network.frame_subsampling_factor = 3  # the network keeps every third frame
    assert trained.subsampling == 3
    samples = audio.read_wav(next(iter(test_wavs.values())), 16000)
    feats = transcription.features(trained, samples, "a", transcription.normalisers(trained, "sliding"))
    whole = transcription.loglikes(trained, feats)
    assert len(whole) == -(-len(feats) // 3) and trained.frame_shift == pytest.approx(0.03)
    searcher = streaming.Searcher(trained)
    offline = decoding.decode(whole, searcher.graph, searcher.model.tid2pdf, decoding.DecoderOptions(
        beam=trained.decoding.beam, max_active=trained.decoding.max_active, min_active=trained.decoding.min_active,
        acoustic_scale=trained.decoding.acwt))
    with torch.no_grad():
        stream = streaming.Stream(trained, searcher, transcription.normalisers(trained, "sliding"), "a")
        for start in range(0, len(samples), 1700):  # 10.6 frames a chunk
            stream.accept(samples[start:start + 1700])
        outcome = stream.finish()
    assert stream.decoded == len(whole)
    assert outcome.words == [searcher.words[w] for w in offline.words] and outcome.alignment == offline.alignment


def test_other_rates_channels_and_a_pipe_give_the_same_words(tiny_word_model, test_wavs, tmp_path, capsys,
                                                             monkeypatch):
    path = next(iter(test_wavs.values()))
    samples = audio.read_wav(path, 16000)
    (tmp_path / "stereo.wav").write_bytes(wav_bytes(np.stack([np.zeros_like(samples), samples], axis=1)))
    code, out, err = run(capsys, tiny_word_model, path)
    words = transcripts(out)[path]
    code, out, err = run(capsys, tiny_word_model, "--channel", 1, tmp_path / "stereo.wav")
    assert code == 0 and transcripts(out)[str(tmp_path / "stereo.wav")] == words
    monkeypatch.setattr(sys, "stdin", SimpleNamespace(buffer=io.BytesIO(samples.astype("<i2").tobytes())))
    code, out, err = run(capsys, tiny_word_model, "-")
    assert code == 0 and transcripts(out)["-"] == words
    import soxr

    (tmp_path / "44k.wav").write_bytes(wav_bytes(soxr.resample(samples, 16000, 44100).round().clip(-32768, 32767),
                                                 rate=44100))
    code, out, err = run(capsys, tiny_word_model, tmp_path / "44k.wav")
    assert code == 0 and f"{tmp_path / '44k.wav'}: resampled from 44100 Hz to 16000 Hz (soxr)" in err
    assert transcripts(out)[str(tmp_path / "44k.wav")]  # words; not necessarily the same ones


@pytest.mark.parametrize("bad, message", [
    ("not_audio", "not a WAV file"),
    ("empty", "an empty file, not audio"),
    ("truncated", "a truncated WAV file: its header promises"),
    ("stereo", "2 channels; choose one with --channel"),
])
@pytest.mark.parametrize("mode", ["offline", "streaming"])
def test_a_bad_audio_file_is_named_and_nothing_is_written_for_it(bad, message, mode, tiny_word_model, test_wavs,
                                                                 tmp_path, capsys):
    good = next(iter(test_wavs.values()))
    content = Path(good).read_bytes()
    path = tmp_path / f"{bad}.wav"
    path.write_bytes({"not_audio": b"utt1 HELLO WORLD\n" * 20, "empty": b"", "truncated": content[:len(content) // 2],
                      "stereo": wav_bytes(np.zeros((3200, 2)))}[bad])
    code, out, err = run(capsys, tiny_word_model, *(["--streaming"] if mode == "streaming" else []), path, good)
    assert code == 1
    assert re.search(rf"{re.escape(str(path))}: .*{message}", err), err
    assert list(transcripts(out)) == [good]  # the good file is transcribed, nothing for the bad one


def test_a_folder_without_a_trained_model_or_with_a_config_it_cannot_read_is_refused(tiny_word_model, tmp_path,
                                                                                     test_wavs, capsys):
    wav = next(iter(test_wavs.values()))
    untrained = copy_experiment(tiny_word_model, tmp_path / "untrained")
    (untrained / "final.pt").unlink()
    code, out, err = run(capsys, untrained, wav)
    assert code == 1 and out == "" and f"{untrained}: no trained model" in err and "final.pt" in err
    (untrained / "final.pt").write_bytes((tiny_word_model / "final.pt").read_bytes()[:1000])  # a copy cut short
    code, out, err = run(capsys, untrained, wav)
    assert code == 1 and out == "" and f"{untrained / 'final.pt'}: a trained model that cannot be read" in err
    future = copy_experiment(tiny_word_model, tmp_path / "future")
    resolved = future / "config.resolved.cfg"
    resolved.write_text(resolved.read_text().replace("[model]\n", "[model]\nlattice_free_everything = True\n"))
    code, out, err = run(capsys, future, wav)
    assert code == 1 and out == ""
    assert f"{resolved}: a config this version cannot read" in err and "lattice_free_everything" in err
    code, out, err = run(capsys, tmp_path / "nowhere", wav)
    assert code == 1 and out == "" and "no such experiment folder" in err


def test_a_phone_model_asked_for_word_timings_is_refused(tiny_word_model, tiny_corpus, tmp_path, test_wavs, capsys):
    """A phone recogniser's graph has no word boundaries (its words are phones): --ctm has nothing to give."""
    phones = copy_experiment(tiny_word_model, tmp_path / "phones")
    choice = json.loads((phones / "decoding.json").read_text())
    choice["graph"] = str(tiny_corpus.graph)
    (phones / "decoding.json").write_text(json.dumps(choice))
    code, out, err = run(capsys, phones, "--ctm", next(iter(test_wavs.values())))
    assert code == 1 and out == ""
    assert f"{phones}: a phone model" in err and "word_boundary.int" in err and "without --ctm" in err


def test_a_bidirectional_model_is_refused_for_streaming(tiny_word_model, tmp_path, test_wavs, capsys):
    both_ways = copy_experiment(tiny_word_model, tmp_path / "bidirectional")
    resolved = both_ways / "config.resolved.cfg"
    resolved.write_text(resolved.read_text().replace("bidirectional = False", "bidirectional = True"))
    saved = torch.load(both_ways / "final.pt", weights_only=True)
    model, _ = build_model(parse_config(resolved), saved["input_dim"], saved["num_pdfs"], None,
                           stream_dims=saved["stream_dims"])
    save_tensors({**saved, "model": model.state_dict()}, both_ways / "final.pt")
    code, out, err = run(capsys, both_ways, "--streaming", next(iter(test_wavs.values())))
    assert code == 1 and out == ""
    assert f"{both_ways}: the model cannot stream" in err and "bidirectional" in err
    with pytest.raises(SystemExit) as exit_status:  # CMVN over the whole file cannot stream either
        transcribe.main([str(tiny_word_model), "--streaming", "--cmvn", "file", "x.wav"])
    assert exit_status.value.code == 2 and "cannot stream" in capsys.readouterr().err

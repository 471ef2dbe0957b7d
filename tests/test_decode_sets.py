"""decode.decode_sets, the entry point the trainer calls, on the built-in corpus (tiny size).

Log-likelihoods are made from the corpus alignments and written with data_io.LoglikeWriter, as
the trainer writes them: oracle ones (all the mass on the aligned pdf) must decode to a near-zero
PER, random ones to a high PER; the acoustic scale is chosen on dev and only applied to test; a pool
of workers gives the hypotheses of one; bad inputs are errors naming their files; utterances
without a path are counted. The Kaldi path runs with stand-ins for its binaries (no Kaldi here).
"""

import os
import re
import shutil
import stat
from pathlib import Path

import numpy as np
import pytest

from bru_kaldi import config
from bru_kaldi import decoding as decode
from bru_kaldi.decoding import kaldi_scripts, python_decoder
from data_io import LoglikeWriter, log_priors
from recipes.mini_timit.local.check import read_alignments
from recipes.mini_timit.local.layout import read_table
from tests.kaldi_fixtures import path_without_kaldi
from bru_kaldi.kaldi.transition_model import read_transition_model

OFF_PATH = float(np.log(1e-30))  # log posterior of every pdf but the aligned one, in the oracle
RES_LINE = re.compile(r"^(\w+): %WER (\d+\.\d\d) \[ \d+ / \d+, \d+ ins, \d+ del, \d+ sub \] (acwt=\S+) decoder=python "
                      r"rtf=\d+\.\d+")


@pytest.fixture(scope="module")
def corpus(tiny_corpus):
    """The tiny corpus with its model and the aligned pdfs of dev and test, ``{split: {utt: (T,)}}``."""
    tm = read_transition_model(tiny_corpus.model)
    pdfs = {split: {u: tm.tid2pdf[a] for u, a in read_alignments(tiny_corpus.ali(split)).items()}
            for split in ("dev", "test")}
    return tiny_corpus, tm, pdfs


def oracle(pdfs: np.ndarray, num_pdfs: int) -> np.ndarray:
    """(T, num_pdfs) log posteriors: log 1 on the aligned pdf of each frame, log 1e-30 elsewhere."""
    out = np.full((len(pdfs), num_pdfs), OFF_PATH, dtype=np.float32)
    out[np.arange(len(pdfs)), pdfs] = 0.0
    return out


def noisy(pdfs: np.ndarray, num_pdfs: int, rng, margin: float = 1.0, sd: float = 1.0) -> np.ndarray:
    """Gaussian scores with the aligned pdf raised by ``margin``: right on average, often wrong per frame."""
    out = rng.normal(0.0, sd, (len(pdfs), num_pdfs)).astype(np.float32)
    out[np.arange(len(pdfs)), pdfs] += margin
    return out


def write_loglikes(directory: Path, name: str, matrices: dict, priors: bool = True) -> Path:
    """Log posteriors written as the trainer writes them (minus flat log priors); returns the scp."""
    directory.mkdir(parents=True, exist_ok=True)
    num_pdfs = next(iter(matrices.values())).shape[1]
    flat = log_priors(np.ones(num_pdfs)) if priors else None  # without: matrices of any shape can be written
    with LoglikeWriter(directory / f"{name}.ark", directory / f"{name}.scp", flat) as w:
        for utt in sorted(matrices):
            w.write(utt, matrices[utt])
    return directory / f"{name}.scp"


def make_job(corpus, split: str, scp: Path, out: Path, **changes) -> decode.DecodeJob:
    fields = dict(name=split, loglikes_scp=scp, graph_dir=corpus.graph, model=corpus.model,
                  ref_text=corpus.data(split) / "text", out_dir=out / f"decode_{split}")
    fields.update(changes)
    return decode.DecodeJob(**fields)


def decoding(**changes) -> config.Decoding:
    return config.Decoding(**{"decoder": "python", "scoring": "timit", "acwt": 0.1, "num_jobs": 1, **changes})


def both_sets(corpus, tmp_path, make) -> list:
    """Jobs for dev and test with log posteriors ``make(pdfs)`` for each utterance."""
    tiny, _, pdfs = corpus
    scps = {split: write_loglikes(tmp_path / "forward", split, {u: make(p) for u, p in pdfs[split].items()})
            for split in ("dev", "test")}
    return [make_job(tiny, split, scp, tmp_path) for split, scp in scps.items()]


def oracle_scp(corpus, directory: Path, split: str, name: str = "") -> Path:
    _, tm, pdfs = corpus
    return write_loglikes(directory, name or split, {u: oracle(p, tm.num_pdfs) for u, p in pdfs[split].items()})


def quiet(line: str) -> None:
    """A log that keeps nothing."""


# --------------------------------------------------------------------------- what must be shown
def test_oracle_posteriors_decode_to_near_zero_per_on_dev_and_test(corpus, tmp_path):
    tiny, tm, _ = corpus
    jobs = both_sets(corpus, tmp_path, lambda p: oracle(p, tm.num_pdfs))
    lines = []
    results = decode.decode_sets(jobs, decoding(acwt_sweep=[0.1, 0.3]), tune_on="dev", log=lines.append)
    assert list(results) == ["dev", "test"]
    for name, result in results.items():
        assert result.score.total.rate < 1.0, result.res_line()
        assert result.failed == [] and result.partial == [] and result.decoder == "python"
        match = RES_LINE.match(result.res_line())
        assert match and match.group(1) == name, result.res_line()
        assert result.audio_seconds == pytest.approx(sum(len(p) for p in corpus[2][name].values()) * 0.01)
        assert result.rtf == pytest.approx(result.seconds / result.passes / result.audio_seconds)
        out = jobs[0 if name == "dev" else 1].out_dir
        assert read_table(out / "text").keys() == read_table(tiny.data(name) / "text").keys()
        assert (out / "per_utt").read_text().startswith("# utt ref_len errors ins del sub\n")
        assert (out / "scoring" / "summary.txt").read_text().splitlines()[-1] == result.res_line()
    # a tie (both scales perfect) goes to the smaller scale; one log line per scale tried on dev
    assert results["dev"].setting == results["test"].setting == "acwt=0.1"
    assert [line.split(":")[0] for line in lines if line.startswith("dev acwt=")] == ["dev acwt=0.1", "dev acwt=0.3"]


def test_random_posteriors_give_a_high_per(corpus, tmp_path):
    tiny, tm, pdfs = corpus
    rng = np.random.default_rng(0)
    logits = {u: rng.normal(0.0, 2.0, (len(p), tm.num_pdfs)) for u, p in pdfs["dev"].items()}
    log_posteriors = {u: (x - np.logaddexp.reduce(x, axis=1, keepdims=True)).astype(np.float32)
                      for u, x in logits.items()}
    job = make_job(tiny, "dev", write_loglikes(tmp_path, "dev", log_posteriors), tmp_path)
    result = decode.decode_sets([job], decoding(), tune_on=None, log=quiet)["dev"]
    assert result.score.total.rate > 50.0, result.res_line()
    assert result.setting == "acwt=0.1" and result.passes == 1


def test_the_scale_is_chosen_on_dev_and_applied_unchanged_to_test(corpus, tmp_path):
    # The same noisy scores, three times larger on dev: decoding dev at scale a is decoding test at
    # 3a, so dev prefers the smaller scale of the sweep where test, on its own, prefers the larger.
    tiny, tm, pdfs = corpus
    rng = np.random.default_rng(1)
    sets = {split: {u: noisy(p, tm.num_pdfs, rng) * (3.0 if split == "dev" else 1.0) for u, p in pdfs[split].items()}
            for split in ("dev", "test")}
    jobs = [make_job(tiny, split, write_loglikes(tmp_path / "forward", split, sets[split]), tmp_path)
            for split in ("dev", "test")]
    sweep = decoding(acwt_sweep=[1.0, 0.3], grid_extensions=0)  # two scales, no more (growth: the next test)
    results = decode.decode_sets(jobs, sweep, tune_on="dev", log=quiet)
    assert results["dev"].setting == results["test"].setting == "acwt=0.3"
    assert results["dev"].passes == 2 and results["test"].passes == 1
    test_scoring = jobs[1].out_dir / "scoring"
    assert sorted(p.name for p in test_scoring.glob("acwt_*.txt")) == ["acwt_0.3.txt"]  # decoded at dev's scale only
    assert "acwt=0.3" in results["test"].res_line()

    # tuned on test itself (which the trainer never does), the other scale would have won
    alone = [make_job(tiny, "test", jobs[1].loglikes_scp, tmp_path / "tuned_on_test")]
    on_test = decode.decode_sets(alone, sweep, tune_on="test", log=quiet)["test"]
    assert on_test.setting == "acwt=1"
    assert on_test.score.total.errors < results["test"].score.total.errors


def test_a_best_scale_on_the_edge_of_its_grid_grows_the_grid_until_it_is_inside(corpus, tmp_path):
    # Noisy scores whose best scale lies above a grid of 0.2 and 0.3 (on them 1.0 beats 0.3: the test
    # above): the grid grows by its own ratio, 1.5, until dev's best is inside it, or the limit is reached.
    tiny, tm, pdfs = corpus
    rng = np.random.default_rng(1)
    scp = write_loglikes(tmp_path / "forward", "dev", {u: noisy(p, tm.num_pdfs, rng) for u, p in pdfs["dev"].items()})
    job = make_job(tiny, "dev", scp, tmp_path / "grown")
    lines = []
    grown = decode.decode_sets([job], decoding(acwt_sweep=[0.2, 0.3]), "dev", log=lines.append)["dev"]
    scales = [float(v) for v in re.search(r"grid=acwt:(\S+);", grown.res_line()).group(1).split(",")]
    assert scales[:3] == [0.2, 0.3, 0.45] and len(scales) > 3, grown.res_line()
    assert scales[0] < grown.acoustic_scale < scales[-1] and "edge=" not in grown.res_line(), grown.res_line()
    assert grown.passes == len(scales)  # each scale decoded once: a grown grid decodes only what is new
    assert any("is on the edge of the acwt grid: trying acwt=0.45" in line for line in lines)

    # no growth allowed: the edge is kept and marked
    fixed = decode.decode_sets([make_job(tiny, "dev", scp, tmp_path / "fixed")],
                               decoding(acwt_sweep=[0.2, 0.3], grid_extensions=0), "dev", log=quiet)["dev"]
    assert fixed.setting == "acwt=0.3" and fixed.res_line().endswith("grid=acwt:0.2,0.3;wip:0 edge=acwt")
    assert grown.score.total.errors < fixed.score.total.errors
    # a single scale is a fixed setting, not a grid: nothing to grow, no edge
    single = decode.decode_sets([make_job(tiny, "dev", scp, tmp_path / "single")], decoding(acwt_sweep=[0.05]),
                                "dev", log=quiet)["dev"]
    assert single.passes == 1 and "edge=" not in single.res_line()


def test_a_pool_of_workers_gives_the_hypotheses_of_one(corpus, tmp_path):
    tiny, tm, _ = corpus
    rng = np.random.default_rng(2)
    jobs = both_sets(corpus, tmp_path / "data", lambda p: noisy(p, tm.num_pdfs, rng, margin=2.0))
    outputs = {}
    for num_jobs in (1, 2):
        out = tmp_path / f"jobs{num_jobs}"
        moved = [make_job(tiny, j.name, j.loglikes_scp, out) for j in jobs]
        results = decode.decode_sets(moved, decoding(acwt_sweep=[0.3, 1.0], num_jobs=num_jobs), "dev", log=quiet)
        outputs[num_jobs] = {p.relative_to(out): p.read_text() for p in sorted(out.rglob("*")) if p.is_file()
                             and p.name not in ("summary.txt", "decode.log")}  # these two hold timings
        outputs[num_jobs]["results"] = {n: (r.setting, r.score.total, r.failed) for n, r in results.items()}
    assert outputs[1] == outputs[2]
    assert outputs[1]["results"]["test"][1].errors > 0  # noisy enough for the hypotheses to differ from the references


def test_utterances_without_a_path_are_counted_reported_and_scored_as_deletions(corpus, tmp_path):
    tiny, tm, pdfs = corpus
    matrices = {u: oracle(p, tm.num_pdfs) for u, p in pdfs["dev"].items()}
    nan_utt, dead_utt = sorted(matrices)[:2]
    matrices[nan_utt][5] = np.nan  # a diverged network
    matrices[dead_utt][:] = -np.inf  # nothing survives the beam
    job = make_job(tiny, "dev", write_loglikes(tmp_path, "dev", matrices), tmp_path)
    lines = []
    result = decode.decode_sets([job], decoding(), tune_on="dev", log=lines.append)["dev"]
    assert result.failed == sorted([nan_utt, dead_utt])
    assert "failed=2" in result.res_line()
    report = next(line for line in lines if "failed, scored as all deletions" in line)
    assert f"{nan_utt} (NaN log-likelihoods (first at frame 5))" in report and f"{dead_utt} (no path survived" in report
    refs = read_table(tiny.data("dev") / "text")
    for utt in (nan_utt, dead_utt):
        counts = result.score.per_utterance[utt]
        assert counts.dels == counts.ref_len == len(refs[utt].split())
    assert set(read_table(job.out_dir / "text")) == set(refs) - {nan_utt, dead_utt}
    others = [c for u, c in result.score.per_utterance.items() if u not in (nan_utt, dead_utt)]
    assert sum(c.errors for c in others) == 0


def test_partial_missing_and_unreferenced_utterances_are_reported(corpus, tmp_path):
    tiny, tm, pdfs = corpus
    matrices = {u: oracle(p, tm.num_pdfs) for u, p in pdfs["dev"].items()}
    dropped = sorted(matrices)[0]
    del matrices[dropped]  # a reference without log-likelihoods
    matrices["zz_short"] = oracle(pdfs["dev"][dropped][:1], tm.num_pdfs)  # one frame: no final state reachable
    job = make_job(tiny, "dev", write_loglikes(tmp_path, "dev", matrices), tmp_path)
    lines = []
    result = decode.decode_sets([job], decoding(), tune_on="dev", log=lines.append)["dev"]
    assert result.partial == ["zz_short"] and result.failed == [] and "partial=1" in result.res_line()
    assert result.score.missing == [dropped] and result.score.extra == ["zz_short"]
    assert result.missing == [dropped] and "missing=1" in result.res_line()
    assert any(f"have no log-likelihoods in {job.loglikes_scp}, scored as all deletions: {dropped}" in line
               for line in lines)
    assert any("1 decoded utterance(s) have no reference" in line for line in lines)
    assert any("reached no final state, their best partial paths are kept: zz_short" in line for line in lines)


def test_a_crashed_decode_leaves_no_old_results_behind(corpus, tmp_path, monkeypatch):
    tiny = corpus[0]
    job = make_job(tiny, "dev", oracle_scp(corpus, tmp_path, "dev"), tmp_path)
    decode.decode_sets([job], decoding(), tune_on="dev", log=quiet)
    assert (job.out_dir / "scoring" / "summary.txt").is_file()

    def crash(task):
        raise MemoryError("out of memory")

    monkeypatch.setattr(python_decoder, "decode_task", crash)
    with pytest.raises(MemoryError):
        decode.decode_sets([job], decoding(), tune_on="dev", log=quiet)
    assert not (job.out_dir / "scoring").exists() and not (job.out_dir / "text").exists()


def die(task):
    """A worker killed mid-decode (module level: the pool pickles it by name)."""
    os._exit(9)


def test_a_worker_that_dies_is_an_error_not_a_hang(corpus, tmp_path, monkeypatch):
    tiny = corpus[0]
    job = make_job(tiny, "dev", oracle_scp(corpus, tmp_path, "dev"), tmp_path)
    monkeypatch.setattr(python_decoder, "decode_task", die)
    with pytest.raises(RuntimeError, match="decoding set 'dev': a decoding worker died"):
        decode.decode_sets([job], decoding(num_jobs=2), tune_on="dev", log=quiet)
    assert not (job.out_dir / "scoring" / "summary.txt").exists()


# --------------------------------------------------------------------------- errors
def test_log_likelihoods_of_another_dimension_name_the_scp_and_the_utterance(corpus, tmp_path):
    tiny, tm, pdfs = corpus
    matrices = {u: oracle(p, tm.num_pdfs) for u, p in pdfs["test"].items()}
    odd = sorted(matrices)[3]
    matrices[odd] = np.zeros((10, tm.num_pdfs + 1), np.float32)
    scp = write_loglikes(tmp_path, "test", matrices, priors=False)
    expected = rf"{re.escape(str(scp))}: utterance {odd} has log-likelihoods of dimension {tm.num_pdfs + 1}, but "
    with pytest.raises(decode.DecodeInputError, match=expected + rf".*final.mdl has {tm.num_pdfs} pdfs"):
        decode.decode_sets([make_job(tiny, "test", scp, tmp_path)], decoding(), None, log=quiet)
    assert not (tmp_path / "decode_test").exists()  # checked before anything was decoded or written


def test_a_graph_built_for_another_model_is_refused(corpus, tmp_path):
    tiny, tm, _ = corpus
    scp = oracle_scp(corpus, tmp_path, "test")
    graph_dir = tmp_path / "graph"
    graph_dir.mkdir()
    decode.linear_loop_graph(tm.num_transition_ids + 7).write(str(graph_dir / "HCLG.fst"))
    (graph_dir / "words.txt").write_text("".join(f"w{i} {i}\n" for i in range(tm.num_transition_ids + 8)))
    job = make_job(tiny, "test", scp, tmp_path, graph_dir=graph_dir)
    expected = (rf"{re.escape(str(graph_dir / 'HCLG.fst'))} has input label \(transition-id\) "
                rf"{tm.num_transition_ids + 7}, but {re.escape(str(tiny.model))} has only {tm.num_transition_ids}")
    with pytest.raises(decode.GraphMismatchError, match=expected):
        decode.decode_sets([job], decoding(), None, log=quiet)
    # and a words.txt that is not the graph's
    words = tmp_path / "words_graph"
    words.mkdir()
    (words / "HCLG.fst").symlink_to(tiny.graph / "HCLG.fst")
    (words / "words.txt").write_text("<eps> 0\naa 1\n")
    with pytest.raises(decode.GraphMismatchError, match="does not list: that words.txt is not the one"):
        decode.decode_sets([make_job(tiny, "test", scp, tmp_path, graph_dir=words)], decoding(), None, log=quiet)


@pytest.mark.parametrize("missing, what", [("HCLG.fst", "decoding graph"), ("words.txt", "word list"),
                                           ("final.mdl", "model"), ("loglikes.scp", "log-likelihood scp"),
                                           ("text", "reference text")])
def test_missing_inputs_are_named(corpus, tmp_path, missing, what):
    tiny = corpus[0]
    scp = oracle_scp(corpus, tmp_path, "test", "loglikes")
    graph_dir = tmp_path / "graph"
    graph_dir.mkdir()
    for name in ("HCLG.fst", "words.txt"):
        (graph_dir / name).symlink_to(tiny.graph / name)
    job = make_job(tiny, "test", scp, tmp_path, graph_dir=graph_dir)
    gone = {"HCLG.fst": graph_dir / "HCLG.fst", "words.txt": graph_dir / "words.txt", "loglikes.scp": scp,
            "final.mdl": tmp_path / "final.mdl", "text": tmp_path / "text"}[missing]
    if missing in ("HCLG.fst", "words.txt", "loglikes.scp"):
        gone.unlink()
    else:
        field = "model" if missing == "final.mdl" else "ref_text"
        job = make_job(tiny, "test", scp, tmp_path, graph_dir=graph_dir, **{field: gone})
    with pytest.raises(decode.MissingInputError, match=rf"decoding set 'test': no such {what} {re.escape(str(gone))}"):
        decode.decode_sets([job], decoding(), None, log=quiet)


def test_the_set_to_tune_on_must_exist_and_have_references(corpus, tmp_path):
    tiny = corpus[0]
    scp = oracle_scp(corpus, tmp_path, "dev")
    job = make_job(tiny, "dev", scp, tmp_path)
    with pytest.raises(decode.DecodeInputError, match=r"tune_on='valid' is not one of the sets to decode: \['dev'\]"):
        decode.decode_sets([job], decoding(), "valid", log=quiet)
    with pytest.raises(decode.DecodeInputError, match=r"tune_on='dev' has no reference text"):
        decode.decode_sets([make_job(tiny, "dev", scp, tmp_path, ref_text=None)], decoding(), "dev", log=quiet)
    with pytest.raises(decode.DecodeInputError, match="different names"):
        decode.decode_sets([job, job], decoding(), "dev", log=quiet)
    # without references: decoded at acwt, not scored
    result = decode.decode_sets([make_job(tiny, "dev", scp, tmp_path, ref_text=None)], decoding(), None,
                                log=quiet)["dev"]
    assert result.score is None and result.res_line().startswith("dev: no reference (6 utterances decoded) acwt=0.1")


# --------------------------------------------------------------------------- Kaldi, with stand-ins for its binaries
STAND_INS = {
    # one "lattice" line per utterance of the scp it is given, but none for $STANDIN_FAIL
    "latgen-faster-mapped": 'for a in "$@"; do case "$a" in scp:*) scp=${a#scp:} ;; esac; done\n'
                            'out="${*: -1}"\n'
                            'cut -d" " -f1 "$scp" | grep -v -x -F "${STANDIN_FAIL:-none}" | sh -c "${out#ark:|}"\n',
    # "utt LMWT" per lattice
    # in decode_dnn.sh's pipe with --acoustic-scale (post-decode scaling): passes the lattices on, noting it
    "lattice-scale": 'case "$1" in --acoustic-scale=*) echo "$1" >> "${STANDIN_SCALED:-/dev/null}"; cat; exit ;; esac\n'
                     'lmwt=${1#--inv-acoustic-scale=}\nsrc=${2#ark:}\n'
                     'sh -c "${src%|}" | awk -v l="$lmwt" \'{ print $1, l }\'\n',
    "lattice-add-penalty": "cat\n",
    # word ids from $STANDIN_HYPS ("utt LMWT id ..."): an utterance is recognised at one LM weight only
    "lattice-best-path": 'awk \'NR == FNR { k = $1 " " $2; $1 = $2 = ""; hyp[k] = $0; next } '
                         '{ print $1 hyp[$1 " " $2] }\' "$STANDIN_HYPS" -\n',
    "compute-wer": 'echo "%WER 0.00 [ 0 / 1, 0 ins, 0 del, 0 sub ]"\n',
}


@pytest.fixture
def kaldi_bin(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, body in STAND_INS.items():
        path = bin_dir / name
        path.write_text("#!/usr/bin/env bash\nset -euo pipefail\n" + body)
        path.chmod(path.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", os.pathsep.join([str(bin_dir), path_without_kaldi(os.environ["PATH"])]))
    return bin_dir


def test_chain_lattices_are_scaled_after_decoding_and_scored_over_lm_weights_around_it(corpus, kaldi_bin, tmp_path,
                                                                                      monkeypatch):
    """``post_decode_acwt = 10`` (chain models, Kaldi's --post-decode-acwt): decode_dnn.sh multiplies the lattices'
    acoustic scores by 10 after decoding, and score.sh tries LM weights 5..20 (acoustic scales 2 to 0.5)."""
    tiny, tm, pdfs = corpus
    ids = {w: i for w, i in read_table(tiny.graph / "words.txt").items()}
    hyps = tmp_path / "standin_hyps"
    hyps.write_text("".join(f"{u} 12 {' '.join(ids[w] for w in t.split())}\n" for split in ("dev", "test")
                            for u, t in read_table(tiny.data(split) / "text").items()))
    monkeypatch.setenv("STANDIN_HYPS", str(hyps))
    monkeypatch.setenv("STANDIN_SCALED", str(tmp_path / "scaled"))
    jobs = both_sets(corpus, tmp_path, lambda p: oracle(p, tm.num_pdfs))
    results = decode.decode_sets(jobs, decoding(decoder="kaldi", acwt=1.0, post_decode_acwt=10.0, num_jobs=2), "dev",
                                 log=quiet)
    assert set((tmp_path / "scaled").read_text().split()) == {"--acoustic-scale=10.0"}
    lmwts = {int(f.name.split("_")[1]) for f in jobs[0].out_dir.glob("wer_*")}
    assert lmwts == set(range(5, 21))
    assert results["dev"].setting == "lmwt=12 wip=0.0" and results["dev"].score.total.errors == 0
    assert results["test"].setting == "lmwt=12 wip=0.0" and results["test"].score.total.errors == 0


def test_kaldi_is_chosen_when_its_binaries_are_there_and_named_when_not(kaldi_bin, tmp_path, monkeypatch):
    assert decode.choose_decoder("auto") == "kaldi" and decode.choose_decoder("python") == "python"
    (kaldi_bin / "lattice-best-path").unlink()
    assert decode.choose_decoder("auto") == "python"
    with pytest.raises(decode.KaldiNotFoundError, match="decoder = kaldi, but these Kaldi binaries are not on PATH: "
                                                        "lattice-best-path"):
        decode.choose_decoder("kaldi")
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(decode.KaldiNotFoundError, match=" ".join(decode.KALDI_BINARIES)):
        decode.choose_decoder("kaldi")


def test_kaldi_chooses_lm_weight_on_dev_and_applies_it_to_the_other_sets(corpus, kaldi_bin, tmp_path, monkeypatch):
    tiny, tm, pdfs = corpus
    ids = {w: i for w, i in read_table(tiny.graph / "words.txt").items()}
    hyps = tmp_path / "standin_hyps"
    good = {"dev": 3, "test": 5}  # the LM weight at which each set is recognised; elsewhere nothing is
    hyps.write_text("".join(f"{u} {good[split]} {' '.join(ids[w] for w in t.split())}\n" for split in good
                            for u, t in read_table(tiny.data(split) / "text").items()))
    monkeypatch.setenv("STANDIN_HYPS", str(hyps))
    monkeypatch.setenv("STANDIN_FAIL", sorted(pdfs["test"])[1])
    monkeypatch.setattr(kaldi_scripts, "KALDI_LMWTS", (2, 3, 4, 5))  # a smaller grid than score.sh's 1..10: faster
    jobs = both_sets(corpus, tmp_path, lambda p: oracle(p, tm.num_pdfs))
    jobs.append(make_job(tiny, "dev", jobs[0].loglikes_scp, tmp_path, name="eval", ref_text=None,
                         out_dir=tmp_path / "decode_eval"))
    lines = []
    results = decode.decode_sets(jobs, decoding(decoder="auto", num_jobs=2), "dev", log=lines.append)
    assert {r.decoder for r in results.values()} == {"kaldi"}
    assert results["dev"].setting == "lmwt=3 wip=0.0"  # three penalties tie: the smallest wins
    assert results["dev"].score.total.errors == 0
    assert sum(line.startswith("dev lmwt=") for line in lines) == 4 * len(kaldi_scripts.KALDI_WIPS)
    assert len((jobs[0].out_dir / "scoring" / "summary.txt").read_text().splitlines()) == 4 * 3 + 2
    assert results["dev"].passes == 1  # lattices rescored, not decoded again
    # test is scored at dev's setting only, where the stand-in recognises nothing: all deletions
    assert results["test"].setting == "lmwt=3 wip=0.0" and "lmwt=3 wip=0.0 decoder=kaldi" in results["test"].res_line()
    assert sorted(p.name for p in jobs[1].out_dir.glob("wer_*")) == ["wer_3_0.0"]
    assert results["test"].score.total.dels == results["test"].score.total.ref_len
    assert results["test"].failed == [sorted(pdfs["test"])[1]] and "failed=1" in results["test"].res_line()
    # a set without references gets hypotheses at the same setting
    assert results["eval"].score is None
    assert read_table(tmp_path / "decode_eval" / "text") == read_table(tiny.data("dev") / "text")
    assert len(list(jobs[0].out_dir.glob("lat.*.gz"))) == 2  # the scp split over two decoding jobs


def test_kaldi_grows_the_lm_weights_past_an_edge_and_marks_one_it_cannot_pass(corpus, kaldi_bin, tmp_path,
                                                                             monkeypatch):
    tiny, tm, pdfs = corpus
    ids = {w: i for w, i in read_table(tiny.graph / "words.txt").items()}
    hyps = tmp_path / "standin_hyps"
    texts = read_table(tiny.data("dev") / "text")

    def recognised(words_at: dict[int, int]) -> str:  # "utt LMWT ids": the first n words at each LM weight
        return "".join(f"{u} {lmwt} {' '.join(ids[w] for w in t.split()[:n])}\n" for lmwt, n in words_at.items()
                       for u, t in texts.items())

    hyps.write_text(recognised({3: 2, 2: 100}))  # all of it at LM weight 2, two words at 3, none at 4 and 5
    monkeypatch.setenv("STANDIN_HYPS", str(hyps))
    monkeypatch.setattr(kaldi_scripts, "KALDI_LMWTS", (3, 4, 5))
    dev = oracle_scp(corpus, tmp_path / "forward", "dev")
    lines = []
    result = decode.decode_sets([make_job(tiny, "dev", dev, tmp_path)], decoding(decoder="kaldi", num_jobs=1), "dev",
                                log=lines.append)["dev"]
    # 3 is the grid's edge and better than 4: 2 is tried and is best, so 1 is tried too
    assert result.setting == "lmwt=2 wip=0.0" and result.score.total.errors == 0
    assert "grid=lmwt:1,2,3,4,5;wip:0,0.5,1" in result.res_line() and "edge=" not in result.res_line()
    # penalties that all tie are not an edge: the grid keeps score.sh's three
    assert not any("wip grid" in line for line in lines)

    # better and better down to LM weight 1, the lowest there is: the edge stays, marked
    hyps.write_text(recognised({3: 1, 2: 2, 1: 100}))
    result = decode.decode_sets([make_job(tiny, "dev", dev, tmp_path / "again")], decoding(decoder="kaldi", num_jobs=1),
                                "dev", log=quiet)["dev"]
    assert result.setting == "lmwt=1 wip=0.0" and result.res_line().endswith("edge=lmwt")


def test_a_const_graph_as_kaldis_mkgraph_writes_it_decodes_as_the_vector_one(corpus, tmp_path):
    """utils/mkgraph.sh converts HCLG to a const FST, which kaldifst cannot read: our own reader can."""
    import kaldifst

    tiny, _, _ = corpus
    const_graph = tmp_path / "const_graph"
    shutil.copytree(tiny.graph, const_graph)
    kaldifst.StdConstFst(kaldifst.StdVectorFst.read(str(tiny.graph / "HCLG.fst"))).write(str(const_graph / "HCLG.fst"))
    assert kaldifst.StdVectorFst.read(str(const_graph / "HCLG.fst")) is None  # the failure this guards against
    scp = oracle_scp(corpus, tmp_path / "forward", "test")
    lines = {}
    for name, graph_dir in (("vector", tiny.graph), ("const", const_graph)):
        job = make_job(tiny, "test", scp, tmp_path / name, graph_dir=graph_dir)
        lines[name] = decode.decode_sets([job], decoding(acwt=0.2), None, log=quiet)["test"].res_line()
        lines[name] = re.sub(r" rtf=\S+", "", lines[name])
    assert lines["const"] == lines["vector"]


def test_a_graph_that_is_not_an_fst_is_one_error_naming_it(corpus, tmp_path):
    tiny, _, _ = corpus
    broken = tmp_path / "graph"
    shutil.copytree(tiny.graph, broken)
    (broken / "HCLG.fst").write_bytes(b"not an fst at all")
    job = make_job(tiny, "test", oracle_scp(corpus, tmp_path / "forward", "test"), tmp_path, graph_dir=broken)
    with pytest.raises(decode.DecodeInputError, match=f"{broken / 'HCLG.fst'}: not a decoding graph"):
        decode.decode_sets([job], decoding(), None, log=quiet)

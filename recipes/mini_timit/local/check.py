"""Stage 6: check the experiment as a whole, then an oracle decode of the test set.

Checks (every failure raises, naming the file and the utterance):

* every table and archive reads back with kaldiio; tables are sorted in the C locale with unique keys;
* every utterance has a wav, a transcript of known phones, a speaker, fbank and MFCC features of
  the expected dimensions, and an alignment as long as its features; every speaker has CMVN stats;
  ``spk2utt`` is ``utt2spk`` inverted; no speaker is in two splits;
* every transition-id of every alignment exists and maps to a pdf below ``num_pdfs``.

Oracle decode: log-likelihoods that put all the mass on the aligned pdf of every frame (log 1 and
log 1e-30 elsewhere), decoded with ``exp/mono/graph/HCLG.fst`` (``decode.py``), must give a phone
error rate below 1 % on the test set: graph, model and alignments agree. Writes
``exp/mono/decode_oracle_test/{text,per.txt}``.
"""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np

from recipes.mini_timit.local.layout import SPLITS, atomic_write_text, read_table, run_stage, stage_args

DIMS = {"feats.scp": 40, "feats_mfcc.scp": 13}
ORACLE_MAX_PER = 1.0  # percent
OFF_PATH_LOGLIKE = float(np.log(1e-30))


def check_sorted(path: Path) -> dict[str, str]:
    """A Kaldi table that must be sorted (C locale) with unique keys."""
    table = read_table(path)
    keys = [k.encode() for k in table]
    if keys != sorted(keys):
        raise ValueError(f"{path}: keys are not sorted in the C locale")
    return table


def read_alignments(ali_dir: Path) -> dict[str, np.ndarray]:
    """All ``ali.N.gz`` of an alignment dir, read with kaldiio."""
    import kaldiio

    num_jobs = int((ali_dir / "num_jobs").read_text())
    alignments = {}
    for job in range(1, num_jobs + 1):
        with gzip.open(ali_dir / f"ali.{job}.gz", "rb") as f:
            for utt, ali in kaldiio.load_ark(f):
                if utt in alignments:
                    raise ValueError(f"{ali_dir}/ali.{job}.gz: utterance {utt} is in two archives")
                alignments[utt] = np.asarray(ali)
    return alignments


def check_split(root: Path, split: str, phones: set[str], tid2pdf: np.ndarray, num_pdfs: int) -> set[str]:
    """All the checks of one split (module docstring); returns its speakers."""
    import kaldiio

    data = root / "data" / split
    tables = {name: check_sorted(data / name) for name in ("wav.scp", "text", "utt2spk", "spk2utt", "utt2num_frames")}
    utts = set(tables["utt2spk"])
    for name in ("wav.scp", "text", "utt2num_frames"):
        if set(tables[name]) != utts:
            raise ValueError(f"{data / name} and {data / 'utt2spk'} list different utterances: "
                             f"{sorted(set(tables[name]) ^ utts)[:3]}")
    inverted: dict[str, list[str]] = {}
    for utt, spk in tables["utt2spk"].items():
        inverted.setdefault(spk, []).append(utt)
    if {s: " ".join(u) for s, u in inverted.items()} != tables["spk2utt"]:
        raise ValueError(f"{data / 'spk2utt'} is not {data / 'utt2spk'} inverted")
    for utt, text in tables["text"].items():
        unknown = set(text.split()) - phones
        if unknown:
            raise ValueError(f"{data / 'text'}: utterance {utt} has phones not in phones.txt: {sorted(unknown)}")
        if not Path(tables["wav.scp"][utt]).is_file():
            raise FileNotFoundError(f"{data / 'wav.scp'}: utterance {utt}: no such file {tables['wav.scp'][utt]}")
    alignments = read_alignments(root / "exp" / f"mono_ali_{split}")
    if set(alignments) != utts:
        raise ValueError(f"exp/mono_ali_{split} aligns different utterances than {data / 'utt2spk'}")
    for scp, dim in DIMS.items():
        check_sorted(data / scp)
        feats = kaldiio.load_scp(str(data / scp))
        if set(feats) != utts:
            raise ValueError(f"{data / scp} lists different utterances than {data / 'utt2spk'}")
        for utt in sorted(utts):
            shape = feats[utt].shape
            if shape[1] != dim or shape[0] != int(tables["utt2num_frames"][utt]) or shape[0] != len(alignments[utt]):
                raise ValueError(f"{data / scp}: utterance {utt} has features {shape}, expected "
                                 f"({tables['utt2num_frames'][utt]}, {dim}) and {len(alignments[utt])} aligned frames")
        cmvn_scp = data / scp.replace("feats", "cmvn")
        check_sorted(cmvn_scp)
        cmvn = kaldiio.load_scp(str(cmvn_scp))
        for spk in tables["spk2utt"]:
            if spk not in cmvn or cmvn[spk].shape != (2, dim + 1):
                raise ValueError(f"{cmvn_scp}: speaker {spk} has no (2, {dim + 1}) CMVN statistics")
    for utt, ali in alignments.items():
        if ali.min() < 1 or ali.max() >= len(tid2pdf) or tid2pdf[ali].max() >= num_pdfs:
            raise ValueError(f"exp/mono_ali_{split}: utterance {utt} has transition-ids outside 1..{len(tid2pdf) - 1}")
    return set(tables["spk2utt"])


def oracle_decode(ali_dir: Path, graph_dir: Path, text: Path, tm, filter_name: str):
    """Decode the aligned pdfs of ``ali_dir`` (one-hot log-likelihoods) through ``graph_dir`` and score them
    against ``text`` with scoring's ``filter_name``; returns (scoring's Score, {utt: words})."""
    from bru_kaldi import decoding, scoring

    graph = decoding.load_graph(graph_dir / "HCLG.fst")
    words = decoding.read_words(graph_dir / "words.txt")
    refs = {u: t.split() for u, t in read_table(text).items()}
    hyps = {}
    for utt, ali in sorted(read_alignments(ali_dir).items()):
        loglikes = np.full((len(ali), tm.num_pdfs), OFF_PATH_LOGLIKE, dtype=np.float32)
        loglikes[np.arange(len(ali)), tm.tid2pdf[ali]] = 0.0
        hyps[utt] = [words[w] for w in decoding.decode(loglikes, graph, tm.tid2pdf).words]
    return scoring.score(refs, hyps, filter_name), hyps


def report_oracle(out: Path, result, hyps: dict[str, list[str]], metric: str, limit: float, label: str,
                  parts: str) -> None:
    """Write the oracle decode's hypotheses (``out/text``) and score line (``out/<metric>.txt``); raise
    when its error rate reaches ``limit`` percent, which means ``parts`` disagree."""
    atomic_write_text(out / "text", "".join(f"{u} {' '.join(h)}\n" for u, h in sorted(hyps.items())))
    line = result.total.kaldi_line().replace("%WER", f"%{metric.upper()}")
    atomic_write_text(out / f"{metric}.txt", line + "\n")
    print(f"{label}: {line}")
    if result.total.rate >= limit:
        raise RuntimeError(f"oracle {metric.upper()} {result.total.rate:.2f} % >= {limit} %: {parts} disagree "
                           f"(hypotheses in {out / 'text'})")


def check_disjoint_speakers(speakers: dict[str, set[str]]) -> None:
    """``{split: its speakers}``: no speaker may be in two splits."""
    seen: dict[str, str] = {}
    for split, found in speakers.items():
        for spk in sorted(found):
            if spk in seen:
                raise ValueError(f"speaker {spk} is in both {seen[spk]} and {split}")
            seen[spk] = split


def main() -> None:
    args = stage_args(6, __doc__.splitlines()[0])
    root = args.root.resolve()
    with run_stage(root, 6, args.size, args.seed, inputs=(2, 4, 5)) as run:
        if not run:
            return
        from bru_kaldi.kaldi.transition_model import read_transition_model

        tm = read_transition_model(root / "exp" / "mono" / "final.mdl")
        phones = {p for p, _ in (line.split() for line in (root / "data" / "lang" / "phones.txt").read_text().splitlines())}
        check_disjoint_speakers({split: check_split(root, split, phones, tm.tid2pdf, tm.num_pdfs) for split in SPLITS})
        result, hyps = oracle_decode(root / "exp" / "mono_ali_test", root / "exp" / "mono" / "graph",
                                     root / "data" / "test" / "text", tm, "plain")
        report_oracle(root / "exp" / "mono" / "decode_oracle_test", result, hyps, "per", ORACLE_MAX_PER,
                      "oracle decode of test", "graph, model and alignments")


if __name__ == "__main__":
    main()

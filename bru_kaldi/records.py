"""What an experiment folder records so that its model can be used on new audio (``transcribe.py``).

Two JSON files, each written atomically by ``run_exp.py``:

* ``front_end.json``, with ``final.pt``: each stream the network reads, in its order: the front end that
  computed the training features (``conf/<kind>.conf`` beside them, :func:`bru_kaldi.frontend.front_end_of`;
  ``null`` with the reason where none says), their post-processing (``fea_opts``: CMVN and deltas;
  ``cw_left``, ``cw_right``: splicing), the name of the statistics file a data directory holds for it
  (``cmvn.scp``), and the training set's CMVN statistics summed over its speakers (Kaldi's
  ``global_cmvn.stats``): the prior of sliding-window CMVN for a speaker never seen.
* ``decoding.json``, with the decode: the graph and the setting chosen on dev (acoustic scale and word
  insertion penalty, whichever decoder chose them).

>>> import tempfile, pathlib
>>> path = pathlib.Path(tempfile.mkdtemp()) / "decoding.json"
>>> write_decoding(path, DecodingChoice("exp/mono/graph", 0.1, 0.5, "acwt=0.1 wip=0.5", "dev", "python"))
>>> read_decoding(path).acoustic_scale
0.1
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

from bru_kaldi.atomic import write_text_atomically
from bru_kaldi.feature_transforms import FeatureOptions
from bru_kaldi.frontend import FrontEnd, front_end_of
from bru_kaldi.kaldi.rspecifiers import parse_rspecifier

FRONT_END = "front_end.json"
DECODING = "decoding.json"
_PATHS = ("cmvn_stats", "utt2spk")  # fea_opts fields naming the training data's files: of no use elsewhere


class RecordError(ValueError):
    """A record that is missing or cannot be read; the message names the file and how to make it."""


@dataclass
class StreamRecord:
    """One input stream of a trained network: what turns audio into its training features."""

    fea_name: str
    dim: int  # values per frame before deltas and splicing
    front_end: Optional[FrontEnd]  # None: nothing said which (see why)
    why: str
    options: FeatureOptions  # CMVN mode and what it normalises, deltas
    cw_left: int
    cw_right: int
    cmvn_file: str  # the statistics' file name in a data directory (cmvn.scp), "" for none
    global_cmvn: Optional[np.ndarray]  # (2, dim + 1) float64, summed over the training speakers

    @property
    def width(self) -> int:
        """Values per frame the network reads from this stream: with deltas and spliced context."""
        return self.dim * (1 + self.options.delta_order) * (1 + self.cw_left + self.cw_right)


def stream_record(source) -> dict:
    """The record of a ``FeatureSource`` (one stream of the training corpus) as JSON values."""
    try:  # a description that cannot be read (FrontEndError, or worse) stops transcribe.py, not the training
        front_end, why = front_end_of(source.stream.fea_lst, source.raw_dim).as_dict(), ""
    except (OSError, ValueError) as error:
        front_end, why = None, str(error)
    options = {k: v for k, v in dataclasses.asdict(source.options).items() if k not in _PATHS}
    stats = sum(source.cmvn.values()) if source.cmvn else None
    spec = parse_rspecifier(source.options.cmvn_stats) if source.options.cmvn_stats else None
    cmvn_file = "" if source.options.cmvn == "none" or spec and spec.is_pipe else Path(spec.target).name if spec \
        else "cmvn.scp"  # FeatureSource's default: the one beside the features
    return {"fea_name": source.stream.fea_name, "dim": source.raw_dim, "front_end": front_end, "why": why,
            "fea_opts": options, "cw_left": source.stream.cw_left, "cw_right": source.stream.cw_right,
            "cmvn_file": cmvn_file, "global_cmvn": None if stats is None else stats.tolist()}


def write_front_end(folder, sources: Sequence, input_dim: int) -> None:
    """``folder/front_end.json``: the records of the streams of ``sources`` (the training corpus's
    ``FeatureSource`` s, concatenated per frame in that order) that make the network's ``input_dim``
    values per frame (an mse target after them is not an input)."""
    ends = np.cumsum([s.dim for s in sources])
    inputs = [s for s, end in zip(sources, ends) if end <= input_dim]
    text = json.dumps({"streams": [stream_record(s) for s in inputs]}, indent=1)
    write_text_atomically(Path(folder) / FRONT_END, text + "\n")


def _load(path: Path, made_by: str) -> dict:
    if not path.is_file():
        raise RecordError(f"{path} is missing: {made_by}")
    try:
        return json.loads(path.read_text())
    except ValueError as error:
        raise RecordError(f"{path}: not the JSON run_exp.py writes ({error})") from None


def read_front_end(folder) -> list[StreamRecord]:
    """The streams of ``folder/front_end.json``; :class:`RecordError` when it is missing or damaged."""
    path = Path(folder) / FRONT_END
    data = _load(path, "run_exp.py writes it when training ends (a folder trained by an earlier version has none: "
                       "train again with --force)")
    records = []
    try:
        for s in data["streams"]:
            front_end = s["front_end"]
            records.append(StreamRecord(
                s["fea_name"], int(s["dim"]),
                FrontEnd(front_end["kind"], front_end["options"], front_end["source"]) if front_end else None,
                s["why"], FeatureOptions(**s["fea_opts"]), int(s["cw_left"]), int(s["cw_right"]), s["cmvn_file"],
                None if s["global_cmvn"] is None else np.asarray(s["global_cmvn"], dtype=np.float64)))
    except (KeyError, TypeError, ValueError) as error:
        raise RecordError(f"{path}: not the record run_exp.py writes ({type(error).__name__}: {error})") from None
    return records


@dataclass(frozen=True)
class DecodingChoice:
    """The graph a model was decoded with and the setting chosen: ``acoustic_scale`` (Kaldi's lattices:
    ``post_decode_acwt / LMWT``) and ``word_penalty``, ``setting`` as ``res.res`` shows it, ``tuned_on`` the set
    that chose it (``None``: ``[decoding] acwt`` untuned), ``decoder`` the one that did."""

    graph: str
    acoustic_scale: float
    word_penalty: float
    setting: str
    tuned_on: Optional[str]
    decoder: str


def write_decoding(path, choice: DecodingChoice) -> None:
    write_text_atomically(path, json.dumps(dataclasses.asdict(choice), indent=1) + "\n")


def record_decoding(folder, jobs: Sequence, results: dict, tune_on: Optional[str]) -> None:
    """``folder/decoding.json`` from a decode (``decoding.decode_sets``' jobs and results): the setting of
    ``tune_on`` (untuned: of the first set) and its job's graph."""
    job = next(j for j in jobs if j.name == (tune_on or jobs[0].name))
    result = results[job.name]
    write_decoding(Path(folder) / DECODING, DecodingChoice(str(Path(job.graph_dir).resolve()), result.acoustic_scale,
                                                           result.word_penalty, result.setting, tune_on, result.decoder))


def read_decoding(folder) -> DecodingChoice:
    """``folder/decoding.json`` (or the file ``folder`` itself); :class:`RecordError` when missing or damaged."""
    path = Path(folder)
    path = path / DECODING if path.is_dir() else path
    data = _load(path, "run_exp.py writes it when it decodes (run the decode: run_exp.py CONFIG --stage decode)")
    try:
        return DecodingChoice(**data)
    except TypeError as error:
        raise RecordError(f"{path}: not the record run_exp.py writes ({error})") from None

"""The experiment folder (``[exp] out_folder``): where each output lives, which stages are finished,
``res.res``, and the rule that a folder is only resumed with the config that made it.

::

  config.resolved.cfg   every option, defaults included      log.txt   the log
  res.res               one line per epoch, then one per decoded set   learning_curve.png
  checkpoint.pt         the latest complete chunk (model, optimisers, progress)
  final.pt              the trained weights    feature_norm.npz, pdf_counts, final.mdl: what forward needs
  front_end.json        the inputs' front end    decoding.json  the graph and the chosen scale: what transcribe.py reads
  best.pt               with [exp] patience, the weights of the lowest dev error so far: final.pt at the end
  forward_<set>/        loglikes.ark, loglikes.scp     decode_<set>/   hypotheses, per-utterance counts
  .done/<stage>         a stage's marker, written after all its outputs
  .lock                 held by the run using the folder (a second run is refused)

>>> import tempfile
>>> exp = Experiment(tempfile.mkdtemp())
>>> exp.mark("train"); exp.done("train"), exp.done("decode")
(True, False)
"""

from __future__ import annotations

import configparser
import fcntl
import json
import logging
import os
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator, Optional

from bru_kaldi.atomic import write_text_atomically
from bru_kaldi.config import ConfigError, inert_options, left_to_the_unit, option_default
from bru_kaldi.feature_transforms import GlobalNorm

log = logging.getLogger(__name__)


class Experiment:
    """Paths in the experiment folder and the markers of finished stages (``.done/<stage>``)."""

    def __init__(self, folder):
        self.folder = Path(folder)
        self.checkpoint = self.folder / "checkpoint.pt"
        self.final = self.folder / "final.pt"
        self.best = self.folder / "best.pt"  # [exp] patience: the weights of the lowest dev error so far
        self.res = self.folder / "res.res"
        self.resolved = self.folder / "config.resolved.cfg"
        self.norm = self.folder / "feature_norm.npz"
        self.counts = self.folder / "pdf_counts"
        self.model = self.folder / "final.mdl"
        self.derived = self.folder / "derived.json"  # the training data's fingerprint the three above came from

    @contextmanager
    def lock(self) -> Iterator[None]:
        """Hold the folder for this run: a second run on the same folder is refused, not interleaved.

        The lock is an ``flock`` on ``.lock``, which the kernel releases when its holder exits or is
        killed, so a crashed run never leaves the folder locked.
        """
        self.folder.mkdir(parents=True, exist_ok=True)
        path = self.folder / ".lock"
        with open(path, "a+") as handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                handle.seek(0)
                owner = handle.read().strip() or "another process"
                raise ConfigError(f"{self.folder} is in use by {owner}: two runs would write the same files; wait for "
                                  "it to finish, or give this run another [exp] out_folder") from None
            handle.seek(0)
            handle.truncate()
            handle.write(f"process {os.getpid()} (since {time.strftime('%Y-%m-%d %H:%M:%S')})")
            handle.flush()
            # temporaries of a run that was killed (their writer is gone: we hold the folder); never read
            for stale in self.folder.rglob(".*.tmp.*"):
                stale.unlink(missing_ok=True)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    def clear(self) -> None:
        """Remove every output (``--force``), keeping the lock file this run holds."""
        import shutil

        for path in self.folder.iterdir():
            if path.name != ".lock":
                shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink()

    def trained_some(self) -> bool:
        """Whether the folder's checkpoint has gone past the initial weights."""
        import torch  # only here: the rest of this module needs no torch

        try:
            progress = torch.load(self.checkpoint, map_location="cpu", weights_only=True).get("progress", {})
        except Exception:  # missing, or unreadable: training says which when it loads it
            return False
        return bool(progress.get("epoch") or progress.get("chunk"))

    def derived_from(self, inputs: str) -> bool:
        """Whether the derived files (``feature_norm.npz``, ``pdf_counts``, ``final.mdl``) were computed from
        ``inputs`` (a fingerprint of the training data): ``derived.json`` records it, written after them."""
        if not self.derived.is_file() or not self.norm.is_file():
            return False
        try:
            return json.loads(self.derived.read_text()).get("inputs") == inputs
        except ValueError:
            return False

    def record_derived(self, inputs: str) -> None:
        """Record that the derived files now in the folder were computed from ``inputs``: call it last."""
        write_text_atomically(self.derived, json.dumps({"inputs": inputs}) + "\n")

    def training_norm(self, inputs: str, compute: Callable[[], GlobalNorm], save: bool = True) -> tuple[GlobalNorm, bool]:
        """The global normalisation of the training features (``feature_norm.npz``), computed once.

        ``inputs`` is a fingerprint of the training data (``bru_kaldi.corpus.fingerprint``). The folder's is
        kept where the derived files were computed from those inputs, and where a folder older than that
        record has begun training; else ``compute()`` gives it, saved when ``save`` (the main process). The
        data changing under a folder whose training has begun is a :class:`ConfigError`: its weights would be
        mixed with features normalised otherwise.

        Returns ``(norm, current)``: with ``current`` False, write the other derived files (``pdf_counts``,
        ``final.mdl``) and then :meth:`record_derived`, so that a run killed before that computes them all again.

        >>> import numpy as np, tempfile
        >>> exp, norm = Experiment(tempfile.mkdtemp()), GlobalNorm(np.zeros(2, np.float32), np.ones(2, np.float32))
        >>> exp.training_norm("data v1", lambda: norm)[1]
        False
        >>> exp.record_derived("data v1"); exp.training_norm("data v1", lambda: None)[1]
        True
        """
        current = self.derived_from(inputs)  # else: none yet, or computed from data that has changed since
        if not current and self.norm.is_file() and self.trained_some():
            if not self.derived.is_file():  # a folder older than the record: kept as it was
                current = True
            else:
                raise ConfigError(f"{self.folder}: the training data changed since this experiment started (its "
                                  f"files differ from those {self.norm} was computed from); use --force to train "
                                  "again on them")
        if current:
            return GlobalNorm.load(self.norm), True
        if self.norm.is_file():
            log.warning("%s was computed from other training data (its inputs changed): computing it again", self.norm)
        norm = compute()  # statistics of the training set only; dev and test get the same ones
        if save:
            norm.save(self.norm)
        return norm, False

    def done(self, stage: str) -> bool:
        return (self.folder / ".done" / stage).is_file()

    def mark(self, stage: str) -> None:
        (self.folder / ".done").mkdir(parents=True, exist_ok=True)
        (self.folder / ".done" / stage).touch()

    def unmark(self, stages) -> None:
        for stage in stages:
            (self.folder / ".done" / stage).unlink(missing_ok=True)

    def write_res(self, history: list[dict], decode_lines: Optional[list[str]] = None) -> None:
        """``res.res``: the epoch lines, then the decoding lines (kept in ``decode.res`` between runs)."""
        decode_file = self.folder / "decode.res"
        if decode_lines is not None:
            write_text_atomically(decode_file, "".join(f"{line}\n" for line in decode_lines))
        lines = [epoch_line(h) for h in history]
        if decode_file.is_file():
            lines += decode_file.read_text().splitlines()
        write_text_atomically(self.res, "".join(f"{line}\n" for line in lines))


def epoch_line(h: dict) -> str:
    """One ``res.res`` line per epoch: train/dev loss and frame error, learning rates, seconds."""
    lrs = " ".join(f"lr_{name}={lr:.3g}" for name, lr in h["lr"].items())
    return (f"epoch={h['epoch']:03d} train_loss={h['train_loss']:.4f} train_err={h['train_err']:.4f} "
            f"dev_loss={h['dev_loss']:.4f} dev_err={h['dev_err']:.4f} {lrs} time={h['seconds']:.1f}s")


def read_res(path) -> tuple[list[dict[str, str]], dict[str, str]]:
    """A ``res.res`` read by field name: ``(epochs, decodes)``, one ``{field: value}`` dict per epoch
    line (``epoch``, ``train_loss``, ..., ``lr_<arch>``, ``time``) and ``{set: "%WER ... acwt=..."}``.

    >>> import tempfile, pathlib
    >>> res = pathlib.Path(tempfile.mkdtemp()) / "res.res"
    >>> _ = res.write_text("epoch=001 train_loss=2.5000 train_err=0.6000 dev_loss=2.1000 dev_err=0.5500 "
    ...                    "lr_rnn=0.0004 time=12.5s\\ntest: %WER 30.00 [ 3 / 10, 0 ins, 1 del, 2 sub ] acwt=0.2\\n")
    >>> epochs, decodes = read_res(res)
    >>> epochs[0]["dev_err"], decodes["test"]
    ('0.5500', '%WER 30.00 [ 3 / 10, 0 ins, 1 del, 2 sub ] acwt=0.2')
    """
    epochs, decodes = [], {}
    for number, line in enumerate(Path(path).read_text().splitlines(), 1):
        if line.startswith("epoch="):
            epochs.append(dict(field.split("=", 1) for field in line.split()))
        elif ": " in line:
            name, _, rest = line.partition(": ")
            decodes[name] = rest
        elif line.strip():
            raise ValueError(f"{path}, line {number}: expected an epoch line (epoch=...) or '<set>: %WER ...', "
                             f"got {line!r}")
    return epochs, decodes


def pytorch_kaldi_epoch_lines(path, train_name: str = "train", dev_name: str = "dev") -> list[str]:
    """The epoch lines of ``res.res`` in pytorch-kaldi's positional format, for its readers
    (``utils.export_loss_acc_to_txt`` reads the fields at positions 2, 3, 5 and 6)::

        ep=00 tr=['train'] loss=2.500 err=0.600 valid=dev loss=2.100 err=0.550 lr_rnn=0.0004 time(s)=12

    Epochs count from 0 there, zero-padded to the digits of the number of epochs.
    """
    epochs, _ = read_res(path)
    digits = max(len(str(len(epochs) - 1)), 1) if epochs else 1
    lines = []
    for fields in epochs:
        lrs = " ".join(f"{name}={value}" for name, value in fields.items() if name.startswith("lr_"))
        lines.append(f"ep={int(fields['epoch']) - 1:0{digits}d} tr=['{train_name}'] "
                     f"loss={float(fields['train_loss']):.3f} err={float(fields['train_err']):.3f} "
                     f"valid={dev_name} loss={float(fields['dev_loss']):.3f} err={float(fields['dev_err']):.3f} "
                     f"{lrs} time(s)={int(float(fields['time'].rstrip('s')))}")
    return lines


# Sections and options that may change between runs on one folder: they do not change what was
# trained (the stages they feed are done again). None: the whole section.
RESUMABLE_CHANGES = {"decoding": None, "forward": None, "data_use": {"forward_with"}, "exp": {"device"}}
# Fields of a label stream that only decoding reads: the graph and the references.
DECODE_ONLY_FIELDS = ("lab_graph", "lab_data_folder")


def _options(text: str) -> dict[tuple[str, str], str]:
    parser = configparser.ConfigParser(interpolation=None)
    parser.optionxform = str
    parser.read_string(text)
    return {(section, option): value for section in parser.sections() for option, value in parser.items(section)}


def _split_lab(value: str) -> tuple[str, str]:
    """A ``lab =`` block as (what training reads, what only decoding reads)."""
    lines = value.splitlines()
    decode_only = [line for line in lines if line.strip().split("=", 1)[0] in DECODE_ONLY_FIELDS]
    return "\n".join(line for line in lines if line not in decode_only), "\n".join(decode_only)


def _view(text: str, part: int) -> dict[tuple[str, str], str]:
    """The options of a resolved config, lab blocks cut to what training (0) or decoding (1) reads."""
    return {key: _split_lab(value)[part] if key[1] == "lab" else value for key, value in _options(text).items()}


def check_same_experiment(exp: Experiment, resolved_text: str, source: str) -> None:
    """A folder with training progress may only be resumed with the config that made it.

    Changes to ``[decoding]``, ``[forward]``, ``[data_use] forward_with``, ``[exp] device`` and the
    decode-only fields of label streams (``lab_graph``, ``lab_data_folder``) are allowed
    (:func:`stages_to_redo` says what they redo), and so is an option the folder's config does not list
    (added to the toolkit later) while it has its default; anything else is a :class:`ConfigError`
    naming the first five differences.
    """
    if not exp.resolved.is_file() or not (exp.checkpoint.is_file() or exp.final.is_file()):
        return
    allowed = RESUMABLE_CHANGES

    def relevant(text):
        return {key: value for key, value in _view(text, 0).items()
                if key[0] not in allowed or (allowed[key[0]] is not None and key[1] not in allowed[key[0]])}

    before, now = relevant(exp.resolved.read_text()), relevant(resolved_text)
    if "lfmmi" not in {before.get(("model", "objective")), now.get(("model", "objective"))}:
        for key in inert_options({**before, **now}):  # LF-MMI's options of a cross-entropy run, however written
            before.pop(key, None), now.pop(key, None)

    def unchanged(key):
        # an option the toolkit gained after the folder was made changes nothing while it keeps its default, nor
        # does a unit's option left at the unit's default, however written (or not written)
        old, new = before.get(key, option_default(*key)), now.get(key)
        return old == new or all(v is None or left_to_the_unit(*key, v) for v in (old, new))

    changed = sorted(k for k in set(before) | set(now) if not unchanged(k))
    if changed:
        def shown(section, option):
            old, new = before.get((section, option)), now.get((section, option))
            if old and new and "\n" in old + new:  # a stream block: its first line that differs says enough
                pairs = zip(old.splitlines() + [""] * 99, new.splitlines() + [""] * 99)
                old, new = next((a, b) for a, b in pairs if a != b)
            return f"[{section}] {option}: {old!r} -> {new!r}"

        details = "; ".join(shown(s, o) for s, o in changed[:5])
        if len(changed) > 5:
            details += f"; and {len(changed) - 5} more"
        raise ConfigError(f"{source}: {exp.folder} holds an experiment trained with a different config ({details}); "
                          "use --force to start it again, or another [exp] out_folder")


def stages_to_redo(exp: Experiment, resolved_text: str) -> list[str]:
    """What the allowed changes since the folder's last run make stale: ``forward`` (``[forward]``
    changed: every set's log-likelihoods and the decode) or ``decode`` (``[decoding]`` or a label
    stream's graph or references changed)."""
    if not exp.resolved.is_file():
        return []
    before, now = _options(exp.resolved.read_text()), _options(resolved_text)
    old_decode, new_decode = _view(exp.resolved.read_text(), 1), _view(resolved_text, 1)

    def section(options, name):
        return {k: v for k, v in options.items() if k[0] == name}

    if section(before, "forward") != section(now, "forward"):
        return ["forward", "decode"]
    labs = {k: v for k, v in old_decode.items() if k[1] == "lab"}, {k: v for k, v in new_decode.items() if k[1] == "lab"}
    if section(before, "decoding") != section(now, "decoding") or labs[0] != labs[1]:
        return ["decode"]
    return []


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description="Print a res.res's epoch lines in pytorch-kaldi's format "
                                     "(for scripts that read its fields by position).")
    parser.add_argument("res", help="an experiment's res.res")
    parser.add_argument("--train-name", default="train")
    parser.add_argument("--dev-name", default="dev")
    arguments = parser.parse_args()
    print("\n".join(pytorch_kaldi_epoch_lines(arguments.res, arguments.train_name, arguments.dev_name)))

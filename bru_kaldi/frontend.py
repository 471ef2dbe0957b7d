"""The acoustic front end: Kaldi's fbank and MFCC, computed with kaldi-native-fbank and described as Kaldi does.

Kaldi's ``steps/make_fbank.sh`` and ``make_mfcc.sh`` leave the options they computed a data directory's
features with in ``<data>/conf/fbank.conf`` or ``conf/mfcc.conf``: the options of ``compute-fbank-feats``
or ``compute-mfcc-feats``, one ``--name=value`` a line. :class:`FrontEnd` is one such description, the
kind and its options under Kaldi's names and with Kaldi's defaults (a file that leaves ``--dither`` out
means Kaldi's 1.0, not kaldi-native-fbank's 3e-5). It computes the features of int16-scale samples
(:meth:`FrontEnd.compute`, or frame by frame as samples arrive, :meth:`FrontEnd.online`), reads and
writes the conf file, and :func:`front_end_of` finds the description of a feature list.

>>> import numpy as np
>>> fbank = FrontEnd("fbank", {"num-mel-bins": "40", "dither": "0"})
>>> fbank.dim, fbank.frame_shift, fbank.compute(np.zeros(16000, dtype=np.float32)).shape
(40, 0.01, (98, 40))
>>> FrontEnd.from_conf_text("--num-ceps=13\\n--dither=0  # no noise", "mfcc").options
{'num-ceps': '13', 'dither': '0'}
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from bru_kaldi.atomic import write_text_atomically

KINDS = ("fbank", "mfcc")

# Kaldi's option -> (kaldi-native-fbank's attribute, type, Kaldi's default): the frame and mel options
# both kinds share (FrameExtractionOptions, MelBanksOptions), then each kind's own.
_SHARED = {
    "sample-frequency": ("frame_opts.samp_freq", float, 16000.0),
    "frame-shift": ("frame_opts.frame_shift_ms", float, 10.0),
    "frame-length": ("frame_opts.frame_length_ms", float, 25.0),
    "dither": ("frame_opts.dither", float, 1.0),
    "preemphasis-coefficient": ("frame_opts.preemph_coeff", float, 0.97),
    "remove-dc-offset": ("frame_opts.remove_dc_offset", bool, True),
    "window-type": ("frame_opts.window_type", str, "povey"),
    "round-to-power-of-two": ("frame_opts.round_to_power_of_two", bool, True),
    "blackman-coeff": ("frame_opts.blackman_coeff", float, 0.42),
    "snip-edges": ("frame_opts.snip_edges", bool, True),
    "num-mel-bins": ("mel_opts.num_bins", int, 23),
    "low-freq": ("mel_opts.low_freq", float, 20.0),
    "high-freq": ("mel_opts.high_freq", float, 0.0),
    "vtln-low": ("mel_opts.vtln_low", float, 100.0),
    "vtln-high": ("mel_opts.vtln_high", float, -500.0),
    "energy-floor": ("energy_floor", float, 0.0),
    "raw-energy": ("raw_energy", bool, True),
    "htk-compat": ("htk_compat", bool, False),
}
OPTIONS = {
    "fbank": {**_SHARED, "use-energy": ("use_energy", bool, False), "use-log-fbank": ("use_log_fbank", bool, True),
              "use-power": ("use_power", bool, True)},
    "mfcc": {**_SHARED, "use-energy": ("use_energy", bool, True), "num-ceps": ("num_ceps", int, 13),
             "cepstral-lifter": ("cepstral_lifter", float, 22.0)},
}


class FrontEndError(ValueError):
    """A front end that cannot be described or used; the message names the file or option."""


def _value(kind: type, text: str, where: str):
    try:
        if kind is bool:
            if text.lower() not in ("true", "false"):
                raise ValueError
            return text.lower() == "true"
        return kind(text)
    except ValueError:
        expected = "true or false" if kind is bool else kind.__name__
        raise FrontEndError(f"{where}: expected {expected}, got {text!r}") from None


@dataclass(frozen=True)
class FrontEnd:
    """One feature kind (``"fbank"`` or ``"mfcc"``) and its options, ``{Kaldi option name: value text}``:
    the options given, every other one at Kaldi's default. ``source`` names where they were read from."""

    kind: str
    options: dict = field(default_factory=dict)
    source: str = "<given>"

    def __post_init__(self):
        if self.kind not in KINDS:
            raise FrontEndError(f"{self.source}: feature kind {self.kind!r} is not one of {', '.join(KINDS)}")
        for name, text in self.options.items():
            if name not in OPTIONS[self.kind]:
                raise FrontEndError(f"{self.source}: --{name} is not an option of compute-{self.kind}-feats that "
                                    f"this front end computes (known: {', '.join(sorted(OPTIONS[self.kind]))})")
            _value(OPTIONS[self.kind][name][1], str(text), f"{self.source} --{name}")

    def get(self, name: str):
        """The value of option ``name`` (Kaldi's name), given or Kaldi's default, typed."""
        _, kind, default = OPTIONS[self.kind][name]
        return _value(kind, str(self.options[name]), f"{self.source} --{name}") if name in self.options else default

    @property
    def dim(self) -> int:
        """Values per frame: the mel bins (and the energy) of fbank, the cepstra of MFCC."""
        if self.kind == "mfcc":
            return self.get("num-ceps")
        return self.get("num-mel-bins") + int(self.get("use-energy"))

    @property
    def sample_rate(self) -> int:
        return int(self.get("sample-frequency"))

    @property
    def frame_shift(self) -> float:
        """Seconds between frames."""
        return self.get("frame-shift") / 1000.0

    def knf_options(self):
        """The options as kaldi-native-fbank's ``FbankOptions`` / ``MfccOptions``."""
        import kaldi_native_fbank as knf

        opts = knf.FbankOptions() if self.kind == "fbank" else knf.MfccOptions()
        for name, (attribute, _, _) in OPTIONS[self.kind].items():
            owner, *inner = attribute.split(".")
            target = getattr(opts, owner) if inner else opts
            setattr(target, inner[0] if inner else owner, self.get(name))
        return opts

    def online(self):
        """kaldi-native-fbank's ``OnlineFbank`` / ``OnlineMfcc``: ``accept_waveform(rate, samples)`` as they
        arrive, ``input_finished()`` at the end, frames ``get_frame(i)`` for ``i < num_frames_ready``."""
        import kaldi_native_fbank as knf

        return (knf.OnlineFbank if self.kind == "fbank" else knf.OnlineMfcc)(self.knf_options())

    def compute(self, samples: np.ndarray) -> np.ndarray:
        """Features ``(T, dim)`` float32 of int16-scale samples ``(N,)`` at :attr:`sample_rate`."""
        extractor = self.online()
        extractor.accept_waveform(self.sample_rate, np.asarray(samples, dtype=np.float32))
        extractor.input_finished()
        return frames_ready(extractor, 0, self.dim)

    # ----------------------------------------------------------------------- conf files
    def conf_text(self) -> str:
        """The options as Kaldi's ``--config`` file, one ``--name=value`` a line."""
        return "".join(f"--{name}={value}\n" for name, value in self.options.items())

    def write_conf(self, path) -> None:
        write_text_atomically(path, self.conf_text())

    @classmethod
    def from_conf_text(cls, text: str, kind: str, source: str = "<given>") -> "FrontEnd":
        """Options of a Kaldi ``--config`` file: ``--name=value`` (``--name`` alone: true), ``#`` comments."""
        options = {}
        for number, line in enumerate(text.splitlines(), 1):
            line = line.split("#", 1)[0].strip()
            if not line:
                continue
            if not line.startswith("--") or " " in line:
                raise FrontEndError(f"{source}:{number}: expected --name=value, got {line!r}")
            name, _, value = line[2:].partition("=")
            options[name.replace("_", "-")] = value if _ else "true"
        return cls(kind, options, source)

    @classmethod
    def from_conf(cls, path, kind: str) -> "FrontEnd":
        return cls.from_conf_text(Path(path).read_text(), kind, str(path))

    def as_dict(self) -> dict:
        return {"kind": self.kind, "options": dict(self.options), "source": self.source}


def frames_ready(extractor, first: int, dim: int) -> np.ndarray:
    """Frames ``first..`` of a kaldi-native-fbank online extractor that are ready, ``(T, dim)`` float32."""
    count = extractor.num_frames_ready - first
    if count <= 0:
        return np.zeros((0, dim), dtype=np.float32)
    return np.stack([extractor.get_frame(first + i) for i in range(count)]).astype(np.float32)


def front_end_of(fea_lst: str, dim: int) -> FrontEnd:
    """The front end that computed the features of ``fea_lst`` (``<data>/feats[_<kind>].scp``), whose frames
    have ``dim`` values: ``<data>/conf/<kind>.conf`` as Kaldi's make_fbank.sh and make_mfcc.sh leave it.

    ``feats_<kind>.scp`` is described by ``conf/<kind>.conf``; ``feats.scp`` by whichever of
    ``conf/fbank.conf`` and ``conf/mfcc.conf`` makes frames of ``dim`` values (a data directory with
    both kinds, as the built-in corpus's, tells them apart so). Raises :class:`FrontEndError` saying
    what is missing.
    """
    spec = str(fea_lst)
    path = Path(spec.split(":", 1)[1] if spec.startswith(("scp:", "scp,")) else spec)
    if path.suffix != ".scp":
        raise FrontEndError(f"{fea_lst}: not an scp beside a data directory, so nothing says which front end made "
                            "its features")
    stem = path.stem
    kinds = [stem[len("feats_"):]] if stem.startswith("feats_") else list(KINDS)
    found = []
    for kind in kinds:
        conf = path.parent / "conf" / f"{kind}.conf"
        if kind in KINDS and conf.is_file():
            found.append(FrontEnd.from_conf(conf, kind))
    fitting = [f for f in found if f.dim == dim]
    if len(fitting) == 1:
        return fitting[0]
    wanted = " or ".join(f"{path.parent / 'conf' / k}.conf" for k in kinds)
    if not found:
        raise FrontEndError(f"{fea_lst}: no {wanted} says which front end made its features (Kaldi's make_fbank.sh "
                            "and make_mfcc.sh leave one there)")
    if len(fitting) > 1:
        raise FrontEndError(f"{fea_lst}: {' and '.join(f.source for f in fitting)} both make frames of {dim} values: "
                            "which made these features is not said")
    raise FrontEndError(f"{fea_lst}: features of {dim} values, but {', '.join(f'{f.source} makes {f.dim}' for f in found)}")


"""Audio in: WAV files and raw PCM, as the int16-scale samples a front end computes features of.

Kaldi reads 16-bit WAV samples as they are, so its features are of int16-scale values; samples of other
integer widths are brought to that scale here (8-bit centred and times 256, 24-bit / 256, 32-bit / 65536)
so that their features match. A file at another sample rate is resampled with soxr (its "HQ" quality),
and the caller's log says so; a file of several channels is refused unless one is chosen. Python's
``wave`` reads the RIFF structure; what it does not check (a file shorter than its header says) is
checked here. Every error is an :class:`AudioError` naming the file.

>>> import io, wave
>>> buffer = io.BytesIO()
>>> with wave.open(buffer, "wb") as w:
...     w.setnchannels(1); w.setsampwidth(2); w.setframerate(8000); w.writeframes(b"\\x10\\x00" * 800)
>>> _ = buffer.seek(0)
>>> samples = read_wav(buffer, rate=16000, name="tone.wav", log=print)
tone.wav: resampled from 8000 Hz to 16000 Hz (soxr)
>>> samples.dtype, samples.shape
(dtype('float32'), (1600,))
"""

from __future__ import annotations

import wave
from pathlib import Path
from typing import BinaryIO, Callable, Iterator, Optional, Union

import numpy as np


class AudioError(ValueError):
    """Audio that cannot be read; the message names the file and what is wrong with it."""


def _int16_scale(data: bytes, width: int) -> np.ndarray:
    """Little-endian integer PCM of ``width`` bytes per sample as float32 on the int16 scale."""
    if width == 1:  # unsigned, centred on 128
        return (np.frombuffer(data, dtype=np.uint8).astype(np.float32) - 128.0) * 256.0
    if width == 2:
        return np.frombuffer(data, dtype="<i2").astype(np.float32)
    if width == 3:  # three bytes, sign in the last: shift them into the top of an int32
        raw = np.frombuffer(data, dtype=np.uint8).reshape(-1, 3).astype(np.int32)
        values = (raw[:, 0] << 8 | raw[:, 1] << 16 | raw[:, 2] << 24) >> 8
        return values.astype(np.float32) / 256.0
    return (np.frombuffer(data, dtype="<i4").astype(np.float64) / 65536.0).astype(np.float32)


def resample(samples: np.ndarray, from_rate: int, rate: int, name: str, log: Callable[[str], None]) -> np.ndarray:
    """``samples`` at ``rate`` (soxr, "HQ"); the log says when they were at another rate."""
    if from_rate == rate:
        return samples
    import soxr

    log(f"{name}: resampled from {from_rate} Hz to {rate} Hz (soxr)")
    return soxr.resample(samples, from_rate, rate, quality="HQ").astype(np.float32)


def read_wav(source: Union[str, Path, BinaryIO], rate: int, channel: Optional[int] = None, name: Optional[str] = None,
             log: Callable[[str], None] = lambda line: None) -> np.ndarray:
    """The samples ``(N,)`` float32, int16 scale, at ``rate`` Hz, of a WAV file of integer PCM.

    ``channel`` (from 0, as Kaldi's ``--channel``) picks one channel of several; without it a file of
    more than one is refused. ``name`` names the file in messages (default: ``source``).
    """
    name = name or str(source)
    if isinstance(source, (str, Path)):
        path = Path(source)
        if not path.is_file():
            raise AudioError(f"{name}: no such file")
        if path.stat().st_size == 0:
            raise AudioError(f"{name}: an empty file, not audio")
    try:
        with wave.open(str(source) if isinstance(source, Path) else source, "rb") as w:
            channels, width, from_rate, frames = w.getnchannels(), w.getsampwidth(), w.getframerate(), w.getnframes()
            data = w.readframes(frames)
    except EOFError:
        raise AudioError(f"{name}: a truncated WAV file (it ends inside its header)") from None
    except wave.Error as error:
        raise AudioError(f"{name}: not a WAV file of integer PCM ({error})") from None
    if width not in (1, 2, 3, 4):
        raise AudioError(f"{name}: {8 * width}-bit samples; 8, 16, 24 or 32-bit integer PCM is read")
    if len(data) < frames * width * channels:
        raise AudioError(f"{name}: a truncated WAV file: its header promises {frames} samples per channel, it holds "
                         f"{len(data) // (width * channels)}")
    if frames == 0:
        raise AudioError(f"{name}: a WAV file without samples")
    samples = _int16_scale(data, width).reshape(frames, channels)
    if channel is None and channels > 1:
        raise AudioError(f"{name}: {channels} channels; choose one with --channel (0 is the first)")
    if channel is not None and not 0 <= channel < channels:
        raise AudioError(f"{name}: no channel {channel} (it has {channels}, numbered from 0)")
    return resample(np.ascontiguousarray(samples[:, channel or 0]), from_rate, rate, name, log)


def pcm_chunks(stream: BinaryIO, rate: int, seconds: float) -> Iterator[np.ndarray]:
    """Raw 16-bit little-endian mono PCM at ``rate`` Hz from a pipe (``arecord -f S16_LE``, ``sox -t raw``), in
    chunks of ``seconds`` as they arrive, int16 scale; an odd byte at the end is dropped."""
    size = 2 * max(1, int(round(rate * seconds)))
    carry = b""
    while True:
        data = stream.read(size)
        if not data:
            break
        data = carry + data
        whole = len(data) - len(data) % 2
        carry = data[whole:]
        if whole:
            yield np.frombuffer(data[:whole], dtype="<i2").astype(np.float32)

"""What keeps the synthetic task from being easy: channel, level, reverberation and noise.

espeak-ng speaks every phone of a voice almost identically, so clean synthetic speech is close to
trivially separable. Each speaker gets a fixed microphone-like channel (a smooth random spectral
tilt and ripple, sometimes band-limited like a telephone); each utterance gets a random level,
reverberation in some utterances and additive noise at a random SNR. Noise is coloured
(spectral slope from white to brown) or babble made of other utterances of the same job.

The amounts below were set by measurement (README.md): with 0-20 dB SNR, reverberation in half
the utterances up to RT60 0.6 s and 30 % babble, a small MLP decoded at 49.6 % PER, too hard for
a good recurrent model to reach TIMIT-like 10-30 %; these settings give 29.5 % for that MLP.

All randomness comes from the ``numpy.random.Generator`` passed in, so a seed fixes the result.
"""

from __future__ import annotations

import numpy as np

RATE = 16000
SNR_DB = (5.0, 25.0)  # additive noise, uniform in dB
REVERB_SHARE = 0.3  # utterances with reverberation
RT60_S = (0.1, 0.4)  # their reverberation time, uniform
BABBLE_SHARE = 0.2  # noises that are babble (else coloured noise)
TELEPHONE_SHARE = 0.1  # speakers whose channel is band-limited


def speaker_channel(rng: np.random.Generator, n_fft: int = 512) -> np.ndarray:
    """A speaker's channel as a magnitude response (n_fft // 2 + 1,) over 0..8 kHz."""
    freqs = np.linspace(0, RATE / 2, n_fft // 2 + 1)
    # ripple of +-6 dB at 8 random anchor frequencies, plus a tilt of -6..+3 dB per octave above 1 kHz
    anchors = np.sort(rng.uniform(100, RATE / 2, 8))
    gains_db = np.interp(freqs, anchors, rng.uniform(-6, 6, 8))
    gains_db += rng.uniform(-6, 3) * np.log2(np.maximum(freqs, 1000) / 1000)
    if rng.random() < TELEPHONE_SHARE:  # band-limited: 300 Hz - 3.4 kHz with soft edges
        low, high = rng.uniform(200, 400), rng.uniform(3000, 4000)
        gains_db -= 40 / (1 + np.exp(-(freqs - high) / 100)) + 40 / (1 + np.exp((freqs - low) / 50))
    return 10 ** (gains_db / 20)


def apply_response(x: np.ndarray, response: np.ndarray) -> np.ndarray:
    """Filter ``x`` (N,) by a magnitude response (linear-phase FIR, its delay removed): (N,)."""
    n_fft = 2 * (len(response) - 1)
    # the magnitude response as a short linear-phase FIR (Hann-windowed), then one FFT convolution
    fir = np.fft.irfft(response, n_fft)
    fir = np.roll(fir, n_fft // 2) * np.hanning(n_fft)
    y = fft_convolve(x, fir)
    return y[n_fft // 2: n_fft // 2 + len(x)]


def fft_convolve(x: np.ndarray, h: np.ndarray) -> np.ndarray:
    """Full linear convolution of two 1-d signals, (len(x) + len(h) - 1,)."""
    n = len(x) + len(h) - 1
    size = 1 << (n - 1).bit_length()
    return np.fft.irfft(np.fft.rfft(x, size) * np.fft.rfft(h, size), size)[:n]


def room_response(rng: np.random.Generator) -> np.ndarray:
    """A synthetic room impulse response: a direct path plus exponentially decaying noise."""
    rt60 = rng.uniform(*RT60_S)
    t = np.arange(int(rt60 * RATE)) / RATE
    tail = rng.standard_normal(len(t)) * np.exp(-6.9 * t / rt60)  # -60 dB at rt60
    tail[: int(0.002 * RATE)] = 0  # the first reflection comes after the direct sound
    h = tail * rng.uniform(0.1, 0.4) / np.sqrt(np.sum(tail ** 2) + 1e-12)
    h[0] = 1.0
    return h


def coloured_noise(rng: np.random.Generator, n: int) -> np.ndarray:
    """Gaussian noise with a power spectrum ~ 1 / f^beta, beta uniform in [0, 2] (white to brown)."""
    beta = rng.uniform(0, 2)
    spectrum = np.fft.rfft(rng.standard_normal(n))
    f = np.maximum(np.fft.rfftfreq(n, 1 / RATE), 20.0)
    return np.fft.irfft(spectrum / f ** (beta / 2), n)


def corrupt(speech: np.ndarray, channel: np.ndarray, rng: np.random.Generator, babble_pool: list[np.ndarray]) -> np.ndarray:
    """Apply a speaker's ``channel``, maybe reverberation, and noise to ``speech`` (N,) float.

    ``babble_pool`` holds clean utterances already made by this job (other talkers for babble).
    Returns float samples (N,) scaled to a random level in the int16 range.
    """
    x = apply_response(speech, channel)
    if rng.random() < REVERB_SHARE:
        x = fft_convolve(x, room_response(rng))[: len(x)]
    active = np.abs(x) > 0.05 * np.abs(x).max()
    speech_power = np.mean(x[active] ** 2)
    if babble_pool and rng.random() < BABBLE_SHARE:
        picks = rng.choice(len(babble_pool), size=min(3, len(babble_pool)), replace=False)
        noise = np.zeros(len(x))
        for p in picks:
            talker = babble_pool[p]
            offset = rng.integers(len(talker))
            noise += np.resize(np.roll(talker, -offset), len(x))
    else:
        noise = coloured_noise(rng, len(x))
    snr_db = rng.uniform(*SNR_DB)
    noise *= np.sqrt(speech_power / (np.mean(noise ** 2) + 1e-12) / 10 ** (snr_db / 10))
    y = x + noise
    peak_dbfs = rng.uniform(-12, -1)
    return y * (32767 * 10 ** (peak_dbfs / 20) / (np.abs(y).max() + 1e-9))

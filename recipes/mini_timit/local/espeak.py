"""espeak-ng through ctypes: speech at 22050 Hz plus the start sample of every phoneme.

The library and its data come from the ``espeakng-loader`` wheel; no system espeak is used. The
synthesiser runs in synchronous mode with phoneme events switched on (``espeak_Initialize`` with
``AUDIO_OUTPUT_SYNCHRONOUS`` and ``espeakINITIALIZE_PHONEME_EVENTS``), and every event of type
``espeakEVENT_PHONEME`` carries the phoneme mnemonic and its start sample in the output.

Determinism: espeak-ng draws noise from its own generator and from libc ``rand()`` and keeps some
state from one utterance to the next, so re-seeding both before each utterance is not enough for
byte-identical audio. What is reproducible is a *fresh process* that synthesises the same list of
utterances in the same order; the synthesis stage is organised that way (one process per job).
"""

from __future__ import annotations

import ctypes
import ctypes.util

import numpy as np

# espeak_AUDIO_OUTPUT, espeak_EVENT_TYPE, espeak_PARAMETER and flags from speak_lib.h
_AUDIO_OUTPUT_SYNCHRONOUS = 2
_INITIALIZE_PHONEME_EVENTS = 0x0001
_INITIALIZE_DONT_EXIT = 0x8000
_EVENT_LIST_TERMINATED = 0
_EVENT_PHONEME = 7
_POS_CHARACTER = 1
_CHARS_UTF8 = 1
_RATE, _PITCH, _RANGE, _WORDGAP = 1, 3, 4, 7
SAMPLE_RATE = 22050  # espeak-ng's fixed output rate (checked at initialisation)
_PHONEME_SEPARATOR = "|"  # between the phonemes of a word in espeak_TextToPhonemes output (not a mnemonic)


class _EventId(ctypes.Union):
    _fields_ = [("number", ctypes.c_int), ("name", ctypes.c_char_p), ("string", ctypes.c_char * 8)]


class _Event(ctypes.Structure):
    # espeak_EVENT in speak_lib.h
    _fields_ = [
        ("type", ctypes.c_int),
        ("unique_identifier", ctypes.c_uint),
        ("text_position", ctypes.c_int),
        ("length", ctypes.c_int),
        ("audio_position", ctypes.c_int),  # milliseconds
        ("sample", ctypes.c_int),  # sample index in the output
        ("user_data", ctypes.c_void_p),
        ("id", _EventId),
    ]


_CALLBACK = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_short), ctypes.c_int, ctypes.POINTER(_Event))


class Espeak:
    """One espeak-ng instance (the library is process-global: create one per process).

    >>> tts = Espeak.shared()
    >>> audio, phonemes = tts.synth("a cat", voice="en-us+m3", rate=170, pitch=50, pitch_range=50)
    >>> audio.dtype, [name for name, _ in phonemes][:3]
    (dtype('int16'), ['a#', 'k', "'a"])
    """

    _instance: "Espeak | None" = None

    @classmethod
    def shared(cls) -> "Espeak":
        """This process's instance, created on first use."""
        return cls._instance or cls()

    def __init__(self):
        import espeakng_loader

        if Espeak._instance is not None:
            raise RuntimeError("espeak-ng keeps global state: create one Espeak per process")
        self._lib = ctypes.CDLL(espeakng_loader.get_library_path())
        self._libc = ctypes.CDLL(ctypes.util.find_library("c"))
        self._lib.espeak_ng_SetRandSeed.argtypes = [ctypes.c_long]
        data = espeakng_loader.get_data_path().encode()
        rate = self._lib.espeak_Initialize(
            _AUDIO_OUTPUT_SYNCHRONOUS, 0, data, _INITIALIZE_PHONEME_EVENTS | _INITIALIZE_DONT_EXIT
        )
        if rate != SAMPLE_RATE:
            raise RuntimeError(f"espeak_Initialize({data!r}) returned {rate}, expected the sample rate {SAMPLE_RATE}")
        self._phonemizing_voice: str | None = None  # the voice phonemize() last set
        self._chunks: list[np.ndarray] = []
        self._events: list[tuple[str, int]] = []
        self._callback = _CALLBACK(self._on_audio)  # kept referenced: espeak calls it later
        self._lib.espeak_SetSynthCallback(self._callback)
        Espeak._instance = self

    def _on_audio(self, wav, num_samples, events):
        if num_samples > 0:
            self._chunks.append(np.ctypeslib.as_array(wav, (num_samples,)).copy())
        i = 0
        while events[i].type != _EVENT_LIST_TERMINATED:
            if events[i].type == _EVENT_PHONEME:
                self._events.append((events[i].id.string.decode("utf-8"), events[i].sample))
            i += 1
        return 0  # 0: go on synthesising

    def synth(self, text: str, voice: str, rate: int, pitch: int, pitch_range: int, word_gap: int = 0,
              seed: int = 0) -> tuple[np.ndarray, list[tuple[str, int]]]:
        """Speak ``text``; return int16 samples (N,) at 22050 Hz and ``[(mnemonic, start_sample)]``.

        ``voice`` is an espeak-ng voice name with an optional variant (``"en-us+f3"``); ``rate`` is in
        words per minute (80-450), ``pitch`` and ``pitch_range`` are 0-100, ``word_gap`` is extra
        pause between words in units of 10 ms.
        """
        self._phonemizing_voice = None
        if self._lib.espeak_SetVoiceByName(voice.encode()) != 0:
            raise ValueError(f"espeak-ng has no voice {voice!r}")
        for parameter, value in ((_RATE, rate), (_PITCH, pitch), (_RANGE, pitch_range), (_WORDGAP, word_gap)):
            self._lib.espeak_SetParameter(parameter, int(value), 0)
        self._chunks, self._events = [], []
        self._lib.espeak_ng_SetRandSeed(seed)
        self._libc.srand(seed & 0xFFFFFFFF)
        data = text.encode("utf-8")
        status = self._lib.espeak_Synth(data, len(data) + 1, 0, _POS_CHARACTER, 0, _CHARS_UTF8, None, None)
        if status != 0 or self._lib.espeak_Synchronize() != 0:
            raise RuntimeError(f"espeak_Synth failed with status {status} on {text!r} ({voice})")
        if not self._chunks:
            raise RuntimeError(f"espeak-ng produced no audio for {text!r} ({voice})")
        return np.concatenate(self._chunks), self._events

    def phonemize(self, text: str, voice: str) -> list[list[str]]:
        """The phoneme mnemonics espeak-ng would speak for ``text``, one list per phonetic word.

        No audio is made (``espeak_TextToPhonemes``, clause by clause). A phonetic word is mostly one
        written word, but espeak-ng joins some pairs of function words (``with the``) into one.
        Stress marks stay on their vowels (``'aI``); pauses are ``_`` mnemonics.

        >>> Espeak.shared().phonemize("A cat, sir.", "en-us")
        [['a#'], ['k', "'a", 't'], ['s', ',3:']]
        """
        if voice != self._phonemizing_voice:  # switching voices costs more than phonemizing a word
            if self._lib.espeak_SetVoiceByName(voice.encode()) != 0:
                raise ValueError(f"espeak-ng has no voice {voice!r}")
            self._phonemizing_voice = voice
        convert = self._lib.espeak_TextToPhonemes
        convert.restype = ctypes.c_char_p
        convert.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_int, ctypes.c_int]
        buffer = ctypes.create_string_buffer(text.encode("utf-8"))
        pointer = ctypes.c_void_p(ctypes.addressof(buffer))  # advanced by espeak-ng clause by clause
        words = []
        while pointer.value:
            # phoneme mode: ASCII mnemonics with "|" between phonemes (bits 8-23: the separator)
            clause = convert(ctypes.byref(pointer), _CHARS_UTF8, ord(_PHONEME_SEPARATOR) << 8)
            words += [[p for p in word.split(_PHONEME_SEPARATOR) if p] for word in (clause or b"").decode().split()]
        return [w for w in words if w]

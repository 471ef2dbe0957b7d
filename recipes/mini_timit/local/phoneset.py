"""The phone set: espeak-ng's English phonemes folded onto TIMIT's 39 scoring phones.

The 39 phones are those of Lee and Hon (1989), the set Kaldi's TIMIT recipe scores with, so a
phone error rate here reads like a TIMIT one. espeak-ng names phonemes with its own mnemonics
(``phsource/ph_english*``, listed in ``espeak-ng-data/phontab``); every mnemonic of its English
tables (en, en-us, en-rp, en-sc, en-n, en-wm, en-wi, plus the base consonants they use) is mapped
below, so an unmapped name is a new espeak-ng version and raises :class:`UnknownPhoneme`.

Folding choices, as TIMIT's 48 -> 39 map: ``ao`` -> ``aa``, ``zh`` -> ``sh``, schwas -> ``ah``,
syllabic l/n -> ``l``/``n``. Stress marks (``'`` and ``,``) are dropped. A few mnemonics carry
no segment of their own (``;`` palatalises the previous consonant, ``?`` is a glottal stop, as
TIMIT's ``q`` which its recipe deletes); they map to ``None`` and their time goes to the previous
phone. Pauses (``_``, ``_:``, ``_!``, ...) become ``sil``.

>>> to_timit("'aU"), to_timit("t#"), to_timit("_:"), to_timit(";")
('aw', 'dx', 'sil', None)
>>> len(PHONES), PHONES[:3], SIL
(39, ('aa', 'ae', 'ah'), 'sil')
"""

from __future__ import annotations

SIL = "sil"
# the vowels among them (er included): what a post-vocalic l or r follows (lexicon variants)
VOWELS = frozenset("iy ih eh ae ah uw uh aa ey ay oy aw ow er".split())

# TIMIT's 39 scoring phones, sorted as Kaldi's TIMIT phones.txt lists them.
PHONES = tuple(sorted(
    "iy ih eh ae ah uw uh aa ey ay oy aw ow er l r w y m n ng ch jh dh b d dx g p t k z v f th "
    "s sh hh sil".split()
))

_VOWELS = {
    # schwas and reduced vowels (TIMIT ax, ix-like centralised, ah)
    "@": "ah", "@-": "ah", "@2": "ah", "@5": "ah", "@#": "ah", "#@": "ah", "a#": "ah", "a#2": "ah",
    "V": "ah", "A#": "ah",
    "@L": "l",  # syllabic l (TIMIT el -> l)
    "3": "er", "3:": "er", "VR": "er", "IR": "er",
    "a": "ae", "aa": "ae", "a2": "ae", "a/": "ae", "#a": "ae",
    "A:": "aa", "A@": "aa", "A~": "aa", "0": "aa", "0#": "aa", "02": "aa",
    "O": "aa", "O:": "aa", "O2": "aa", "O@": "aa", "O~": "aa", "o@": "aa", "o:": "aa",  # ao -> aa
    "aI": "ay", "aI2": "ay", "aI3": "ay", "aI@": "ay",
    "aU": "aw", "aU@": "aw",
    "E": "eh", "E#": "eh", "E2": "eh", "e": "eh", "e#": "eh", "e@": "eh", "#e": "eh", "EI": "ey",
    "eI": "ey", "e:": "ey",
    "I": "ih", "I2": "ih", "I#": "ih", "I2#": "ih", "#i": "ih",
    "i": "iy", "i:": "iy", "i@": "iy", "i@3": "iy",
    "OI": "oy", "oI": "oy",
    "oU": "ow", "oU#": "ow", "o": "ow", "#o": "ow",
    "U": "uh", "U@": "uh",
    "u:": "uw", "u": "uw", "#u": "uw",
}
_CONSONANTS = {
    "p": "p", "b": "b", "t": "t", "t2": "t", "t[": "t", "d": "d", "d[": "d", "d#": "d",
    "t#": "dx",  # the flap of American "butter"
    "k": "k", "g": "g", "f": "f", "v": "v", "v#": "v", "T": "th", "D": "dh",
    "s": "s", "z": "z", "z#": "z", "z/2": "z", "S": "sh", "Z": "sh",  # zh -> sh
    "h": "hh", "tS": "ch", "dZ": "jh", "m": "m", "m-": "m", "n": "n", "n-": "n", "N": "ng", "N-": "ng",
    "l": "l", "l-": "l", "l/": "l", "l/2": "l", "l/3": "l", "L": "l",
    "r": "r", "r-": "r", "r/": "r", "R": "r", "*": "dx",
    "w": "w", "w#": "w", "j": "y",
}
# no segment of their own: the time goes to the previous phone
_MODIFIERS = {";", "?", ":", "-", "||", "_^_", "#X1", "_X1"}


class UnknownPhoneme(ValueError):
    """An espeak-ng phoneme mnemonic that has no entry in the TIMIT map."""


def to_timit(mnemonic: str) -> str | None:
    """Map one espeak-ng phoneme mnemonic (as its phoneme event names it) to a TIMIT-39 phone.

    Returns ``None`` for marks that carry no segment of their own (see the module docstring).
    """
    name = mnemonic.lstrip("',")
    if name.startswith("_"):
        return SIL
    if name in _MODIFIERS:
        return None
    phone = _VOWELS.get(name) or _CONSONANTS.get(name)
    if phone is None:
        raise UnknownPhoneme(f"espeak-ng phoneme {mnemonic!r} has no TIMIT-39 mapping in {__file__}")
    return phone

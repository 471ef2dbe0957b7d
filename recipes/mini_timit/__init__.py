"""The built-in corpus: a TIMIT-like Kaldi experiment synthesised with espeak-ng (see README.md)."""

"""Recipes: one folder per corpus, each a Kaldi-style staged ``run.sh`` plus its Python stages."""

"""Stages of the mini_timit recipe; each module runs as ``python -m recipes.mini_timit.local.NAME``."""

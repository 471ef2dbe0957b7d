"""The C++ LF-MMI forward-backward for CPU tensors (``csrc/forward_backward.cpp``), built on first use.

Built and cached by the machinery of the recurrences' kernels (:class:`models.fast.native.Extension`:
one build per vector ISA, in torch's extension cache under a folder named for the source's hash, a
build lock that dies with its process), under the same switch ``BRU_KALDI_NATIVE``: ``auto`` (build,
and if that fails warn once and run the loop of torch ops), ``1`` (build or raise: what the tests use),
``0`` (never). :func:`bru_kaldi.chain.objective.forward_backward` asks :func:`native_ops` for a CPU tensor
of its outputs' dtype (GPU outputs are copied to the host for it) and runs its torch loop, on the outputs'
device, where it gets ``None`` (other dtypes, ``BRU_KALDI_NATIVE=0``, no C++ compiler). ``python -m
bru_kaldi.chain.native`` builds it ahead of time and prints where it is.

>>> import torch
>>> native_ops(torch.zeros(1, dtype=torch.float16)) is None  # float32 and float64 CPU tensors only
True
"""

from __future__ import annotations

import logging
import os
from typing import Optional

import torch

from models.fast.native import Extension

SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "csrc", "forward_backward.cpp")

EXTENSION = Extension(SOURCE, namespace="bru_kaldi_chain", name="bru_kaldi_chain",
                      fallback="the LF-MMI forward-backward runs as its loop of torch ops (slower on a CPU, "
                               "same results)")


def native_ops(example: torch.Tensor) -> Optional[object]:
    """``torch.ops.bru_kaldi_chain`` (its op ``forward_backward``) if the C++ forward-backward serves
    outputs like ``example``, else ``None``. See :meth:`models.fast.native.Extension.native_ops`."""
    return EXTENSION.native_ops(example)


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    EXTENSION.load(verbose=True)
    name, flags = next(c for c in EXTENSION.build_candidates() if c[0] == EXTENSION.loaded_build())
    print(f"{name} ({' '.join(flags)}) in {EXTENSION.build_directory(name, flags)}: torch.ops.bru_kaldi_chain")

"""The fused C++ kernels of the CPU fast paths (``models/fast/csrc/recurrences.cpp``), built on first use.

The fast paths in :mod:`models.fast.gated` and :mod:`models.fast.scans` run their time loops either
here, one fused pass per step (or per sequence, for the elementwise recursions), or as TorchScript
loops of small ATen kernels. The C++ ops are used for CPU tensors of float32 and float64; the
TorchScript loops run everything else (CUDA) and are the fallback where the extension cannot be
built. Both are tested against the reference loop of every unit.

The first use compiles the extension with the machine's C++ compiler (about 15 s on 2 cores) into
torch's extension cache (``$TORCH_EXTENSIONS_DIR``, by default ``~/.cache/torch_extensions``); later
runs load it from there, and an edit of the source rebuilds it. ``python -m models.fast.native`` builds it
ahead of time and prints where it is.

``BRU_KALDI_NATIVE`` chooses: ``auto`` (default: build, and if that fails warn once and use
TorchScript), ``1`` (build or raise: what the tests use), ``0`` (never, TorchScript only).

>>> import torch
>>> ops = native_ops(torch.zeros(1))  # doctest: +SKIP
>>> c, k, x0 = torch.zeros(3, 1, 2), torch.zeros(2, 2), torch.zeros(1, 2)
>>> ops.softplus_scan(c, k, x0, False).abs().max()  # doctest: +SKIP
tensor(0.)
"""

from __future__ import annotations

import logging
import os
import warnings
from typing import Optional

import torch

SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "csrc", "recurrences.cpp")
MODES = ("auto", "1", "0")

_loaded: dict = {}  # "ops" -> torch.ops.bru_kaldi once built; "error" -> why it could not be


def mode() -> str:
    value = os.environ.get("BRU_KALDI_NATIVE", "auto")
    if value not in MODES:
        raise ValueError(f"BRU_KALDI_NATIVE must be one of {MODES}, got {value!r}")
    return value


def build_flags() -> tuple[str, list[str]]:
    """The build's name and compiler flags for this CPU.

    ATen's vector types (SLEEF exp/log1p from libtorch itself) are compiled for AVX2 where the CPU
    has it, and the name says so: a shared home directory on a cluster with older CPUs gets a second,
    generic build instead of an illegal instruction.
    """
    capability = torch.backends.cpu.get_cpu_capability()
    flags = ["-O3", "-fopenmp"]  # at::parallel_for is OpenMP in the header: without it, one thread
    if capability in ("AVX2", "AVX512"):
        return "bru_kaldi_avx2", flags + ["-mavx2", "-mfma", "-DCPU_CAPABILITY_AVX2", "-DCPU_CAPABILITY=AVX2"]
    return "bru_kaldi_generic", flags + ["-DCPU_CAPABILITY_DEFAULT", "-DCPU_CAPABILITY=DEFAULT"]


def load(verbose: bool = False):
    """Builds (first time) and loads the extension; returns ``torch.ops.bru_kaldi``. Raises on failure."""
    if "ops" not in _loaded:
        import time

        from torch.utils import cpp_extension

        name, flags = build_flags()
        start = time.perf_counter()
        cpp_extension.load(name, [SOURCE], extra_cflags=flags, extra_ldflags=["-fopenmp"], is_python_module=False,
                           verbose=verbose)
        _loaded["ops"] = torch.ops.bru_kaldi
        logging.getLogger(__name__).info("C++ kernels %s ready in %.1f s (built on first use, then cached by torch)",
                                         name, time.perf_counter() - start)
    return _loaded["ops"]


def native_ops(example: torch.Tensor) -> Optional[object]:
    """``torch.ops.bru_kaldi`` if the C++ kernels serve tensors like ``example``, else ``None``
    (the caller runs its TorchScript loop)."""
    if example.device.type != "cpu" or example.dtype not in (torch.float32, torch.float64):
        return None
    chosen = mode()
    if chosen == "0":
        return None
    if "ops" in _loaded:
        return _loaded["ops"]
    if "error" in _loaded and chosen == "auto":
        return None
    try:
        return load()
    except Exception as error:  # no compiler, no ninja, a read-only cache...
        if chosen == "1":
            raise RuntimeError(f"BRU_KALDI_NATIVE=1 but the C++ kernels ({SOURCE}) could not be built: {error}") from error
        _loaded["error"] = error
        warnings.warn(f"the C++ kernels ({SOURCE}) could not be built, so the recurrences run as TorchScript "
                      f"loops (slower on a CPU, same results): {error}. Set BRU_KALDI_NATIVE=0 to silence this.")
        return None


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    load(verbose=True)
    print(f"{build_flags()[0]} ({' '.join(build_flags()[1])}): torch.ops.bru_kaldi")

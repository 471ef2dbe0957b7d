"""The fused C++ kernels of the CPU fast paths (``models/fast/csrc/recurrences.cpp``), built on first use.

The fast paths in :mod:`models.fast.gated` and :mod:`models.fast.scans` run their time loops either
here, one fused pass per step (or per sequence, for the elementwise recursions), or as TorchScript
loops of small ATen kernels. The C++ ops are used for CPU tensors of float32 and float64; the
Triton kernels (:mod:`models.fast.triton_loops`) run CUDA tensors, and the TorchScript loops are the
fallback where neither can run. Both are tested against the reference loop of every unit.

The first use compiles the extension with the machine's C++ compiler (about 15 s on 2 cores) into
torch's extension cache (``$TORCH_EXTENSIONS_DIR``, by default ``~/.cache/torch_extensions``), in a
folder named for the source's hash (:func:`build_directory`); later runs, from any checkout with the
same source, load it from there, and an edited source builds into a new folder. Builds hold a lock
that dies with its process (:func:`build_lock`): a build killed half-way never blocks the next one. ``python -m models.fast.native`` builds it
ahead of time and prints where it is.

``BRU_KALDI_NATIVE`` chooses: ``auto`` (default: build, and if that fails warn once and use
TorchScript), ``1`` (build or raise: what the tests use), ``0`` (never, TorchScript only).

The machinery is an :class:`Extension` (a source, its op namespace, its builds' name), so that other
C++ sources are built the same way without repeating it (the LF-MMI forward-backward of
``bru_kaldi.chain`` is one; this package knows nothing of it). The module's functions
(:func:`native_ops`, :func:`load`, :func:`build_directory`, ...) are those of the recurrences' extension.

>>> import torch
>>> ops = native_ops(torch.zeros(1))  # doctest: +SKIP
>>> c, k, x0 = torch.zeros(3, 1, 2), torch.zeros(2, 2), torch.zeros(1, 2)
>>> ops.softplus_scan(c, k, x0, False).abs().max()  # doctest: +SKIP
tensor(0.)
"""

from __future__ import annotations

import contextlib
import fcntl
import glob
import hashlib
import logging
import os
import sys
import time
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


def isa_builds() -> list[tuple[str, list[str]]]:
    """The builds to try for this CPU, widest vector ISA first: ``[(isa, compiler flags), ...]``, ``isa``
    one of ``avx512``, ``avx2``, ``generic``; an extension's build is named ``<its name>_<isa>``.

    ATen's vector types (SLEEF exp/log1p from libtorch itself) are compiled for the ISA torch itself
    dispatches to on this CPU (``torch.backends.cpu.get_cpu_capability()``): 512-bit vectors where it
    has AVX-512 (with the AVX2 build as the fallback if that build fails), AVX2, or generic code. The
    name says which, so a home directory shared by machines with other CPUs keeps one build per ISA
    instead of loading an illegal instruction.

    >>> isa_builds()[-1][0] in ("avx2", "generic")
    True
    """
    capability = torch.backends.cpu.get_cpu_capability()
    flags = ["-O3", "-fopenmp"]  # at::parallel_for is OpenMP in the header: without it, one thread
    avx2 = ("avx2", flags + ["-mavx2", "-mfma", "-DCPU_CAPABILITY_AVX2", "-DCPU_CAPABILITY=AVX2"])
    if capability == "AVX512":
        return [("avx512", flags + ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mfma",
                                    "-DCPU_CAPABILITY_AVX512", "-DCPU_CAPABILITY=AVX512"]), avx2]
    if capability == "AVX2":
        return [avx2]
    return [("generic", flags + ["-DCPU_CAPABILITY_DEFAULT", "-DCPU_CAPABILITY=DEFAULT"])]


def build_candidates() -> list[tuple[str, list[str]]]:
    """The recurrences' builds to try on this CPU, widest first: ``[(name, compiler flags), ...]``, named
    ``bru_kaldi_avx512``, ``bru_kaldi_avx2`` or ``bru_kaldi_generic`` (see :func:`isa_builds`)."""
    return [(f"bru_kaldi_{isa}", flags) for isa, flags in isa_builds()]


def build_flags() -> tuple[str, list[str]]:
    """The first build to try on this CPU (see :func:`build_candidates`)."""
    return build_candidates()[0]


def _cache_root() -> str:
    return os.environ.get("TORCH_EXTENSIONS_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "torch_extensions")


@contextlib.contextmanager
def build_lock(directory: str, wait_note_seconds: float = 2.0):
    """Hold an exclusive lock on ``directory`` for a build, and clear torch's own lock if it is stale.

    torch's lock is a plain file that a killed build leaves behind, after which every later build waits
    for it forever, silently. Ours is an ``flock``, which the kernel releases when its holder dies, so a
    run never inherits a dead build's lock; while we hold it, a torch lock file in the folder can only
    be stale, and is removed with a warning naming it. A run that has to wait for a live build says so
    within ``wait_note_seconds`` (and names the process and the file), then every 30 s.
    """
    os.makedirs(directory, exist_ok=True)
    path = directory + ".lock"
    log = logging.getLogger(__name__)
    with open(path, "a+") as handle:
        started, noted = time.monotonic(), 0.0
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                waited = time.monotonic() - started
                if waited >= wait_note_seconds and waited - noted >= (30.0 if noted else 0.0):
                    handle.seek(0)
                    owner = handle.read().strip() or "unknown"
                    log.warning("waiting for process %s to finish building the C++ kernels in %s (lock %s, %.0f s so far)",
                                owner, directory, path, waited)
                    noted = waited
                time.sleep(0.2)
        handle.seek(0)
        handle.truncate()
        handle.write(str(os.getpid()))
        handle.flush()
        stale = os.path.join(directory, "lock")
        if os.path.exists(stale):
            log.warning("removing %s, left by a build that was killed (it would make every build wait forever)", stale)
            os.unlink(stale)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


class Extension:
    """One C++ source built on first use into the torch ops of one namespace, by this module's machinery.

    ``source``: the ``.cpp`` file (it registers its ops with ``TORCH_LIBRARY(namespace, m)``);
    ``namespace``: where they appear, ``torch.ops.<namespace>``; ``name``: the builds' prefix (``<name>_avx2``
    ...: the library and its folder in the cache); ``fallback``: what its callers do instead, for the
    warning of a failed build under ``BRU_KALDI_NATIVE=auto``. Each extension keeps its own state: one that
    cannot be built leaves the others usable. Another package builds its own kernels with one of these
    (``bru_kaldi.chain.native`` does, for the LF-MMI forward-backward); this module's functions are the
    recurrences' one.

    >>> kernels = Extension("kernels.cpp", "my_ops", "my_ops", "the torch loop runs instead")
    >>> kernels.build_candidates()[0][0].startswith("my_ops_"), kernels.loaded_build()
    (True, None)
    """

    def __init__(self, source: str, namespace: str, name: str, fallback: str):
        self._source, self.namespace, self.name, self.fallback = source, namespace, name, fallback
        self._state: dict = {}  # "ops", "name" once built; "error" -> why it could not be

    @property
    def source(self) -> str:
        """The C++ file."""
        return self._source

    @property
    def loaded(self) -> dict:
        """The extension's state: ``ops`` and ``name`` once loaded, ``error`` once it could not be built."""
        return self._state

    def build_candidates(self) -> list[tuple[str, list[str]]]:
        """The builds to try on this CPU, widest first: ``[(<name>_<isa>, compiler flags), ...]``."""
        return [(f"{self.name}_{isa}", flags) for isa, flags in isa_builds()]

    def loaded_build(self) -> Optional[str]:
        """The name of the build that was loaded (``<name>_avx2``, ...), None before one was."""
        return self.loaded.get("name")

    def build_directory(self, name: str, flags: list[str]) -> str:
        """Where the source is built: ``<torch's extension cache>/<name>_<hash>``.

        The hash covers the source, the flags and torch's version, so checkouts with the same source share
        one build, an edited source gets a fresh folder (never a half-rebuilt one), and a torch upgrade
        never loads a stale library.
        """
        digest = hashlib.sha256()
        with open(self.source, "rb") as f:
            digest.update(f.read())
        digest.update(" ".join([*flags, torch.__version__, sys.version]).encode())
        return os.path.join(_cache_root(), f"{name}_{digest.hexdigest()[:12]}")

    def load(self, verbose: bool = False):
        """Builds (first time) and loads the extension; returns ``torch.ops.<namespace>``. Raises on failure.

        A finished build leaves a ``built`` marker naming its library: later runs load that library
        directly, without the lock or the compiler (many runs can start at once, also where the disk is
        full). A build killed before its marker is redone.
        """
        if "ops" not in self.loaded:
            candidates = self.build_candidates()
            for i, (name, flags) in enumerate(candidates):
                try:
                    self._load_build(name, flags, verbose, has_fallback=i + 1 < len(candidates))
                    break
                except Exception as error:
                    if i + 1 == len(candidates):
                        raise
                    logging.getLogger(__name__).warning("the %s build of the C++ kernels failed (%s); trying %s",
                                                        name, error, candidates[i + 1][0])
        return self.loaded["ops"]

    def _load_build(self, name: str, flags: list[str], verbose: bool, has_fallback: bool) -> None:
        directory = self.build_directory(name, flags)
        marker, failed = os.path.join(directory, "built"), os.path.join(directory, "failed")
        if os.path.isfile(failed):  # this build failed here before: do not spend the compiler's time again
            with open(failed) as f:
                raise RuntimeError(f"an earlier build in {directory} failed: {f.read().strip()[-500:]}")
        start = time.perf_counter()
        if not os.path.isfile(marker):
            with build_lock(directory):
                if not os.path.isfile(marker):  # else another process finished it while we waited
                    from torch.utils import cpp_extension

                    try:
                        cpp_extension.load(name, [self.source], extra_cflags=flags, extra_ldflags=["-fopenmp"],
                                           is_python_module=False, build_directory=directory, verbose=verbose)
                    except Exception as error:
                        if has_fallback:  # only a build with a fallback is remembered as failed
                            with open(failed, "w") as f:
                                f.write(str(error))
                        raise
                    library = max(glob.glob(os.path.join(directory, "*.so")), key=os.path.getmtime)
                    with open(marker + ".tmp", "w") as f:
                        f.write(os.path.basename(library))
                    os.replace(marker + ".tmp", marker)
        with open(marker) as f:
            torch.ops.load_library(os.path.join(directory, f.read().strip()))
        self.loaded["ops"], self.loaded["name"] = getattr(torch.ops, self.namespace), name
        logging.getLogger(__name__).info("C++ kernels %s ready in %.1f s (built on first use into %s, then cached)",
                                         name, time.perf_counter() - start, directory)

    def native_ops(self, example: torch.Tensor) -> Optional[object]:
        """``torch.ops.<namespace>`` if the C++ kernels serve tensors like ``example`` (CPU, float32 or
        float64, ``BRU_KALDI_NATIVE`` not 0, the build works), else ``None``: the caller runs its fallback."""
        if example.device.type != "cpu" or example.dtype not in (torch.float32, torch.float64):
            return None
        chosen = mode()
        if chosen == "0":
            return None
        if "ops" in self.loaded:
            return self.loaded["ops"]
        if "error" in self.loaded and chosen == "auto":
            return None
        try:
            return self.load()
        except Exception as error:  # no compiler, no ninja, a read-only cache...
            if chosen == "1":
                raise RuntimeError(f"BRU_KALDI_NATIVE=1 but the C++ kernels ({self.source}) could not be built: "
                                   f"{error}") from error
            self.loaded["error"] = error
            warnings.warn(f"the C++ kernels ({self.source}) could not be built, so {self.fallback}: {error}. "
                          f"Set BRU_KALDI_NATIVE=0 to silence this.")
            return None


class _Recurrences(Extension):
    """The recurrences' extension, whose state is this module's globals (``SOURCE``, ``_loaded``,
    ``build_candidates``, ``load``): the names its callers use and its tests replace."""

    source = property(lambda self: SOURCE)
    loaded = property(lambda self: _loaded)

    def build_candidates(self):
        """:func:`build_candidates` (the module's, as the tests replace it)."""
        return build_candidates()

    def load(self, verbose: bool = False):
        """:func:`load` (the module's, as the tests replace it)."""
        return load(verbose)


RECURRENCES = _Recurrences(SOURCE, "bru_kaldi", "bru_kaldi",
                           "the recurrences run as TorchScript loops (slower on a CPU, same results)")


def loaded_build() -> Optional[str]:
    """The name of the recurrences' build that was loaded (``bru_kaldi_avx512``, ...), None before one was."""
    return RECURRENCES.loaded_build()


def build_directory(name: str, flags: list[str]) -> str:
    """Where the recurrences' source is built (see :meth:`Extension.build_directory`)."""
    return RECURRENCES.build_directory(name, flags)


def load(verbose: bool = False):
    """Builds (first time) and loads the recurrences' kernels; returns ``torch.ops.bru_kaldi``. Raises on
    failure (see :meth:`Extension.load`)."""
    return Extension.load(RECURRENCES, verbose)


def native_ops(example: torch.Tensor) -> Optional[object]:
    """``torch.ops.bru_kaldi`` if the recurrences' C++ kernels serve tensors like ``example``, else ``None``
    (the caller runs its TorchScript loop)."""
    return RECURRENCES.native_ops(example)


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    load(verbose=True)
    name, flags = next(c for c in build_candidates() if c[0] == loaded_build())
    print(f"{name} ({' '.join(flags)}) in {build_directory(name, flags)}: torch.ops.bru_kaldi")

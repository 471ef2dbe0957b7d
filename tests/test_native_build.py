"""The C++ kernels' build: a build killed half-way never blocks the next one, and a run that has to wait
for a live build says so within seconds (torch's own lock file would make it wait forever, silently)."""

import logging
import os
import select
import signal
import subprocess
import sys
from pathlib import Path

from models.fast import native

ROOT = Path(__file__).resolve().parents[1]

HOLD = """
import sys, time
sys.path.insert(0, {root!r})
from models.fast.native import build_lock
with build_lock({directory!r}):
    print("holding", flush=True)
    time.sleep({seconds})
print("released", flush=True)
"""


def hold_lock(directory: Path, seconds: float) -> subprocess.Popen:
    """A second process that takes the build lock of ``directory`` and keeps it for ``seconds``."""
    process = subprocess.Popen([sys.executable, "-c", HOLD.format(root=str(ROOT), directory=str(directory), seconds=seconds)],
                               stdout=subprocess.PIPE, text=True)
    assert process.stdout.readline().strip() == "holding"
    return process


def test_a_torch_lock_left_by_a_killed_build_is_removed_and_named(tmp_path, caplog):
    directory = tmp_path / "bru_kaldi_avx2_0123"
    directory.mkdir()
    (directory / "lock").touch()  # what torch's FileBaton leaves when its build is killed
    with caplog.at_level(logging.WARNING), native.build_lock(str(directory)):
        assert not (directory / "lock").exists()
    assert str(directory / "lock") in caplog.text and "killed" in caplog.text


def test_a_killed_builder_releases_the_lock_at_once(tmp_path, caplog):
    directory = tmp_path / "build"
    holder = hold_lock(directory, seconds=60)
    os.kill(holder.pid, signal.SIGKILL)
    holder.wait()
    with caplog.at_level(logging.WARNING), native.build_lock(str(directory), wait_note_seconds=0):
        pass
    assert "waiting for process" not in caplog.text  # the first try took it: nothing to wait for


def test_waiting_for_a_live_build_is_announced_with_its_process(tmp_path, caplog):
    directory = tmp_path / "build"
    holder = hold_lock(directory, seconds=3)
    with caplog.at_level(logging.WARNING), native.build_lock(str(directory), wait_note_seconds=0.5):
        # the lock came only once its holder had let it go: its word of that is already there to read
        assert select.select([holder.stdout], [], [], 0)[0] and holder.stdout.readline().strip() == "released"
    holder.wait()
    assert f"waiting for process {holder.pid}" in caplog.text and str(directory) in caplog.text


def test_the_build_folder_follows_the_source(tmp_path, monkeypatch):
    """Checkouts with the same source share a build; another source (or torch) gets another folder."""
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    name, flags = native.build_flags()
    first = native.build_directory(name, flags)
    assert Path(first).parent == tmp_path and Path(first).name.startswith(name + "_")
    assert native.build_directory(name, flags) == first
    edited = tmp_path / "recurrences.cpp"
    edited.write_bytes(Path(native.SOURCE).read_bytes() + b"\n// edited\n")
    monkeypatch.setattr(native, "SOURCE", str(edited))
    assert native.build_directory(name, flags) != first


def test_a_failed_wider_build_falls_back_to_the_next_and_is_not_retried(tmp_path, monkeypatch):
    """On an AVX-512 CPU the 512-bit build is tried first and the AVX2 build if it fails; a failed build
    leaves a note in its folder, so later runs go straight to the fallback instead of compiling again."""
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    monkeypatch.setattr(native, "_loaded", {})
    candidates = [("bru_kaldi_wide", ["-O1"]), ("bru_kaldi_narrow", ["-O2"])]
    monkeypatch.setattr(native, "build_candidates", lambda: candidates)
    compiled = []

    def fake_compile(name, sources, **kwargs):
        compiled.append(name)
        if name == "bru_kaldi_wide":
            raise RuntimeError("error: unsupported instruction set")
        Path(kwargs["build_directory"], name + ".so").write_bytes(b"")

    from torch.utils import cpp_extension

    monkeypatch.setattr(cpp_extension, "load", fake_compile)
    monkeypatch.setattr(native.torch.ops, "load_library", lambda path: None)
    native.load()
    assert compiled == ["bru_kaldi_wide", "bru_kaldi_narrow"] and native.loaded_build() == "bru_kaldi_narrow"
    failed = Path(native.build_directory(*candidates[0]), "failed")
    assert "unsupported instruction set" in failed.read_text()
    monkeypatch.setattr(native, "_loaded", {})
    native.load()  # the next process: no second attempt at the wide build, the narrow one is cached
    assert compiled == ["bru_kaldi_wide", "bru_kaldi_narrow"] and native.loaded_build() == "bru_kaldi_narrow"

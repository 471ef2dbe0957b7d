"""The shape of the project: what lives where, which way imports point, and what a wheel installs.

The layout is a promise to users (the top level is their view: ``run_exp.py``, ``data_io.py``,
``models/``, ``cfg/``...) and to contributors (one library package, dependencies pointing down),
so it is tested like behaviour.
"""

import ast
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LIBRARY = sorted((ROOT / "bru_kaldi").rglob("*.py"))
MODELS = sorted((ROOT / "models").rglob("*.py"))
TOP = [ROOT / "run_exp.py", ROOT / "data_io.py", ROOT / "compare.py", ROOT / "transcribe.py"]
OURS = LIBRARY + MODELS + TOP + sorted((ROOT / "recipes").rglob("*.py")) + sorted((ROOT / "bench").rglob("*.py"))


def imported(path: Path) -> set[str]:
    """The top-level names of every module ``path`` imports, wherever the import statement is."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def test_the_top_level_python_files_are_the_entry_points():
    loose = sorted(p.name for p in ROOT.glob("*.py"))
    assert loose == ["compare.py", "data_io.py", "run_exp.py", "transcribe.py"], \
        f"library modules belong in bru_kaldi/: {loose}"


def _relative(path: Path) -> str:
    return str(path.relative_to(ROOT))


def test_dependencies_point_down():
    """models/ stands alone; the library never imports a recipe, the data pipeline or the entry point.
    One test for every module, naming each that breaks the rule."""
    offenders = []
    for path in LIBRARY + MODELS + TOP:
        names = imported(path)
        wrong = names & {"recipes"} | (names & {"run_exp"} if path.name != "run_exp.py" else set()) | (
            names & {"compare"} if path.name != "compare.py" else set())
        if path in LIBRARY:
            wrong |= names & {"data_io"}  # bru_kaldi sits under data_io, not over it
        if path in MODELS:
            wrong |= names & {"bru_kaldi", "data_io"}  # models/ is importable without the rest of the toolkit
        if wrong:
            offenders.append(f"{_relative(path)} imports {sorted(wrong)}")
    assert not offenders, offenders


def _module(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def test_the_library_names_its_modules_that_import_the_units():
    """bru_kaldi/__init__.py says which of the library's modules import ``models``; exactly those do."""
    importers = {_module(p).removeprefix("bru_kaldi.") for p in LIBRARY if "models" in imported(p)}
    text = " ".join(ast.get_docstring(ast.parse((ROOT / "bru_kaldi" / "__init__.py").read_text())).split())
    said = re.search(r"modules here import ``models``: (.*?);", text)
    assert said, "bru_kaldi/__init__.py does not say which of its modules import models"
    assert set(re.findall(r"``([\w.]+)`` \(", said.group(1))) == importers, (said.group(1), sorted(importers))


def test_the_library_has_no_import_cycle():
    """No chain of imports in bru_kaldi/ comes back to where it started, counting the imports inside
    functions (which hide a cycle from Python without removing it)."""
    modules = {_module(p): p for p in LIBRARY}
    graph = {}
    for name, path in modules.items():
        found = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module.startswith("bru_kaldi"):
                found |= {f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in modules else node.module
                          for a in node.names}
            elif isinstance(node, ast.Import):
                found |= {a.name for a in node.names}
        graph[name] = {m for m in found if m in modules and m != name}

    def cycle_from(start, node, path):
        for following in graph[node]:
            if following == start:
                return path + [start]
            if following not in path:
                found = cycle_from(start, following, path + [following])
                if found:
                    return found
        return None

    cycles = {" -> ".join(c) for c in (cycle_from(m, m, [m]) for m in graph) if c}
    assert not cycles, sorted(cycles)


def test_the_bayesian_units_do_not_inherit_from_the_baselines():
    for name in ("bru.py", "ubru.py", "tpami.py"):
        assert "models.gated" not in (ROOT / "models" / name).read_text(), name


def test_code_cites_nothing_outside_the_repository():
    offenders = [_relative(p) for p in OURS
                 if re.search(r"field[ -]notes|issue \d|\.\./shared", p.read_text(), flags=re.I)]
    assert not offenders, offenders


LONG = 400  # lines: about what a reader takes in at one sitting


def test_every_module_says_what_it_does_and_a_long_one_why_it_is_one():
    """Each module does one job and says which in the first line of its docstring (a C++ file: its opening
    comment). A module longer than :data:`LONG` lines is allowed, but its opening says why it is one
    module, in a sentence with "long because": length is a cost to the reader that needs a reason, not
    a limit to trim code under (a hard limit only moves code to where it does not belong)."""
    offenders = []
    for path in LIBRARY + MODELS + TOP + sorted([*ROOT.glob("models/**/csrc/*.cpp"), *ROOT.glob("bru_kaldi/**/csrc/*.cpp")]):
        text = path.read_text()
        if path.suffix == ".py":
            docstring = ast.get_docstring(ast.parse(text)) or ""
            if not docstring.strip() and path.name != "__init__.py" or (docstring and not docstring.splitlines()[0].strip()):
                offenders.append(f"{_relative(path)}: no docstring whose first line says what it does")
        if text.count("\n") > LONG:
            head = " ".join(re.sub(r"^\s*//", "", text[:5000], flags=re.M).split()).lower()  # C++ comments joined
            if "long because" not in head:
                offenders.append(f"{_relative(path)}: {text.count(chr(10))} lines, and its opening does not say why "
                                 f"(\"long because ...\")")
    assert not offenders, offenders


def test_a_wheel_installs_the_units_for_other_projects(tmp_path):
    """What ``pip install -e .`` / a wheel gives another project: ``from models import build`` and the
    library, with the C++ source beside the kernels' loader, from any working directory."""
    source = tmp_path / "src"
    keep = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in ("models", "bru_kaldi"):
        shutil.copytree(ROOT / name, source / name, ignore=keep)
    for name in ("pyproject.toml", "README.md", "requirements.txt", "data_io.py", "run_exp.py", "compare.py",
                 "transcribe.py"):
        shutil.copy(ROOT / name, source / name)
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                            "-w", str(tmp_path / "dist"), str(source)], capture_output=True, text=True)
    assert build.returncode == 0, build.stderr[-2000:]
    (wheel,) = (tmp_path / "dist").glob("bru_kaldi-*.whl")
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    assert (site / "models/fast/csrc/recurrences.cpp").is_file()
    assert (site / "bru_kaldi/chain/csrc/forward_backward.cpp").is_file()
    code = ("import torch, models, bru_kaldi.config, data_io\n"
            "from models import build\n"
            "from models.fast import native\n"
            "import os\n"
            "print(build('libru', 3, 4)(torch.randn(2, 5, 3), [5, 3]).shape[-1], os.path.isfile(native.SOURCE),\n"
            "      models.__file__.startswith(os.environ['SITE']))")
    elsewhere = tmp_path / "another_project"
    elsewhere.mkdir()
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=elsewhere,
                         # the wheel first, then where this Python finds the dependencies if not in its site-packages
                         env={"PYTHONPATH": os.pathsep.join([str(site)] + [p for p in [os.environ.get("PYTHONPATH")] if p]),
                              "SITE": str(site), "PATH": "/usr/bin:/bin",
                              "BRU_KALDI_NATIVE": "0"})  # the kernels build elsewhere in the suite
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.split() == ["4", "True", "True"]

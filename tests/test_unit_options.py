"""Each unit option has one home, its unit's code (``models.unit_options``: a cell's ``__init__`` signature):
the config check, the option lists and the docs read it there. A unit defined outside the package trains from
a config that sets its option, with nothing else edited; configs and runs resolved before the units declared
their options still read back, resume and group with the runs made since."""

import ast
import dataclasses
import logging
import re
import shlex
import sys
from pathlib import Path

import pytest

import models
from bru_kaldi.config import Architecture, LEGACY_UNIT_DEFAULTS, ConfigError, parse_config, write_resolved

ROOT = Path(__file__).resolve().parents[1]
ALL_UNITS = models.UNITS + models.CONV_UNITS


def declared() -> set[tuple[str, str]]:
    """``(option, unit)`` for every option of every shipped unit, as the code declares it."""
    return {(option, unit) for unit in ALL_UNITS for option in models.unit_options(unit)}


def table(text: str, after: str) -> list[list[str]]:
    """The cells of the markdown table that follows ``after`` in ``text``, header and rule left out."""
    lines = text[text.index(after):].splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("|"))
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip("|").split(" | ")])
    return rows


def named(cell: str) -> list[str]:
    return re.findall(r"`([a-z_0-9]+)`", cell)


def test_cfg_readme_documents_every_option_of_every_unit_as_declared():
    """cfg/README.md's table of unit options: each (option, unit) pair the code declares, and no other."""
    rows = table((ROOT / "cfg" / "README.md").read_text(), "Unit-specific options of `[architectureN]`")
    documented = {(option, unit) for options, units, _ in rows for option in named(options) for unit in named(units)}
    assert documented == declared(), (f"undocumented: {sorted(declared() - documented)}; "
                                      f"documented but not declared: {sorted(documented - declared())}")


def test_the_unit_tables_list_every_unit():
    """README.md's table of units names each unit a config can use; models/__init__.py's each recurrent one."""
    readme = {name for row in table((ROOT / "README.md").read_text(), "## Recurrent units") for name in named(row[0])}
    assert readme == set(ALL_UNITS), (sorted(set(ALL_UNITS) - readme), sorted(readme - set(ALL_UNITS)))
    guide = set(re.findall(r"^``([a-z_]+)``\s", models.__doc__, re.M))
    assert guide == set(models.UNITS), (sorted(set(models.UNITS) - guide), sorted(guide - set(models.UNITS)))


def test_no_option_of_a_unit_is_declared_outside_its_unit():
    """The config schema has no field of a unit's option, and the code between a config and the units names
    none (what it knows of them it reads from the units); config.py names only the one an older resolved
    config wrote at its old default (LEGACY_UNIT_DEFAULTS)."""
    options = {option for option, _ in declared()}
    assert not options & {f.name for f in dataclasses.fields(Architecture)}
    for path, allowed in ((ROOT / "bru_kaldi" / "network.py", set()),
                          (ROOT / "bru_kaldi" / "config.py", set(LEGACY_UNIT_DEFAULTS))):
        strings = {node.value for node in ast.walk(ast.parse(path.read_text()))
                   if isinstance(node, ast.Constant) and isinstance(node.value, str)}
        assert strings & options <= allowed, (path.name, sorted(strings & options - allowed))


def test_the_declared_options_are_what_the_units_take():
    """The declaration is the code's: each option has a default (or is required), and a unit built with every
    variant the tests sweep takes them; a name outside the declaration is refused by build."""
    for unit in models.UNITS:
        for _, options in models.variants(unit):
            assert set(options) <= set(models.unit_options(unit)), (unit, options)
    assert models.unit_options("cnn")["kernel_sizes"].default is models.unit_options("cnn")["kernel_sizes"].empty
    assert models.first_layer_options("fusionrnn") == ("mics", "fusion_act", "fusion_reduce")
    assert models.first_layer_options("sincnet") == ("sample_rate", "min_low_hz", "min_band_hz")
    assert [u for u in ALL_UNITS if models.has_inner_dropout(u)] == [
        "ligru", "gru", "lstm", "rnn", "mlp", "qlstm", "fusionrnn", "cnn", "sincnet"]
    with pytest.raises(ValueError, match=r"unknown option for ubru 'rho' \(did you mean 'rho0'\?\)"):
        models.build("ubru", 3, 4, rho=0.5)


TOY = '''
"""A toy unit with one option, registered from outside the package."""
import torch

import models
from models.recurrent import RecurrentMatrixCell

BUILT = []  # the leak of every cell built, as it reached the cell


class LeakyCell(RecurrentMatrixCell):
    """h_t = (1 - leak) tanh(W x_t + U h_{t-1}) + leak h_{t-1}"""

    def __init__(self, hidden_size: int, leak: float = 0.0):
        if not 0.0 <= leak < 1.0:
            raise ValueError(f"leak must be in [0, 1), got {leak}")
        super().__init__(hidden_size)
        self.leak = leak
        BUILT.append(leak)

    def step(self, proj_t, state):
        h = (1 - self.leak) * torch.tanh(proj_t + self.recurrent(state[0])) + self.leak * state[0]
        return (h,), (h,)


models.register_unit("leaky", LeakyCell)
'''


@pytest.fixture
def toy_unit(tmp_path, monkeypatch):
    """The toy unit's module, imported from a temporary folder; the registry is put back afterwards."""
    import importlib

    monkeypatch.setattr(models, "_CELLS", dict(models._CELLS))
    monkeypatch.setattr(models, "UNITS", models.UNITS)
    monkeypatch.setattr(models, "BAYESIAN_UNITS", models.BAYESIAN_UNITS)
    (tmp_path / "toy_unit_module.py").write_text(TOY)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "toy_unit_module", raising=False)
    module = importlib.import_module("toy_unit_module")
    yield module
    sys.modules.pop("toy_unit_module", None)


@pytest.mark.slow  # trains an epoch on the tiny corpus in-process
def test_a_unit_from_a_temporary_module_trains_from_a_config_that_sets_its_option(toy_unit, tiny_corpus, tmp_path,
                                                                                   monkeypatch, one_thread):
    import run_exp

    monkeypatch.setenv("MINI_TIMIT", str(tiny_corpus.root))
    text = (ROOT / "tests" / "data" / "tiny_liBRU.cfg").read_text()
    assert "unit = libru\n" in text

    def run(options: str, name: str) -> tuple[int, Path]:
        cfg = tmp_path / f"{name}.cfg"
        cfg.write_text(text.replace("unit = libru\n", f"unit = leaky\n{options}\n"))
        monkeypatch.setenv("BRU_TEST_EXP", str(tmp_path / name))
        code = run_exp.main([str(cfg), "--stop-stage", "train", "--exp,n_epochs_tr=1"])
        logging.shutdown()
        return code, tmp_path / name

    code, folder = run("leak = 0.25", "trained")
    assert code == 0, (folder / "log.txt").read_text()[-3000:]
    assert toy_unit.BUILT and set(toy_unit.BUILT) == {0.25} and all(type(v) is float for v in toy_unit.BUILT)
    assert re.match(r"epoch=001 .* dev_err=", (folder / "res.res").read_text())
    resolved = (folder / "config.resolved.cfg").read_text()
    assert "\nunit = leaky\n" in resolved and "\nleak = 0.25\n" in resolved
    assert parse_config(folder / "config.resolved.cfg").architectures[0].unit_options == {"leak": "0.25"}
    # the unit's own check and its declaration name what is wrong, before any data is read
    toy_unit.BUILT.clear()
    for options, message in (("leak = 1.5", "leak must be in [0, 1), got 1.5"),
                             ("lek = 0.25", "unknown option 'lek' (did you mean 'leak'?)"),
                             ("leak = lots", "option leak: expected a number, got 'lots'")):
        with pytest.raises(ConfigError, match=re.escape(message)):
            run_exp.run([str(_write(tmp_path, text.replace("unit = libru\n", f"unit = leaky\n{options}\n")))])
    assert not (tmp_path / "bad").exists()


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "bad.cfg"
    path.write_text(text.replace("$BRU_TEST_EXP", str(tmp_path / "bad")))
    return path


# --------------------------------------------------------------------------- resolved configs written before
STUDY = ROOT / "results" / "study_runs" / "layout2"


def _archived_runs():
    return sorted(STUDY.glob("*/*/seed1"))


def test_the_archived_study_is_there_to_check_against():
    """The test below takes one run of each archived system: none found would leave it nothing to check."""
    assert len(_archived_runs()) >= 10, f"no archived study runs in {STUDY}: point the tests below at the study kept"


def _resolved_again(folder: Path, seed: int, out_folder: str):
    """The config of the command line in ``folder``'s log, with another seed and folder, checked as run_exp.py
    checks it: what a further seed of that archived system is resolved from now."""
    from bru_kaldi.network import check_architectures

    command = shlex.split((folder / "log.txt").read_text().splitlines()[0].split(" ", 1)[1])
    assert command[0] == "run_exp.py", command
    overrides = [a for a in command[2:] if not a.startswith(("--exp,seed=", "--exp,out_folder="))]
    config = parse_config(ROOT / command[1], overrides + [f"--exp,seed={seed}", f"--exp,out_folder={out_folder}"])
    check_architectures(config)
    return config


@pytest.mark.parametrize("folder", _archived_runs(), ids=lambda f: f"{f.parent.parent.name}/{f.parent.name}")
def test_a_new_seed_of_an_archived_system_is_one_of_its_seeds(folder, tmp_path, monkeypatch):
    """The study's runs were resolved when the schema listed every unit's options in every architecture; a
    run of the same command now writes its unit's options alone, and must still be a seed of that system
    (compare.py groups seeds by what their resolved configs share)."""
    from bru_kaldi.comparison.runs import read_run

    monkeypatch.chdir(ROOT)
    config = _resolved_again(folder, 9, str(tmp_path / "seed9"))
    (tmp_path / "seed9").mkdir()
    write_resolved(config, tmp_path / "seed9" / "config.resolved.cfg")
    old, new = read_run(folder), read_run(tmp_path / "seed9")
    if "grid=" in (folder / "res.res").read_text():
        assert new.key == old.key, sorted(old.options ^ new.options)
    else:  # decoded before grids grew: its config's grid may have moved since (the word configs' scales did),
        # and nothing else
        assert {option for option, _ in old.options ^ new.options} <= {"[decoding] acwt_sweep"}, \
            sorted(old.options ^ new.options)


def test_a_folder_resolved_before_the_units_declared_their_options_resumes(tmp_path, monkeypatch):
    """check_same_experiment: the archived resolved config of MINI_UBRU_kalman against the one this code writes
    for its command: the same experiment. Another backward recursion, or none, is a different one. The old
    file also reads back as a config, its options left to the units saying nothing."""
    from bru_kaldi.experiment import Experiment, check_same_experiment
    from bru_kaldi.network import build_model

    monkeypatch.chdir(ROOT)
    folder = STUDY / "phones" / "MINI_UBRU_kalman" / "seed1"
    old_text = (folder / "config.resolved.cfg").read_text()
    exp = Experiment(tmp_path / "exp")
    exp.folder.mkdir()
    exp.resolved.write_text(old_text)
    exp.final.write_bytes(b"")  # a trained folder (check_same_experiment looks for the file alone)
    out_folder = re.search(r"^out_folder = (.*)$", old_text, re.M).group(1)
    config = _resolved_again(folder, 1, out_folder)
    assert config.architectures[0].unit_options == {"backward": "kalman"}
    write_resolved(config, tmp_path / "now.cfg")
    check_same_experiment(exp, (tmp_path / "now.cfg").read_text(), "now.cfg")
    for edit in ({"backward": "hmm"}, {}):
        config.architectures[0].unit_options = edit
        write_resolved(config, tmp_path / "now.cfg")
        with pytest.raises(ConfigError, match=r"\[architecture1\] backward: 'kalman' -> "):
            check_same_experiment(exp, (tmp_path / "now.cfg").read_text(), "now.cfg")
    old = parse_config(folder / "config.resolved.cfg")
    model, _ = build_model(old, input_dim=13, num_pdfs=5, num_mono=None)
    assert model.stacks[0].layers[0].cells[0].backward == "kalman"

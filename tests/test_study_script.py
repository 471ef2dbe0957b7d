"""recipes/mini_timit/run_study.sh: what each stage asks compare.py to do, and the archive it restores from.

The script is run with a stand-in ``python`` first on PATH that records its arguments instead of training,
so the test checks the orchestration (configs, seeds, overrides, the pairs it names, which archived runs it
copies back) in a second, not the study itself (hours; its parts are tested in test_compare.py).
"""

import os
import shlex
import subprocess
from pathlib import Path

from bru_kaldi.comparison.runs import find_runs, group
from tests.test_compare import fake_run

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "recipes" / "mini_timit" / "run_study.sh"


def run_script(tmp_path, *options):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    calls = tmp_path / "calls"
    fake = bin_dir / "python"
    fake.write_text(f"#!/bin/sh\nfor a in \"$@\"; do printf '%s\\t' \"$a\"; done >> {shlex.quote(str(calls))}\n"
                    f"echo >> {shlex.quote(str(calls))}\n")
    fake.chmod(0o755)
    env = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    result = subprocess.run(["bash", str(SCRIPT), "--out", str(tmp_path / "out"), "--archive", str(tmp_path / "kept"),
                             *options], env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    lines = calls.read_text().splitlines() if calls.exists() else []
    return [line.rstrip("\t").split("\t") for line in lines]


def test_the_stages_sweep_phones_words_and_plain_rmsprop_then_make_the_tables(tmp_path):
    calls = run_script(tmp_path)
    verbs = [(c[0], c[1]) for c in calls]
    assert verbs[:5] == [("compare.py", "sweep")] * 5
    phones, phones_stacked, words, plain, plain_stacked = calls[:5]
    phone_cfgs = [a for a in phones + phones_stacked if a.endswith(".cfg")]
    assert len(phone_cfgs) == 15 and "cfg/MINI_MGU.cfg" in phone_cfgs and "cfg/MINI_liGRU_UBRU.cfg" in phone_cfgs
    assert all((ROOT / cfg).is_file() for cfg in phone_cfgs)
    for sweep in calls[:5]:
        assert "--exp,n_epochs_tr=24" in sweep and "--exp,patience=2" in sweep and "1,2,3" in sweep
    assert [a for a in words if a.endswith(".cfg")] == ["cfg/MINIW_liBRU.cfg", "cfg/MINIW_liGRU.cfg", "cfg/MINIW_LSTM.cfg"]
    # the study's one optimiser: bias-corrected RMSprop in every architecture, also where a config ships
    # with plain RMSprop (cfg/MINI_LSTM.cfg does)
    assert "opt_bias_correction = False" in (ROOT / "cfg" / "MINI_LSTM.cfg").read_text()
    for sweep in (phones, words):
        assert "--architecture1,opt_bias_correction=True" in sweep and not any("architecture2" in a for a in sweep)
    assert [a for a in phones_stacked if a.endswith(".cfg")] == ["cfg/MINI_liGRU_UBRU.cfg"]
    assert {"--architecture1,opt_bias_correction=True", "--architecture2,opt_bias_correction=True"} <= set(phones_stacked)
    assert str(tmp_path / "out" / "phones") in phones and str(tmp_path / "out" / "phones") in phones_stacked
    # the "before" of the seeds fix: every phone config, plain RMSprop in each of its architectures
    assert sorted(a for a in plain + plain_stacked if a.endswith(".cfg")) == sorted(phone_cfgs)
    assert "--architecture1,opt_bias_correction=False" in plain and not any("architecture2" in a for a in plain)
    assert [a for a in plain_stacked if a.endswith(".cfg")] == ["cfg/MINI_liGRU_UBRU.cfg"]
    assert {"--architecture1,opt_bias_correction=False", "--architecture2,opt_bias_correction=False"} <= set(plain_stacked)
    assert str(tmp_path / "out" / "phones_plain") in plain and str(tmp_path / "out" / "phones_plain") in plain_stacked
    # nothing archived or run (the stand-in trains nothing): the phone table only, from the archive
    tables = [c for c in calls if c[:2] == ["compare.py", "table"]]
    assert len(tables) == 1 and tables[0][2] == str(tmp_path / "kept" / "phones")


def test_stage_4_archives_and_pairs_each_config_with_its_plain_twin_by_the_name_the_table_gives(tmp_path):
    kept = tmp_path / "kept"
    for task in ("phones", "phones_plain"):
        (tmp_path / "out" / task).mkdir(parents=True)
    for task, extra in (("phones", ""), ("phones_plain", "opt_bias_correction = False\n")):
        folder = kept / task / "MINI_liGRU_UBRU" / "seed1"
        fake_run(folder, "MINI_liGRU_UBRU", "ligru", 1, [1] * 30, 20, 20)
        resolved = folder / "config.resolved.cfg"
        resolved.write_text(resolved.read_text().replace("sizes = 8,8\n", "sizes = 8,8\n" + extra))
    calls = run_script(tmp_path, "--stage", "4")
    archives = [c for c in calls if c[:2] == ["compare.py", "archive"]]
    assert [c[2:] for c in archives] == [[str(tmp_path / "out" / t), str(kept / t)] for t in ("phones", "phones_plain")]
    fix = next(c for c in calls if "study-seeds-fix" in c)
    assert fix[2:4] == [str(kept / "phones"), str(kept / "phones_plain")]
    pairs = [p.split(":") for p in fix[fix.index("--pairs") + 1].split(",")]
    assert len(pairs) == 15 and ["MINI_MGU", "MINI_MGU(opt_bias_correction=False)"] in pairs
    # the names asked for are the names the table gives the two systems
    names = [s.name for s in group(find_runs([str(kept / "phones" / "*" / "seed*"), str(kept / "phones_plain" / "*" / "seed*")]))]
    assert ["MINI_liGRU_UBRU", "MINI_liGRU_UBRU(opt_bias_correction=False)"] == names
    assert names in pairs


def test_a_sweep_stage_copies_back_the_archived_runs_it_lacks_and_keeps_the_finished_ones(tmp_path):
    kept, out = tmp_path / "kept" / "phones" / "MINI_GRU", tmp_path / "out" / "phones" / "MINI_GRU"
    for seed in (1, 2):
        fake_run(kept / f"seed{seed}", "MINI_GRU", "gru", seed, [1] * 30, 20, 20)
    (out / "seed2" / ".done").mkdir(parents=True)
    (out / "seed2" / ".done" / "decode").write_text("")
    (out / "seed2" / "mine").write_text("a finished run of this clone")
    run_script(tmp_path, "--stop-stage", "1")
    assert (out / "seed1" / "config.resolved.cfg").read_text() == (kept / "seed1" / "config.resolved.cfg").read_text()
    assert (out / "seed2" / "mine").is_file() and not (out / "seed2" / "config.resolved.cfg").exists()


def test_a_bad_option_value_stops_with_the_usage(tmp_path):
    result = subprocess.run(["bash", str(SCRIPT), "--stage", "two"], capture_output=True, text=True, timeout=60)
    assert result.returncode != 0 and "--stage" in result.stderr and "Usage" in result.stderr

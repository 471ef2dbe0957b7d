"""recipes/mini_timit/run_lfmmi.sh: what each stage asks compare.py to do, and the archive it restores from
(the orchestration, with a stand-in ``python`` as tests/test_study_script.py runs run_study.sh)."""

import subprocess
from pathlib import Path

from tests.test_compare import fake_run
from tests.test_study_script import ROOT, run_script

SCRIPT = ROOT / "recipes" / "mini_timit" / "run_lfmmi.sh"


def configs(call):
    return [a for a in call if a.endswith(".cfg")]


def test_the_sweeps_pair_each_unit_with_its_chain_model_then_the_ablation_and_the_choices(tmp_path):
    calls = run_script(tmp_path, "--stop-stage", "3", script=SCRIPT)
    assert all(c[:2] == ["compare.py", "sweep"] for c in calls) and len(calls) == 3 + 4
    words, phones, ablation, *choices = calls
    units = ("liBRU", "liGRU", "LSTM")
    assert configs(words) == [f"cfg/MINIW_{u}{s}.cfg" for u in units for s in ("", "_lfmmi")]
    assert configs(phones) == [f"cfg/MINI_{u}{s}.cfg" for u in units for s in ("", "_lfmmi")]
    assert [c[c.index("--seeds") + 1] for c in (words, phones, ablation)] == ["1-5", "1-5", "1-3"]
    fixes = ("first", "weights", "initial", "chain", "schedule", "without_schedule")
    assert configs(ablation) == [f"cfg/lfmmi_ablation/MINIW_liGRU_lfmmi_{f}.cfg" for f in fixes]
    assert all((ROOT / cfg).is_file() for call in calls for cfg in configs(call))
    # the recipe's choices: the word task's Li-GRU at seeds 1-2, each with its one option, each in its folder
    assert [configs(c) for c in choices] == [["cfg/MINIW_liGRU_lfmmi.cfg"]] * 4
    assert [[a for a in c if a.startswith("--model,")] for c in choices] == [
        ["--model,lfmmi_phone_lm_order=1"], ["--model,lfmmi_phone_lm_order=3"], ["--model,lfmmi_phone_lm_order=4"],
        ["--model,frame_subsampling=splice"]]
    outs = [c[c.index("--out") + 1] for c in choices]
    assert len(set(outs)) == 4 and all(c[c.index("--seeds") + 1] == "1-2" for c in choices)


def test_stage_4_archives_and_tables_lfmmi_against_cross_entropy(tmp_path):
    (tmp_path / "out" / "words").mkdir(parents=True)
    kept = tmp_path / "kept"
    for seed in (1, 4):  # the word task's runs before this stage: seed 1 is the ablation's, seed 4 is not
        fake_run(kept / "words" / "MINIW_liGRU_lfmmi" / f"seed{seed}", "MINIW_liGRU_lfmmi", "ligru", seed, [1] * 30, 20, 20)
    calls = run_script(tmp_path, "--stage", "4", script=SCRIPT)
    archives = [c[2:] for c in calls if c[:2] == ["compare.py", "archive"]]
    assert archives == [[str(tmp_path / "out" / "words"), str(tmp_path / "kept" / "words")]]
    tables = {c[c.index("--section") + 1]: c for c in calls if c[:2] == ["compare.py", "table"]}
    assert set(tables) == {"lfmmi-words", "lfmmi-phones", "lfmmi-ablation", "lfmmi-choices"}
    pairs = tables["lfmmi-words"][tables["lfmmi-words"].index("--pairs") + 1].split(",")
    assert pairs == [f"MINIW_{u}_lfmmi:MINIW_{u}" for u in ("liBRU", "liGRU", "LSTM")]
    ablation = tables["lfmmi-ablation"]
    assert ablation[ablation.index("--baseline") + 1] == "MINIW_liGRU_lfmmi_first"
    assert {f"MINIW_liGRU_lfmmi_{f}:MINIW_liGRU_lfmmi_first" for f in ("weights", "initial", "chain", "schedule")} | \
        {"MINIW_liGRU_lfmmi:MINIW_liGRU_lfmmi_without_schedule"} <= set(ablation[ablation.index("--pairs") + 1].split(","))
    # the full recipe and cross-entropy at the ablation's seeds: the word task's runs as they were, kept beside it
    assert ablation[2:3] == [str(kept / "ablation")]
    assert sorted(p.name for p in (kept / "ablation" / "baselines" / "MINIW_liGRU_lfmmi").iterdir()) == ["seed1"]
    assert [p.name for p in (kept / "choices" / "recipe" / "MINIW_liGRU_lfmmi").iterdir()] == ["seed1"]
    choices = tables["lfmmi-choices"]  # the recipe first: its runs keep the config's name
    assert choices[2:4] == [str(kept / "choices" / "recipe"), str(kept / "choices" / "order1")]
    # a later stage 4, after the word runs were made again, leaves those copies as they were
    (kept / "words" / "MINIW_liGRU_lfmmi" / "seed1" / "res.res").write_text("rerun\n")
    run_script(tmp_path, "--stage", "4", script=SCRIPT)
    assert (kept / "ablation" / "baselines" / "MINIW_liGRU_lfmmi" / "seed1" / "res.res").read_text() != "rerun\n"
    for section in tables:
        assert f"<!-- compare.py {section} -->" in (ROOT / "RESULTS.md").read_text()


def test_a_stage_copies_back_only_its_configs_archived_runs(tmp_path):
    kept, out = tmp_path / "kept" / "words", tmp_path / "out" / "words"
    fake_run(kept / "MINIW_liGRU" / "seed1", "MINIW_liGRU", "ligru", 1, [1] * 30, 20, 20)
    fake_run(kept / "MINI_GRU" / "seed1", "MINI_GRU", "gru", 1, [1] * 30, 20, 20)  # not a word config
    run_script(tmp_path, "--stop-stage", "1", script=SCRIPT)
    assert (out / "MINIW_liGRU" / "seed1" / "config.resolved.cfg").is_file() and not (out / "MINI_GRU").exists()


def test_a_bad_option_value_stops_with_the_usage():
    result = subprocess.run(["bash", str(SCRIPT), "--jobs", "two"], capture_output=True, text=True, timeout=60)
    assert result.returncode != 0 and "--jobs" in result.stderr and "Usage" in result.stderr

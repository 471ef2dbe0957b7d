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


def run_script(tmp_path, *options, seconds=0, script=SCRIPT):
    """Run the script with a stand-in python that records each call as a line of tab-separated arguments
    (one write, so that calls side by side do not mix); with ``seconds``, each call then waits that long
    and records the line ``ended``."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    calls = tmp_path / "calls"
    fake = bin_dir / "python"
    fake.write_text(f"#!/bin/bash\nline=$(printf '%s\\t' \"$@\")\necho \"$line\" >> {shlex.quote(str(calls))}\n"
                    + (f"sleep {seconds}\necho ended >> {shlex.quote(str(calls))}\n" if seconds else ""))
    fake.chmod(0o755)
    env = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    result = subprocess.run(["bash", str(script), "--out", str(tmp_path / "out"), "--archive", str(tmp_path / "kept"),
                             *options], env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    lines = calls.read_text().splitlines() if calls.exists() else []
    return [line.rstrip("\t").split("\t") for line in lines]


def test_the_stages_sweep_the_claims_configs_and_the_word_task_then_make_the_tables(tmp_path):
    calls = run_script(tmp_path)
    verbs = [(c[0], c[1]) for c in calls]
    assert verbs == [("compare.py", "sweep")] * 3  # nothing archived or run: no table yet; no stage 3 unasked
    # asked for more phone seeds, stage 3 sweeps them after seeds 1-5 of both tasks, as stage 1 did
    calls = run_script(tmp_path, "--more-seeds", "6-10")[3:]
    assert [(c[0], c[1]) for c in calls] == [("compare.py", "sweep")] * 5
    phones, phones_stacked, words, more, more_stacked = calls
    def seeds_of(sweep):
        return sweep[sweep.index("--seeds") + 1]

    def besides_seeds(sweep):
        return [a for a in sweep if a != seeds_of(sweep)]

    assert [seeds_of(c) for c in (more, more_stacked)] == ["6-10"] * 2
    assert besides_seeds(more) == besides_seeds(phones) and besides_seeds(more_stacked) == besides_seeds(phones_stacked)
    phone_cfgs = [a for a in phones + phones_stacked if a.endswith(".cfg")]
    assert len(phone_cfgs) == 13 and all((ROOT / cfg).is_file() for cfg in phone_cfgs)
    # every system a claim names is trained, on its task
    for claims, cfgs in (("claims_phones.tsv", phone_cfgs), ("claims_words.tsv", words)):
        rows = [line.split("\t") for line in (ROOT / "results" / claims).read_text().splitlines()[1:] if line]
        named = {name for row in rows for name in row[3].split(":")}
        assert {f"cfg/{name}.cfg" for name in named} <= set(cfgs), (claims, named)
    for sweep, seeds in ((phones, "1-5"), (phones_stacked, "1-5"), (words, "1-5")):
        assert "--exp,n_epochs_tr=24" in sweep and "--exp,patience=2" in sweep
        assert seeds_of(sweep) == seeds
    assert [a for a in words if a.endswith(".cfg")] == ["cfg/MINIW_liBRU.cfg", "cfg/MINIW_liGRU.cfg", "cfg/MINIW_LSTM.cfg"]
    # one optimiser and one rate in every architecture, also where a config ships with others
    assert "opt_bias_correction = False" in (ROOT / "cfg" / "MINI_GRU.cfg").read_text()
    assert "arch_lr = 0.001" in (ROOT / "cfg" / "MINI_liGRU_UBRU.cfg").read_text()
    for sweep in (phones, words):
        assert {"--architecture1,opt_bias_correction=True", "--architecture1,arch_lr=0.002"} <= set(sweep)
        assert not any("architecture2" in a for a in sweep)
    assert [a for a in phones_stacked if a.endswith(".cfg")] == ["cfg/MINI_liGRU_UBRU.cfg"]
    assert {f"--architecture{i},{o}" for i in (1, 2) for o in ("opt_bias_correction=True", "arch_lr=0.002")} <= \
        set(phones_stacked)
    assert str(tmp_path / "out" / "phones") in phones and str(tmp_path / "out" / "words") in words


def test_stage_4_archives_the_runs_and_makes_the_tables_with_the_claims(tmp_path):
    kept = tmp_path / "kept"
    (tmp_path / "out" / "phones").mkdir(parents=True)
    fake_run(kept / "phones" / "MINI_GRU" / "seed1", "MINI_GRU", "gru", 1, [1] * 30, 20, 20)
    calls = run_script(tmp_path, "--stage", "4")
    archives = [c for c in calls if c[:2] == ["compare.py", "archive"]]
    assert [c[2:] for c in archives] == [[str(tmp_path / "out" / "phones"), str(kept / "phones")]]
    # no word runs: the phone tables alone, into RESULTS.md, and the claims' table from the same runs into README.md
    table, readme = [c for c in calls if c[:2] == ["compare.py", "table"]]
    for made in (table, readme):
        assert made[2] == str(kept / "phones") and made[made.index("--claims") + 1] == "results/claims_phones.tsv"
    assert table[table.index("--section") + 1] == "study-layout2-phones" and "--claims-only" not in table
    assert table[table.index("--target") + 1] == "1.5"  # the seeds the study's aim would take, per pair
    assert readme[readme.index("--markdown") + 1:readme.index("--markdown") + 3] == ["README.md", "--section"]
    assert readme[readme.index("--section") + 1] == "claims-phones" and "--claims-only" in readme
    assert "study-layout2-phones -->" in (ROOT / "RESULTS.md").read_text()  # where the tables go
    assert "<!-- compare.py claims-phones -->" in (ROOT / "README.md").read_text()


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


def test_jobs_all_runs_every_run_of_a_stage_at_once(tmp_path):
    """--jobs all: each sweep gets as many jobs as it has runs (configs x seeds), and the sweeps of 1- and
    2-architecture configs run side by side: both start before either ends."""
    calls = run_script(tmp_path, "--stop-stage", "1", "--seeds", "5,7-8", "--jobs", "all", seconds=1)
    assert [c[0] for c in calls] == ["compare.py", "compare.py", "ended", "ended"]  # not one after the other
    jobs = sorted((sum(a.endswith(".cfg") for a in c), c[c.index("--jobs") + 1]) for c in calls[:2])
    assert jobs == [(1, "3"), (12, "36")]
    result = subprocess.run(["bash", str(SCRIPT), "--jobs", "most"], capture_output=True, text=True, timeout=60)
    assert result.returncode != 0 and "--jobs (or all)" in result.stderr


def test_a_bad_option_value_stops_with_the_usage(tmp_path):
    result = subprocess.run(["bash", str(SCRIPT), "--stage", "two"], capture_output=True, text=True, timeout=60)
    assert result.returncode != 0 and "--stage" in result.stderr and "Usage" in result.stderr


def test_phone_configs_restricts_the_phone_sweeps_and_refuses_a_missing_file(tmp_path):
    kept = tmp_path / "kept" / "phones"
    for name in ("MINI_GRU", "MINI_liGRU_UBRU"):
        fake_run(kept / name / "seed1", name, "gru", 1, [1] * 30, 20, 20)
    calls = run_script(tmp_path, "--stop-stage", "1", "--phone-configs", "cfg/MINI_liGRU_UBRU.cfg")
    assert [[a for a in c if a.endswith(".cfg")] for c in calls] == [["cfg/MINI_liGRU_UBRU.cfg"]]
    # only the swept config's archived runs are copied back: a second instance sweeping the others copies theirs
    assert sorted(p.name for p in (tmp_path / "out" / "phones").iterdir()) == ["MINI_liGRU_UBRU"]
    calls = run_script(tmp_path, "--stop-stage", "1", "--phone-configs", "cfg/MINI_GRU.cfg cfg/MINI_LBRU.cfg")
    assert [[a for a in c if a.endswith(".cfg")] for c in calls][-1:] == [["cfg/MINI_GRU.cfg", "cfg/MINI_LBRU.cfg"]]
    missing = subprocess.run(["bash", str(SCRIPT), "--phone-configs", "cfg/MINI_nothing.cfg"], capture_output=True,
                             text=True, timeout=60)
    assert missing.returncode == 1 and "--phone-configs: no config file cfg/MINI_nothing.cfg" in missing.stderr


def test_readmes_claims_are_resultss_claims():
    """README.md's claims tables are RESULTS.md's, row for row: both are written by stage 4 from the same
    archived runs, so a hand edit of one, or one regenerated without the other, fails here."""
    def section(page, name):
        text = (ROOT / page).read_text()
        return text.split(f"<!-- compare.py {name} -->\n", 1)[1].split(f"<!-- /compare.py {name} -->", 1)[0]

    def claim_rows(text):  # the claims' table: its header line and every table line after it
        lines = text.splitlines()
        start = next((i for i, line in enumerate(lines) if line.startswith("| claim | the paper's numbers |")),
                     len(lines))
        return [line for line in lines[start:] if line.startswith("| ")]

    for task in ("phones", "words"):
        in_readme = claim_rows(section("README.md", f"claims-{task}"))
        assert in_readme == claim_rows(section("RESULTS.md", f"study-layout2-{task}")), task
    assert len(claim_rows(section("README.md", "claims-phones"))) == 12  # header, rule, ten claims

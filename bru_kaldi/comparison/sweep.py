"""Run every (config, seed) of a comparison through ``run_exp.py``, each into its own experiment folder.

``OUT/<config name>/seed<N>`` holds run ``N`` of a config; its ``run_exp.py`` output goes to
``sweep.log`` there. A run whose decode is complete is not started again; an unfinished one is
started and resumes from its last checkpoint (``run_exp.py`` does that), so a killed sweep picks up
where it stopped. A run that fails does not stop the sweep: the failures are listed at the end.
"""

from __future__ import annotations

import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from bru_kaldi.experiment import Experiment

RUN_EXP = Path(__file__).resolve().parents[2] / "run_exp.py"


@dataclass
class Outcome:
    config: Path
    seed: int
    folder: Path
    status: str  # "done", "skipped" (finished before), "failed"
    seconds: float = 0.0
    message: str = ""


def folder_of(out: Path, config: Path, seed: int) -> Path:
    return Path(out) / Path(config).stem / f"seed{seed}"


def is_finished(folder: Path) -> bool:
    exp = Experiment(folder)
    return exp.done("train") and exp.done("decode")


def _last_error(log: Path) -> str:
    lines = [line for line in log.read_text(errors="replace").splitlines() if "error" in line.lower()]
    return lines[-1].strip() if lines else f"see {log}"


def run_sweep(configs: Sequence[Path], seeds: Sequence[int], out: Path, overrides: Sequence[str] = (),
              log: Callable[[str], None] = print, python: str = sys.executable) -> list[Outcome]:
    """Run every (config, seed); returns one :class:`Outcome` per run, in order."""
    for config in configs:
        if not Path(config).is_file():
            raise FileNotFoundError(f"config file {config} does not exist")
    pairs = [(Path(c), s) for c in configs for s in seeds]
    outcomes: list[Outcome] = []
    started, spent = time.time(), []
    for number, (config, seed) in enumerate(pairs, 1):
        folder = folder_of(out, config, seed)
        if is_finished(folder):
            outcomes.append(Outcome(config, seed, folder, "skipped"))
            log(f"[{number}/{len(pairs)}] {config.stem} seed {seed}: finished before, skipped ({folder})")
            continue
        folder.mkdir(parents=True, exist_ok=True)
        command = [python, str(RUN_EXP), str(config), f"--exp,seed={seed}", f"--exp,out_folder={folder}", *overrides]
        log(f"[{number}/{len(pairs)}] {config.stem} seed {seed}: running -> {folder}")
        begin = time.time()
        with open(folder / "sweep.log", "a") as output:
            output.write(f"# {' '.join(command)}\n")
            output.flush()
            code = subprocess.run(command, stdout=output, stderr=subprocess.STDOUT, cwd=RUN_EXP.parent).returncode
        seconds = time.time() - begin
        spent.append(seconds)
        if code == 0:
            outcomes.append(Outcome(config, seed, folder, "done", seconds))
        else:
            outcomes.append(Outcome(config, seed, folder, "failed", seconds,
                                    f"exit status {code}: {_last_error(folder / 'sweep.log')}"))
        remaining = sum(1 for c, s in pairs[number:] if not is_finished(folder_of(out, c, s)))
        eta = remaining * sum(spent) / len(spent)
        log(f"[{number}/{len(pairs)}] {config.stem} seed {seed}: {outcomes[-1].status} in {seconds:.0f} s; "
            f"elapsed {_duration(time.time() - started)}, about {_duration(eta)} to go")
    return outcomes


def _duration(seconds: float) -> str:
    minutes, seconds = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{seconds:02d}s"

"""Run every (config, seed) of a comparison through ``run_exp.py``, each into its own experiment folder.

``OUT/<config name>/seed<N>`` holds run ``N`` of a config; its ``run_exp.py`` output goes to
``sweep.log`` there. A run whose decode is complete is not started again; an unfinished one is
started and resumes from its last checkpoint (``run_exp.py`` does that), so a killed sweep picks up
where it stopped. A run that fails does not stop the sweep: the failures are listed at the end.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from bru_kaldi.experiment import Experiment

RUN_EXP = Path(__file__).resolve().parents[2] / "run_exp.py"


@dataclass
class Outcome:
    """What became of one (config, seed) run of a sweep."""

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
              log: Callable[[str], None] = print, python: str = sys.executable, jobs: int = 1) -> list[Outcome]:
    """Run every (config, seed), ``jobs`` at a time; returns one :class:`Outcome` per run, in order.

    With ``jobs`` > 1 each run gets ``cores / jobs`` threads (``OMP_NUM_THREADS``, unless it is set):
    the small recurrent models of the built-in corpus gain nothing from a second thread (a MINI Li-GRU
    epoch took 24-33 s on one, 25 s on two: per-step products of about 2 MFLOP), so two one-thread runs
    on two cores finish about twice the runs an hour.
    """
    for config in configs:
        if not Path(config).is_file():
            raise FileNotFoundError(f"config file {config} does not exist")
    if jobs < 1:
        raise ValueError(f"--jobs {jobs}: expected at least 1 run at a time")
    # seed by seed: a sweep stopped part-way has every config at its first seeds, a table to read already
    pairs = [(Path(c), s) for s in seeds for c in configs]
    environment = dict(os.environ)
    if jobs > 1:
        environment.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // jobs)))
    outcomes: dict[int, Outcome] = {}
    running: dict[int, tuple[subprocess.Popen, float]] = {}
    started, spent = time.time(), []
    waiting = list(enumerate(pairs, 1))
    # a SIGTERM (kill, a job scheduler's stop) ends the sweep through the finally below, as Ctrl-C does
    stop = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _exit_on_sigterm) if stop else None

    def finish(number: int, code: int, begin: float) -> None:
        config, seed = pairs[number - 1]
        folder, seconds = folder_of(out, config, seed), time.time() - begin
        spent.append(seconds)
        if code == 0:
            outcomes[number] = Outcome(config, seed, folder, "done", seconds)
        else:
            outcomes[number] = Outcome(config, seed, folder, "failed", seconds,
                                       f"exit status {code}: {_last_error(folder / 'sweep.log')}")
        remaining = sum(1 for c, s in pairs if not is_finished(folder_of(out, c, s))) - len(running)
        eta = max(remaining, 0) * sum(spent) / len(spent) / jobs
        log(f"[{number}/{len(pairs)}] {config.stem} seed {seed}: {outcomes[number].status} in {seconds:.0f} s; "
            f"elapsed {_duration(time.time() - started)}, about {_duration(eta)} to go")

    try:
        while waiting or running:
            while waiting and len(running) < jobs:
                number, (config, seed) = waiting.pop(0)
                folder = folder_of(out, config, seed)
                if is_finished(folder):
                    outcomes[number] = Outcome(config, seed, folder, "skipped")
                    log(f"[{number}/{len(pairs)}] {config.stem} seed {seed}: finished before, skipped ({folder})")
                    continue
                folder.mkdir(parents=True, exist_ok=True)
                command = [python, str(RUN_EXP), str(config), f"--exp,seed={seed}", f"--exp,out_folder={folder}",
                           *overrides]
                log(f"[{number}/{len(pairs)}] {config.stem} seed {seed}: running -> {folder}")
                with open(folder / "sweep.log", "a") as output:
                    output.write(f"# {' '.join(command)}\n")
                    output.flush()
                    process = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT, cwd=RUN_EXP.parent,
                                               env=environment)
                running[number] = (process, time.time())
            for number, (process, begin) in list(running.items()):
                if process.poll() is not None:
                    del running[number]
                    finish(number, process.returncode, begin)
            if running:
                time.sleep(0.2)
    finally:  # interrupted: the runs it started stop with it (each resumes from its checkpoint next time)
        for process, _ in running.values():
            process.terminate()
        for process, _ in running.values():
            process.wait()
        if stop:
            signal.signal(signal.SIGTERM, previous)
    return [outcomes[number] for number in sorted(outcomes)]


def _exit_on_sigterm(signum, frame):
    raise SystemExit(128 + signum)


def _duration(seconds: float) -> str:
    minutes, seconds = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{seconds:02d}s"

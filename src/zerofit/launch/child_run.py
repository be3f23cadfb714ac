"""Run one `zerofit train` as a child process and read what it left: the one runner that
`zerofit bench`, `zerofit plan --measure` and `benchmarks/calibrate.py` share."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass
class Outcome:
    code: int  # the exit status; -1 when it ran past the timeout
    wall_s: float
    summary: dict[str, Any] | None  # <run_dir>/summary.json, when the run wrote it
    log_file: Path

    @property
    def ok(self) -> bool:
        return self.code == 0 and self.summary is not None

    def log(self) -> str:
        return self.log_file.read_text(errors="replace") if self.log_file.is_file() else ""


TIMED_OUT = -1  # Outcome.code of a run stopped at its timeout


def train(
    run_dir: Path,
    overrides: list[str],
    log_file: Path,
    config: str | None = None,
    nproc: int | None = None,
    timeout: float | None = None,
) -> Outcome:
    """`zerofit train [-c config] [--nproc N] --log.run_dir RUN_DIR --key=value ...`, its stdout and
    stderr into `log_file` (first line: the command)."""
    cmd = [sys.executable, "-m", "zerofit.cli", "train"]
    cmd += ["-c", config] if config else []
    cmd += ["--nproc", str(nproc)] if nproc else []
    cmd += [f"--{o}" for o in [*overrides, f"log.run_dir={run_dir}"]]
    log_file.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    with open(log_file, "w") as log:
        log.write(" ".join(cmd) + "\n")
        log.flush()
        try:
            code = subprocess.run(
                cmd, stdout=log, stderr=subprocess.STDOUT, timeout=timeout, env=os.environ.copy()
            ).returncode
        except subprocess.TimeoutExpired:
            code = TIMED_OUT
    summary_file = run_dir / "summary.json"
    summary = json.loads(summary_file.read_text()) if summary_file.is_file() else None
    return Outcome(code, time.perf_counter() - t0, summary, log_file)


# A few timed steps and nothing else: no eval, no checkpoint, no progress bar.
MEASURE_ONLY = [
    "train.epochs=null",  # the measurement sets train.steps itself
    "train.eval_every=0",
    "log.progress=false",
    "checkpoint.every=0",
    "checkpoint.save_final=false",
]

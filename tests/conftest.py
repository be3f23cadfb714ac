"""Shared helpers: run `zerofit train` as a real user would (a subprocess that starts its workers)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

# Small enough for 2 CPU cores, big enough to exercise every code path.
TINY = {
    "model": {"preset": "tiny", "seq_len": 64, "overrides": {"n_layers": 2}},
    "data": {"max_tokens": 300_000},
    "train": {"steps": 10, "micro_batch_size": 4, "grad_accum_steps": 1, "eval_every": 0},
    "optim": {"lr": 3e-3, "warmup_steps": 2},
    "precision": {"mode": "fp32"},
    "log": {"every": 1, "progress": False},
}


def deep_update(base: dict, extra: dict) -> dict:
    out = json.loads(json.dumps(base))
    for k, v in extra.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict) and k != "overrides":
            out[k] = deep_update(out[k], v)
        else:
            out[k] = v
    return out


def write_config(path: Path, extra: dict | None = None) -> Path:
    path.write_text(yaml.safe_dump(deep_update(TINY, extra or {})))
    return path


def zerofit(*args: str, cwd: Path, timeout: int = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    src = str(Path(__file__).resolve().parents[1] / "src")
    env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
    return subprocess.run(
        [sys.executable, "-m", "zerofit.cli", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def losses(run_dir: Path) -> dict[int, float]:
    out = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        rec = json.loads(line)
        if "loss" in rec:
            out[rec["step"]] = rec["loss"]
    return out


def train_run(tmp: Path, name: str, extra: dict | None = None, *args: str) -> Path:
    """Train with TINY + extra in tmp/name; assert success; return the run dir."""
    run_dir = tmp / name
    cfg = write_config(
        tmp / f"{name}.yaml", deep_update({"log": {"run_dir": str(run_dir)}}, extra or {})
    )
    proc = zerofit("train", "-c", str(cfg), *args, cwd=tmp)
    assert proc.returncode == 0, f"{name} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    return run_dir


def assert_resume_exact(tmp: Path, extra: dict) -> tuple[Path, Path]:
    """Train 10 steps (checkpoint every 5) in tmp/full; resume a copy of the step-5 checkpoint in
    tmp/cut, as if the run had died at step 7; steps 6-10 must log bitwise-equal losses."""
    import shutil

    extra = deep_update(extra, {"checkpoint": {"every": 5}})
    full = train_run(tmp, "full", extra, "--nproc", "2")
    cut = tmp / "cut"
    shutil.copytree(full / "checkpoints" / "step_00000005", cut / "checkpoints" / "step_00000005")
    cfg = write_config(tmp / "cut.yaml", deep_update(extra, {"log": {"run_dir": str(cut)}}))
    proc = zerofit("train", "-c", str(cfg), "--nproc", "2", "--resume", cwd=tmp)
    assert proc.returncode == 0, proc.stderr[-4000:]
    before, after = losses(full), losses(cut)
    assert sorted(after) == [6, 7, 8, 9, 10]
    assert all(after[s] == before[s] for s in after), {s: (before[s], after[s]) for s in after}
    return full, cut


@pytest.fixture(scope="session")
def session_tmp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("runs")


@pytest.hookimpl(trylast=True)  # after `-m` deselection: torch is imported only for gpu tests kept
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked `gpu` are skipped (not failed) where torch sees no CUDA device."""
    gpu_items = [item for item in items if item.get_closest_marker("gpu")]
    if not gpu_items:
        return
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (torch.cuda.is_available() is false)")
    for item in gpu_items:
        item.add_marker(skip)

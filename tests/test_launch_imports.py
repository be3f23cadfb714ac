"""What a fresh run's launcher imports before its first worker starts: every `zerofit train` waits
for it, and on a CPU it is much of a short run's time. Neither torch.distributed.checkpoint (~1 s:
a fresh run's launcher writes no checkpoint and reads none) nor torch._dynamo (~0.5 s: pulled in by
the first `normal_` on a meta tensor, which building the model's skeleton no longer runs)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from conftest import write_config

SRC = Path(__file__).resolve().parents[1] / "src"
HEAVY = ("torch.distributed.checkpoint", "torch._dynamo")
# `zerofit train` as the CLI runs it, with the workers' start replaced by a look at sys.modules.
CHECK = f"""
import sys
import zerofit.launch.spawn as spawn_module
from zerofit.cli import main

def spawn(prep, opts, nproc):
    print("before the workers:", [m for m in {HEAVY!r} if m in sys.modules])
    return 0

spawn_module.spawn = spawn
sys.exit(main(["train", "-c", sys.argv[1], "--nproc", "2"]))
"""


@pytest.mark.parametrize("backend", ["fsdp", "ddp", "deepspeed"])
def test_a_fresh_launch_imports_no_checkpoint_reader_nor_dynamo(
    tmp_path: Path, backend: str
) -> None:
    if backend == "deepspeed":
        pytest.importorskip("deepspeed")
    extra = {"parallel": {"backend": backend}, "log": {"run_dir": str(tmp_path / "run")}}
    cfg = write_config(tmp_path / "c.yaml", extra)
    out = subprocess.run(
        [sys.executable, "-c", CHECK, str(cfg)],
        cwd=tmp_path,
        env={"PYTHONPATH": str(SRC), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=600,  # a hang guard: it takes ~3 s
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "before the workers: []" in out.stdout, out.stdout[-2000:]

"""What a fresh run's launcher imports before its first worker starts: every `zerofit train` waits
for it, and on a CPU it is much of a short run's time. Neither torch.distributed.checkpoint (~1 s:
a fresh run's launcher writes no checkpoint and reads none) nor torch._dynamo (~0.5 s: pulled in by
the first `normal_` on a meta tensor, which building the model's skeleton no longer runs)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
HEAVY = ("torch.distributed.checkpoint", "torch._dynamo")
# `zerofit train` as the CLI runs it, once per engine (one process: each launch checks what is
# loaded so far), with the workers' start replaced by a look at sys.modules.
CHECK = f"""
import sys
import zerofit.launch.spawn as spawn_module
from zerofit.cli import main

def spawn(prep, opts, nproc):
    print(prep.cfg.parallel.backend, "before the workers:", [m for m in {HEAVY!r} if m in sys.modules])
    return 0

spawn_module.spawn = spawn
for backend in sys.argv[2:]:
    run_dir = f"--log.run_dir={{sys.argv[1]}}/{{backend}}"
    code = main(["train", "--nproc", "2", "--parallel.backend", backend, run_dir])
    assert code == 0, backend
"""


def test_a_fresh_launch_imports_no_checkpoint_reader_nor_dynamo(tmp_path: Path) -> None:
    backends = ["fsdp", "ddp"] + (["deepspeed"] if importlib.util.find_spec("deepspeed") else [])
    out = subprocess.run(
        [sys.executable, "-c", CHECK, str(tmp_path), *backends],
        cwd=tmp_path,
        env={"PYTHONPATH": str(SRC), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=600,  # a hang guard: it takes ~4 s
    )
    assert out.returncode == 0, out.stderr[-3000:]
    for backend in backends:
        assert f"{backend} before the workers: []" in out.stdout, out.stdout[-2000:]

"""Resume on another engine and world size: a checkpoint of any engine continues under any other.

Each case trains 10 steps with the source layout (checkpoint at step 5), then resumes a copy of
the step-5 checkpoint with the target layout at the same global batch (4 sequences). Steps 6-10
must log the losses of the uninterrupted run within 1e-5 relative (fp32, CPU, gloo): the weights,
both AdamW moments, the step count, the schedule and the data position all carried over.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from conftest import deep_update, losses, train_run, write_config, zerofit

pytestmark = pytest.mark.dist

Z = {"parallel": {"backend": "deepspeed"}}
LAYOUTS = {
    "fsdp@2": ({"parallel": {"backend": "fsdp"}, "train": {"micro_batch_size": 2}}, 2),
    "ddp@1": ({"parallel": {"backend": "ddp"}, "train": {"micro_batch_size": 2, "grad_accum_steps": 2}}, 1),
    "fsdp-hybrid@2": ({"parallel": {"backend": "fsdp", "fsdp": {"replicate_degree": 2}}, "train": {"micro_batch_size": 2}}, 2),
    "fsdp@1": ({"parallel": {"backend": "fsdp"}, "train": {"micro_batch_size": 4}}, 1),
    "z3@1": (deep_update(Z, {"parallel": {"deepspeed": {"stage": 3}}, "train": {"micro_batch_size": 1, "grad_accum_steps": 4}}), 1),
    "z2@2": (deep_update(Z, {"parallel": {"deepspeed": {"stage": 2}}, "train": {"micro_batch_size": 2}}), 2),
    "z3-offload@2": (deep_update(Z, {"parallel": {"deepspeed": {"stage": 3, "offload_optimizer": "cpu"}}, "train": {"micro_batch_size": 2}}), 2),
    "ddp@2": ({"parallel": {"backend": "ddp"}, "train": {"micro_batch_size": 2}}, 2),
}  # fmt: skip
PAIRS = [
    ("fsdp@2", "z3@1"),
    ("z2@2", "fsdp@1"),
    ("ddp@1", "fsdp-hybrid@2"),
    ("z3-offload@2", "ddp@1"),
    ("z3@1", "z2@2"),
]
BASE = {"train": {"steps": 10}, "checkpoint": {"every": 5, "keep_last": 3}}


def resume_as(tmp: Path, ckpt: Path, name: str, extra: dict, nproc: int) -> Path:
    run = tmp / name
    shutil.copytree(ckpt, run / "checkpoints" / ckpt.name)
    cfg = write_config(tmp / f"{name}.yaml", deep_update(extra, {"log": {"run_dir": str(run)}}))
    proc = zerofit("train", "-c", str(cfg), "--nproc", str(nproc), "--resume", cwd=tmp)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "converted through the engine-neutral form" in proc.stderr
    return run


@pytest.mark.parametrize(("src", "dst"), PAIRS, ids=[f"{a}->{b}" for a, b in PAIRS])
def test_resume_on_another_engine_and_world_size(tmp_path: Path, src: str, dst: str) -> None:
    src_extra, src_n = LAYOUTS[src]
    dst_extra, dst_n = LAYOUTS[dst]
    full = train_run(tmp_path, "full", deep_update(BASE, src_extra), "--nproc", str(src_n))
    ckpt = full / "checkpoints" / "step_00000005"
    cut = resume_as(tmp_path, ckpt, "cut", deep_update(BASE, dst_extra), dst_n)
    before, after = losses(full), losses(cut)
    assert sorted(after) == [6, 7, 8, 9, 10]
    rel = {s: abs(after[s] - before[s]) / abs(before[s]) for s in after}
    print(f"{src} -> {dst}: max relative loss difference {max(rel.values()):.2e}")
    assert max(rel.values()) < 1e-5, rel

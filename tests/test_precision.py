"""fp16 with dynamic loss scaling on sharded parameters; bf16 compute with fp32 master weights."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import losses, train_run

pytestmark = pytest.mark.dist


@pytest.mark.parametrize("backend", ["fsdp", "ddp"])
def test_fp16_loss_scaling(tmp_path: Path, backend: str) -> None:
    run = train_run(
        tmp_path,
        "fp16",
        # The plain head (full fp16 logits) overflows at the initial scale; the fused one computes
        # its logit gradients unscaled and need not, so this test uses the plain one.
        {
            "precision": {"mode": "fp16"},
            "parallel": {"backend": backend},
            "model": {"loss_chunk": 0},
        },
        "--nproc",
        "2",
    )
    got = losses(run)
    assert all(v == v and v < 10 for v in got.values()) and got[10] < got[1], got
    ckpt = run / "checkpoints" / "step_00000010"
    scalers = [
        json.loads((ckpt / f"rank{r}.json").read_text())["backend"]["scaler"] for r in range(2)
    ]
    # The overflow check is all-reduced: both ranks skip the same steps and keep the same scale.
    assert scalers[0]["scale"] == scalers[1]["scale"]
    assert scalers[0]["scale"] < 65536.0  # the first steps overflowed and the scale backed off


def test_bf16_compute_fp32_master(tmp_path: Path) -> None:
    run = train_run(tmp_path, "bf16", {"precision": {"mode": "bf16"}}, "--nproc", "2")
    got = losses(run)
    assert got[10] < got[1] - 0.5, got

"""fp16 with dynamic loss scaling on sharded parameters; bf16 compute with fp32 master weights."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from conftest import POOL, deep_update, losses, train_run, wait_all

pytestmark = [pytest.mark.dist, pytest.mark.slow]


BACKENDS = ["fsdp", "ddp"]
# The plain head (full fp16 logits) overflows at the initial scale; the fused one computes its logit
# gradients unscaled and need not, so the fp16 runs use the plain one.
FP16 = {"precision": {"mode": "fp16"}, "model": {"loss_chunk": 0}}


@pytest.fixture(scope="module")
def fp16_runs(shared_run, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:  # noqa: ANN001
    """The fp16 runs of each backend and the shared bf16 one, started together in the background."""
    shared_run.start("fsdp-bf16@2")
    out = {}
    for backend in BACKENDS:
        extra = deep_update(FP16, {"parallel": {"backend": backend}})
        tmp = tmp_path_factory.mktemp(f"fp16-{backend}")
        out[backend] = POOL.submit(train_run, tmp, "fp16", extra, "--nproc", "2")
    yield out
    wait_all(out.values())


@pytest.mark.parametrize("backend", BACKENDS)
def test_fp16_loss_scaling(fp16_runs, backend: str) -> None:  # noqa: ANN001
    run = fp16_runs[backend].result()
    got = losses(run)
    assert all(v == v and v < 10 for v in got.values()) and got[10] < got[1], got
    ckpt = run / "checkpoints" / "step_00000010"
    scalers = [
        json.loads((ckpt / f"rank{r}.json").read_text())["backend"]["scaler"] for r in range(2)
    ]
    # The overflow check is all-reduced: both ranks skip the same steps and keep the same scale.
    assert scalers[0]["scale"] == scalers[1]["scale"]
    assert scalers[0]["scale"] < 65536.0  # the first steps overflowed and the scale backed off


def test_bf16_compute_fp32_master(shared_run, fp16_runs) -> None:  # noqa: ANN001
    got = losses(shared_run("fsdp-bf16@2"))  # tests/test_deepspeed.py reads its precision.json
    assert got[10] < got[1] - 0.5, got

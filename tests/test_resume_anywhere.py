"""Resume on another engine and world size: a checkpoint of any engine continues under any other.

Each case resumes a copy of the step-5 checkpoint of a 10-step run with the source layout (conftest's
shared runs: other files read them too) under the target layout, at the same global batch (8
sequences). Steps 6-10 must log the losses of the uninterrupted run within 1e-5 relative (fp32,
CPU, gloo): the weights, both AdamW moments, the step count, the schedule and the data position all
carried over.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path

import pytest
from conftest import (
    CKPT5,
    POOL,
    deep_update,
    losses,
    shared_extra,
    wait_all,
    write_config,
    zerofit,
)

pytestmark = [pytest.mark.dist, pytest.mark.slow]

# Where a pair's source or target is a shared run's layout, it is that run's config.
LAYOUTS = {
    "fsdp@2": (shared_extra("fsdp@2"), 2),
    "ddp@1": (shared_extra("ddp@1"), 1),
    "fsdp-hybrid@2": (shared_extra("fsdp-hybrid@2"), 2),
    "fsdp@1": (deep_update(CKPT5, {"parallel": {"backend": "fsdp"}, "train": {"micro_batch_size": 8}}), 1),
    "z3@1": (shared_extra("zero3@1"), 1),
    "z2@2": (shared_extra("zero2@2"), 2),
    "z3-offload@2": (shared_extra("zero3-offload@2"), 2),
}  # fmt: skip
SOURCES = {"fsdp@2": "fsdp@2", "z2@2": "zero2@2", "ddp@1": "ddp@1"}
SOURCES |= {"z3-offload@2": "zero3-offload@2", "z3@1": "zero3@1"}
PAIRS = [
    ("fsdp@2", "z3@1"),
    ("z2@2", "fsdp@1"),
    ("ddp@1", "fsdp-hybrid@2"),
    ("z3-offload@2", "ddp@1"),
    ("z3@1", "z2@2"),
]


def resume_as(tmp: Path, ckpt: Path, name: str, extra: dict, nproc: int) -> Path:
    run = tmp / name
    shutil.copytree(ckpt, run / "checkpoints" / ckpt.name)
    cfg = write_config(tmp / f"{name}.yaml", deep_update(extra, {"log": {"run_dir": str(run)}}))
    proc = zerofit("train", "-c", str(cfg), "--nproc", str(nproc), "--resume", cwd=tmp)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "converted through the engine-neutral form" in proc.stderr
    return run


@pytest.fixture(scope="module")
def cuts(shared_run, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:  # noqa: ANN001
    """Each pair's resumed run, started in the background (two at a time) as its source is done."""
    shared_run.start(*(SOURCES[src] for src, _ in PAIRS))
    out = {}
    for src, dst in PAIRS:
        try:
            ckpt = shared_run(SOURCES[src]) / "checkpoints" / "step_00000005"
        except Exception as e:  # the source failed: its pairs' tests report it
            out[src, dst] = Future()
            out[src, dst].set_exception(e)
            continue
        dst_extra, dst_n = LAYOUTS[dst]
        tmp = tmp_path_factory.mktemp("resume-anywhere")
        out[src, dst] = POOL.submit(resume_as, tmp, ckpt, "cut", dst_extra, dst_n)
    yield out
    wait_all(out.values())


@pytest.mark.parametrize(("src", "dst"), PAIRS, ids=[f"{a}->{b}" for a, b in PAIRS])
def test_resume_on_another_engine_and_world_size(src: str, dst: str, shared_run, cuts) -> None:  # noqa: ANN001
    full = shared_run(SOURCES[src])
    cut = cuts[src, dst].result()
    before, after = losses(full), losses(cut)
    assert sorted(after) == [6, 7, 8, 9, 10]
    rel = {s: abs(after[s] - before[s]) / abs(before[s]) for s in after}
    print(f"{src} -> {dst}: max relative loss difference {max(rel.values()):.2e}")
    assert max(rel.values()) < 1e-5, rel

"""Checkpoints: exact resume, and a save killed midway never looks complete."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import (
    POOL,
    assert_resume_exact,
    losses,
    shared_extra,
    wait_all,
    write_config,
    zerofit,
)

from zerofit.checkpoint import complete_checkpoints, latest_checkpoint

pytestmark = [pytest.mark.dist, pytest.mark.slow]


LAYOUTS = ["fsdp@2", "ddp@2"]


@pytest.fixture(scope="module")
def cuts(shared_run, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:  # noqa: ANN001
    """Each layout's resumed run (assert_resume_exact), started in the background together."""
    shared_run.start(*LAYOUTS)
    out = {}
    for layout in LAYOUTS:
        tmp = tmp_path_factory.mktemp("resume")
        out[layout] = POOL.submit(
            assert_resume_exact, tmp, shared_run(layout), shared_extra(layout)
        )
    yield out
    wait_all(out.values())


@pytest.mark.parametrize("layout", LAYOUTS)
def test_resume_is_bitwise_exact(layout: str, shared_run, cuts) -> None:  # noqa: ANN001
    full = shared_run(layout)  # 10 steps, checkpoints at 5 and 10 (keep_last 2: both kept)
    cut = cuts[layout].result()  # steps 6-10 resumed from step 5: bitwise-equal losses
    assert [p.name for p in complete_checkpoints(full / "checkpoints")] == [
        "step_00000005",
        "step_00000010",
    ]
    # `cut` held only the checkpoint: the resumed run writes its config.yaml there (export reads it)
    assert (cut / "config.yaml").is_file() and not list(cut.glob("config.resume-*.yaml"))


CRASH = textwrap.dedent(
    """
    import os, sys
    from pathlib import Path
    from zerofit.backends.torch_common import TorchBackend
    from zerofit.launch.run_config import load_config
    from zerofit.launch.resolve import resolve
    from zerofit.train.run import run_training

    original = TorchBackend.save
    calls = []

    def dying_save(self, path):
        calls.append(path)
        original(self, path)              # the shards are written...
        if len(calls) == 2:
            os._exit(9)                   # ...and the process dies before meta.json and the rename

    TorchBackend.save = dying_save
    cfg = resolve(load_config(sys.argv[1]), int(os.environ.get("WORLD_SIZE", "1")), "cpu")
    run_training(cfg, Path(sys.argv[2]), None)
    """
)


def test_save_killed_midway_leaves_previous_checkpoint(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    cfg = write_config(
        tmp_path / "c.yaml",
        {"checkpoint": {"every": 3}, "train": {"steps": 6}, "log": {"run_dir": str(run)}},
    )
    (run / "config.yaml").write_text(cfg.read_text())
    script = tmp_path / "crash.py"
    script.write_text(CRASH)
    src = str(Path(__file__).resolve().parents[1] / "src")
    proc = subprocess.run(
        [sys.executable, str(script), str(cfg), str(run)],
        env={"PYTHONPATH": src, "PATH": ""},
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 9, proc.stderr[-3000:]
    root = run / "checkpoints"
    assert (root / "step_00000006.tmp").is_dir()  # the half-written one is there...
    assert latest_checkpoint(root) == root / "step_00000003"  # ...but never picked
    proc = zerofit("train", "-c", str(cfg), "--nproc", "1", "--resume", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert latest_checkpoint(root) == root / "step_00000006"
    assert not (root / "step_00000006.tmp").exists()
    assert sorted(losses(run))[-3:] == [4, 5, 6]


def test_joins_an_external_torchrun(tmp_path: Path) -> None:
    """Started by the user's own torchrun, every rank runs `zerofit train` and joins its group."""
    import os

    cfg = write_config(
        tmp_path / "c.yaml", {"train": {"steps": 3}, "log": {"run_dir": str(tmp_path / "run")}}
    )
    env = {
        **os.environ,
        "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src"),
        "OMP_NUM_THREADS": "1",
    }
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            "2",
            "-m",
            "zerofit.cli",
            "train",
            "-c",
            str(cfg),
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = tmp_path / "run"
    assert sorted(losses(run)) == [1, 2, 3]
    assert sorted(p.name for p in (run / "sharding").iterdir()) == ["rank0.json", "rank1.json"]
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith("run")] == [
        "run"
    ]  # one run dir

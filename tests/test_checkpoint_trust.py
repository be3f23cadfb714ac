"""Issue 27 on real checkpoints: resume and export take only what a checkpoint's manifest vouches
for, and name a damaged file in one short line.

The checkpoints are copies of conftest's shared 10-step runs (steps 5 and 10), damaged the way a
tester did: the manifest regenerated to match each time, so the check that catches it is the one
under test, not the hashes.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import SHARED, deep_update, shared_extra, write_config, zerofit

from zerofit.checkpoint import manifest

pytestmark = [pytest.mark.dist, pytest.mark.slow]
LAST = 10  # the shared runs' newest checkpoint


def rehash(ckpt: Path) -> None:
    """The manifest of what is there now (a link to a folder is never entered)."""
    files = manifest.hash_files(ckpt, manifest.list_files(ckpt))
    manifest.write_manifest(ckpt, files, json.loads((ckpt / "manifest.json").read_text())["step"])


def copy_run(src: Path, dest: Path) -> Path:
    """``dest``: a run folder with the newest checkpoint of ``src`` and its config.yaml; returns
    that checkpoint."""
    ckpt = dest / "checkpoints" / f"step_{LAST:08d}"
    shutil.copytree(src / "checkpoints" / ckpt.name, ckpt)
    shutil.copy(src / "config.yaml", dest / "config.yaml")
    return ckpt


def resume(tmp: Path, run: Path, layout: str, *args: str) -> subprocess.CompletedProcess:
    extra = deep_update(shared_extra(layout), {"log": {"run_dir": str(run)}})
    cfg = write_config(tmp / "c.yaml", extra)
    nproc = str(SHARED[layout][1])
    return zerofit(
        "train", "-c", str(cfg), "--nproc", nproc, "--train.steps", str(LAST + 1), *args, cwd=tmp
    )


def last_line(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    return proc.stderr.strip().splitlines()[-1]


def test_a_model_folder_linked_to_another_runs_is_refused(shared_run, tmp_path: Path) -> None:  # noqa: ANN001
    """The tester's case: ``step_N/model`` replaced by a link to another run's ``model/`` (same
    shapes, other weights), manifest regenerated: resume continued from the other weights with
    exit 0, and export exported them. Now both refuse, naming the link."""
    src = shared_run("fsdp@2")
    run = tmp_path / "run"
    ckpt = copy_run(src, run)
    shutil.rmtree(ckpt / "model")
    (ckpt / "model").symlink_to(src / "checkpoints" / "step_00000005" / "model")
    rehash(ckpt)
    why = "model is a symbolic link (a checkpoint holds its own files only)"
    line = last_line(resume(tmp_path, run, "fsdp@2", "--resume"))
    assert line.endswith(f"skipping damaged checkpoint {ckpt.name}: {why})"), line
    line = last_line(resume(tmp_path, run, "fsdp@2", "--resume", str(ckpt)))
    assert line == f"error: checkpoint {ckpt}: {why}", line
    exported = zerofit("export", str(run), "--out", str(tmp_path / "hf"), cwd=tmp_path)
    assert last_line(exported) == f"error: checkpoint {ckpt}: {why}"
    assert not (tmp_path / "hf").exists()
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == [ckpt.name]  # no new save


@pytest.mark.parametrize(
    ("layout", "rel"),
    [
        ("fsdp@2", "model/__0_0.distcp"),
        ("zero3@2", "model/zero_pp_rank_1_mp_rank_00_optim_states.pt"),  # DeepSpeed's loader
    ],
)
def test_a_truncated_file_with_a_forged_manifest_is_one_short_line(
    shared_run,  # noqa: ANN001
    tmp_path: Path,
    layout: str,
    rel: str,
) -> None:
    """It used to be torch's paragraph about zip archives, naming the checkpoint folder."""
    ckpt = copy_run(shared_run(layout), tmp_path / "run")
    data = (ckpt / rel).read_bytes()
    (ckpt / rel).write_bytes(data[: len(data) // 2])
    rehash(ckpt)
    line = last_line(resume(tmp_path, tmp_path / "run", layout, "--resume", str(ckpt)))
    head = f"error: checkpoint {ckpt}: {rel} "
    assert line.startswith(head) and "PytorchStreamReader failed reading zip archive" in line, line
    assert "If you are seeing" not in line, line  # torch's next sentences: cut
    # about 200 characters (after "error: "); the reason keeps 80 where the paths take more
    assert len(line) - len("error: ") <= max(200, len(head) - len("error: ") + 80), line

"""`--resume` looks only at the run it names (its log.run_dir, or a path), never at another run's
checkpoints."""

from __future__ import annotations

from pathlib import Path

import pytest


def test_resume_without_its_run_folder_never_takes_another_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--resume` with no log.run_dir used to take the newest run under runs/, whoever's it was:
    now one line asking which run, and runs/ untouched."""
    from zerofit.cli import main

    other = tmp_path / "runs" / "someone-else" / "checkpoints" / "step_00000002"
    other.mkdir(parents=True)
    (other / "meta.json").write_text("{}")
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    monkeypatch.chdir(tmp_path)
    assert main(["train", "--resume"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "error: --resume: which run? set log.run_dir to the run's folder (or pass --resume RUN_DIR)"
    ]
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before

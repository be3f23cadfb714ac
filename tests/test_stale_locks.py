"""A build lock left by a killed process is removed; one held by a live build is kept. The processes
are real: one creates its lock the way torch's FileBaton does and is SIGKILLed, one holds its lock."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from zerofit.faults import stale_locks
from zerofit.faults.stale_locks import candidate_locks, clear_stale_build_locks

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")

HOLD = """
import os, sys, time
fd = os.open(sys.argv[1], os.O_CREAT | os.O_EXCL)  # as torch.utils.file_baton.FileBaton does
print("held", flush=True)
time.sleep(600)
"""


def _holder(lock: Path) -> subprocess.Popen:
    lock.parent.mkdir(parents=True)
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(lock)], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    return proc


def test_only_the_lock_of_a_dead_build_is_removed(tmp_path: Path) -> None:
    dead = tmp_path / "py311_cpu" / "cpu_adam" / "lock"  # torch's default layout
    live = tmp_path / "fused_adam" / "lock"  # TORCH_EXTENSIONS_DIR's layout
    killed, running = _holder(dead), _holder(live)
    try:
        killed.send_signal(signal.SIGKILL)
        killed.wait(timeout=30)
        assert candidate_locks(tmp_path) == sorted([dead, live])
        assert clear_stale_build_locks(tmp_path) == [dead]
        assert not dead.exists() and live.exists()
        assert clear_stale_build_locks(tmp_path) == []  # nothing more to do
    finally:
        running.kill()
        running.wait(timeout=30)
    assert clear_stale_build_locks(tmp_path) == [live]  # its builder is gone now too


def test_a_missing_or_foreign_cache_is_left_alone(tmp_path: Path) -> None:
    assert clear_stale_build_locks(tmp_path / "absent") == []
    link_target = tmp_path / "elsewhere"
    link_target.write_text("")
    (tmp_path / "op").mkdir()
    os.symlink(link_target, tmp_path / "op" / "lock")
    assert clear_stale_build_locks(tmp_path) == []  # a symlink is never followed
    assert link_target.exists()


def test_a_lock_being_released_is_left_to_its_builder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """torch's FileBaton closes its lock, then removes it. A lock seen unheld in between is
    removed by its builder while the cleaner waits (`settle`); the cleaner must not remove it
    first, or the builder's own removal fails (ENOENT, which ended a DeepSpeed run of the
    suite). The builder's removal runs inside the wait here, as it would on a busy machine."""
    lock = tmp_path / "py311_cpu" / "deepspeed_shm_comm" / "lock"
    lock.parent.mkdir(parents=True)
    os.close(os.open(lock, os.O_CREAT | os.O_EXCL))  # the builder has just closed it
    released = []
    monkeypatch.setattr(stale_locks, "settle", lambda: released.append(os.remove(lock)))
    assert clear_stale_build_locks(tmp_path) == []
    assert released == [None]  # the builder's own os.remove succeeded
    # A lock nobody removes during the wait is stale and goes.
    os.close(os.open(lock, os.O_CREAT | os.O_EXCL))
    monkeypatch.setattr(stale_locks, "settle", lambda: None)
    assert clear_stale_build_locks(tmp_path) == [lock]

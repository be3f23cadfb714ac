"""Clear the build locks that a killed process left in torch's extension cache.

DeepSpeed JIT-compiles its ops (CPU Adam for offload, the CPU accelerator's shared-memory
collective, fused optimizers) through `torch.utils.cpp_extension.load`, which guards each build
directory with a `lock` file created with O_EXCL and removed when the build ends. A process killed
mid-build (Ctrl-C twice, a preemption, an OOM kill) never removes it, and every later run then
waits on that file forever, printing nothing.

The builder keeps the lock file open for as long as it builds, so a lock that no live process has
open is stale. This module removes such locks before DeepSpeed starts, under an `fcntl` lock of its
own (released by the kernel even if this process dies) so that the ranks of one machine clean one
at a time: a lock seen by the second rank was created after the first one cleaned, by a live build.
Only Linux can see other processes' open files (/proc); elsewhere nothing is touched.

A builder releases its lock in two steps, closing it and then removing it. A lock seen unheld in
between belongs to a live build that is about to remove it itself: removing it first made that
builder's own removal fail (ENOENT on the lock, which ended a DeepSpeed run of the suite while
another run's rank cleaned). So an unheld lock is removed only if it is still there, the same
file and still unheld, after `SETTLE_S`: a released lock is gone by then, a stale one stays.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import sys
import time
from pathlib import Path

from torch.utils.cpp_extension import get_default_build_root

LOCK_NAME = "lock"  # torch.utils.cpp_extension: <build dir>/lock
SETTLE_S = 0.5  # how long a lock must stay unheld to be stale (a release takes microseconds)


def extension_root() -> Path:
    """Where torch builds extensions: TORCH_EXTENSIONS_DIR, else its default cache folder."""
    env = os.environ.get("TORCH_EXTENSIONS_DIR")
    if env:
        return Path(env)
    return Path(get_default_build_root())


def candidate_locks(root: Path) -> list[Path]:
    """Build locks under `root`: <root>/<name>/lock and <root>/<python_accel>/<name>/lock."""
    found = [*root.glob(f"*/{LOCK_NAME}"), *root.glob(f"*/*/{LOCK_NAME}")]
    return sorted(p for p in found if p.is_file() and not p.is_symlink())


def open_inodes(uid: int) -> set[tuple[int, int]] | None:
    """(device, inode) of every file that a process of `uid` has open; None if unknowable."""
    proc = Path("/proc")
    if not sys.platform.startswith("linux") or not proc.is_dir():
        return None
    held: set[tuple[int, int]] = set()
    for pid_dir in proc.iterdir():
        if not pid_dir.name.isdigit():
            continue
        try:
            if pid_dir.stat().st_uid != uid:
                continue
            fds = list((pid_dir / "fd").iterdir())
        except OSError:  # the process ended, or is not ours to read
            continue
        for fd in fds:
            with contextlib.suppress(OSError):
                st = fd.stat()
                held.add((st.st_dev, st.st_ino))
    return held


def clear_stale_build_locks(root: Path | None = None) -> list[Path]:
    """Remove the build locks under `root` that no live process holds; returns those removed."""
    root = extension_root() if root is None else root
    try:
        guard = open(root / ".zerofit-lock-check", "a")  # noqa: SIM115 - held for the scan
    except OSError:  # no cache yet, or a read-only one: nothing to remove
        return []
    with guard:
        fcntl.flock(guard, fcntl.LOCK_EX)  # released when the file closes, or this process dies
        return _remove_unheld(root)


def settle() -> None:
    """Wait for builders between closing and removing their locks to remove them."""
    time.sleep(SETTLE_S)


def _unheld(locks: dict[Path, tuple[int, int]], uid: int) -> dict[Path, tuple[int, int]] | None:
    """Those of `locks` that are still the same file and open in no process (None: unknowable)."""
    held = open_inodes(uid) if locks else set()
    if held is None:
        return None
    out = {}
    for path, inode in locks.items():
        with contextlib.suppress(OSError):  # gone since the listing: a build just ended
            now = path.stat()  # the same file as listed: no build replaced it since
            if inode not in held and (now.st_dev, now.st_ino) == inode:
                out[path] = inode
    return out


def _remove_unheld(root: Path) -> list[Path]:
    uid = os.getuid()
    locks = {}
    for path in candidate_locks(root):
        with contextlib.suppress(OSError):  # gone since the listing: a build just ended
            st = path.stat()
            if st.st_uid == uid:
                locks[path] = (st.st_dev, st.st_ino)
    unheld = _unheld(locks, uid)
    if not unheld:
        return []
    settle()  # a lock being released is removed by its builder meanwhile
    stale = _unheld(unheld, uid) or {}
    removed = []
    for path in stale:
        with contextlib.suppress(OSError):
            path.unlink()
            removed.append(path)
    return removed


def clear_and_report(rank: int) -> None:
    """Clear stale locks, and say so on stderr (each rank names what it removed)."""
    for lock in clear_stale_build_locks():
        print(
            f"[rank {rank}] removed a stale build lock left by a killed process: {lock}",
            file=sys.stderr,
            flush=True,
        )

"""One run per run folder: `zerofit train` holds an exclusive lock on ``<run_dir>/zerofit.lock``.

The lock is taken before anything in the folder is read or written (checkpoints chosen, metrics
truncated, the config saved) and held for the whole run by the launcher: the process `zerofit
train` started, which outlives its workers and their elastic restarts (under an external torchrun
or srun, rank 0's process). A second `zerofit train` or `--resume` on the same folder stops with
one line naming the holder's pid, exit 2.

In a multi-node run, node 0's launcher holds ``zerofit.lock``; every other node's launcher holds
``zerofit.node<N>.lock`` in the same shared folder (when its filesystem shows it there), so a
second job's node N is refused at once instead of waiting in the rendezvous for a node 0 that was
refused.

It is an `fcntl.flock` on an open file: the kernel drops it when the holder's process ends,
however it ends (SIGKILL and out-of-memory kills included), so a dead run never leaves the folder
locked, and there is nothing to clean up. The pid in the file is only for the message; the file
itself stays. Workers never inherit the lock (the descriptor closes on exec).
"""

from __future__ import annotations

import errno
import fcntl
import os
import sys
import time
from pathlib import Path

from zerofit.errors import UserError

LOCK_FILE = "zerofit.lock"
_held: dict[Path, int] = {}  # lock file (resolved) -> the descriptor holding its lock


def check_free(run_dir: Path) -> None:
    """UserError naming the pid that holds ``run_dir``'s lock, if another process does; creates
    and writes nothing (a refused run leaves the folder as it was)."""
    try:
        fd = os.open(run_dir / LOCK_FILE, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:  # no lock file: never locked (or unreadable: `hold` says why)
        return
    try:
        if not _try(fd, fcntl.LOCK_SH):  # a shared lock, dropped at once by the close below
            raise _in_use(run_dir, fd)
    except OSError:  # a filesystem without locks: `hold` notes it
        pass
    finally:
        os.close(fd)


def lock_file(node: int = 0) -> str:
    """The lock's file name for a launcher on ``node`` (node 0: the run's own lock)."""
    return LOCK_FILE if node == 0 else f"zerofit.node{node}.lock"


def hold(run_dir: Path, node: int = 0) -> None:
    """Lock ``run_dir`` (an existing folder) for this process as the launcher of ``node``, until
    `release_all` or the process's end; holding it already is a no-op. UserError naming the pid
    that holds it."""
    path = run_dir / lock_file(node)
    key = path.resolve()
    if key in _held:
        return
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    except OSError as e:
        raise UserError(f"log.run_dir: cannot open {path} ({e.strerror or e})") from None
    try:
        held = _try(fd, fcntl.LOCK_EX)
    except OSError as e:  # a filesystem without locks
        os.close(fd)
        print(
            f"note: {path} cannot be locked ({e.strerror or e}): a second run on this folder "
            "would not be refused",
            file=sys.stderr,
            flush=True,
        )
        return
    if not held:
        error = _in_use(run_dir, fd, node)
        os.close(fd)
        raise error
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    _held[key] = fd


def _try(fd: int, kind: int) -> bool:
    """Whether ``fd`` got the lock; a few tries over half a second, so that another run's
    `check_free` (a shared lock of a moment) is not taken for a holder."""
    for attempt in range(10):
        try:
            fcntl.flock(fd, kind | fcntl.LOCK_NB)
            return True
        except OSError as e:
            if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise
        if attempt < 9:
            time.sleep(0.05)
    return False


def _in_use(run_dir: Path, fd: int, node: int = 0) -> UserError:
    who = "another zerofit train" if node == 0 else f"node {node} of another multi-node run"
    return UserError(
        f"run directory {run_dir} is in use by {who} (pid {_holder(fd)}); wait for it to end, "
        "or choose another log.run_dir"
    )


def _holder(fd: int) -> str:
    """The pid the holder wrote (it writes it just after locking: a moment's wait at most)."""
    for _ in range(40):
        text = os.pread(fd, 32, 0).decode(errors="replace").strip()
        if text.isdigit():
            return text
        time.sleep(0.05)
    return "unknown"


def release_all() -> None:
    """Drop every lock this process holds (closing the descriptor drops it)."""
    while _held:
        os.close(_held.popitem()[1])

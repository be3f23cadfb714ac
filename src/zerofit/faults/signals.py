"""Preemption inside a worker: the first SIGTERM or SIGINT asks the run to stop after the current
optimizer step (the trainer agrees on the step across ranks, saves and exits 128 + signal); a
second one kills the process at once, by the signal's default action.

Whatever sends it works: our launcher forwards the signal it gets, torchrun forwards its own, and
Slurm and Kubernetes signal every task.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
import time
from pathlib import Path
from types import FrameType

HANDLED = (signal.SIGTERM, signal.SIGINT)


# In the launcher's error directory once it was asked to stop, holding the signal's number: a
# worker that starts after that stops too (see zerofit.train.worker.main).
STOP_MARKER = "STOP"


class StopSignals:
    """Records the first stop signal; re-arms the default action so the next one is fatal."""

    def __init__(self) -> None:
        self.signum = 0
        self.received_at: float | None = None

    def install(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            for sig in HANDLED:
                signal.signal(sig, self._handle)
        return self

    def mark(self, signum: int) -> None:
        """A stop request that came another way (the launcher's STOP_MARKER). The handlers stay:
        the launcher's forwarded copy of the same signal may still be on its way."""
        if not self.signum:
            self.signum, self.received_at = signum, time.monotonic()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.signum:
            return
        self.signum = signum
        self.received_at = time.monotonic()
        # A second signal (of either kind) now ends the process at once, even while this thread
        # waits inside a collective where no Python handler could run.
        for sig in HANDLED:
            signal.signal(sig, signal.SIG_DFL)


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def die_with_parent(launcher: int) -> bool:
    """Have the kernel kill this process when its parent dies: our launcher, or the rank's
    supervisor, forked from the launcher's fork server (`zerofit.train.forked`), which ends when
    the launcher does. False if `launcher` is not among the three nearest ancestors (gone
    already). A launcher killed outright (SIGKILL, an OOM kill, a test's timeout) cannot forward
    a signal, and its workers would otherwise live on, holding ports, memory and build locks.
    This is the second-signal case: the workers go at once. Linux only; elsewhere nothing
    changes."""
    if sys.platform.startswith("linux"):
        pr_set_pdeathsig = 1
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(pr_set_pdeathsig, int(signal.SIGKILL), 0, 0, 0)
    # checked after prctl: a parent gone before it is seen here
    ancestor: int | None = os.getppid()
    for _ in range(3):  # the launcher, or the fork server's, or the supervisor's
        if ancestor == launcher:
            return True
        ancestor = parent_of(ancestor) if ancestor else None
    return False


def name_process(name: str) -> None:
    """This process's name as `ps`, `top` and /proc/<pid>/comm show it (15 bytes; Linux only): a
    forked worker otherwise shows its fork server's command line, as every one of its ranks."""
    if sys.platform.startswith("linux"):
        pr_set_name = 15
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(pr_set_name, name.encode()[:15], 0, 0, 0)


def parent_of(pid: int) -> int | None:
    """`pid`'s parent, from /proc (None where it cannot be read: gone, or not Linux)."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None

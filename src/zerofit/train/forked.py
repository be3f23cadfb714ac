"""A worker started as a fork of the launcher's fork server (`zerofit.launch.forkserver`).

torch's agent runs `forked` in a process the fork server forked. That process is the rank's
supervisor: it restores what a fresh process would have had (the launcher's environment at spawn
time under the agent's per-rank variables, a session of its own, the agent's thread count), forks
the worker itself (named ``zerofit-rank<N>``, killed by the kernel if the supervisor goes), passes
stop signals on to it, waits for it and ends as it ended: with its exit status, or killed by its
signal.

Why a supervisor: when a rank fails, torch's agent reports only the first process it finds ended
(a SIGKILLed rank and the peer whose collective then failed end together). The supervisor leaves
each failed rank's status in the error folder (``exit<rank>``), so the launcher names the rank
that was killed, as it does for workers that torchrun starts as commands.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from multiprocessing import forkserver
from pathlib import Path

from zerofit.faults.signals import die_with_parent, name_process
from zerofit.train.worker import main

# The environment this module was imported with: in the fork server, the server's, which
# `forked` tells the agent's per-rank variables from
_IMPORTED_ENV = dict(os.environ)
PASSED_ON = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1)


def status_file(error_dir: Path, rank: int) -> Path:
    return error_dir / f"exit{rank}"


def exit_statuses(error_dir: Path) -> dict[int, int]:
    """Each failed rank's exit status, as its supervisor left it (negative: killed by that signal)."""
    out = {}
    for f in error_dir.glob("exit[0-9]*"):
        try:
            out[int(f.name[4:])] = int(f.read_text())
        except (OSError, ValueError):
            continue
    return out


def forked(argv: list[str], env: dict[str, str], error_dir: str) -> int:
    """The rank's supervisor (see the module docstring); returns 0 when the worker did."""
    agent = {k: v for k, v in os.environ.items() if _IMPORTED_ENV.get(k) != v}
    os.environ.clear()
    os.environ.update({**env, **agent})
    os.setsid()
    _let_the_server_end()
    die_with_parent(os.getppid())  # the fork server, which ends with the launcher
    rank = int(os.environ.get("RANK", "0"))
    status = status_file(Path(error_dir), rank)
    status.unlink(missing_ok=True)  # a restart's supervisor: the last attempt's is no longer news
    # a stop signal that arrives before the handlers are in place waits for them (blocked
    # across the fork; the worker unblocks its own copy of the mask)
    signal.pthread_sigmask(signal.SIG_BLOCK, PASSED_ON)
    worker = os.fork()
    if worker == 0:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, PASSED_ON)
        _work(argv, rank)
    for sig in PASSED_ON:
        signal.signal(sig, lambda signum, _frame: _pass_on(worker, signum))
    signal.pthread_sigmask(signal.SIG_UNBLOCK, PASSED_ON)
    name_process(f"zerofit-sup{rank}")
    _, wait_status = os.waitpid(worker, 0)
    for sig in PASSED_ON:  # the worker is reaped: its pid may be anyone's now
        signal.signal(sig, signal.SIG_IGN)
    code = os.waitstatus_to_exitcode(wait_status)
    if code == 0:
        return 0
    status.write_text(str(code))
    sys.stdout.flush()
    sys.stderr.flush()
    if code < 0:  # end as the worker did: killed by its signal
        with contextlib.suppress(OSError, ValueError):  # SIGKILL's action cannot be set
            signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    os._exit(code if code > 0 else 1)


def _pass_on(worker: int, signum: int) -> None:
    """A stop signal, on to the worker. It may have ended already, a zombie not yet reaped: no
    error may escape into the supervisor's wait, or its exit status would never be written."""
    with contextlib.suppress(OSError):
        os.kill(worker, signum)


def _let_the_server_end() -> None:
    """Close this process's copy of the launcher's end of the fork server's pipe: every fork of
    the server is handed one, and the server ends only once every copy is closed. With it closed
    here, a launcher killed outright ends the server, and with it this supervisor and its worker."""
    server = forkserver._forkserver
    fd = getattr(server, "_forkserver_alive_fd", None)
    if fd is not None:
        with contextlib.suppress(OSError):
            os.close(fd)
        server._forkserver_alive_fd = None


def _work(argv: list[str], rank: int) -> None:
    """The worker: the fork of the supervisor that trains. Never returns."""
    die_with_parent(os.getppid())  # the supervisor; `main` checks the launcher is still there
    name_process(f"zerofit-rank{rank}")
    threads = os.environ.get("OMP_NUM_THREADS", "")
    # preloaded by the fork server, which imported it with one OpenMP thread
    import torch

    torch.set_num_threads(int(threads) if threads.isdigit() else os.cpu_count() or 1)
    code = 1
    try:
        code = main(argv)
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)

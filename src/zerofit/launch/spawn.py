"""Start this node's workers through torch's elastic agent, and end with one line.

The agent is configured as `torchrun` would configure it (`torchrun_args`); each worker is forked from
the launcher's fork server (`zerofit.launch.forkserver`) by `zerofit.train.forked`.

Signals: the launcher handles SIGTERM and SIGINT itself (torch's agent is told to leave them). The
first is forwarded to every worker, which finishes its optimizer step, saves and leaves a record;
the workers exit 0 so the agent does not restart them, and the launcher exits 128 + signal with
the workers' line. A second signal kills the workers at once (the checkpoint being written, if
any, is left incomplete and ignored; the previous one stays the newest).

Failures: `train.max_restarts` becomes the agent's restart budget (each restart resumes from the
newest verified checkpoint, see zerofit.train.run.restart_checkpoint). When the budget is spent, the
root cause among the workers' records and exit statuses is printed (zerofit.faults.report).
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import sys
import tempfile
import uuid
from pathlib import Path
from types import FrameType
from typing import Any

from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.launcher.api import elastic_launch
from torch.distributed.run import config_from_args, get_args_parser

from zerofit import checkpoint as ckpt
from zerofit.config.schema import Config
from zerofit.errors import UserError
from zerofit.faults import report
from zerofit.faults.signals import HANDLED, STOP_MARKER, parent_of, signal_name
from zerofit.launch import forkserver
from zerofit.launch.options import LaunchOptions, PreparedRun
from zerofit.train.forked import exit_statuses, forked


class ForcedStop(Exception):
    """A second stop signal: the workers were killed."""


class LauncherSignals:
    def __init__(self, error_dir: Path) -> None:
        self.error_dir = error_dir
        self.signum = 0
        self.forced = False
        self._previous: dict[int, Any] = {}

    def install(self) -> None:
        for sig in HANDLED:
            self._previous[sig] = signal.signal(sig, self._handle)

    def uninstall(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if not self.signum:
            self.signum = signum
            (self.error_dir / STOP_MARKER).write_text(str(signum))
            workers = child_pids()
            for pid in workers:
                _send(pid, signum)
            if workers:
                return
        self.forced = True
        for pid in child_pids():
            _send(pid, signal.SIGKILL, group=True)
        raise ForcedStop


def _send(pid: int, sig: int, group: bool = False) -> None:
    try:
        if group:
            os.killpg(pid, sig)  # a worker leads its own session: its helpers go too
        else:
            os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        if group:
            _send(pid, sig)


def child_pids() -> list[int]:
    """The workers, from /proc: this process's children and its fork server's, the launcher's
    helper processes left out (`forkserver.helper_pids`)."""
    helpers = forkserver.helper_pids()
    parents = {os.getpid(), *helpers}
    pids = (int(d.name) for d in Path("/proc").glob("[0-9]*"))
    return [pid for pid in pids if pid not in helpers and parent_of(pid) in parents]


def resume_hint(cfg: Config, run_dir: Path, config_file: Path) -> str:
    last = ckpt.latest_checkpoint(ckpt.checkpoint_root(cfg.checkpoint.dir, run_dir))
    again = f"zerofit train -c {config_file} --resume"
    if last is None:  # --resume starts a run that never saved again, in its own folder
        return f"No checkpoint was saved (set checkpoint.every to save as you go); start it again with: {again}"
    return f"The last checkpoint is {last}; continue with: {again}"


def torchrun_args(opts: LaunchOptions, nproc: int, max_restarts: int, log_dir: Path) -> list[str]:
    args = ["--nproc-per-node", str(nproc), "--nnodes", str(opts.nnodes)]
    if opts.nnodes == 1 and not opts.rdzv_endpoint:
        args.append("--standalone")
    else:
        if not opts.rdzv_endpoint:
            raise UserError("--nnodes > 1 needs --rdzv-endpoint HOST:PORT")
        args += ["--node-rank", str(opts.node_rank), "--rdzv-endpoint", opts.rdzv_endpoint]
        args += ["--rdzv-backend", opts.rdzv_backend]
    args += ["--max-restarts", str(max_restarts), "--log-dir", str(log_dir)]
    known = {s for a in get_args_parser()._actions for s in a.option_strings}
    if "--signals-to-handle" in known:  # leave TERM and INT to LauncherSignals
        args += ["--signals-to-handle", "SIGHUP,SIGQUIT"]
    os.environ["TORCHELASTIC_SIGNALS_TO_HANDLE"] = "SIGHUP,SIGQUIT"
    return args


def launch(args: list[str], argv: list[str], error_dir: Path) -> None:
    """Run torch's elastic agent as `torchrun ARGS` would, its workers forks of the fork server
    running `forked(argv, <this environment>, error_dir)`; ChildFailedError when one fails for
    good."""
    parsed = get_args_parser().parse_args([*args, "zerofit-worker"])  # the script is unused
    if parsed.standalone:  # as torchrun's own `run` sets it up
        parsed.rdzv_backend, parsed.rdzv_endpoint = "c10d", "localhost:0"
        parsed.rdzv_id = str(uuid.uuid4())
    if parsed.master_port is None:
        parsed.master_port = 29500
    config, _, _ = config_from_args(parsed)
    config.start_method = forkserver.METHOD
    forkserver.start()  # running already when `zerofit train` started it
    elastic_launch(config, forked)(argv, dict(os.environ), str(error_dir))


def worker_argv(prep: PreparedRun, error_dir: Path | None = None) -> list[str]:
    argv = ["--config", str(prep.config_file), "--run-dir", str(prep.run_dir)]
    if prep.resume_from:
        argv += ["--resume", str(prep.resume_from)]
    if error_dir is not None:  # started by our launcher (this process): live and die with it
        argv += ["--error-dir", str(error_dir), "--launcher-pid", str(os.getpid())]
    return argv


def spawn(prep: PreparedRun, opts: LaunchOptions, nproc: int) -> int:
    """Start `nproc` workers on this node; returns the exit status after printing its line."""
    logging.getLogger("torch.distributed.elastic").setLevel(logging.CRITICAL)
    logging.getLogger("torch.distributed.run").setLevel(logging.CRITICAL)
    # "Terminating process N via signal SIGTERM": the agent stopping a failed rank's peers
    logging.getLogger("torch.multiprocessing.spawn").setLevel(logging.CRITICAL)
    if "OMP_NUM_THREADS" not in os.environ:
        os.environ["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // nproc))
    scratch = Path(tempfile.mkdtemp(prefix="zerofit-launch-"))
    error_dir = scratch / "errors"
    error_dir.mkdir()
    args = torchrun_args(opts, nproc, prep.cfg.train.max_restarts, scratch / "elastic")
    stopper = LauncherSignals(error_dir)
    stopper.install()
    codes: dict[int, int] = {}
    try:
        launch(args, worker_argv(prep, error_dir), error_dir)
    except ChildFailedError as e:
        codes = {rank: f.exitcode for rank, f in e.failures.items()}
    except ForcedStop:
        pass
    finally:
        stopper.uninstall()
        records = report.read_records(error_dir)
        # every failed rank's status: the agent's error names only the first rank it saw end,
        # and only as its supervisor ended; the supervisor's file says how the worker ended
        codes = {**codes, **exit_statuses(error_dir)}
        shutil.rmtree(scratch, ignore_errors=True)
    if opts.nnodes == 1:  # every writer is gone: a save cut short leaves nothing behind
        root = ckpt.checkpoint_root(prep.cfg.checkpoint.dir, prep.run_dir)
        for partial in root.glob("step_*.tmp") if root.is_dir() else []:
            shutil.rmtree(partial, ignore_errors=True)
    hint = resume_hint(prep.cfg, prep.run_dir, prep.config_file)
    if stopper.signum:
        line, code = stopped_line(stopper, records, codes, hint)
    elif codes:
        line, code = report.launcher_line(records, codes, hint)
        line = f"error: {line}"
    else:
        return 0
    print(line, file=sys.stderr, flush=True)
    return code


def stopped_line(
    stopper: LauncherSignals, records: dict[int, report.Record], codes: dict[int, int], hint: str
) -> tuple[str, int]:
    name, code = signal_name(stopper.signum), 128 + stopper.signum
    if stopper.forced:
        return (
            f"stopped at once by a second {name}: the step in progress, and any checkpoint being "
            f"written, are lost. {hint}",
            code,
        )
    stops = sorted((r for r in records.values() if r.kind == "signal"), key=lambda r: r.rank)
    others = {r: rec for r, rec in records.items() if rec.kind not in ("signal", "peer")}
    if others or (codes and not stops):
        line, status = report.launcher_line(records, codes, hint)
        return f"error: while stopping on {name}: {line}", status
    if stops:
        return stops[0].line, code
    return f"stopped by {name} before the first step finished. {hint}", code

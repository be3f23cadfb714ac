"""Entry point of one training process, and how any training process ends.

`zerofit train` starts workers through torch's elastic agent, each forked from the launcher's fork
server (`zerofit.train.forked`); `python -m zerofit.train.worker` starts one as a fresh process. Under an external torchrun or srun, `zerofit train` itself is the worker
(`zerofit.cli`). Either way
`run_worker` runs the training and turns every way it can end into an exit status and, where
the user must be told, one line: printed here, or left as a record for our launcher to print.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import cast

from zerofit.config.schema import Config
from zerofit.errors import EXIT_IO, RunStopped, UserError
from zerofit.faults import report
from zerofit.faults.signals import STOP_MARKER, StopSignals, die_with_parent
from zerofit.launch.options import LaunchOptions, PreparedRun
from zerofit.launch.resolve import mesh_replicas
from zerofit.launch.run_config import load_config


def run_worker(
    load: Callable[[], Config],
    run_dir: Path,
    resume: Path | None,
    config_file: Path,
    error_dir: Path | None,
    signals: StopSignals,
) -> int:
    """Train, then return the exit status. ``load`` returns the Config (it runs inside the
    error handling, so even a config that fails to load is reported the same way)."""
    # torch loads here, once `main` has installed the stop-signal handlers (it takes seconds)
    from zerofit.distributed.mesh import shutdown
    from zerofit.train.run import RunControl, run_training  # torch: after the signal handlers

    rank = int(os.environ.get("RANK", 0))
    restart = restart_count()
    if error_dir:
        report.clear_records(error_dir, rank)
    control = RunControl(signals, f"zerofit train -c {config_file} --resume", restart)
    try:
        run_training(load(), run_dir, resume, control)
        return 0
    except UserError as e:
        return _ended(error_dir, rank, "user", 2, str(e))
    except RunStopped as e:
        code = _ended(error_dir, rank, e.kind, e.code, str(e))
        # Under our launcher a preempted worker exits 0, so the elastic agent does not restart
        # it; the launcher exits with the record's status.
        return 0 if error_dir and e.kind == "signal" else code
    except Exception as e:  # noqa: BLE001 - every way out is reported
        return _crashed(error_dir, rank, e, signals)
    finally:
        shutdown()


def _crashed(error_dir: Path | None, rank: int, e: Exception, signals: StopSignals) -> int:
    if signals.signum or report.is_peer_failure(e):
        # Another rank died (or the group is being torn down): a consequence, not the cause.
        return _ended(error_dir, rank, "peer", 1, f"{type(e).__name__}: {str(e)[:200]}")
    if isinstance(e, OSError):
        return _ended(error_dir, rank, "io", EXIT_IO, f"I/O error: {report.describe_os_error(e)}")
    traceback.print_exc()
    line = f"rank {rank} failed: {type(e).__name__}: {str(e)[:300]} (its traceback is above)"
    return _ended(error_dir, rank, "crash", 1, line)


def _ended(error_dir: Path | None, rank: int, kind: str, code: int, line: str) -> int:
    if error_dir:  # the launcher prints one line for all ranks
        report.write_record(error_dir, rank, kind, code, line)
    elif rank == 0 or kind in ("crash", "io"):
        prefix = "" if kind == "signal" else "error: "
        print(f"{prefix}{line}" if rank == 0 else f"{prefix}(rank {rank}) {line}", file=sys.stderr)
    return code


def train_joined(cfg: Config, opts: LaunchOptions) -> tuple[int, PreparedRun | None]:
    """One rank started by an external torchrun or srun: rank 0 prepares the run (every input
    check, the run directory), then every rank trains. Returns the exit status and, on rank 0,
    the prepared run. A stop signal, non-finite values or a failed save end the rank with its own
    status and (rank 0) one line."""
    # torch-free path: `zerofit plan` imports this module (through zerofit.commands.train)
    from zerofit.distributed.mesh import init_distributed, shutdown
    from zerofit.launch.prepare import prepare_run  # torch-free path: it imports torch

    signals = StopSignals().install()
    ctx = init_distributed(mesh_replicas(cfg))
    result: object = None
    if ctx.is_main:
        try:
            result = prepare_run(cfg, opts, ctx.world_size, ctx.device.type)
        except UserError as e:
            result = e
    result = ctx.broadcast_object(result)
    if isinstance(result, UserError):
        shutdown()
        raise result
    prep = cast(PreparedRun, result)
    code = run_worker(
        lambda: prep.cfg, prep.run_dir, prep.resume_from, prep.config_file, None, signals
    )
    return code, prep if ctx.is_main else None


def restart_count() -> int:
    """How many times torch's elastic agent restarted this worker's group (0: the first start)."""
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0)


def stop_requested(error_dir: Path, signals: StopSignals) -> bool:
    """Whether this worker, restarted after its launcher was asked to stop, should exit at once.
    A first start that finds the marker (the signal came while it started, after the launcher
    forwarded it to the workers it saw) takes it as received instead: it must still meet its
    peers, which may already wait for it in init_process_group, and stop with them at step 0."""
    marker = error_dir / STOP_MARKER
    if not marker.exists():
        return False
    if restart_count() > 0:
        return True
    text = marker.read_text().strip()
    signals.mark(int(text) if text.isdigit() else int(signal.SIGTERM))
    return False


def main(argv: list[str] | None = None) -> int:
    signals = StopSignals().install()  # first: a signal during start-up is a stop request too
    parser = argparse.ArgumentParser(prog="zerofit-worker")
    parser.add_argument("--config", required=True)
    parser.add_argument("--run-dir", required=True)
    parser.add_argument("--resume", default=None)
    parser.add_argument("--error-dir", default=None, help="leave each rank's outcome here")
    parser.add_argument("--launcher-pid", type=int, default=None, help="end when it ends")
    args = parser.parse_args(argv)
    if args.launcher_pid is not None and not die_with_parent(args.launcher_pid):
        return 1  # our launcher died before we started: nobody is left to train for
    if args.error_dir and stop_requested(Path(args.error_dir), signals):
        return 0  # restarted after our launcher was asked to stop: nothing to do
    return run_worker(
        lambda: load_config(args.config),
        Path(args.run_dir),
        Path(args.resume) if args.resume else None,
        Path(args.config),
        Path(args.error_dir) if args.error_dir else None,
        signals,
    )


if __name__ == "__main__":
    exit_code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # Everything is written and the process group is destroyed. Skip interpreter teardown: with
    # gloo and CPU offload, C++ worker threads destroyed at exit have aborted the process (SIGABRT,
    # "terminate called without an active exception") after a complete run.
    os._exit(exit_code)

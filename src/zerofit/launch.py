"""Run preparation (all input checks happen here, before any worker starts) and process launch.

`zerofit train` starts its own workers through torch.distributed.run (N GPUs, or N gloo CPU
processes); under an external torchrun or srun it joins that process group instead.
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from zerofit import checkpoint as ckpt
from zerofit.checkpoint import compat
from zerofit.config import Config, check_world, resolve_precision, save_config
from zerofit.errors import UserError
from zerofit.metrics import truncate_metrics


@dataclass
class LaunchOptions:
    nproc: int | None = None  # None: every visible GPU, or 2 CPU processes
    nnodes: int = 1
    node_rank: int = 0
    rdzv_endpoint: str | None = None
    rdzv_backend: str = "static"
    resume: str | None = None  # None: fresh run; "latest": newest checkpoint; or a path


@dataclass
class PreparedRun:
    cfg: Config
    run_dir: Path
    config_file: Path
    resume_from: Path | None


def default_nproc() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 2


def check_nproc(nproc: int) -> None:
    if nproc < 1:
        raise UserError(f"--nproc must be >= 1, got {nproc}")
    if torch.cuda.is_available() and nproc > torch.cuda.device_count():
        raise UserError(f"--nproc {nproc} but only {torch.cuda.device_count()} GPU(s) are visible")


def ensure_writable_dir(path: Path, what: str) -> None:
    """Create ``path`` and prove it takes a file, now rather than at the first save."""
    shown = str(path)[:200] + ("..." if len(str(path)) > 200 else "")
    if "\x00" in str(path):
        raise UserError(f"{what}: the path contains a NUL byte: {shown!r}")
    try:
        if path.exists() and not path.is_dir():
            raise UserError(f"{what}: {shown} exists and is not a directory")
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".zerofit-write-test-{os.getpid()}"
        probe.write_bytes(b"ok")
        probe.unlink()
    except OSError as e:
        raise UserError(
            f"{what}: {shown} is not a writable directory ({e.strerror or e})"
        ) from None


def _find_resume(cfg: Config, resume: str) -> tuple[Path, Path, dict, list[str]]:
    """(run_dir, checkpoint, its meta, skip notes) for --resume [PATH].

    A checkpoint named explicitly must verify; otherwise the newest one that verifies is taken,
    with one note per newer checkpoint skipped as damaged."""
    if resume != "latest":
        path = Path(resume)
        if not path.exists():
            raise UserError(f"--resume: no such checkpoint or run directory: {path}")
        if (path / "model").is_dir() or (path / "meta.json").exists():  # <run>/checkpoints/step_N
            run_dir = Path(cfg.log.run_dir) if cfg.log.run_dir else path.parent.parent
            return run_dir, path, ckpt.verify(path), []
        return (path, *ckpt.select_checkpoint(ckpt.checkpoint_root(cfg.checkpoint.dir, path)))
    if cfg.log.run_dir:
        run_dir = Path(cfg.log.run_dir)
        return (run_dir, *ckpt.select_checkpoint(ckpt.checkpoint_root(cfg.checkpoint.dir, run_dir)))
    runs = sorted(
        (p for p in Path("runs").glob("*") if ckpt.step_dirs(p / "checkpoints")),
        key=lambda p: p.stat().st_mtime,
    )
    if not runs:
        raise UserError(
            "--resume: no run with a checkpoint under runs/; pass a path or set log.run_dir"
        )
    return (runs[-1], *ckpt.select_checkpoint(runs[-1] / "checkpoints"))


def _new_run_dir(cfg: Config) -> Path:
    if cfg.log.run_dir:
        run_dir = Path(cfg.log.run_dir)
        if (run_dir / "config.yaml").exists():
            raise UserError(
                f"run directory {run_dir} already holds a run; pass --resume or choose another log.run_dir"
            )
        return run_dir
    base = Path("runs") / time.strftime("%Y%m%d-%H%M%S")
    run_dir, n = base, 1
    while run_dir.exists():
        run_dir, n = base.with_name(f"{base.name}-{n}"), n + 1
    return run_dir


def prepare_run(
    cfg: Config, opts: LaunchOptions, world_size: int, device_type: str, create: bool = True
) -> PreparedRun:
    """Every check that can fail on user input, then the run directory and its resolved config."""
    from zerofit.backends import get_backend
    from zerofit.trainer import build_inputs, checkpoint_meta, make_loader  # torch-heavy imports

    if cfg.parallel.backend == "auto":
        from zerofit.planner.auto import resolve_auto

        cfg = resolve_auto(cfg, world_size)
    cfg = get_backend(cfg.parallel.backend).prepare_config(cfg, world_size, device_type)
    cfg = replace(cfg, precision=resolve_precision(cfg.precision, device_type))
    dp = check_world(cfg, world_size)
    inputs = build_inputs(cfg)
    make_loader(cfg, inputs.data, 0, dp)  # raises if the data cannot fill one global batch
    resume_from = None
    if opts.resume:
        run_dir, resume_from, saved, notes = _find_resume(cfg, opts.resume)
        current = checkpoint_meta(cfg, inputs.spec, world_size)
        notes += compat.check(resume_from, saved, current, cfg.optim)
        step = saved["step"]
        if step >= cfg.train.steps:
            raise UserError(
                f"checkpoint {resume_from} is at step {step}; raise train.steps above it to continue"
            )
        if create:
            dropped = truncate_metrics(run_dir, step)
            if dropped:
                notes.append(
                    f"metrics.jsonl: {dropped} record(s) after step {step} moved to metrics.abandoned.jsonl"
                )
        for line in [f"resuming from {resume_from} (step {step})", *notes]:
            print(f"note: {line}", file=sys.stderr, flush=True)
        name = f"config.resume-{step:08d}.yaml"
    elif not create and cfg.log.run_dir:  # another node of a multi-node run: node 0 owns the dir
        run_dir = Path(cfg.log.run_dir)
        name = "config.yaml"
    else:
        run_dir = _new_run_dir(cfg)
        name = "config.yaml"
    cfg = replace(cfg, log=replace(cfg.log, run_dir=str(run_dir)))
    if create:
        ensure_writable_dir(run_dir, "log.run_dir")
        ensure_writable_dir(ckpt.checkpoint_root(cfg.checkpoint.dir, run_dir), "checkpoint.dir")
        config_file = run_dir / name
    else:  # a non-zero node of a multi-node run: keep the resolved config local
        config_file = Path(tempfile.mkdtemp(prefix="zerofit-")) / name
    save_config(cfg, config_file)
    return PreparedRun(cfg, run_dir, config_file, resume_from)


def worker_argv(prep: PreparedRun, error_dir: Path | None = None) -> list[str]:
    argv = ["--config", str(prep.config_file), "--run-dir", str(prep.run_dir)]
    if prep.resume_from:
        argv += ["--resume", str(prep.resume_from)]
    if error_dir is not None:
        argv += ["--error-dir", str(error_dir)]
    return argv


def worker_error_line(error_dir: Path) -> str | None:
    """One line for the input errors the workers wrote (any rank): the message once when every
    rank agrees, else the lowest rank's, naming it."""
    found = {}
    for f in error_dir.glob("rank*.txt"):
        try:
            found[int(f.stem[4:])] = f.read_text(errors="replace").strip()
        except (OSError, ValueError):
            continue
    if not found:
        return None
    rank = min(found)
    if len(set(found.values())) == 1:
        return f"error: {found[rank]}"
    return f"error (rank {rank}): {found[rank]}"


def failure_line(codes: dict[int, int]) -> str:
    """A worker that died without a Python error: say how (a signal, or an exit code)."""
    import signal

    rank, code = min(codes.items(), key=lambda kv: (kv[1] >= 0, kv[0]))
    if code < 0:
        name = (
            signal.Signals(-code).name if -code in signal.Signals._value2member_map_ else str(-code)
        )
        hint = " (the host OOM killer, or kill -9?)" if -code == signal.SIGKILL else ""
        return f"error: local rank {rank} was killed by {name}{hint}"
    return f"error: training failed on local rank {rank} (exit code {code}); its traceback is above"


def spawn(prep: PreparedRun, opts: LaunchOptions, nproc: int) -> int:
    """Start `nproc` workers on this node through torch.distributed.run. Returns an exit code."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import get_args_parser, run

    logging.getLogger("torch.distributed.elastic").setLevel(logging.CRITICAL)
    logging.getLogger("torch.distributed.run").setLevel(logging.CRITICAL)
    if "OMP_NUM_THREADS" not in os.environ:
        os.environ["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // nproc))
    args = ["--nproc-per-node", str(nproc), "--nnodes", str(opts.nnodes)]
    if opts.nnodes == 1 and not opts.rdzv_endpoint:
        args.append("--standalone")
    else:
        if not opts.rdzv_endpoint:
            raise UserError("--nnodes > 1 needs --rdzv-endpoint HOST:PORT")
        args += [
            "--node-rank",
            str(opts.node_rank),
            "--rdzv-endpoint",
            opts.rdzv_endpoint,
            "--rdzv-backend",
            opts.rdzv_backend,
        ]
    error_dir = Path(tempfile.mkdtemp(prefix="zerofit-errors-"))
    args += ["--module", "zerofit.worker", *worker_argv(prep, error_dir)]
    try:
        run(get_args_parser().parse_args(args))
    except ChildFailedError as e:
        line = worker_error_line(error_dir)
        codes = {f.local_rank: f.exitcode for f in e.failures.values()}
        print(line or failure_line(codes), file=sys.stderr)
        return 2 if line else 1
    finally:
        shutil.rmtree(error_dir, ignore_errors=True)
    return 0

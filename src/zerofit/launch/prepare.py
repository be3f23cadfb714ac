"""Run preparation (all input checks happen here, before any worker starts) and process launch.

`zerofit train` starts its own workers through torch.distributed.run (N GPUs, or N gloo CPU
processes); under an external torchrun or srun it joins that process group instead.
"""

from __future__ import annotations

import functools
import os
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from zerofit import checkpoint as ckpt
from zerofit.backends import engine_of
from zerofit.backends.terms import EngineMemory
from zerofit.checkpoint import compat
from zerofit.config import Config, explicit_keys, save_config
from zerofit.config.limits import shown
from zerofit.config.replacing import replace_config
from zerofit.config.sizes import human_bytes
from zerofit.errors import UserError
from zerofit.launch import run_lock
from zerofit.launch.options import LaunchOptions, PreparedRun
from zerofit.launch.requirements import check_installed
from zerofit.launch.resolve import resolve
from zerofit.models.shape import shape_from_config
from zerofit.planner.memory import workload_for
from zerofit.planner.plan import HOST_SHARE
from zerofit.planner.shape import host_ram
from zerofit.report.metrics import truncate_metrics
from zerofit.train.inputs import build_inputs, checkpoint_meta, make_loader, resolve_steps

if TYPE_CHECKING:
    from zerofit.models import ModelSpec


def default_nproc() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 2


def device_type() -> str:
    """The device the workers started here train on."""
    return "cuda" if torch.cuda.is_available() else "cpu"


def check_nproc(nproc: int) -> None:
    if nproc < 1:
        raise UserError(f"--nproc must be >= 1, got {nproc}")
    if torch.cuda.is_available() and nproc > torch.cuda.device_count():
        raise UserError(f"--nproc {nproc} but only {torch.cuda.device_count()} GPU(s) are visible")


def local_ranks(opts: LaunchOptions, world_size: int) -> int:
    """The ranks on this node: torchrun's LOCAL_WORLD_SIZE under an external launcher, else an
    even share of the world over the nodes."""
    given = os.environ.get("LOCAL_WORLD_SIZE", "")
    return int(given) if given.isdigit() and int(given) > 0 else world_size // max(1, opts.nnodes)


def _planned(cfg: Config, world_size: int) -> EngineMemory:
    """The planner's memory of the resolved config, per rank."""
    engine = engine_of(cfg)
    w = workload_for(cfg, world_size)
    return engine.memory(shape_from_config(cfg), w, engine.opts(cfg))


def check_machine(
    cfg: Config,
    world_size: int,
    ranks_here: int,
    planned: Callable[[], EngineMemory] | None = None,
) -> None:
    """What this node must offer the resolved config (the engine's `check_machine`: NVMe
    offload's op and directory, sized by the planner's bytes per rank, `planned`), before any
    rank starts. Host RAM is checked once the inputs are (`check_host_ram`, from `prepare_run`)."""
    planned = planned or (lambda: _planned(cfg, world_size))
    engine_of(cfg).check_machine(cfg, planned, ranks_here)


def check_host_ram(per_rank: float, ranks: int, total: int | None) -> str | None:
    """Offloaded states and pinned buffers (the planner's host bytes, torch's pinned rounding
    included) over this machine's RAM: one line, before any rank pins a byte; over the planner's
    share of it (HOST_SHARE), the note to print (None: nothing to say)."""
    need = per_rank * ranks
    if not need or total is None:
        return None
    what = (
        f"host RAM: {ranks} rank(s) x {human_bytes(per_rank)} of offloaded states and pinned "
        f"buffers (the planner's count) = {human_bytes(need)}"
    )
    if need > total:
        raise UserError(
            f"{what}, more than this machine's {human_bytes(total)}; "
            "`zerofit plan -c CONFIG` lists what fits"
        )
    if need > HOST_SHARE * total:
        return (
            f"{what}, over {HOST_SHARE:.0%} of this machine's {human_bytes(total)}: "
            "the OS and the data loader need the rest"
        )
    return None


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
    except (OSError, RecursionError, ValueError) as e:
        why = e.strerror if isinstance(e, OSError) and e.strerror else type(e).__name__
        raise UserError(f"{what}: {shown} is not a writable directory ({why})") from None


def _resume_run_dir(cfg: Config, resume: str) -> tuple[Path, Path | None]:
    """The run folder ``--resume [PATH]`` continues, and the checkpoint PATH names (None: the
    newest of the run). Without a path, only this run's own folder (its ``log.run_dir``)."""
    if resume == "latest":
        if not cfg.log.run_dir:  # the newest run under runs/ may be another run's: never guess
            raise UserError(
                "--resume: which run? set log.run_dir to the run's folder (or pass --resume RUN_DIR)"
            )
        return Path(cfg.log.run_dir), None
    path = Path(resume)
    if not path.exists():
        raise UserError(f"--resume: no such checkpoint or run directory: {path}")
    if (path / "model").is_dir() or (path / "meta.json").exists():  # <run>/checkpoints/step_N
        return (Path(cfg.log.run_dir) if cfg.log.run_dir else path.parent.parent), path
    return path, None


def _find_resume(
    cfg: Config, resume: str, create: bool
) -> tuple[Path, Path | None, dict, list[str]]:
    """(run_dir, checkpoint, its meta, notes) for --resume [PATH]; a live run in that folder is
    named first (`run_lock.check_free`: `_prepare_resume` locks it before its first write).

    A checkpoint named explicitly must verify; otherwise the newest one that verifies is taken,
    with one note per newer checkpoint skipped as damaged. A run that stopped before its first
    save (its config.yaml, no checkpoint, no summary) starts again from step 0 in its own folder:
    checkpoint None, meta {}."""
    run_dir, named = _resume_run_dir(cfg, resume)
    if create:  # a live run there is named by its pid before anything is read
        run_lock.check_free(run_dir)
    if named is not None:
        return run_dir, named, ckpt.verify(named), []
    root = ckpt.checkpoint_root(cfg.checkpoint.dir, run_dir)
    started = (run_dir / "config.yaml").is_file() and not (run_dir / "summary.json").exists()
    if started and not ckpt.step_dirs(root):
        note = (
            f"--resume: no checkpoint under {root} yet (the run stopped before its first "
            f"save): it starts again from step 0 in {run_dir}"
        )
        return run_dir, None, {}, [note]
    return (run_dir, *ckpt.select_checkpoint(root))


def _new_run_dir(cfg: Config, create: bool) -> Path:
    """``log.run_dir`` (a live run there is named by its pid), refused when it holds a run; else a
    new folder under runs/, made here (two runs started in the same second get two)."""
    if cfg.log.run_dir:
        run_dir = Path(cfg.log.run_dir)
        if create:
            run_lock.check_free(run_dir)
        _check_unused(run_dir)
        return run_dir
    base = Path("runs") / time.strftime("%Y%m%d-%H%M%S")
    run_dir, n = base, 1
    while True:
        try:
            if create:
                run_dir.mkdir(parents=True)  # exclusive: a folder another run made is skipped
            elif run_dir.exists():
                raise FileExistsError(run_dir)
            return run_dir
        except FileExistsError:
            run_dir, n = base.with_name(f"{base.name}-{n}"), n + 1
        except OSError:  # ensure_writable_dir says why, in one line
            return run_dir


def _check_unused(run_dir: Path) -> None:
    if (run_dir / "config.yaml").exists():
        raise UserError(
            f"run directory {shown(run_dir, quote=False)} already holds a run; pass --resume or choose another log.run_dir"
        )


def _expand_user(cfg: Config) -> Config:
    """`~` in log.run_dir and checkpoint.dir, as data.source and data.tokenizer already do."""
    run_dir, ck = cfg.log.run_dir, cfg.checkpoint.dir
    return replace_config(
        cfg,
        log=replace(cfg.log, run_dir=os.path.expanduser(run_dir) if run_dir else run_dir),
        checkpoint=replace(cfg.checkpoint, dir=os.path.expanduser(ck) if ck else ck),
    )


def _prepare_resume(
    cfg: Config, resume: str, spec: ModelSpec, world_size: int, create: bool
) -> tuple[Path, Path | None, str]:
    """The checkpoint a ``--resume`` run continues (checked against this config), its notes
    printed: (run_dir, checkpoint or None to start again, the name to save the config under)."""
    run_dir, resume_from, saved, notes = _find_resume(cfg, resume, create)
    step = 0
    if resume_from is not None:
        current = checkpoint_meta(cfg, spec, world_size)
        notes += compat.check(resume_from, saved, current, cfg.optim)
        step = saved["step"]
        if step >= cfg.train.steps:
            raise UserError(
                f"checkpoint {resume_from} is at step {step}; raise train.steps above it to continue"
            )
        notes.insert(0, f"resuming from {resume_from} (step {step})")
    if create:
        if run_dir.is_dir():  # locked before the first write (metrics, config)
            run_lock.hold(run_dir)
        dropped = truncate_metrics(run_dir, step)
        if dropped:
            notes.append(
                f"metrics.jsonl: {dropped} record(s) after step {step} moved to metrics.abandoned.jsonl"
            )
    for line in notes:
        print(f"note: {line}", file=sys.stderr, flush=True)
    # A new run directory (or a run started again) gets its config.yaml (export and doctor read
    # it); a resumed one keeps the original beside each resume's.
    fresh = resume_from is None or not (run_dir / "config.yaml").exists()
    return run_dir, resume_from, "config.yaml" if fresh else f"config.resume-{step:08d}.yaml"


def prepare_run(
    cfg: Config, opts: LaunchOptions, world_size: int, device_type: str, create: bool = True
) -> PreparedRun:
    """Every check that can fail on user input, then the run directory and its resolved config."""
    steps_given = "train.steps" in explicit_keys(cfg)  # lost by the replace()s below
    cfg = resolve(_expand_user(cfg), world_size, device_type)
    check_installed(cfg)  # before anything imports them, and before any worker starts
    ranks = local_ranks(opts, world_size)
    planned = functools.cache(lambda: _planned(cfg, world_size))  # for both checks below
    check_machine(cfg, world_size, ranks, planned)
    inputs = build_inputs(cfg, world_size)  # raises if the data cannot fill one global batch
    ram_note = check_host_ram(planned().host, ranks, host_ram())
    cfg, data_note = resolve_steps(cfg, inputs.data, world_size, steps_given)  # train.epochs
    make_loader(cfg, inputs.data, 0, world_size)
    launch = engine_of(cfg).launch_check(cfg, world_size)  # the engine library's files
    if opts.resume:
        run_dir, resume_from, name = _prepare_resume(
            cfg, opts.resume, inputs.spec, world_size, create
        )
    elif not create and cfg.log.run_dir:  # another node of a multi-node run: node 0 owns the dir
        run_dir, resume_from, name = Path(cfg.log.run_dir), None, "config.yaml"
    else:
        run_dir, resume_from, name = _new_run_dir(cfg, create), None, "config.yaml"
    cfg = replace_config(cfg, log=replace(cfg.log, run_dir=str(run_dir)))
    if create:
        ensure_writable_dir(run_dir, "log.run_dir")
        run_lock.hold(run_dir)  # held already, unless the folder is new
        if not opts.resume:
            _check_unused(run_dir)  # a run that began and ended before the lock was taken
        ensure_writable_dir(ckpt.checkpoint_root(cfg.checkpoint.dir, run_dir), "checkpoint.dir")
        config_file = run_dir / name
    else:  # a non-zero node of a multi-node run: keep the resolved config local
        if run_dir.is_dir():  # a shared folder: this node's own lock (zerofit.launch.run_lock)
            run_lock.hold(run_dir, node=opts.node_rank)
        config_file = Path(tempfile.mkdtemp(prefix="zerofit-")) / name
    save_config(cfg, config_file)
    for name, text in launch.files.items():
        (config_file.parent / name).write_text(text)
    # last: a refused run prints nothing but its error line
    for line in [n for n in (data_note, ram_note) if n] + list(launch.notes):
        print(f"note: {line}", file=sys.stderr, flush=True)
    return PreparedRun(cfg, run_dir, config_file, resume_from)

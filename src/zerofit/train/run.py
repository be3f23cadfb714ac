"""One worker's run, assembled: the process group, the Trainer (which builds its parts, see
zerofit.train.components), the checkpoint to resume (asked for, or after an elastic restart the newest
that verifies), then training. A CUDA out-of-memory error becomes one line with a diagnosis."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from zerofit import checkpoint as ckpt
from zerofit.config import Config
from zerofit.distributed.mesh import cap_gpu_memory, init_distributed
from zerofit.errors import UserError
from zerofit.launch.resolve import mesh_replicas
from zerofit.report.metrics import truncate_metrics
from zerofit.report.run_files import compiled_ac_failure, oom_report
from zerofit.train.components import RunControl
from zerofit.train.trainer import Trainer

__all__ = ["RunControl", "restart_checkpoint", "run_training"]


def run_training(
    cfg: Config, run_dir: Path, resume: Path | None, control: RunControl | None = None
) -> dict[str, Any]:
    control = control or RunControl()
    ctx = init_distributed(mesh_replicas(cfg))
    cap_gpu_memory(cfg.train.gpu_memory_limit, ctx)  # before anything is allocated
    if ctx.device.type == "cuda":  # record allocations during start-up and the first steps
        torch.cuda.memory._record_memory_history(max_entries=200_000)
    try:
        trainer = Trainer(cfg, run_dir, ctx, control)
        if control.restart:
            resume = restart_checkpoint(trainer, control.restart)
        if resume is not None:
            trainer.resume(resume)
        return trainer.fit()
    except torch.cuda.OutOfMemoryError:
        raise UserError(oom_report(cfg, run_dir, ctx)) from None
    except SystemError as e:
        line = compiled_ac_failure(cfg, e)
        if line is None:
            raise
        raise UserError(line) from e


def restart_checkpoint(trainer: Trainer, restart: int) -> Path | None:
    """After an elastic restart: the newest checkpoint that verifies (rank 0 picks, every rank
    takes the same), or None to start over. Metrics of the lost steps move aside."""
    ctx, limit = trainer.ctx, trainer.cfg.train.max_restarts
    found: Path | None = None
    if ctx.is_main:
        try:
            found, saved, notes = ckpt.select_checkpoint(trainer.ckpt_root)
            step = saved["step"]
        except UserError:
            found, notes, step = None, [], 0
        truncate_metrics(trainer.run_dir, step)
        where = (
            f"resuming from {found} (step {step})" if found else "no checkpoint yet: from step 0"
        )
        for line in [f"restart {restart} of {limit} after a failure: {where}", *notes]:
            print(f"note: {line}", flush=True)
    return ctx.broadcast_object(found)  # type: ignore[return-value]

"""The parts a worker builds its run from, and how the worker was started.

`build_parts` makes the model spec and data, the loader, the engine set up with the model, what
checkpoints record about the run, and the files a run leaves at start (sharding report, env.json).
`RunControl` is how the worker was started; `agreed` turns an error on any rank into the same error
on every rank. `zerofit.train.run` assembles a run from these; `zerofit.train.trainer` trains it.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TypeVar

import torch
from torch import nn

from zerofit import checkpoint as ckpt
from zerofit.backends import checkpoint_readers, engine_of
from zerofit.backends.base import Backend
from zerofit.config import Config
from zerofit.data import DataBundle, PackedLoader
from zerofit.distributed.mesh import DistContext
from zerofit.errors import UserError
from zerofit.faults.signals import StopSignals
from zerofit.models import ModelSpec
from zerofit.models.llama import set_attention_backend
from zerofit.report.run_files import write_environment, write_sharding_report
from zerofit.train.inputs import build_inputs, checkpoint_meta, make_loader

T = TypeVar("T")


@dataclass
class RunControl:
    """How a worker was started, beyond the config: its stop signals, the command that
    continues the run (quoted in stop lines), and which elastic restart this is."""

    signals: StopSignals = field(default_factory=StopSignals)
    resume_command: str = "zerofit train --resume"
    restart: int = 0


@dataclass
class RunParts:
    """What a Trainer trains, built once per worker by `build_parts`."""

    spec: ModelSpec
    data: DataBundle
    loader: PackedLoader
    backend: Backend
    ckpt_root: Path  # where this run's checkpoints go
    meta: dict[str, Any]  # what each checkpoint records about the run (zerofit.checkpoint.compat)
    frozen: nn.Module | None = None  # DPO's reference copy (train.dpo.reference: copy)


def build_parts(cfg: Config, run_dir: Path, ctx: DistContext) -> RunParts:
    """Seed this rank, build the model and data, the loader of this rank's share, and the engine
    set up with the model (and DPO's reference copy, built from the same source: the starting
    weights, also on a resume); then write the sharding report and (rank 0) env.json. ``cfg`` is
    resolved: precision for this device, world size checked."""
    torch.manual_seed(cfg.train.seed + ctx.rank)
    set_attention_backend(cfg.model.attention)
    inputs = build_inputs(cfg)
    loader = make_loader(cfg, inputs.data, ctx.dp_rank, ctx.dp_size)
    backend: Backend = engine_of(cfg).runtime()(ctx, cfg, checkpoint_readers())
    # DPO's reference copy: the unwrapped meta module, taken before the engine wraps the policy's
    copied = cfg.train.objective == "dpo" and cfg.train.dpo.reference == "copy"
    frozen = replace(inputs.spec, module=copy.deepcopy(inputs.spec.module)) if copied else None
    backend.setup(inputs.spec, cfg.model.init_seed)
    parts = RunParts(
        spec=inputs.spec,
        data=inputs.data,
        loader=loader,
        backend=backend,
        ckpt_root=ckpt.checkpoint_root(cfg.checkpoint.dir, run_dir),
        meta=checkpoint_meta(cfg, inputs.spec, ctx.world_size),
        frozen=backend.wrap_frozen(frozen, cfg.model.init_seed) if frozen else None,
    )
    write_sharding_report(backend, run_dir, ctx)
    write_environment(run_dir, ctx)
    return parts


def agreed(ctx: DistContext, fn: Callable[[], T]) -> T:
    """Run ``fn`` on every rank; if it raised a UserError on any rank, raise it on all of them
    (so no rank goes on into a collective its peers will never join)."""
    error: str | None = None
    result = None
    try:
        result = fn()
    except UserError as e:
        error = str(e)
    failed = [(r, m) for r, m in enumerate(ctx.gather_object(error)) if m]
    if failed:
        rank, message = failed[0]
        raise UserError(message if len({m for _, m in failed}) == 1 else f"(rank {rank}) {message}")
    return result  # type: ignore[return-value]

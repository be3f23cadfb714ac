"""Files a run leaves for `zerofit doctor`: its environment, the sharding proof, the effective
precision, OOM diagnoses."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch

from zerofit.backends.base import Backend
from zerofit.config import Config
from zerofit.distributed.mesh import DistContext
from zerofit.report import precision as precision_report
from zerofit.report.doctor import oom_advice


def write_sharding_report(backend: Backend, run_dir: Path, ctx: DistContext) -> None:
    """Per-rank local vs global parameter elements: proof that sharding took effect."""
    params = {name: [local, full] for name, local, full in backend.local_param_numel()}
    report = {
        "rank": ctx.rank,
        "world_size": ctx.world_size,
        "local_numel": sum(v[0] for v in params.values()),
        "global_numel": sum(v[1] for v in params.values()),
        "params": params,
    }
    out = run_dir / "sharding"
    out.mkdir(parents=True, exist_ok=True)
    (out / f"rank{ctx.rank}.json").write_text(json.dumps(report))


def write_environment(run_dir: Path, ctx: DistContext) -> None:
    """env.json (rank 0): see `environment`."""
    if ctx.is_main:
        (run_dir / "env.json").write_text(json.dumps(environment(ctx), indent=1))


def write_precision_report(
    backend: Backend, run_dir: Path, ctx: DistContext, compute: torch.dtype | None
) -> None:
    """precision.json (rank 0) and its summary line and warnings, once the first step has shown
    the compute dtype (see zerofit.report.precision)."""
    rep = precision_report.report(backend, compute)
    if ctx.is_main:
        (run_dir / "precision.json").write_text(json.dumps(rep, indent=1))
        eff = rep["effective"]
        print(
            f"precision ({rep['backend']}): compute {eff['compute']}, master weights {eff['master_weights']}, "
            f"optimizer states {eff['optimizer_states']}, gradient reduction {eff['gradient_reduction']}"
            + (f", frozen base {eff['frozen_weights']}" if "frozen_weights" in eff else "")
            + (f", frozen linears {eff['frozen_linears']}" if "frozen_linears" in eff else ""),
            flush=True,
        )
        for line in rep["warnings"]:
            print(f"warning: {line}", flush=True)


def environment(ctx: DistContext) -> dict[str, Any]:
    """What `zerofit doctor` checks about the machine: versions, GPUs, NCCL/CUDA variables."""
    gpus = (
        [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        if ctx.device.type == "cuda"
        else []
    )
    keep = (
        "NCCL_",
        "CUDA_",
        "TORCH_NCCL",
        "TORCH_DISTRIBUTED",
        "OMP_NUM_THREADS",
        "PYTORCH_CUDA_ALLOC_CONF",
    )
    return {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "device": ctx.device.type,
        "world_size": ctx.world_size,
        "threads": torch.get_num_threads(),  # each rank's CPU ops (OMP_NUM_THREADS)
        "gpus": gpus,
        "env": {k: v for k, v in os.environ.items() if k.startswith(keep)},
    }


def oom_report(cfg: Config, run_dir: Path, ctx: DistContext) -> str:
    """Dump the CUDA memory snapshot and a diagnosis; returns the one-line message."""
    snapshot = run_dir / f"oom_snapshot_rank{ctx.rank}.pickle"
    torch.cuda.memory._dump_snapshot(str(snapshot))
    torch.cuda.memory._record_memory_history(enabled=None)
    gpu_mem = torch.cuda.get_device_properties(ctx.device).total_memory
    advice = oom_advice(cfg, ctx.world_size, gpu_mem)
    (run_dir / f"oom_rank{ctx.rank}.txt").write_text(advice + "\n")
    return f"CUDA out of memory on rank {ctx.rank}: {advice}. Snapshot: {snapshot} (open it at pytorch.org/memory_viz)"


def compiled_ac_failure(cfg: Config, error: SystemError) -> str | None:
    """The one line for torch 2.11's failure of a compiled region inside activation checkpointing
    (pytorch/pytorch#179536; ZeRO-3 compiles each block's forward inside its AC wrapper), or None
    when `error` is something else."""
    if "FunctionMeta" not in str(error) or cfg.parallel.compile is not True:  # resolved: a bool
        return None
    if cfg.parallel.activation_checkpointing == "none":
        return None
    return (
        f"torch {torch.__version__} failed in a compiled block under activation checkpointing "
        f"({str(error)[:80]}...; pytorch/pytorch#179536): set parallel.compile: false or "
        "parallel.activation_checkpointing: none"
    )

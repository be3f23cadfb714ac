"""Whether this process was started as one rank by a launcher other than zerofit's (torchrun, srun):
read from the environment only, so the launcher can tell before it imports torch."""

from __future__ import annotations

import os


def in_launched_worker() -> bool:
    """True when torchrun (or a compatible launcher) already started this process as one rank."""
    return all(
        k in os.environ for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
    )


def adopt_slurm_env() -> bool:
    """Under `srun`, map SLURM's task variables onto torch.distributed's (MASTER_ADDR/PORT must be set)."""
    if in_launched_worker() or "SLURM_PROCID" not in os.environ or "SLURM_NTASKS" not in os.environ:
        return False
    if "MASTER_ADDR" not in os.environ or int(os.environ["SLURM_NTASKS"]) < 2:
        return False
    os.environ.setdefault("MASTER_PORT", "29500")
    os.environ["RANK"] = os.environ["SLURM_PROCID"]
    os.environ["WORLD_SIZE"] = os.environ["SLURM_NTASKS"]
    os.environ["LOCAL_RANK"] = os.environ.get("SLURM_LOCALID", "0")
    return True

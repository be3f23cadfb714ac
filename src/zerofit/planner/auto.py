"""`parallel.backend: auto`: the planner picks the strategy for this machine before launch."""

from __future__ import annotations

from dataclasses import replace

from zerofit.config import Config, with_fields
from zerofit.errors import UserError
from zerofit.models.shape import shape_from_config
from zerofit.planner.memory import workload_for
from zerofit.planner.plan import closest, plan, recommend
from zerofit.planner.shape import detect_hardware


def resolve_auto(cfg: Config, world_size: int) -> Config:
    hw = detect_hardware()
    if hw is None:  # CPU processes on gloo: memory is host RAM, FSDP is the general answer
        print("parallel.backend auto: no GPU, using fsdp", flush=True)
        return with_fields(cfg, {"parallel.backend": "fsdp"})
    hw = replace(
        hw,
        gpus_per_node=min(hw.gpus_per_node, world_size),
        nodes=max(1, world_size // hw.gpus_per_node),
    )
    options = plan(shape_from_config(cfg), workload_for(cfg, world_size), hw, cfg)
    best = recommend(options)
    if best is None:
        near = closest(options)
        raise UserError(
            f"parallel.backend auto: nothing fits; the closest is {near.strategy.label} ({near.why_not})"
        )
    print(
        f"parallel.backend auto: {best.strategy.label} (predicted {best.memory.peak_reserved / 2**30:.1f} GiB per GPU)",
        flush=True,
    )
    return with_fields(cfg, best.strategy.overrides())

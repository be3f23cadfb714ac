"""`parallel.backend: auto`: the planner picks the strategy for this machine before launch.

It plans for `train.gpu_memory_limit` when the config caps the GPUs (refused before launch when
the cap is above the card), and with `train.global_batch_size` fixed it picks the micro-batch x
accumulation (and the engine's tunings, such as DeepSpeed's offload_ratio) as `zerofit plan` does.
Activation checkpointing the user wrote (AC_KEYS) is kept: the planner picks the engine for it.
"""

from __future__ import annotations

from dataclasses import replace

from zerofit.backends.catalog import DEFAULT_BACKEND
from zerofit.config import Config, explicit_keys, with_fields
from zerofit.config.sizes import gib, memory_fraction
from zerofit.errors import UserError
from zerofit.models.shape import shape_from_config
from zerofit.planner.memory import workload_for
from zerofit.planner.plan import batch_splits, closest, near_limit, option_fields, plan, recommend
from zerofit.planner.shape import Hardware, detect_hardware

# The fields that choose activation checkpointing: written by the user, `auto` keeps them
AC_KEYS = frozenset(
    {"parallel.activation_checkpointing", "parallel.ac_blocks", "parallel.ac_every"}
)


def keeps_ac(cfg: Config, explicit: frozenset[str] | None = None) -> bool:
    """Whether `auto` keeps the config's activation checkpointing: the user wrote it (`explicit`,
    else the keys `cfg` was loaded with)."""
    return bool((explicit_keys(cfg) if explicit is None else explicit) & AC_KEYS)


def capped(hw: Hardware, limit: int | None) -> Hardware:
    """`hw` with each GPU's memory at `train.gpu_memory_limit` (UserError above the card)."""
    if limit is None:
        return hw
    memory_fraction(limit, hw.gpu_mem, hw.name)
    return replace(hw, gpu_mem=limit, gpu_mem_from="train.gpu_memory_limit")


def resolve_auto(cfg: Config, world_size: int, explicit: frozenset[str] | None = None) -> Config:
    """`cfg` with the planner's pick for this machine (`explicit`: the keys the user wrote)."""
    hw = detect_hardware()
    if hw is None:  # CPU processes on gloo: memory is host RAM, FSDP is the general answer
        print(f"parallel.backend auto: no GPU, using {DEFAULT_BACKEND}", flush=True)
        return with_fields(cfg, {"parallel.backend": DEFAULT_BACKEND})
    hw = replace(
        hw,
        gpus_per_node=min(hw.gpus_per_node, world_size),
        nodes=max(1, world_size // hw.gpus_per_node),
    )
    hw = capped(hw, cfg.train.gpu_memory_limit)
    fixed = cfg.train.global_batch_size
    splits = batch_splits(fixed, world_size) if fixed is not None else None
    kept = keeps_ac(cfg, explicit)
    options = plan(shape_from_config(cfg), workload_for(cfg, world_size), hw, cfg, splits, kept)
    best = recommend(options) or near_limit(options, hw)
    if best is not None and not best.fits:
        print(
            f"warning: parallel.backend auto: nothing fits with the planner's headroom; taking "
            f"{best.strategy.label}, forecast {best.memory.peak_allocated / 2**30:.1f} GiB "
            f"allocated of the card's {gib(hw.gpu_mem)} (near the limit: if it runs out of "
            "memory, lower the micro-batch or add GPUs)",
            flush=True,
        )
    if best is None:
        near = closest(options)
        raise UserError(
            f"parallel.backend auto: nothing fits; the closest is {near.strategy.label} ({near.why_not})"
        )
    fields = option_fields(best) if splits is not None else best.strategy.overrides()
    batch = ""
    if splits is not None:
        batch = (
            f" at micro-batch {fields['train.micro_batch_size']} x accumulation "
            f"{fields['train.grad_accum_steps']} (global batch {fixed})"
        )
    where = (
        f" of the {gib(hw.gpu_mem)} train.gpu_memory_limit" if cfg.train.gpu_memory_limit else ""
    )
    print(
        f"parallel.backend auto: {best.strategy.label}{batch} (predicted "
        f"{best.memory.peak_reserved / 2**30:.1f} GiB per GPU{where}"
        f"{'; activation checkpointing as configured' if kept else ''})",
        flush=True,
    )
    return with_fields(cfg, fields)

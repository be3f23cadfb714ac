"""`resolve(cfg, world_size, device_type)`: everything about a config that depends on where it runs.

It runs once, in the launcher (or, under an external torchrun/srun, on rank 0 before the others
train), and its result is saved as the run's config.yaml; workers trust that file. Order:
- `parallel.backend: auto` becomes the planner's pick for this machine (keeping the activation
  checkpointing the user wrote);
- `precision.mode: auto` and the unset dtypes become explicit (bf16 on GPU, fp32 on CPU);
- the engine resolves its own section (DeepSpeed merges a user's ds_config.json), knowing which
  keys the user wrote (`explicit_keys`; `precision.mode: auto` counts as unwritten);
- `parallel.compile: auto` becomes true on CUDA, false on CPU, unless the engine's resolved
  options keep it off (`Engine.uncompiled`, said at launch), as the planner forecasts;
- the batch arithmetic and the engine's mesh are checked against the world size.
"""

from __future__ import annotations

from dataclasses import replace

from zerofit.backends import engine_of
from zerofit.backends.engine import Engine, compiles_unless
from zerofit.config import check_world, explicit_keys, resolve_precision
from zerofit.config.replacing import replace_config
from zerofit.config.schema import Config
from zerofit.planner.auto import resolve_auto


def resolve(cfg: Config, world_size: int, device_type: str) -> Config:
    explicit = explicit_keys(cfg) - ({"precision.mode"} if cfg.precision.mode == "auto" else set())
    if cfg.parallel.backend == "auto":
        cfg = resolve_auto(cfg, world_size, explicit)
    cfg = replace_config(cfg, precision=resolve_precision(cfg.precision, device_type))
    object.__setattr__(cfg, "_explicit", explicit)  # `precision.mode: auto` counts as unwritten
    engine = engine_of(cfg)
    cfg = engine.prepare(cfg, world_size, device_type)
    cfg = _resolve_compile(cfg, engine, device_type)
    check_world(cfg, world_size)
    engine.check_world(engine.opts(cfg), world_size)
    return cfg


def _resolve_compile(cfg: Config, engine: Engine, device_type: str) -> Config:
    """`parallel.compile` as a bool, as the engine's resolved options allow (`Engine.compiles`'s
    rule), saying so when they keep `auto` off."""
    p, opts = cfg.parallel, engine.opts(cfg)
    why_not = engine.uncompiled(opts)
    on = compiles_unless(p.compile, device_type, why_not)
    if p.compile == "auto" and device_type == "cuda" and not on:
        print(f"parallel.compile auto: off, as {why_not}", flush=True)
    return replace_config(cfg, parallel=replace(p, compile=on))


def mesh_replicas(cfg: Config) -> int:
    """Replicas on the outer mesh dim before the config is resolved (`auto`: one, for now)."""
    if cfg.parallel.backend == "auto":
        return 1
    engine = engine_of(cfg)
    return engine.replicas(engine.opts(cfg))

"""The built-in engines, and the run schema they make together.

`ENGINES` lists each engine's spec (imported here, statically: the registry has no hidden
imports); `DEFAULT_BACKEND` is `parallel.backend`'s default. `RunConfig` is the full config a run loads:
the engine-free sections of `zerofit.config.schema` plus `parallel.<engine>` for each engine here.
A new engine adds one entry to `ENGINES`, and its options class to `EngineOptions`.
"""

from __future__ import annotations

from zerofit.backends.ddp.options import DDPOptions
from zerofit.backends.ddp.spec import ENGINE as DDP
from zerofit.backends.deepspeed.options import DeepSpeedOptions
from zerofit.backends.deepspeed.spec import ENGINE as DEEPSPEED
from zerofit.backends.engine import Engine
from zerofit.backends.fsdp.options import FSDPOptions
from zerofit.backends.fsdp.spec import ENGINE as FSDP
from zerofit.config.schema import Config, assemble

ENGINES: dict[str, Engine] = {e.name: e for e in (DDP, FSDP, DEEPSPEED)}
DEFAULT_BACKEND = FSDP.name
SECTIONS: dict[str, type] = {name: e.options for name, e in ENGINES.items()}
EngineOptions = DDPOptions | FSDPOptions | DeepSpeedOptions  # any engine's `parallel.<name>`


def check_engine(cfg: Config) -> None:
    """Every engine's section checks, and the named engine's own checks (`auto` is checked once
    the planner has picked)."""
    for name, each in ENGINES.items():
        each.check_options(getattr(cfg.parallel, name))
    engine = ENGINES.get(cfg.parallel.backend)  # type: ignore[attr-defined]
    if engine is not None:
        engine.validate(cfg)


ParallelConfig, RunConfig = assemble(SECTIONS, DEFAULT_BACKEND, check_engine, __name__)

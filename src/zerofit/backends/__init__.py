"""Engines behind one interface, picked by `parallel.backend`.

Each engine is a package: `options` (its `parallel.<name>` config section), `spec` (an `Engine`:
what the launcher, planner, doctor and bench need, torch-free) and `runtime` (its `Backend`, which
imports torch and the engine library only when a run starts). `catalog.SECTIONS` lists them.
"""

from __future__ import annotations

import functools
import importlib
from typing import TYPE_CHECKING

from zerofit.backends.catalog import SECTIONS

if TYPE_CHECKING:
    from zerofit.backends.engine import Engine
    from zerofit.config import Config


@functools.cache
def engines() -> dict[str, Engine]:
    """Every engine's spec, in catalog order."""
    out = {}
    for name, options in SECTIONS.items():
        engine = importlib.import_module(f"zerofit.backends.{name}.spec").ENGINE
        assert engine.name == name and engine.options is options, name
        out[name] = engine
    return out


def get_engine(name: str) -> Engine:
    return engines()[name]


def engine_of(cfg: Config) -> Engine:
    """The engine a (resolved: not `auto`) config runs on."""
    return engines()[cfg.parallel.backend]


__all__ = ["engine_of", "engines", "get_engine"]

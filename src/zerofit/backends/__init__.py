"""Engines behind one interface, picked by `parallel.backend`.

Each engine is a package: `options` (its `parallel.<name>` config section), `spec` (an `Engine`:
what the launcher, planner, doctor and bench need, torch-free) and `runtime` (its `Backend`, which
imports torch and the engine library only when a run starts). `catalog.ENGINES` lists them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

from zerofit.backends.catalog import ENGINES

if TYPE_CHECKING:
    from zerofit.backends.engine import Engine
    from zerofit.config import Config


def engines() -> dict[str, Engine]:
    """Every engine's spec, in catalog order."""
    return ENGINES


def get_engine(name: str) -> Engine:
    return ENGINES[name]


def engine_of(cfg: Config) -> Engine:
    """The engine a (resolved: not `auto`) config runs on."""
    return ENGINES[cfg.parallel.backend]  # type: ignore[attr-defined]


def checkpoint_readers() -> dict[str, Callable[[Path], Any]]:
    """The readers of the checkpoint formats other than DCP, by format (imported on call)."""
    return {
        e.checkpoint_format: reader for e in ENGINES.values() if (reader := e.reader()) is not None
    }


def checkpoint_files(saved: dict[str, Any]) -> Iterator[tuple[str, ...]] | None:
    """The files under a checkpoint's ``model/`` (`Engine.checkpoint_files`), asked of an engine
    that writes its format (meta.json ``saved``); None when no engine writes that format."""
    for e in ENGINES.values():
        if e.checkpoint_format == saved.get("format"):
            return e.checkpoint_files(saved)
    return None


def library_versions() -> dict[str, str | None]:
    """The installed version of each engine's own library (None: not installed), by package."""
    out: dict[str, str | None] = {}
    for e in ENGINES.values():
        if e.library is not None:
            try:
                out[e.library] = metadata.version(e.library)
            except metadata.PackageNotFoundError:
                out[e.library] = None
    return out


__all__ = [
    "checkpoint_files",
    "checkpoint_readers",
    "engine_of",
    "engines",
    "get_engine",
    "library_versions",
]

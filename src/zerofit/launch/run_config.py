"""A run's config: `zerofit.config`'s loaders with the full schema, every engine's section in it
(`zerofit.backends.catalog.RunConfig`). Everything that loads a config for a run loads it here."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import zerofit.config as generic
from zerofit.backends.catalog import RunConfig
from zerofit.config.schema import Config


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> Config:
    """A YAML config (or the embedded defaults when path is None) with dotted overrides applied."""
    return generic.load_config(path, overrides, RunConfig)


def config_from_dict(data: dict[str, Any]) -> Config:
    """A config from a mapping of sections, validated like a loaded file."""
    return generic.config_from_dict(data, RunConfig)


def default_config() -> Config:
    """The embedded defaults."""
    return RunConfig()


def field_help() -> list[tuple[str, str, str]]:
    """(dotted key, default, help) for every option: feeds `zerofit train --help`."""
    return generic.field_help(RunConfig)


def int_bounds() -> dict[str, tuple[Any, Any]]:
    """(ge, le) of every integer field, by dotted key."""
    return generic.int_bounds(RunConfig)

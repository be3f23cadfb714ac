"""`replace_config`: `dataclasses.replace` of a Config's sections, keeping the keys the user wrote."""

from __future__ import annotations

import dataclasses
from typing import Any

from zerofit.config import explicit_keys
from zerofit.config.schema import Config


def replace_config(cfg: Config, **sections: Any) -> Config:
    """`dataclasses.replace` of whole sections, keeping the keys the user wrote: a plain
    `replace` of a Config drops them, and then `parallel.backend: auto` took its own activation
    checkpointing over a written one on every GPU run (the launcher expanded `~` in two paths
    with `replace` before resolving)."""
    new = dataclasses.replace(cfg, **sections)
    object.__setattr__(new, "_explicit", explicit_keys(cfg))
    return new

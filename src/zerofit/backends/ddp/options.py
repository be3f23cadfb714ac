"""`parallel.ddp.*`: DDP's options (no torch here: the schema and the planner read them)."""

from __future__ import annotations

from pydantic.dataclasses import dataclass

from zerofit.config.fields import SECTION


@dataclass(config=SECTION)
class DDPOptions:
    """DDP: every rank holds the whole model; gradients are all-reduced. Nothing to set."""

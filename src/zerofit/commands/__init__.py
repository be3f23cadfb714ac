"""`zerofit <command>`: one module per subcommand, each owning its arguments.

A command module defines `register(sub)`: it adds its parser (help, arguments) to the subparsers
and sets `run(args, overrides) -> int` as the parser's default, with `takes_overrides=True` when
config flags (`--train.steps 5`) apply to it. Engines may add their own commands
(`Engine.commands`, e.g. DeepSpeed's `ds-config`).
"""

from __future__ import annotations

import importlib
from types import ModuleType

BUILT_IN = ("train", "plan", "bench", "doctor", "export", "config", "data")


def modules() -> list[ModuleType]:
    from zerofit.backends import engines

    names = [f"zerofit.commands.{name}" for name in BUILT_IN]
    names += [module for eng in engines().values() for module in eng.commands]
    return [importlib.import_module(name) for name in names]

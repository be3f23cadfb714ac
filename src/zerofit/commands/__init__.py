"""`zerofit <command>`: one module per subcommand, each owning its arguments.

A command module defines `register(sub)`: it adds its parser (help, arguments) to the subparsers
and sets `run(args, overrides) -> int` as the parser's default, with `takes_overrides=True` when
config flags (`--train.steps 5`) apply to it. `engine_files` adds one command per engine that
runs from a file of its own (DeepSpeed's `ds-config`).
"""

from __future__ import annotations

from types import ModuleType

from zerofit.commands import bench, config, data, doctor, engine_files, export, plan, train


def modules() -> list[ModuleType]:
    """The command modules, in the order `zerofit --help` lists them."""
    return [train, plan, bench, doctor, export, config, data, engine_files]

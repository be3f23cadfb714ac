"""`zerofit <engine file command>`: the file an engine runs from, as a config turns into it.

An engine whose library reads its own config file names a command for it (`Engine.file_command`,
e.g. DeepSpeed's `ds-config`, which prints its JSON). Every such command loads a config, sets
`parallel.backend` to the engine, resolves it for this machine, checks the file as a launch would
(`Engine.launch_check`: its notes go to stderr), and prints the engine's file.
"""

from __future__ import annotations

import argparse
import sys
from functools import partial

from zerofit.backends import engines
from zerofit.backends.engine import Engine
from zerofit.config import with_fields
from zerofit.launch.resolve import resolve
from zerofit.launch.run_config import load_config
from zerofit.planner.shape import visible_gpus
from zerofit.report.quiet import data_output


def register(sub: argparse._SubParsersAction) -> None:
    for engine in engines().values():
        if engine.file_command is None:
            continue
        p = sub.add_parser(
            engine.file_command,
            help=engine.file_help,
            description=f"{engine.file_help[0].upper()}{engine.file_help[1:]}, for "
            f"`parallel.backend: {engine.name}` on this machine.",
        )
        p.add_argument("-c", "--config", help="YAML config file (default: the embedded defaults)")
        p.add_argument(
            "--nproc", type=int, default=None, help="processes per node (default: the GPUs here)"
        )
        p.add_argument("--nnodes", type=int, default=1)
        p.set_defaults(run=partial(run, engine), takes_overrides=True)


def run(engine: Engine, args: argparse.Namespace, overrides: list[str]) -> int:
    with data_output() as stdout:  # the file alone on stdout, whatever the engine's library prints
        cfg = load_config(args.config, overrides)
        cfg = with_fields(cfg, {"parallel.backend": engine.name})
        gpus = visible_gpus()
        world = (args.nproc or gpus or 2) * args.nnodes
        cfg = resolve(cfg, world, "cuda" if gpus else "cpu")
        for line in engine.launch_check(cfg, world).notes:  # checked as `train` checks it
            print(f"note: {line}", file=sys.stderr)
        print(engine.render_file(cfg, world), file=stdout)
    return 0

"""`zerofit doctor RUN_DIR`: the OOM checklist, run against what a run wrote."""

from __future__ import annotations

import argparse
from pathlib import Path

from zerofit.errors import UserError
from zerofit.report.doctor import diagnose, print_report


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "doctor", help="check a run directory: sharding, dtypes, batch, environment, memory, speed"
    )
    p.add_argument("run_dir", help="a zerofit run directory")
    p.set_defaults(run=run)


def run(args: argparse.Namespace, overrides: list[str]) -> int:
    run_dir = Path(args.run_dir)
    if not run_dir.is_dir():
        raise UserError(f"no such run directory: {run_dir}")
    return print_report(diagnose(run_dir))

"""`zerofit ds-config`: the DeepSpeed JSON a config turns into (DeepSpeed's own command)."""

from __future__ import annotations

import argparse
import json


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "ds-config",
        help="print the DeepSpeed JSON a config turns into",
        description="Print the DeepSpeed JSON that `parallel.backend: deepspeed` would run with.",
    )
    p.add_argument("-c", "--config", help="YAML config file (default: the embedded defaults)")
    p.add_argument(
        "--nproc", type=int, default=None, help="world size to compute train_batch_size for"
    )
    p.add_argument("--nnodes", type=int, default=1)
    p.set_defaults(run=run, takes_overrides=True)


def run(args: argparse.Namespace, overrides: list[str]) -> int:
    import torch

    from zerofit.backends.deepspeed.ds_json import to_ds_json
    from zerofit.config import load_config, with_fields
    from zerofit.launch import default_nproc
    from zerofit.resolve import resolve

    cfg = load_config(args.config, overrides)
    cfg = with_fields(cfg, {"parallel.backend": "deepspeed"})
    world = (args.nproc or default_nproc()) * args.nnodes
    cfg = resolve(cfg, world, "cuda" if torch.cuda.is_available() else "cpu")
    print(json.dumps(to_ds_json(cfg, world), indent=2))
    return 0

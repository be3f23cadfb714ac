"""`zerofit train`: start the workers on this node (or join an external torchrun/srun)."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path

from zerofit.config.schema import Config
from zerofit.errors import UserError
from zerofit.launch import external, forkserver, run_lock
from zerofit.launch.options import LaunchOptions
from zerofit.launch.run_config import field_help, load_config
from zerofit.train.worker import train_joined


def _options_epilog() -> str:
    lines = ["config options (set in the YAML file, or override as --section.key VALUE):"]
    section = ""
    for key, default, comment in field_help():
        head = key.split(".")[0]
        if head != section:
            section = head
            lines.append(f"  {section}:")
        text = f"    --{key} (default {default})"
        lines.append(f"{text:<52} {comment}".rstrip())
    lines += [
        "",
        "examples:",
        "  zerofit train                                   # tiny model, stdlib corpus, all GPUs or 2 CPU procs",
        "  zerofit train -c cfg.yaml --nproc 8 --train.steps 1000 --parallel.backend auto",
        "  zerofit train -c cfg.yaml --log.run_dir runs/a --resume  # continue runs/a from its latest complete checkpoint",
    ]
    return "\n".join(lines)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "train",
        help="train a model",
        description="Train a model. Without -c, the embedded default: the tiny preset on this "
        "Python's stdlib sources.",
        epilog=_options_epilog(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("-c", "--config", help="YAML config file (default: the embedded defaults)")
    p.add_argument(
        "--nproc",
        type=int,
        default=None,
        help="processes on this node (default: every GPU, or 2 on CPU)",
    )
    p.add_argument("--nnodes", type=int, default=1, help="number of nodes (torchrun rendezvous)")
    p.add_argument("--node-rank", type=int, default=0, help="this node's rank (multi-node)")
    p.add_argument("--rdzv-endpoint", default=None, help="HOST:PORT of node 0 (multi-node)")
    p.add_argument(
        "--rdzv-backend", default="static", help="torchrun rendezvous backend (default static)"
    )
    p.add_argument(
        "--resume",
        nargs="?",
        const="latest",
        default=None,
        metavar="PATH",
        help="resume from PATH (a run or checkpoint dir), or from the latest complete checkpoint",
    )
    p.set_defaults(run=run, takes_overrides=True)


def print_summary(run_dir: Path) -> None:
    from rich.console import Console  # light CLI start: rich loads once a run has finished

    from zerofit.report.progress import summary_table  # light CLI start: it imports rich
    from zerofit.report.tables import print_lines, print_table  # light CLI start: rich

    summary_file = run_dir / "summary.json"
    console = Console()
    if summary_file.is_file():
        print_table(summary_table(json.loads(summary_file.read_text())), console)
    print_lines(console, [f"run directory: {run_dir}"])


def run(args: argparse.Namespace, overrides: list[str]) -> int:
    cfg = load_config(args.config, overrides)
    opts = LaunchOptions(
        args.nnodes, args.node_rank, args.rdzv_endpoint, args.rdzv_backend, args.resume
    )
    if external.in_launched_worker() or external.adopt_slurm_env():
        return _train_joined(cfg, opts)
    forkserver.start(forkserver.preload_for(cfg.model.hf is not None))  # beside the launcher's
    # torch-free path: `zerofit plan` imports every command module; these two import torch
    from zerofit.launch import prepare  # torch-free path: it imports torch
    from zerofit.launch.spawn import spawn  # torch-free path: it imports torch

    nproc = args.nproc if args.nproc is not None else prepare.default_nproc()
    prepare.check_nproc(nproc)
    if args.nnodes < 1 or not 0 <= args.node_rank < args.nnodes:
        raise UserError(f"--node-rank {args.node_rank} is not in [0, --nnodes {args.nnodes})")
    if args.nnodes > 1 and not cfg.log.run_dir:
        raise UserError(
            "multi-node runs need log.run_dir (the same shared directory on every node)"
        )
    world, device = nproc * args.nnodes, prepare.device_type()
    try:  # the run folder is locked from here to the end (zerofit.launch.run_lock)
        prep = prepare.prepare_run(cfg, opts, world, device, create=args.node_rank == 0)
        try:
            code = spawn(prep, opts, nproc)
        finally:
            if args.node_rank != 0:  # the config copy of a non-zero node lives in a temp dir
                shutil.rmtree(prep.config_file.parent, ignore_errors=True)
        if code == 0 and args.node_rank == 0:
            print_summary(prep.run_dir)
            _export_final(prep.cfg, prep.run_dir)
        return code
    finally:
        run_lock.release_all()


def _export_final(cfg: Config, run_dir: Path) -> None:
    """`checkpoint.export_final`: the final checkpoint as a Hugging Face folder, offline, in this
    (launcher) process once the workers are gone: no GPU memory, no process group."""
    if not cfg.checkpoint.export_final:
        return
    from zerofit.export.run import (  # torch-free path: torch
        EXPORTS,
        export_checkpoint,
        find_checkpoint,
    )

    ckpt = find_checkpoint(run_dir, None)
    out = run_dir / EXPORTS / ckpt.name
    if out.exists():
        print(f"export: {out} already exists; left as it is")
        return
    s = export_checkpoint(ckpt, run_dir, out, cfg.checkpoint.export_dtype)
    print(f"exported step {s['step']} as a Hugging Face folder ({s['dtype']}): {s['out']}")


def _train_joined(cfg: Config, opts: LaunchOptions) -> int:
    """Started by an external torchrun/srun: this process is one rank (zerofit.train.worker)."""
    code, prep = train_joined(cfg, opts)
    if code == 0 and prep is not None:  # rank 0
        print_summary(prep.run_dir)
        _export_final(prep.cfg, prep.run_dir)
    # This process is a rank: everything is written and the process group destroyed. End it here,
    # as zerofit.train.worker does, without interpreter teardown: gloo's C++ threads destroyed at exit
    # have aborted a finished rank (SIGABRT, "terminate called without an active exception").
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)

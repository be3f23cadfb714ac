"""`zerofit` command line. Every config key is also a flag: `--train.steps 100`."""

from __future__ import annotations

import argparse
import json
import shlex
import shutil
import signal
import sys
import threading
from pathlib import Path

from zerofit.config import field_help, load_config
from zerofit.errors import UserError


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
        "  zerofit train                                   # tiny model, stdlib corpus, FSDP, all GPUs or 2 CPU procs",
        "  zerofit train -c cfg.yaml --nproc 8 --train.steps 1000 --parallel.backend ddp",
        "  zerofit train -c cfg.yaml --resume               # continue from the latest complete checkpoint",
    ]
    return "\n".join(lines)


def split_overrides(rest: list[str]) -> list[str]:
    """['--train.steps', '100', '--optim.lr=3e-4'] -> ['train.steps=100', 'optim.lr=3e-4'].

    Each `--section.key` names a field under a section; whether the config file has a mapping
    there is checked when they are merged (`zerofit.config.load_config`)."""
    from zerofit.limits import shown

    out, i = [], 0
    while i < len(rest):
        tok = rest[i]
        if not tok.startswith("--") or "." not in tok.split("=", 1)[0]:
            raise UserError(
                f"unrecognized argument {shown(tok)} (config overrides look like --train.steps 100)"
            )
        if "=" in tok:
            out.append(tok[2:])
            i += 1
        else:
            if i + 1 >= len(rest):
                raise UserError(f"{shown(tok)} needs a value")
            out.append(f"{tok[2:]}={rest[i + 1]}")
            i += 2
    return out


def _add_export(sub: argparse._SubParsersAction) -> None:
    export = sub.add_parser(
        "export",
        help="write a Hugging Face model folder from a checkpoint (offline)",
        description="Write config.json, safetensors shards and the tokenizer files of a run's "
        "checkpoint (any engine) as a folder that transformers' from_pretrained loads.",
    )
    export.add_argument("run_dir", help="a zerofit run directory")
    export.add_argument("--step", type=int, default=None, help="checkpoint step (default: newest)")
    export.add_argument("--out", required=True, help="output directory (must not hold files)")
    export.add_argument("--dtype", choices=["bf16", "fp16", "fp32"], default="bf16")
    export.add_argument(
        "--max-shard-size", default="5GiB", help="largest safetensors file (e.g. 5GB, 500MB)"
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="zerofit", description="Train LLMs with FSDP2 or DDP behind one config."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    train = sub.add_parser(
        "train",
        help="train a model",
        description="Train a model. Without -c, the embedded default: the tiny preset on this Python's stdlib sources.",
        epilog=_options_epilog(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    train.add_argument("-c", "--config", help="YAML config file (default: the embedded defaults)")
    train.add_argument(
        "--nproc",
        type=int,
        default=None,
        help="processes on this node (default: every GPU, or 2 on CPU)",
    )
    train.add_argument(
        "--nnodes", type=int, default=1, help="number of nodes (torchrun rendezvous)"
    )
    train.add_argument("--node-rank", type=int, default=0, help="this node's rank (multi-node)")
    train.add_argument("--rdzv-endpoint", default=None, help="HOST:PORT of node 0 (multi-node)")
    train.add_argument(
        "--rdzv-backend", default="static", help="torchrun rendezvous backend (default static)"
    )
    train.add_argument(
        "--resume",
        nargs="?",
        const="latest",
        default=None,
        metavar="PATH",
        help="resume from PATH (a run or checkpoint dir), or from the latest complete checkpoint",
    )
    ds = sub.add_parser(
        "ds-config",
        help="print the DeepSpeed JSON a config turns into",
        description="Print the DeepSpeed JSON that `parallel.backend: deepspeed` would run with.",
    )
    ds.add_argument("-c", "--config", help="YAML config file (default: the embedded defaults)")
    ds.add_argument(
        "--nproc", type=int, default=None, help="world size to compute train_batch_size for"
    )
    ds.add_argument("--nnodes", type=int, default=1)
    plan = sub.add_parser(
        "plan",
        help="per-GPU memory and speed of every strategy, and which to use",
        description="Forecast per-GPU memory (by component) and speed for DDP, FSDP and ZeRO, say what fits, and recommend.",
    )
    from zerofit.planner.cli import add_arguments

    add_arguments(plan)
    bench = sub.add_parser(
        "bench",
        help="measure engines and settings side by side (tokens/s, MFU, memory)",
        description="Run each variant as its own `zerofit train` on the same model, data and seed; "
        "report the median step after warm-up, write results.json, results.md and charts.",
        epilog="examples:\n"
        "  zerofit bench -c cfg.yaml --backends ddp,fsdp,deepspeed\n"
        "  zerofit bench -c cfg.yaml --backends fsdp,deepspeed --sweep train.micro_batch_size=1,2,4\n"
        "  zerofit bench -c cfg.yaml --backends deepspeed --sweep parallel.deepspeed.reduce_bucket_size=5e7,2e8\n"
        "  zerofit bench -c cfg.yaml --variant 'compiled: parallel.compile=true' --train.micro_batch_size 2",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    bench.add_argument("-c", "--config", help="YAML config file shared by every variant")
    bench.add_argument(
        "--backends", default=None, help="comma-separated engines (default: the config's)"
    )
    bench.add_argument(
        "--sweep",
        action="append",
        default=[],
        metavar="KEY=V1,V2",
        help="vary a config key; several --sweep give their product",
    )
    bench.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="'NAME: KEY=V ...'",
        help="an extra named variant (its overrides on top of the shared ones)",
    )
    bench.add_argument("--nproc", type=int, default=None, help="processes per variant")
    bench.add_argument("--warmup", type=int, default=3, help="steps left out of the timing")
    bench.add_argument("--steps", type=int, default=10, help="timed steps (median taken)")
    bench.add_argument("--timeout", type=float, default=None, help="seconds per variant")
    bench.add_argument("--out", default=None, help="output directory (default runs/bench-<time>)")
    doctor = sub.add_parser(
        "doctor", help="check a run directory: sharding, dtypes, batch, environment, memory"
    )
    doctor.add_argument("run_dir", help="a zerofit run directory")
    _add_export(sub)
    return parser


def cmd_doctor(args: argparse.Namespace, overrides: list[str]) -> int:
    from zerofit.doctor import diagnose, print_report

    run = Path(args.run_dir)
    if not run.is_dir():
        raise UserError(f"no such run directory: {run}")
    return print_report(diagnose(run))


def cmd_export(args: argparse.Namespace, overrides: list[str]) -> int:
    from zerofit.export import export_checkpoint, find_checkpoint, parse_size

    if overrides:
        raise UserError(f"unrecognized arguments: {' '.join(overrides)}")
    run = Path(args.run_dir)
    ckpt = find_checkpoint(run, args.step)
    size = parse_size(args.max_shard_size)
    s = export_checkpoint(ckpt, run, Path(args.out), args.dtype, size)
    print(
        f"exported {s['architecture']} step {s['step']} to {s['out']}: {s['tensors']} tensors, "
        f"{s['total_bytes'] / 1e9:.3g} GB {s['dtype']} in {s['shards']} shard(s); "
        f"tokenizer: {s['tokenizer']}"
    )
    return 0


def cmd_plan(args: argparse.Namespace, overrides: list[str]) -> int:
    from zerofit.planner.cli import cmd_plan as run_plan

    if overrides:
        raise UserError(f"unrecognized arguments: {' '.join(overrides)}")
    return run_plan(args)


def cmd_bench(args: argparse.Namespace, overrides: list[str]) -> int:
    import time

    from zerofit import bench
    from zerofit.backends import registry
    from zerofit.bench_report import environment, print_table, write_report
    from zerofit.launch import default_nproc

    if args.steps < 1 or args.warmup < 0:
        raise UserError("--steps must be >= 1 and --warmup >= 0")
    owners = {name: cls.own_keys for name, cls in registry().items()}
    sweeps = [bench.parse_sweep(s) for s in args.sweep]
    extra = [bench.parse_variant(v) for v in args.variant]
    if args.backends or not extra:
        names = (
            args.backends.split(",")
            if args.backends
            else [load_config(args.config, overrides).parallel.backend]
        )
        variants = bench.expand([b.strip() for b in names if b.strip()], sweeps, owners)
    else:
        variants = []
    variants += extra
    for v in variants:  # every variant's config must load before anything runs
        try:
            v.backend = load_config(args.config, [*overrides, *v.overrides]).parallel.backend
        except UserError as e:
            raise UserError(f"variant '{v.name}': {e}") from None
    if len({v.name for v in variants}) != len(variants):
        raise UserError("two variants have the same name; name each --variant differently")
    out = Path(args.out or f"runs/bench-{time.strftime('%Y%m%d-%H%M%S')}")
    if (out / "results.json").exists():
        raise UserError(f"{out} already holds bench results; choose another --out")
    meta = {
        "date": time.strftime("%Y-%m-%d"),
        "command": "zerofit " + shlex.join(args.argv),
        "nproc": args.nproc or default_nproc(),
        "warmup": args.warmup,
        "steps": args.steps,
        "env": environment(),
    }
    print(f"zerofit bench: {len(variants)} variant(s) -> {out}", flush=True)

    def report(r: bench.Result) -> None:
        figure = f"{r.tokens_per_s:,.0f} tokens/s" if r.tokens_per_s else r.error
        print(f"  {r.name}: {r.status} {figure} ({r.wall_s:.0f} s)", flush=True)

    settings = bench.Settings(
        overrides, args.config, args.nproc, args.warmup, args.steps, args.timeout
    )
    results = bench.run_bench(variants, out, settings, on_result=report)
    write_report(results, out, meta)
    print_table(results)
    print(f"results: {out}/results.json, results.md, throughput.png, memory.png")
    return 0 if any(r.status == "ok" for r in results) else 1


def cmd_ds_config(args: argparse.Namespace, overrides: list[str]) -> int:
    from dataclasses import replace

    import torch

    from zerofit.backends.deepspeed import DeepSpeedBackend
    from zerofit.config import check_world, resolve_precision
    from zerofit.ds_config import to_ds_json
    from zerofit.launch import default_nproc

    cfg = load_config(args.config, overrides)
    world = (args.nproc or default_nproc()) * args.nnodes
    device_type = "cuda" if torch.cuda.is_available() else "cpu"
    cfg = DeepSpeedBackend.prepare_config(cfg, world, device_type)
    cfg = replace(cfg, precision=resolve_precision(cfg.precision, device_type))
    check_world(cfg, world)
    print(json.dumps(to_ds_json(cfg, world), indent=2))
    return 0


def _print_summary(run_dir: Path) -> None:
    from rich.console import Console

    from zerofit.progress import summary_table

    summary_file = run_dir / "summary.json"
    console = Console()
    if summary_file.is_file():
        console.print(summary_table(json.loads(summary_file.read_text())))
    console.print(f"run directory: {run_dir}")


def cmd_train(args: argparse.Namespace, overrides: list[str]) -> int:
    from zerofit import dist
    from zerofit.launch import LaunchOptions, check_nproc, default_nproc, prepare_run, spawn

    cfg = load_config(args.config, overrides)
    opts = LaunchOptions(
        args.nproc, args.nnodes, args.node_rank, args.rdzv_endpoint, args.rdzv_backend, args.resume
    )
    if dist.in_launched_worker() or dist.adopt_slurm_env():
        return _train_joined(cfg, opts)
    nproc = args.nproc if args.nproc is not None else default_nproc()
    check_nproc(nproc)
    if args.nnodes < 1 or not 0 <= args.node_rank < args.nnodes:
        raise UserError(f"--node-rank {args.node_rank} is not in [0, --nnodes {args.nnodes})")
    if args.nnodes > 1 and not cfg.log.run_dir:
        raise UserError(
            "multi-node runs need log.run_dir (the same shared directory on every node)"
        )
    import torch

    device_type = "cuda" if torch.cuda.is_available() else "cpu"
    prep = prepare_run(cfg, opts, nproc * args.nnodes, device_type, create=args.node_rank == 0)
    try:
        code = spawn(prep, opts, nproc)
    finally:
        if args.node_rank != 0:  # the config copy of a non-zero node lives in a temp dir
            shutil.rmtree(prep.config_file.parent, ignore_errors=True)
    if code == 0 and args.node_rank == 0:
        _print_summary(prep.run_dir)
        _export_final(prep.cfg, prep.run_dir)
    return code


def _export_final(cfg, run_dir: Path) -> None:  # noqa: ANN001
    """`checkpoint.export_final`: the final checkpoint as a Hugging Face folder, offline, in this
    (launcher) process once the workers are gone: no GPU memory, no process group."""
    if not cfg.checkpoint.export_final:
        return
    from zerofit.export import export_checkpoint, find_checkpoint

    ckpt = find_checkpoint(run_dir, None)
    out = run_dir / "export" / ckpt.name
    if out.exists():
        print(f"export: {out} already exists; left as it is")
        return
    s = export_checkpoint(ckpt, run_dir, out, cfg.checkpoint.export_dtype)
    print(f"exported step {s['step']} as a Hugging Face folder ({s['dtype']}): {s['out']}")


def _train_joined(cfg, opts) -> int:  # noqa: ANN001
    """Started by an external torchrun/srun: this process is one rank (zerofit.worker)."""
    from zerofit.worker import train_joined

    code, prep = train_joined(cfg, opts)
    if code == 0 and prep is not None:  # rank 0
        _print_summary(prep.run_dir)
        _export_final(prep.cfg, prep.run_dir)
    return code


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(signum)


def main(argv: list[str] | None = None) -> int:
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _interrupt)  # until workers start and take over
    parser = build_parser()
    args, rest = parser.parse_known_args(argv)
    args.argv = list(argv if argv is not None else sys.argv[1:])
    try:
        overrides = split_overrides(rest)
        handler = {
            "train": cmd_train,
            "ds-config": cmd_ds_config,
            "plan": cmd_plan,
            "doctor": cmd_doctor,
            "bench": cmd_bench,
            "export": cmd_export,
        }[args.command]
        return handler(args, overrides)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as e:  # before any worker started (they handle their own signals)
        signum = e.args[0] if e.args and isinstance(e.args[0], int) else signal.SIGINT
        print(
            f"stopped by {signal.Signals(signum).name} before training started; nothing was lost",
            file=sys.stderr,
        )
        return 128 + signum


if __name__ == "__main__":
    sys.exit(main())

"""`zerofit bench`: engines and settings side by side, each variant its own `zerofit train`."""

from __future__ import annotations

import argparse
import shlex
import time
from pathlib import Path

from zerofit.backends import engines
from zerofit.bench import run as bench
from zerofit.config import Config
from zerofit.errors import UserError
from zerofit.launch.run_config import load_config

_ALL = ",".join(engines())
EXAMPLES = f"""examples:
  zerofit bench -c cfg.yaml --backends {_ALL}
  zerofit bench -c cfg.yaml --backends {_ALL} --sweep train.micro_batch_size=1,2,4
  zerofit bench -c cfg.yaml --variant 'compiled: parallel.compile=true' --train.micro_batch_size 2
  zerofit bench -c cfg.yaml --backends {_ALL} --profile   # + a trace and time breakdown"""


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "bench",
        help="measure engines and settings side by side (tokens/s, MFU, memory)",
        description="Run each variant as its own `zerofit train` on the same model, data and "
        "seed; report the median step after warm-up, write results.json, results.md and charts.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("-c", "--config", help="YAML config file shared by every variant")
    p.add_argument(
        "--backends", default=None, help="comma-separated engines (default: the config's)"
    )
    p.add_argument(
        "--sweep",
        action="append",
        default=[],
        metavar="KEY=V1,V2",
        help="vary a config key; several --sweep give their product",
    )
    p.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="'NAME: KEY=V ...'",
        help="an extra named variant (its overrides on top of the shared ones)",
    )
    p.add_argument("--nproc", type=int, default=None, help="processes per variant")
    p.add_argument("--warmup", type=int, default=3, help="steps left out of the timing")
    p.add_argument("--steps", type=int, default=10, help="timed steps (median taken)")
    p.add_argument("--timeout", type=float, default=None, help="seconds per variant")
    p.add_argument(
        "--profile",
        type=int,
        nargs="?",
        const=3,
        default=0,
        metavar="STEPS",
        help="after the timed steps, profile STEPS more (default 3) with the torch profiler: a "
        "trace per variant and where the step time went (compute, communication, optimizer, "
        "host, idle) with the top kernels",
    )
    p.add_argument("--out", default=None, help="output directory (default runs/bench-<time>)")
    p.set_defaults(run=run, takes_overrides=True)


def model_label(cfg: Config) -> str:
    """'llama3-1b', the model folder's name, or 'tiny (n_layers=2)' with shape overrides."""
    m = cfg.model
    name = m.preset or Path(str(m.hf)).name
    changed = ", ".join(f"{k}={v}" for k, v in (m.overrides or {}).items())
    return f"{name} ({changed})" if changed else name


def _variants(args: argparse.Namespace, overrides: list[str]) -> list:
    owners = {name: eng.own_keys() for name, eng in engines().items()}
    sweeps = [bench.parse_sweep(s) for s in args.sweep]
    extra = [bench.parse_variant(v) for v in args.variant]
    variants = []
    if args.backends or not extra:
        names = (
            args.backends.split(",")
            if args.backends
            else [load_config(args.config, overrides).parallel.backend]
        )
        variants = bench.expand([b.strip() for b in names if b.strip()], sweeps, owners)
    variants += extra
    for v in variants:  # every variant's config must load before anything runs
        try:
            cfg = load_config(args.config, [*overrides, *v.overrides])
        except UserError as e:
            raise UserError(f"variant '{v.name}': {e}") from None
        v.backend, v.model = cfg.parallel.backend, model_label(cfg)
    if len({v.name for v in variants}) != len(variants):
        raise UserError("two variants have the same name; name each --variant differently")
    return variants


def run(args: argparse.Namespace, overrides: list[str]) -> int:
    # torch-free path: `zerofit plan` imports every command module; bench.report imports torch
    from zerofit.bench.report import environment, print_results, write_report
    from zerofit.launch.prepare import default_nproc  # torch-free path: it imports torch

    if args.steps < 1 or args.warmup < 0:
        raise UserError("--steps must be >= 1 and --warmup >= 0")
    if not 0 <= args.profile <= 1000:
        raise UserError(f"--profile {args.profile}: expected 1 to 1000 steps (0: off)")
    variants = _variants(args, overrides)
    out = Path(args.out or f"runs/bench-{time.strftime('%Y%m%d-%H%M%S')}")
    if (out / "results.json").exists():
        raise UserError(f"{out} already holds bench results; choose another --out")
    meta = {
        "date": time.strftime("%Y-%m-%d"),
        "command": "zerofit " + shlex.join(args.argv),
        "nproc": args.nproc or default_nproc(),
        "warmup": args.warmup,
        "steps": args.steps,
        "profile_steps": args.profile,
        "model": ", ".join(dict.fromkeys(v.model for v in variants)),
        "env": environment(),
    }
    print(f"zerofit bench: {len(variants)} variant(s) -> {out}", flush=True)

    def report(r: bench.Result) -> None:
        figure = f"{r.tokens_per_s:,.0f} tokens/s" if r.tokens_per_s else r.error
        print(f"  {r.name}: {r.status} {figure} ({r.wall_s:.0f} s)", flush=True)
        if r.profile:
            print(f"    profile: {Path(r.profile_dir) / r.profile['trace']}", flush=True)
        elif args.profile and r.status == "ok":
            print(f"    {r.error}", flush=True)

    settings = bench.Settings(
        overrides, args.config, args.nproc, args.warmup, args.steps, args.timeout, args.profile
    )
    results = bench.run_bench(variants, out, settings, on_result=report)
    write_report(results, out, meta)
    print_results(results, meta)
    print(f"results: {out}/results.json, results.md, throughput.png, memory.png")
    return 0 if any(r.status == "ok" for r in results) else 1

"""`zerofit plan`: per-GPU memory and speed of every strategy, the recommendation, `--measure`."""

from __future__ import annotations

import argparse
import json
import tempfile
from dataclasses import replace
from pathlib import Path

from zerofit.config import Config, load_config, save_config, with_fields
from zerofit.errors import UserError
from zerofit.models.shape import ModelShape, shape_from_config, shape_from_hf_config
from zerofit.planner.memory import workload_for
from zerofit.planner.plan import Option, plan, recommend, to_json
from zerofit.planner.shape import Hardware, detect_hardware, parse_size
from zerofit.planner.terms import GIB, Workload


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "plan",
        help="per-GPU memory and speed of every strategy, and which to use",
        description="Forecast per-GPU memory (by component) and speed for DDP, FSDP and ZeRO, "
        "say what fits, and recommend.",
    )
    add_arguments(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace, overrides: list[str]) -> int:
    return cmd_plan(args)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "-c", "--config", help="a zerofit config: model, batch, seq_len and precision come from it"
    )
    p.add_argument("--preset", help="a built-in model preset (instead of -c)")
    p.add_argument(
        "--hf-config", help="a Hugging Face config.json or its directory (instead of -c)"
    )
    p.add_argument(
        "--layers", type=int, help="plain numbers: layers (with --dim --heads --ffn --vocab)"
    )
    p.add_argument("--dim", type=int)
    p.add_argument("--heads", type=int)
    p.add_argument("--kv-heads", type=int)
    p.add_argument("--ffn", type=int)
    p.add_argument("--vocab", type=int)
    p.add_argument(
        "--micro-batch", type=int, help="sequences per GPU per step (default: config, else 1)"
    )
    p.add_argument("--seq-len", type=int, help="default: config, else 2048")
    p.add_argument("--grad-accum", type=int, help="default: config, else 1")
    p.add_argument("--gpus", type=int, help="GPUs per node (default: detected)")
    p.add_argument("--gpu-mem", help="memory per GPU, e.g. 40GiB, 80GB (default: detected)")
    p.add_argument("--cpu-mem", help="host RAM per node, e.g. 512GiB")
    p.add_argument("--nvme", help="NVMe space per node, e.g. 2TB")
    p.add_argument("--nodes", type=int, default=1)
    p.add_argument("--json", action="store_true", help="print JSON instead of tables")
    p.add_argument(
        "--write", metavar="CFG", help="write the recommended configuration as a zerofit config"
    )
    p.add_argument(
        "--measure",
        type=int,
        default=0,
        metavar="K",
        help="run the K best fitting strategies for a few steps and compare memory",
    )
    p.add_argument("--all", action="store_true", help="list every strategy (default: the 12 best)")


def _model_and_base(args: argparse.Namespace) -> tuple[ModelShape, Config]:
    sources = [bool(args.config), bool(args.preset), bool(args.hf_config), args.layers is not None]
    if sum(sources) != 1:
        raise UserError(
            "give exactly one model source: -c CFG, --preset NAME, --hf-config PATH, or --layers/--dim/..."
        )
    base = load_config(args.config) if args.config else Config()
    if args.preset:
        base = with_fields(
            base, {"model.preset": args.preset, "model.hf": None, "model.overrides": {}}
        )
    if args.config or args.preset:
        return shape_from_config(base), base
    if args.hf_config:
        return shape_from_hf_config(args.hf_config), with_fields(
            base,
            {
                "model.preset": None,
                "model.hf": str(
                    Path(args.hf_config).parent
                    if args.hf_config.endswith(".json")
                    else args.hf_config
                ),
            },
        )
    missing = [n for n in ("dim", "heads", "ffn", "vocab") if getattr(args, n) is None]
    if missing:
        raise UserError(f"plain numbers need --{' --'.join(missing)}")
    shape = ModelShape(
        "custom",
        args.layers,
        args.dim,
        args.heads,
        args.kv_heads or args.heads,
        args.ffn,
        args.vocab,
        fused_head=base.model.loss_chunk > 0,  # a zerofit-built decoder of that shape
    )
    return shape, base


def _hardware(args: argparse.Namespace) -> Hardware:
    found = detect_hardware()
    if args.gpus is None and found is None:
        raise UserError(
            "no GPU detected here: give --gpus N and --gpu-mem SIZE (e.g. --gpus 8 --gpu-mem 80GB)"
        )
    if args.gpu_mem is None and found is None:
        raise UserError("no GPU detected here: give --gpu-mem SIZE too")
    hw = found or Hardware(gpus_per_node=args.gpus, gpu_mem=parse_size(args.gpu_mem))
    return replace(
        hw,
        gpus_per_node=args.gpus or hw.gpus_per_node,
        gpu_mem=parse_size(args.gpu_mem) if args.gpu_mem else hw.gpu_mem,
        cpu_mem=parse_size(args.cpu_mem) if args.cpu_mem else hw.cpu_mem,
        nvme=parse_size(args.nvme) if args.nvme else hw.nvme,
        nodes=args.nodes,
    )


def _workload(args: argparse.Namespace, base: Config, hw: Hardware) -> Workload:
    """The config's workload (`workload_for`), with the flags' and, without a config, the plain
    defaults' micro-batch, sequence length and accumulation."""
    given = bool(args.config)
    w = workload_for(base, hw.world_size)
    return replace(
        w,
        micro_batch_size=args.micro_batch or (w.micro_batch_size if given else 1),
        seq_len=args.seq_len or (w.seq_len if given else 2048),
        grad_accum_steps=args.grad_accum or (w.grad_accum_steps if given else 1),
    )


def recommended_config(base: Config, w: Workload, option: Option) -> Config:
    fields = {
        "model.seq_len": w.seq_len,
        "train.micro_batch_size": w.micro_batch_size,
        "train.grad_accum_steps": w.grad_accum_steps,
    }
    fields |= {"precision.mode": w.compute_dtype, "precision.master_dtype": w.master_dtype}
    return with_fields(base, fields | option.strategy.overrides())


COLUMNS = ("strategy", "params", "grads", "optim", "activ", "logits", "buffers", "overhead")
COLUMNS += ("GPU total", "host/GPU", "fits", "step s", "tok/s", "MFU")
COMPONENTS = ("parameters", "gradients", "optimizer_states", "activations", "logits", "buffers")
COMPONENTS += ("overhead",)


def _row(o: Option) -> list[str]:
    c = o.memory.components()
    return [
        o.strategy.label,
        *(f"{c[k] / GIB:.1f}" for k in COMPONENTS),
        f"{o.memory.peak_reserved / GIB:.1f}",
        f"{o.memory.host / GIB:.1f}",
        "yes" if o.fits else "no",
        f"{o.speed.step_time:.2f}",
        f"{o.speed.tokens_per_s:,.0f}",
        f"{100 * o.speed.mfu:.0f}%",
    ]


def _verdict(options: list[Option]) -> str:
    best = recommend(options)
    if best is None:
        return (
            f"[bold red]nothing fits[/]: the closest is {options[0].strategy.label} "
            f"({options[0].why_not}). Lower the micro-batch or seq_len, add GPUs, or add host RAM "
            "/ NVMe for offload."
        )
    return (
        f"[bold green]recommended:[/] {best.strategy.label}: "
        f"{best.memory.peak_reserved / GIB:.1f} GiB per GPU, ~{best.speed.tokens_per_s:,.0f} tokens/s"
    )


def _print_tables(
    m: ModelShape, w: Workload, hw: Hardware, options: list[Option], show_all: bool
) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    console = Console(width=max(console.width, 170))  # a wide table reads better wrapped
    title = (
        f"{m.name}: {m.num_params / 1e9:.2f}B params, micro-batch {w.micro_batch_size} x seq "
        f"{w.seq_len}, {hw.world_size} x {hw.gpu_mem / GIB:.0f} GiB, {w.compute_dtype} compute / "
        f"{w.master_dtype} master"
    )
    if w.lora:
        title += (
            f"; LoRA r={w.lora.rank}: {w.lora.params / 1e6:.3g}M adapter params train, the base is "
            f"frozen in {w.compute_dtype}"
        )
    table = Table(title=title)
    for col in COLUMNS:
        table.add_column(col, justify="left" if col == "strategy" else "right")
    for o in options if show_all else options[:12]:
        table.add_row(*_row(o))
    console.print(table)
    console.print(
        "GiB per GPU; GPU total = peak allocated + CUDA context + fragmentation. Speed: roofline "
        "(see zerofit/planner/speed.py)."
    )
    console.print(_verdict(options))


def measure(base: Config, w: Workload, options: list[Option], k: int) -> list[dict]:
    """Run the k best fitting strategies for a few steps on this machine; predicted vs measured."""
    from zerofit import runner

    rows = []
    for o in [o for o in options if o.fits][:k]:
        cfg = with_fields(recommended_config(base, w, o), {"train.steps": 4, "log.every": 1})
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "cfg.yaml"
            save_config(cfg, path)
            got = runner.train(
                Path(tmp) / "run", runner.MEASURE_ONLY, Path(tmp) / "log", str(path), w.world_size
            )
            failed = None if got.ok else got.log().strip().splitlines()[-1:]
        measured = (got.summary or {}).get("mem_alloc_gib")
        predicted = o.memory.peak_allocated / GIB
        error = predicted / measured - 1 if measured else None
        rows.append(
            {
                "strategy": o.strategy.label,
                "predicted_gib": predicted,
                "measured_gib": measured,
                "error": error,
                "failed": failed,
            }
        )
        seen = f"{measured:7.2f} GiB   error {100 * error:+.1f}%" if error is not None else "failed"
        print(
            f"{o.strategy.label:<40} predicted {predicted:7.2f} GiB   measured {seen}", flush=True
        )
    return rows


def cmd_plan(args: argparse.Namespace) -> int:
    shape, base = _model_and_base(args)
    hw = _hardware(args)
    w = _workload(args, base, hw)
    options = plan(shape, w, hw, base)
    if args.json:
        print(json.dumps(to_json(shape, w, hw, options), indent=1))
    else:
        _print_tables(shape, w, hw, options, args.all)
    best = recommend(options)
    if args.write:
        if best is None:
            raise UserError("nothing fits, so there is no configuration to write")
        save_config(recommended_config(base, w, best), args.write)
        print(f"wrote {args.write}")
    if args.measure:
        measure(base, w, options, args.measure)
    return 0

"""`zerofit plan`: per-GPU memory and speed of every strategy, the recommendation, `--measure`."""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import NoReturn

from zerofit.config import Config, load_config, save_config, with_fields
from zerofit.errors import UserError
from zerofit.limits import shown
from zerofit.models.shape import ModelShape, shape_from_config, shape_from_hf_config
from zerofit.planner.gpus import GPUS, find_gpu
from zerofit.planner.memory import workload_for
from zerofit.planner.plan import Option, closest, headroom_rule, plan, recommend, to_json
from zerofit.planner.shape import (
    Hardware,
    detect_hardware,
    host_ram,
    parse_count,
    parse_positive,
    parse_size,
    with_gpu,
)
from zerofit.planner.terms import GIB, Workload


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "plan",
        help="per-GPU memory and speed of every strategy, and which to use",
        description="Forecast per-GPU memory (by component) and speed for DDP, FSDP and ZeRO, "
        "say what fits, and recommend.",
    )
    add_arguments(p)
    p.error = _one_line_error  # type: ignore[method-assign]
    p.set_defaults(run=run)


def _one_line_error(message: str) -> NoReturn:
    """argparse's own errors (a flag without its value) as one `error:` line and exit 2, like
    every UserError, instead of the usage text."""
    if "expected one argument" in message:
        message += " (give it a value; one that starts with '-' goes as --flag=VALUE)"
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


def run(args: argparse.Namespace, overrides: list[str]) -> int:
    return cmd_plan(args)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Numbers are read as text and checked in `_numbers` (one `error:` line, exit 2)."""
    p.add_argument(
        "-c", "--config", help="a zerofit config: model, batch, seq_len and precision come from it"
    )
    p.add_argument("--preset", help="a built-in model preset (instead of -c)")
    p.add_argument(
        "--hf-config", help="a Hugging Face config.json or its directory (instead of -c)"
    )
    p.add_argument(
        "--layers", metavar="N", help="plain numbers: layers (with --dim --heads --ffn --vocab)"
    )
    for flag in ("--dim", "--heads", "--kv-heads", "--ffn", "--vocab"):
        p.add_argument(flag, metavar="N")
    p.add_argument(
        "--micro-batch", metavar="N", help="sequences per GPU per step (default: config, else 1)"
    )
    p.add_argument("--seq-len", metavar="N", help="default: config, else 2048")
    p.add_argument("--grad-accum", metavar="N", help="default: config, else 1")
    p.add_argument("--gpus", metavar="N", help="GPUs per node (default: detected)")
    p.add_argument(
        "--gpu",
        metavar="NAME",
        help=f"the card, for its memory, peak and bandwidths (default: detected): {', '.join(g.name for g in GPUS)}",
    )
    p.add_argument(
        "--gpu-mem", help="memory per GPU, e.g. 40GiB, 80GB (default: --gpu's, else detected)"
    )
    p.add_argument(
        "--peak-tflops",
        metavar="X",
        help="dense bf16 peak per GPU (default: --gpu's, else detected)",
    )
    p.add_argument("--cpu-mem", help="host RAM per node, e.g. 512GiB (default: this machine's)")
    p.add_argument("--nvme", help="NVMe space per node, e.g. 2TB")
    p.add_argument("--nodes", metavar="N", default="1")
    p.add_argument("--json", action="store_true", help="print JSON instead of tables")
    p.add_argument(
        "--write", metavar="CFG", help="write the recommended configuration as a zerofit config"
    )
    p.add_argument(
        "--measure",
        default="0",
        metavar="K",
        help="run the K best fitting strategies for a few steps and compare memory",
    )
    p.add_argument("--all", action="store_true", help="list every strategy (default: the 12 best)")


COUNTS = ("layers", "dim", "heads", "kv_heads", "ffn", "vocab", "micro_batch", "seq_len")
COUNTS += ("grad_accum", "gpus", "nodes")


def _size(flag: str, text: str | None, positive: bool = False) -> int | None:
    if text is None:
        return None
    try:
        size = parse_size(text)
    except UserError as e:
        raise UserError(f"{flag}: {e}") from None
    if positive and size <= 0:
        raise UserError(f"{flag} must be more than 0, got {shown(text)}")
    return size


def _numbers(args: argparse.Namespace) -> argparse.Namespace:
    """Every numeric flag read and checked (UserError naming the flag); the rest as given."""
    out = argparse.Namespace(**vars(args))
    for name in COUNTS:
        setattr(out, name, parse_count("--" + name.replace("_", "-"), getattr(args, name)))
    out.measure = parse_count("--measure", args.measure, minimum=0)
    out.gpu_mem = _size("--gpu-mem", args.gpu_mem, positive=True)
    out.cpu_mem = _size("--cpu-mem", args.cpu_mem)
    out.nvme = _size("--nvme", args.nvme)
    out.peak_tflops = parse_positive("--peak-tflops", args.peak_tflops)
    out.gpu = find_gpu(args.gpu) if args.gpu is not None else None
    if out.dim and out.heads and out.dim % out.heads:
        raise UserError(f"--dim {out.dim} is not divisible by --heads {out.heads}")
    if out.heads and out.kv_heads and out.heads % out.kv_heads:
        raise UserError(f"--heads {out.heads} is not divisible by --kv-heads {out.kv_heads}")
    return out


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
    """The machine planned for: detected here, with every flag given replacing what it names;
    the host RAM always known when this machine says it (detected when --cpu-mem is not given)."""
    found = detect_hardware()
    if args.gpus is None and found is None:
        raise UserError(
            "no GPU detected here: give --gpus N and --gpu-mem SIZE or --gpu NAME "
            "(e.g. --gpus 8 --gpu-mem 80GB, or --gpus 2 --gpu 'RTX 4090')"
        )
    if args.gpu_mem is None and args.gpu is None and found is None:
        raise UserError("no GPU detected here: give --gpu-mem SIZE or --gpu NAME too")
    hw = found or Hardware(gpus_per_node=args.gpus, gpu_mem=0)
    if args.gpu is not None:
        hw = replace(with_gpu(hw, args.gpu), gpu_from="--gpu")
    if args.peak_tflops is not None:
        given = "--peak-tflops" if hw.gpu_from != "--gpu" else "--gpu, --peak-tflops"
        hw = replace(hw, peak_flops=args.peak_tflops * 1e12, gpu_from=given)
    if args.cpu_mem is not None:
        ram, ram_from = args.cpu_mem, "given"
    elif found is not None:
        ram, ram_from = found.cpu_mem, found.cpu_mem_from
    else:
        ram = host_ram()
        ram_from = "detected" if ram is not None else "unknown"
    return replace(
        hw,
        gpus_per_node=args.gpus or hw.gpus_per_node,
        gpu_mem=args.gpu_mem or hw.gpu_mem,
        cpu_mem=ram,
        cpu_mem_from=ram_from,
        nvme=args.nvme if args.nvme is not None else hw.nvme,
        nodes=args.nodes,
    )


def _workload(args: argparse.Namespace, base: Config, hw: Hardware) -> Workload:
    """The config's workload (`workload_for`), with the flags' and, without a config, the plain
    defaults' micro-batch, sequence length and accumulation."""
    given = bool(args.config)

    def pick(flag: int | None, from_config: int, default: int) -> int:
        return flag if flag is not None else (from_config if given else default)

    w = workload_for(base, hw.world_size)
    return replace(
        w,
        micro_batch_size=pick(args.micro_batch, w.micro_batch_size, 1),
        seq_len=pick(args.seq_len, w.seq_len, 2048),
        grad_accum_steps=pick(args.grad_accum, w.grad_accum_steps, 1),
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
        near = closest(options)
        return (
            f"[bold red]nothing fits[/]: the closest is {near.strategy.label} "
            f"({near.why_not}). Lower the micro-batch or seq_len, add GPUs, or add host RAM "
            "/ NVMe for offload."
        )
    return (
        f"[bold green]recommended:[/] {best.strategy.label}: "
        f"{best.memory.peak_reserved / GIB:.1f} GiB per GPU, ~{best.speed.tokens_per_s:,.0f} tokens/s"
    )


def _gpu_words(hw: Hardware) -> str:
    figures = f"{hw.peak_flops / 1e12:,.0f} TFLOP/s bf16, {hw.mem_bw / 1e9:,.0f} GB/s memory"
    if hw.gpu_from == "assumed":
        return (
            f"GPU not named: speed assumes an H200's {figures} (give --gpu NAME or --peak-tflops)"
        )
    return f"{hw.name} ({hw.gpu_from}): {figures}"


def _host_words(hw: Hardware) -> str:
    if hw.cpu_mem is None:
        return "host RAM unknown (give --cpu-mem): offload cannot fit"
    where = {"given": "given", "detected": "detected here"}.get(hw.cpu_mem_from, hw.cpu_mem_from)
    return f"host RAM {hw.cpu_mem / GIB:,.0f} GiB per node ({where})"


def _print_tables(
    m: ModelShape, w: Workload, hw: Hardware, options: list[Option], show_all: bool
) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    console = Console(width=max(console.width, 170))  # a wide table reads better wrapped
    title = (
        f"{m.name}: {m.num_params / 1e9:.2f}B params, micro-batch {w.micro_batch_size} x seq "
        f"{w.seq_len}, {hw.world_size} x {hw.gpu_mem / GIB:.1f} GiB, {w.compute_dtype} compute / "
        f"{w.master_dtype} master"
    )
    if w.lora:
        title += (
            f"; LoRA r={w.lora.rank}: {w.lora.params / 1e6:.3g}M adapter params train, the base is "
            f"frozen in {w.compute_dtype}"
        )
    title += f"\n{_gpu_words(hw)}; {_host_words(hw)}"
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
    console.print(headroom_rule(hw), soft_wrap=True)
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
    args = _numbers(args)
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

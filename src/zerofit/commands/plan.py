"""`zerofit plan`: per-GPU memory and speed of every strategy, the recommendation, `--measure`."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import NoReturn, TextIO

import zerofit.commands.plan_measure as plan_measure
from zerofit.backends.terms import Workload
from zerofit.commands.plan_table import print_tables
from zerofit.config import Config, save_config, with_fields
from zerofit.config.limits import shown
from zerofit.config.sizes import gib, memory_fraction
from zerofit.errors import UserError
from zerofit.launch.run_config import default_config, load_config
from zerofit.models.shape import ModelShape, shape_from_config, shape_from_hf_config
from zerofit.planner.adapters import lighter_lines, lighter_ways
from zerofit.planner.gpus import GPUS, find_gpu
from zerofit.planner.memory import workload_for
from zerofit.planner.plan import (
    Option,
    batch_splits,
    left_out,
    option_fields,
    plan,
    recommend,
)
from zerofit.planner.plan_json import option_json, to_json
from zerofit.planner.shape import (
    Hardware,
    detect_hardware,
    host_ram,
    parse_count,
    parse_positive,
    parse_size,
    with_gpu,
)
from zerofit.report.quiet import data_output


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "plan",
        help="per-GPU memory and speed of every strategy, and which to use",
        description="Forecast per-GPU memory (by component) and speed for DDP, FSDP and ZeRO, "
        "say what fits, and recommend.",
    )
    add_arguments(p)
    plan_measure.add_arguments(p)
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
    if not args.json:
        return cmd_plan(args, sys.stdout)
    with data_output() as stdout:  # the JSON alone on stdout, whatever the libraries print
        return cmd_plan(args, stdout)


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
    p.add_argument(
        "--global-batch",
        metavar="N",
        help="sequences per optimizer step, fixed: the planner picks each strategy's micro-batch "
        "x accumulation (default: the config's train.global_batch_size)",
    )
    p.add_argument("--gpus", metavar="N", help="GPUs per node (default: detected)")
    p.add_argument(
        "--gpu",
        metavar="NAME",
        help=f"the card, for its memory, peak and bandwidths (default: detected): {', '.join(g.name for g in GPUS)}",
    )
    p.add_argument(
        "--gpu-mem",
        help="memory per GPU, e.g. 40GiB, 80GB (default: the config's train.gpu_memory_limit, "
        "else --gpu's, else detected)",
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
        help="run K fitting strategies here (every engine first, spread over AC modes); compare "
        "memory and speed",
    )
    p.add_argument("--all", action="store_true", help="list every strategy (default: the 12 best)")


COUNTS = ("layers", "dim", "heads", "kv_heads", "ffn", "vocab", "micro_batch", "seq_len")
COUNTS += ("grad_accum", "global_batch", "gpus", "nodes")


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
    base = load_config(args.config) if args.config else default_config()
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


def _hardware(
    args: argparse.Namespace, limit: int | None = None
) -> tuple[Hardware, Hardware | None]:
    """The machine planned for: detected here, with every flag given replacing what it names;
    the host RAM always known when this machine says it (detected when --cpu-mem is not given);
    the GPU memory --gpu-mem's, else the config's train.gpu_memory_limit (`limit`: refused above
    the card detected here), else the card's. Returns it and the machine detected (or None)."""
    found = detect_hardware()
    if args.gpu_mem is None and limit is not None and found is not None and args.gpu is None:
        memory_fraction(limit, found.gpu_mem, found.name)  # as the run would refuse it
    memory = args.gpu_mem or limit
    memory_from = "--gpu-mem" if args.gpu_mem else "train.gpu_memory_limit"
    if args.gpus is None and found is None:
        raise UserError(
            "no GPU detected here: give --gpus N and --gpu-mem SIZE or --gpu NAME "
            "(e.g. --gpus 8 --gpu-mem 80GB, or --gpus 2 --gpu 'RTX 4090')"
        )
    if memory is None and args.gpu is None and found is None:
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
    planned = replace(
        hw,
        gpus_per_node=args.gpus or hw.gpus_per_node,
        gpu_mem=memory or hw.gpu_mem,
        gpu_mem_from=memory_from if memory else "card",
        cpu_mem=ram,
        cpu_mem_from=ram_from,
        nvme=args.nvme if args.nvme is not None else hw.nvme,
        nodes=args.nodes,
    )
    return planned, found


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


def recommended_config(
    base: Config, w: Workload, option: Option, extra: dict[str, object] | None = None
) -> Config:
    """`base` with the option's strategy, micro-batch x accumulation, seq_len and dtypes (and
    `extra` fields: a fixed global batch, a GPU memory cap)."""
    fields: dict[str, object] = {
        "model.seq_len": w.seq_len,
        "train.micro_batch_size": w.micro_batch_size,
        "train.grad_accum_steps": w.grad_accum_steps,
    }
    fields |= {"precision.mode": w.compute_dtype, "precision.master_dtype": w.master_dtype}
    return with_fields(base, fields | option_fields(option) | (extra or {}))


def _written_cap(
    args: argparse.Namespace, found: Hardware | None, base: Config
) -> tuple[dict[str, object], str]:
    """`train.gpu_memory_limit` of the written config, and what to say about it: --gpu-mem X on
    a machine whose GPUs are larger carries X, so that a run here rehearses the card planned
    for; an explicit --gpu-mem replaces the config's own limit (dropped where the GPUs here are
    no larger: nothing to cap)."""
    planned, here = args.gpu_mem, found.gpu_mem if found is not None else None
    if planned is None:
        return {}, ""
    key = "train.gpu_memory_limit"
    if here is not None and planned < here:
        return {key: planned}, (
            f"; {key}: {gib(planned)} since this machine's GPUs have {gib(here)}: a run here is "
            "capped at the memory planned for, a faithful rehearsal"
        )
    old = base.train.gpu_memory_limit
    if old is None or old == planned:
        return {}, ""
    if here is None:
        note = f"; {key}: {gib(planned)} (--gpu-mem) replaces the config's {gib(old)}"
        return {key: planned}, note
    return {key: None}, f"; {key} removed: the GPUs here have {gib(here)}, no more than --gpu-mem"


def _write(
    args: argparse.Namespace,
    base: Config,
    w: Workload,
    best: Option | None,
    found: Hardware | None,
    global_batch: int | None,
) -> None:
    """--write: the recommended configuration, and one line saying what was written."""
    if best is None:
        raise UserError("nothing fits, so there is no configuration to write")
    extra, note = _written_cap(args, found, base)
    if global_batch is not None and best.workload is not None:
        extra["train.global_batch_size"] = global_batch
        note = (
            f"; micro-batch {best.workload.micro_batch_size} x accumulation "
            f"{best.workload.grad_accum_steps} x {w.world_size} GPUs = global batch "
            f"{global_batch}{note}"
        )
    save_config(recommended_config(base, w, best, extra), args.write)
    print(f"wrote {args.write}{note}")


def cmd_plan(args: argparse.Namespace, stdout: TextIO) -> int:
    args = _numbers(args)
    measuring = plan_measure.settings(args)  # checked before anything runs
    shape, base = _model_and_base(args)
    hw, found = _hardware(args, base.train.gpu_memory_limit)
    w = _workload(args, base, hw)
    fixed = args.global_batch or base.train.global_batch_size
    splits = None
    if fixed is not None:
        splits = batch_splits(fixed, hw.world_size, args.micro_batch, args.grad_accum)
    options = plan(shape, w, hw, base, splits)
    refused = left_out(base)
    best = recommend(options)
    ways = lighter_ways(shape, w, hw, base) if best is None else []
    if args.json:
        data = to_json(shape, w, hw, options, fixed, refused)
        data["with_adapters"] = [{"way": x.name, "overrides": x.overrides, "fits": x.fits,
                                  **option_json(x.best, w)} for x in ways]  # fmt: skip
        print(json.dumps(data, indent=1), file=stdout)
    else:
        print_tables(shape, w, hw, options, args.all, fixed, refused)
        if ways:
            print("full fine-tuning fits nowhere here; the same run with adapters:")
            for line in lighter_lines(ways):
                print(f"  {line}")
    if args.write:
        _write(args, base, w, best, found, fixed)
    if measuring:
        config_of = partial(recommended_config, base, w)
        plan_measure.measure(measuring, args.json, shape, w, hw, options, config_of)
    return 0

"""`zerofit plan`'s inputs: its flags, read and checked (one `error:` line, exit 2), the model and
the config planned (`-c`/`--preset`/`--hf-config`, then the `--section.key VALUE` overrides, as
`zerofit train` takes them) and the workload."""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path

from zerofit.backends.terms import Workload
from zerofit.config import Config, explicit_keys
from zerofit.config.limits import shown
from zerofit.errors import UserError
from zerofit.launch.run_config import load_config
from zerofit.models.shape import ModelShape, shape_from_config, shape_from_hf_config
from zerofit.planner.adapters import estimated_adapters
from zerofit.planner.gpus import GPUS, find_gpu
from zerofit.planner.memory import workload_for
from zerofit.planner.shape import Hardware, parse_count, parse_positive, parse_size

COUNTS = ("layers", "dim", "heads", "kv_heads", "ffn", "vocab", "micro_batch", "seq_len")
COUNTS += ("grad_accum", "global_batch", "gpus", "nodes")
MODEL_KEYS = ("model.hf", "model.preset")  # overrides that choose the model


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Numbers are read as text and checked in `numbers` (one `error:` line, exit 2)."""
    p.add_argument(
        "-c", "--config", help="a zerofit config: model, batch, seq_len and precision come from it"
    )
    p.add_argument("--preset", help="a built-in model preset (alone, or replacing -c's model)")
    p.add_argument(
        "--hf-config",
        help="a Hugging Face config.json or its directory (alone, or replacing -c's model)",
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
    add_host_arguments(p)
    p.add_argument("--nodes", metavar="N", default="1")
    p.add_argument("--json", action="store_true", help="print JSON instead of tables")
    p.add_argument(
        "--write",
        metavar="CFG",
        help="write the recommended configuration as a zerofit config (the fields that differ "
        "from the defaults, under a comment giving the forecast)",
    )
    p.add_argument(
        "--measure",
        default="0",
        metavar="K",
        help="run K fitting strategies here (every engine first, spread over AC modes); compare "
        "memory and speed",
    )
    p.add_argument("--all", action="store_true", help="list every strategy (default: the 12 best)")


def add_host_arguments(p: argparse.ArgumentParser) -> None:
    """The node beside its GPUs: host RAM, and the NVMe disk for offload."""
    p.add_argument("--cpu-mem", help="host RAM per node, e.g. 512GiB (default: this machine's)")
    p.add_argument("--nvme", help="NVMe space per node, e.g. 2TB")
    p.add_argument(
        "--nvme-bw",
        metavar="READ[,WRITE]",
        help="the NVMe disk's bandwidth per node in GB/s, read and write (one figure: both); "
        "default: 3 assumed, or --nvme-probe's",
    )
    p.add_argument(
        "--nvme-probe",
        nargs="?",
        const="",
        metavar="DIR",
        help="time 256 MiB written and read back with O_DIRECT in DIR (default: the config's "
        "NVMe offload directory) for the disk's bandwidth and free space",
    )
    p.add_argument(
        "--host-us",
        metavar="LAUNCH,HOOK[,COMPILED]",
        help="the host's microseconds per kernel launch, per engine hook call and per compiled "
        "kernel launch (default: LAUNCH), as --host-probe measures them; default: fitted on the "
        "H200 machine's host",
    )
    p.add_argument(
        "--host-probe",
        action="store_true",
        help="time kernel launches (eager and compiled) and each engine's hooks on this "
        "machine's first GPU (under a minute) for the host's share of each step",
    )


def size(flag: str, text: str | None, positive: bool = False) -> int | None:
    if text is None:
        return None
    try:
        value = parse_size(text)
    except UserError as e:
        raise UserError(f"{flag}: {e}") from None
    if positive and value <= 0:
        raise UserError(f"{flag} must be more than 0, got {shown(text)}")
    return value


def disk_bandwidth(text: str | None) -> tuple[float, float] | None:
    """`--nvme-bw READ[,WRITE]` in GB/s (one figure: both), each a finite number > 0."""
    if text is None:
        return None
    parts = text.split(",")
    if len(parts) > 2:
        raise UserError(f"--nvme-bw takes READ or READ,WRITE in GB/s, got {shown(text)}")
    read = parse_positive("--nvme-bw", parts[0])
    write = parse_positive("--nvme-bw", parts[-1])
    return (read or 0.0, write or 0.0)


def host_rates(text: str | None) -> tuple[float, ...] | None:
    """`--host-us LAUNCH,HOOK[,COMPILED]` in microseconds, each a finite number > 0; in
    seconds."""
    if text is None:
        return None
    parts = text.split(",")
    if len(parts) not in (2, 3):
        raise UserError(
            f"--host-us takes LAUNCH,HOOK[,COMPILED] in microseconds, got {shown(text)}"
        )
    return tuple((parse_positive("--host-us", part) or 0.0) * 1e-6 for part in parts)


def numbers(args: argparse.Namespace) -> argparse.Namespace:
    """Every numeric flag read and checked (UserError naming the flag); the rest as given."""
    out = argparse.Namespace(**vars(args))
    for name in COUNTS:
        setattr(out, name, parse_count("--" + name.replace("_", "-"), getattr(args, name)))
    out.measure = parse_count("--measure", args.measure, minimum=0)
    out.gpu_mem = size("--gpu-mem", args.gpu_mem, positive=True)
    out.cpu_mem = size("--cpu-mem", args.cpu_mem)
    out.nvme = size("--nvme", args.nvme)
    out.nvme_bw = disk_bandwidth(args.nvme_bw)
    out.host_us = host_rates(args.host_us)
    if out.host_us is not None and args.host_probe:
        raise UserError("--host-us and --host-probe both give the host's speed: give one")
    out.peak_tflops = parse_positive("--peak-tflops", args.peak_tflops)
    out.gpu = find_gpu(args.gpu) if args.gpu is not None else None
    if out.dim and out.heads and out.dim % out.heads:
        raise UserError(f"--dim {out.dim} is not divisible by --heads {out.heads}")
    if out.heads and out.kv_heads and out.heads % out.kv_heads:
        raise UserError(f"--heads {out.heads} is not divisible by --kv-heads {out.kv_heads}")
    return out


def _model_fields(args: argparse.Namespace, overrides: list[str]) -> list[str]:
    """The overrides that put the model of --preset / --hf-config / --model.hf into the config
    (before the user's own); UserError unless exactly one model is named (-c's own, or one
    replacing it)."""
    keys = {item.split("=", 1)[0].strip() for item in overrides}
    chosen = [
        flag
        for flag, given in (
            ("--preset", args.preset),
            ("--hf-config", args.hf_config),
            ("--model.hf/--model.preset", keys & set(MODEL_KEYS)),
            ("--layers/--dim/...", args.layers is not None),
        )
        if given
    ]
    plain = args.layers is not None
    if len(chosen) > 1 or (not chosen and not args.config) or (plain and args.config):
        given = " with ".join(["-c", *chosen] if args.config else chosen) or "none"
        raise UserError(
            "give one model: -c CFG, --preset NAME, --hf-config PATH, --model.hf DIR or "
            "--layers/--dim/... (-c with one of the first three replaces the config's model); "
            f"got {given}"
        )

    def text(value: object) -> str:  # a YAML scalar (JSON is YAML): any name or path as it is
        return json.dumps(value)

    if args.preset:
        return [f"model.preset={text(args.preset)}", "model.hf=null", "model.overrides={}"]
    if args.hf_config:
        folder = Path(args.hf_config)
        folder = folder.parent if folder.suffix == ".json" else folder
        return ["model.preset=null", f"model.hf={text(str(folder))}", "model.overrides={}"]
    if "model.hf" in keys and "model.preset" not in keys:
        return ["model.preset=null"]  # an HF folder replaces the config's preset
    if "model.preset" in keys and "model.hf" not in keys:
        return ["model.hf=null"]
    return []


def model_and_base(args: argparse.Namespace, overrides: list[str]) -> tuple[ModelShape, Config]:
    """The model planned and the config: `-c` (or the defaults), its model replaced by
    --preset / --hf-config, then the overrides (`--model.hf DIR`, `--model.lora.rank 16`, ...)
    applied as `zerofit train` applies them."""
    base = load_config(args.config, [*_model_fields(args, overrides), *overrides])
    m = base.model
    if args.hf_config:  # the file named, whatever it is called
        shape = shape_from_hf_config(args.hf_config, m.overrides, m.loss_chunk, m.trust_remote_code)
        return shape, base
    if args.layers is None:
        return shape_from_config(base), base
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
        fused_head=m.loss_chunk > 0,  # a zerofit-built decoder of that shape
    )
    return shape, base


def workload(args: argparse.Namespace, base: Config, hw: Hardware, shape: ModelShape) -> Workload:
    """The config's workload (`workload_for`), with the flags' micro-batch, sequence length and
    accumulation; where neither -c nor an override sets them, the plain defaults'. Plain numbers
    with `model.lora` count the adapters on their shape."""
    explicit = explicit_keys(base)
    lora = base.model.lora
    if args.layers is not None and lora.rank > 0:  # not the config's model: counted on the shape
        full = replace(base, model=replace(base.model, lora=replace(lora, rank=0, quantize="none")))
        w = workload_for(full, hw.world_size)
        w = replace(w, lora=estimated_adapters(shape, lora.rank, lora.quantize != "none"))
    else:
        w = workload_for(base, hw.world_size)

    def pick(flag: int | None, key: str, from_config: int, default: int) -> int:
        if flag is not None:
            return flag
        return from_config if args.config or key in explicit else default

    return replace(
        w,
        micro_batch_size=pick(args.micro_batch, "train.micro_batch_size", w.micro_batch_size, 1),
        seq_len=pick(args.seq_len, "model.seq_len", w.seq_len, 2048),
        grad_accum_steps=pick(args.grad_accum, "train.grad_accum_steps", w.grad_accum_steps, 1),
    )

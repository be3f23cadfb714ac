"""`zerofit export RUN_DIR --out DIR`: a checkpoint (any engine) as a Hugging Face folder."""

from __future__ import annotations

import argparse
from pathlib import Path


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "export",
        help="write a Hugging Face model folder from a checkpoint (offline)",
        description="Write config.json, safetensors shards and the tokenizer files of a run's "
        "checkpoint (any engine) as a folder that transformers' from_pretrained loads.",
    )
    p.add_argument("run_dir", help="a zerofit run directory")
    p.add_argument("--step", type=int, default=None, help="checkpoint step (default: newest)")
    p.add_argument("--out", required=True, help="output directory (must not hold files)")
    p.add_argument("--dtype", choices=["bf16", "fp16", "fp32"], default="bf16")
    p.add_argument(
        "--max-shard-size", default="5GiB", help="largest safetensors file (e.g. 5GB, 500MB)"
    )
    p.add_argument(
        "--adapter",
        action="store_true",
        help="LoRA runs: write a PEFT adapter folder (default: the adapters merged into the "
        "weights); a built-in preset's base model goes into its base/ folder",
    )
    p.set_defaults(run=run)


def run(args: argparse.Namespace, overrides: list[str]) -> int:
    # torch-free path: `zerofit plan` imports every command module; export.run imports torch
    from zerofit.export.run import export_checkpoint, find_checkpoint, parse_size

    run_dir = Path(args.run_dir)
    ckpt = find_checkpoint(run_dir, args.step)
    size = parse_size(args.max_shard_size)
    s = export_checkpoint(ckpt, run_dir, Path(args.out), args.dtype, size, args.adapter)
    lora = s["lora"]
    if lora and lora["adapter"]:
        base = f"base model in {s['base']}" if s["base"] else "base model: the run's model.hf"
        what = (
            f"LoRA adapter (r={lora['rank']}, alpha={lora['alpha']:g}, {lora['layers']} layers, "
            f"{s['total_bytes'] / 1e6:.3g} MB {s['dtype']}) of {s['architecture']} step "
            f"{s['step']} to {s['out']} for peft; {base}"
        )
    else:
        merged = f", LoRA r={lora['rank']} merged" if lora else ""
        what = (
            f"{s['architecture']} step {s['step']} to {s['out']}: {s['tensors']} tensors, "
            f"{s['total_bytes'] / 1e9:.3g} GB {s['dtype']} in {s['shards']} shard(s){merged}"
        )
    print(f"exported {what}; tokenizer: {s['tokenizer']}")
    return 0

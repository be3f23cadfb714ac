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
    p.set_defaults(run=run)


def run(args: argparse.Namespace, overrides: list[str]) -> int:
    from zerofit.export import export_checkpoint, find_checkpoint, parse_size

    run_dir = Path(args.run_dir)
    ckpt = find_checkpoint(run_dir, args.step)
    size = parse_size(args.max_shard_size)
    s = export_checkpoint(ckpt, run_dir, Path(args.out), args.dtype, size)
    print(
        f"exported {s['architecture']} step {s['step']} to {s['out']}: {s['tensors']} tensors, "
        f"{s['total_bytes'] / 1e9:.3g} GB {s['dtype']} in {s['shards']} shard(s); "
        f"tokenizer: {s['tokenizer']}"
    )
    return 0

"""Peak host memory of `zerofit export` against the model size and the shard size.

Trains one step of a preset (FSDP by default, one CPU process) to get a checkpoint, then exports it several
times, each in a fresh Python process that imports everything first and reports its resident set
before the export and its peak (``ru_maxrss``) after. Streaming export should peak at about one
shard plus one tensor above the baseline, whatever the model size.

Usage: python benchmarks/export_memory.py [--preset small] [--overrides '{"dim": 1024}'] [--work DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

MB = 2**20
SRC = str(Path(__file__).resolve().parents[1] / "src")


def current_rss() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def child(ckpt: str, run: str, out: str, dtype: str, shard: int) -> None:
    """Runs in a fresh process: imports, baseline, export, peak; prints one JSON line."""
    import safetensors.torch  # noqa: F401
    import torch  # noqa: F401
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM  # noqa: F401

    import zerofit.backends  # noqa: F401  (DeepSpeed, when installed: registers its format)
    import zerofit.data  # noqa: F401
    from zerofit.export.run import export_checkpoint

    before = current_rss()
    peak_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    summary = export_checkpoint(Path(ckpt), Path(run), Path(out), dtype, shard)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(json.dumps({"rss_before": before, "peak_before": peak_before, "peak": peak, **summary}))


def train(work: Path, preset: str, overrides: dict, backend: str) -> Path:
    run = work / "run"
    cfg = {
        "parallel": {"backend": backend},
        "model": {"preset": preset, "seq_len": 64, "overrides": overrides},
        "data": {"max_tokens": 100_000},
        "train": {"steps": 1, "micro_batch_size": 1, "eval_every": 0},
        "precision": {"mode": "fp32"},
        "log": {"run_dir": str(run), "progress": False},
    }
    (work / "cfg.yaml").write_text(yaml.safe_dump(cfg))
    cmd = [
        sys.executable,
        "-m",
        "zerofit.cli",
        "train",
        "-c",
        str(work / "cfg.yaml"),
        "--nproc",
        "1",
    ]
    subprocess.run(cmd, check=True, env={**os.environ, "PYTHONPATH": SRC}, capture_output=True)
    return run


def measure(run: Path, out: Path, dtype: str, shard: int, env: dict | None = None) -> dict:
    from zerofit.export.run import find_checkpoint

    ckpt = find_checkpoint(run, None)
    cmd = [sys.executable, __file__, "--child", str(ckpt), str(run), str(out), dtype, str(shard)]
    env = {**os.environ, "PYTHONPATH": SRC, **(env or {})}
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="small")
    parser.add_argument("--overrides", default="{}", help="JSON dict of LlamaArgs overrides")
    parser.add_argument("--backend", default="fsdp", help="engine that writes the checkpoint")
    parser.add_argument("--work", default=None, help="working directory (default: a temp dir)")
    parser.add_argument("--json", default=None, help="also write every measurement to this file")
    parser.add_argument("--child", nargs=5, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        ckpt, run, out, dtype, shard = args.child
        child(ckpt, run, out, dtype, int(shard))
        return
    work = Path(args.work or tempfile.mkdtemp(prefix="export-memory-"))
    work.mkdir(parents=True, exist_ok=True)
    run = train(work, args.preset, json.loads(args.overrides), args.backend)
    # glibc raises its mmap threshold (up to 32 MiB) as big blocks are freed, then serves
    # tensors from the heap, where freed blocks stay resident: the second column pins it.
    fixed = {"MALLOC_MMAP_THRESHOLD_": str(128 * 1024)}
    print(f"{'dtype':>5} {'shard limit':>11} {'model':>9} {'shards':>6} {'largest':>9} "
          f"{'RSS before':>10} {'peak':>8} {'peak - before':>13} {'same, fixed mmap threshold':>26}")  # fmt: skip
    rows = []
    for i, (dtype, shard) in enumerate([("fp32", 20 * MB), ("bf16", 20 * MB), ("fp32", 2**40)]):
        r = measure(run, work / f"out{i}", dtype, shard)
        pinned = measure(run, work / f"out{i}-fixed", dtype, shard, fixed)
        rows.append(
            {"dtype": dtype, "shard_limit": shard, "default": r, "fixed_mmap_threshold": pinned}
        )
        files = list((work / f"out{i}").glob("model-*.safetensors"))
        largest = max(f.stat().st_size for f in files)
        limit = "none" if shard >= 2**40 else f"{shard / MB:.0f} MiB"
        print(
            f"{dtype:>5} {limit:>11} {r['total_bytes'] / MB:>5.1f} MiB {r['shards']:>6} "
            f"{largest / MB:>5.1f} MiB {r['rss_before'] / MB:>6.0f} MiB {r['peak'] / MB:>4.0f} MiB "
            f"{(r['peak'] - r['rss_before']) / MB:>9.1f} MiB "
            f"{(pinned['peak'] - pinned['rss_before']) / MB:>22.1f} MiB"
        )
    print(f"work directory: {work}")
    if args.json:
        meta = {
            "preset": args.preset,
            "overrides": json.loads(args.overrides),
            "backend": args.backend,
        }
        Path(args.json).write_text(json.dumps({**meta, "rows": rows}, indent=1, default=str))


if __name__ == "__main__":
    main()

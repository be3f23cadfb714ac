"""Summarize zerofit run directories as a Markdown table (steady state: windows after the first)."""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path


def summarize(run_dir: Path) -> dict:
    recs = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    recs = [r for r in recs if "tokens_per_s" in r]
    steady = recs[1:] or recs  # the first window holds compilation / allocator warm-up
    out = {
        "run": run_dir.name,
        "steps": recs[-1]["step"],
        "tokens_per_s": statistics.median(r["tokens_per_s"] for r in steady),
        "mfu": statistics.median(r.get("mfu", 0.0) for r in steady),
        "step_time_s": statistics.median(r["step_time_s"] for r in steady),
        "final_loss": recs[-1]["loss"],
    }
    if "mem_alloc_gib" in recs[-1]:
        out["mem_alloc_gib"] = max(r["mem_alloc_gib"] for r in recs)
        out["mem_reserved_gib"] = max(r["mem_reserved_gib"] for r in recs)
    return out


def main(paths: list[str]) -> None:
    rows = [summarize(Path(p)) for p in paths if (Path(p) / "metrics.jsonl").is_file()]
    print(
        "| run | tokens/s | MFU | step (s) | peak alloc GiB | peak reserved GiB | loss @ last step |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['run']} | {r['tokens_per_s']:,.0f} | {100 * r['mfu']:.1f}% | {r['step_time_s']:.3f} | "
            f"{r.get('mem_alloc_gib', 0):.1f} | {r.get('mem_reserved_gib', 0):.1f} | {r['final_loss']:.3f} |"
        )
    print()
    print("```json")
    print(json.dumps(rows, indent=1))
    print("```")


if __name__ == "__main__":
    main(sys.argv[1:])

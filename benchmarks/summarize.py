"""Summarize zerofit run directories as a Markdown table and a results.json (steady state: the
logged windows after the first).

Usage: python benchmarks/summarize.py RUN_DIR... [--json OUT_JSON]

Each run's figures are medians over its steady windows, so a ratio of two runs of one call is a
ratio of medians. The JSON has `zerofit bench`'s layout (`meta`, then `results`, one record per run
with `name`, `tokens_per_s`, `mfu`, `step_time_s`, `mem_alloc_gib`, `mem_reserved_gib`,
`final_loss`), plus each run's window values, so docs/benchmarks/data/ can hold it as it is. It goes
to OUT_JSON, or by default to results.json in the run directories' common parent.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
from pathlib import Path


def summarize(run_dir: Path) -> dict:
    recs = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    recs = [r for r in recs if "tokens_per_s" in r]
    steady = recs[1:] or recs  # the first window holds compilation / allocator warm-up
    out = {
        "name": run_dir.name,
        "status": "ok",
        "steps": recs[-1]["step"],
        "tokens_per_s": statistics.median(r["tokens_per_s"] for r in steady),
        "mfu": statistics.median(r.get("mfu") or 0.0 for r in steady),
        "step_time_s": statistics.median(r["step_time_s"] for r in steady),
        "final_loss": recs[-1]["loss"],
        "windows": {
            "steps": [r["step"] for r in steady],
            "tokens_per_s": [r["tokens_per_s"] for r in steady],
        },
    }
    if "mem_alloc_gib" in recs[-1]:
        out["mem_alloc_gib"] = max(r["mem_alloc_gib"] for r in recs)
        out["mem_reserved_gib"] = max(r["mem_reserved_gib"] for r in recs)
    return out


def results(run_dirs: list[Path]) -> dict:
    rows = [summarize(p) for p in run_dirs if (p / "metrics.jsonl").is_file()]
    failed = [
        {"name": p.name, "status": "failed"}
        for p in run_dirs
        if p.is_dir() and not (p / "metrics.jsonl").is_file()
    ]
    env = next(
        (json.loads((p / "env.json").read_text()) for p in run_dirs if (p / "env.json").is_file()),
        {},
    )
    meta = {
        "what": "zerofit train runs: medians over the logged windows after the first",
        "runs": [str(p) for p in run_dirs],
        "env": env,
    }
    return {"meta": meta, "results": rows + failed}


def markdown(rows: list[dict]) -> str:
    lines = [
        "| run | tokens/s | MFU | step (s) | peak alloc GiB | peak reserved GiB | loss @ last step |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        if r["status"] != "ok":
            lines.append(f"| {r['name']} | {r['status']} | | | | | |")
            continue
        lines.append(
            f"| {r['name']} | {r['tokens_per_s']:,.0f} | {100 * r['mfu']:.1f}% | {r['step_time_s']:.3f} | "
            f"{r.get('mem_alloc_gib', 0):.1f} | {r.get('mem_reserved_gib', 0):.1f} | {r['final_loss']:.3f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    runs = [p.resolve() for p in args.runs]
    data = results(runs)
    parent = runs[0].parent if len(runs) == 1 else Path(os.path.commonpath(runs))
    out = args.json or parent / "results.json"
    out.write_text(json.dumps(data, indent=1) + "\n")
    print(markdown(data["results"]))
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()

"""Gather a benchmark folder's results into one JSON (a device call returns only a few files):
every group's results.json, every run's metrics.jsonl and per-step losses (summary.json), the plan
outputs, held-out measurements and profile summaries.

    python benchmarks/bundle_results.py ROOT [OUT_JSON]   (default ROOT/all-results.json)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def bundle(root: Path) -> dict:
    out: dict = {"results": {}, "metrics": {}, "step_losses": {}, "files": {}}
    for p in sorted(root.glob("*/results.json")):
        out["results"][p.parent.name] = json.loads(p.read_text())
    for p in sorted(root.rglob("metrics.jsonl")):
        lines = p.read_text().splitlines()
        out["metrics"][str(p.relative_to(root))] = [json.loads(x) for x in lines if x.strip()]
    for p in sorted(root.rglob("summary.json")):
        if p.parent.name == "profile":
            out["files"][str(p.relative_to(root))] = json.loads(p.read_text())
        else:
            out["step_losses"][str(p.relative_to(root))] = json.loads(p.read_text()).get(
                "step_losses"
            )
    for pattern in ("plans/*", "heldout/*.json"):
        for p in sorted(root.glob(pattern)):
            text = p.read_text(errors="replace")
            try:
                out["files"][str(p.relative_to(root))] = json.loads(text)
            except ValueError:
                out["files"][str(p.relative_to(root))] = text
    return out


if __name__ == "__main__":
    root = Path(sys.argv[1])
    target = Path(sys.argv[2]) if len(sys.argv) > 2 else root / "all-results.json"
    target.write_text(json.dumps(bundle(root), indent=1))

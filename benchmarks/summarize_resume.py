"""Table of a resume experiment (benchmarks/checkpoint_h200.sh resume): for each A-to-B run,
the losses after step 5 against the uninterrupted run of A (`full-A`), as relative differences."""

from __future__ import annotations

import json
import sys
from pathlib import Path


def losses(run: Path) -> dict[int, float]:
    out = {}
    for line in (run / "metrics.jsonl").read_text().splitlines():
        r = json.loads(line)
        if "loss" in r:
            out[r["step"]] = r["loss"]
    return out


def main(root: Path) -> None:
    rows, data = [], {}
    for run in sorted(p for p in root.glob("*-to-*") if p.is_dir()):
        src, dst = run.name.split("-to-")
        if not (run / "metrics.jsonl").is_file():
            rows.append(f"| {src} | {dst} | failed | | |")
            continue
        ref, got = losses(root / f"full-{src}"), losses(run)
        rel = {s: abs(got[s] - ref[s]) / abs(ref[s]) for s in got if s in ref}
        data[run.name] = {"reference": ref, "resumed": got, "rel": rel}
        first = min(rel)
        rows.append(
            f"| {src} | {dst} | {sorted(rel)} | {rel[first]:.2e} | {max(rel.values()):.2e} |"
        )
    print("| checkpoint of | resumed on | steps | rel. diff, first step | max rel. diff |")
    print("|---|---|---|---:|---:|")
    print("\n".join(rows))
    (root / "resume.json").write_text(json.dumps(data, indent=1))


if __name__ == "__main__":
    main(Path(sys.argv[1]))

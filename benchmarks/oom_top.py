"""Read a CUDA memory snapshot (`oom_snapshot_rank0.pickle`, written by a run that ran out of
memory) and print the failed allocation and the largest live blocks, each with the zerofit /
transformers frames that allocated it:  python benchmarks/oom_top.py SNAPSHOT [N]"""

from __future__ import annotations

import pickle
import sys


def frames(entry: dict) -> str:
    keep = [
        f
        for f in entry.get("frames", [])
        if "zerofit" in f["filename"] or "transformers" in f["filename"] or "peft" in f["filename"]
    ]
    return " < ".join(f"{f['filename'].split('/')[-1]}:{f['line']} {f['name']}" for f in keep[:6])


def main() -> None:
    with open(sys.argv[1], "rb") as f:
        snap = pickle.load(f)  # a snapshot this run wrote: trusted input
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 12
    gib = 2**30
    for trace in snap.get("device_traces", []):
        for ev in trace[-400:]:
            if ev["action"] == "oom":
                print(f"OOM asking {ev['size'] / gib:.2f} GiB at: {frames(ev)}")
    blocks = [
        b for seg in snap["segments"] for b in seg["blocks"] if b["state"] == "active_allocated"
    ]
    total = sum(b["size"] for b in blocks)
    print(f"live: {total / gib:.2f} GiB in {len(blocks)} blocks")
    by_site: dict[str, list[int]] = {}
    for b in blocks:
        by_site.setdefault(frames(b) or "?", []).append(b["size"])
    for site, sizes in sorted(by_site.items(), key=lambda kv: -sum(kv[1]))[:n]:
        print(f"{sum(sizes) / gib:8.2f} GiB x{len(sizes):5d}  {site[:400]}")


if __name__ == "__main__":
    main()

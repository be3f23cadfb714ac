"""What a profiled run's GPU did, by kind of kernel: read a torch profiler trace (the
`rank0.pt.trace.json` that `zerofit bench --profile N` writes) and write one JSON.

    python benchmarks/trace_kernels.py TRACE OUT_JSON [--top 40]

For the profiled steps (the `zerofit/step` ranges): the number of kernels, their device time by
kind (matmuls, attention, Triton-generated, copies, other), the device's idle time, how the idle
time splits into gaps by length, and the top kernels by device time. A kernel's kind comes from
its name (`KINDS`, first match wins).
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

from zerofit.report.profiling import KERNEL, STEP, events_from_trace, length, top_table, union

KINDS = (  # (kind, pattern on the kernel's name)
    ("attention", r"flash|fmha|attn"),
    ("matmul", r"gemm|nvjet|xmma|cutlass|sm\d+_|ampere_|cublas"),
    ("triton", r"^triton_"),
    ("copy", r"memcpy|memset|copy|Memcpy|Memset"),
    ("other", r""),
)
GAPS_US = (5, 20, 100, 1000)  # idle gaps split at these lengths


def kind_of(name: str) -> str:
    return next(k for k, pattern in KINDS if re.search(pattern, name))


def summarize(trace: dict, top: int) -> dict:
    events = events_from_trace(trace)
    steps = union((e.start_us, e.start_us + e.dur_us) for e in events if e.kind == STEP)
    kernels = [
        e for e in events if e.kind == KERNEL and any(s <= e.start_us <= t for s, t in steps)
    ]
    by_kind: dict[str, float] = {}
    for e in kernels:
        kind = kind_of(e.name)
        by_kind[kind] = by_kind.get(kind, 0.0) + e.dur_us
    busy = union((e.start_us, e.start_us + e.dur_us) for e in kernels)
    gaps = [b[0] - a[1] for a, b in zip(busy, busy[1:], strict=False) if b[0] > a[1]]
    edges = (0, *GAPS_US, float("inf"))
    split = {
        f"{lo}-{hi}us": round(sum(g for g in gaps if lo <= g < hi) / 1e3, 3)
        for lo, hi in zip(edges, edges[1:], strict=False)
    }
    return {
        "steps": len(steps),
        "wall_ms": round(length(steps) / 1e3, 3),
        "kernels": len(kernels),
        "busy_ms": round(length(busy) / 1e3, 3),
        "device_ms_by_kind": {k: round(v / 1e3, 3) for k, v in sorted(by_kind.items())},
        "idle_gaps_ms_by_length": split,
        "top": [
            {**row, "kind": kind_of(row["name"])}
            for row in top_table([(e.name, e.dur_us) for e in kernels], top)
        ],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--top", type=int, default=40)
    args = ap.parse_args()
    summary = summarize(json.loads(args.trace.read_text()), args.top)
    args.out.write_text(json.dumps(summary, indent=1) + "\n")
    print(json.dumps({k: v for k, v in summary.items() if k != "top"}))


if __name__ == "__main__":
    main()

"""test_doc_figures' checks for docs/benchmarks/2026-12-07-qlora-rebuild-h100.md (issue 26, QLoRA
speed: two profiled 8B QLoRA calls on an H100 and where the 4-bit rebuild's time goes): each cell
from the call's bundled results and its kernel tables (benchmarks/trace_kernels.py)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

DOC = "docs/benchmarks/2026-12-07-qlora-rebuild-h100.md"
DIR = "2026-12-07-qlora-rebuild-h100/"
DATA = Path(__file__).resolve().parents[1] / "docs" / "benchmarks" / "data"
RUNS = {  # row: (call, bench group, the call's kernel table)
    "1 | 1 x 16, no AC": ("call1", "8b-qlora-host-1x16"),
    "2 | 1 x 16, no AC": ("call2", "8b-qlora-host-1x16"),
    "2 | 2 x 8, planner's choice": ("call2", "8b-qlora-host-2x8"),
}
# The rebuild's kernels in call 1's 1 x 16 trace: the torch ops' rebuild (its name holds the
# nibble shifts) and the view + cast kernel after it, for the 4096 x 14336 and 4096 x 4096 weights
REBUILD = {
    "rebuild, MLP weights": ("triton_poi_fused___rshift____to_copy_add_arange_bitwise_and_div_index_lift_fresh_mul_stack_unsqueeze_view_", ("14", "0")),
    "view + cast, MLP weights": ("triton_poi_fused__to_copy_view_", ("1", "15")),
    "rebuild, q and o": ("triton_poi_fused___rshift____to_copy_add_arange_bitwise_and_div_index_lift_fresh_mul_stack_unsqueeze_view_", ("8", "1")),
    "view + cast, q and o": ("triton_poi_fused__to_copy_view_", ("9", "2")),
}  # fmt: skip


def _load(rel: str) -> Any:
    return json.loads((DATA / DIR / rel).read_text())


def runs() -> dict[str, list]:
    """Per run: real tokens/s, median step s, peak allocated GiB; from its profiled step: the
    device's idle share %, and its matmul, Triton and attention ms."""
    rows = {}
    for row, (call, group) in RUNS.items():
        r = _load(f"{call}/all-results.json")["results"][group]["results"][0]
        k = _load(f"{call}/{group}-kernels.json")
        by = k["device_ms_by_kind"]
        rows[row] = [r["real_tokens_per_s"], r["step_time_s"], r["mem_alloc_gib"],
                     100 * r["profile"]["breakdown"]["idle"], by["matmul"], by["triton"],
                     by["attention"]]  # fmt: skip
    return rows


def rebuild() -> dict[str, list]:
    """Per kernel pair of call 1's trace: calls, total ms, us a call, share of the device's busy
    time %."""
    k = _load("call1/8b-qlora-host-1x16-kernels.json")
    top = {t["name"]: t for t in k["top"]}
    rows = {}
    for row, (stem, ends) in REBUILD.items():
        picked = [top[stem + e] for e in ends]
        calls, ms = sum(t["calls"] for t in picked), sum(t["total_ms"] for t in picked)
        rows[row] = [calls, ms, 1000 * ms / calls, 100 * ms / k["busy_ms"]]
    return rows


HELD_OUT = {"1 x 16, no AC": ("1x16", "8b-qlora-host-1x16"),
            "2 x 8, planner's choice": ("2x8", "8b-qlora-host-2x8")}  # fmt: skip


def planner() -> dict[str, list]:
    """Per call-2 run (held out: the fit read call 1's trace only): measured median step s, the
    planner's step s with the old rebuild efficiency and the error %, the same with the fitted
    one, and peak allocated GiB forecast against measured (error %)."""
    rows = {}
    for row, (plan, group) in HELD_OUT.items():
        r = _load("call2/all-results.json")["results"][group]["results"][0]
        old, new = (_load(f"plans/{plan}-{w}.json")["as_configured"] for w in ("before", "after"))
        got = r["step_time_s"]
        rows[row] = [got, old["step_time_s"], 100 * (old["step_time_s"] / got - 1),
                     new["step_time_s"], 100 * (new["step_time_s"] / got - 1),
                     100 * (new["peak_allocated_gib"] / r["mem_alloc_gib"] - 1)]  # fmt: skip
    return rows


QLORA_REBUILD: dict[str, tuple[list[str], Callable[[], Any], int]] = {
    "qlora-rebuild-runs": (
        [DIR + f"{c}/all-results.json" for c in ("call1", "call2")]
        + [DIR + f"{c}/{g}-kernels.json" for c, g in RUNS.values()],
        runs,
        2,
    ),
    "qlora-rebuild-kernels": ([DIR + "call1/8b-qlora-host-1x16-kernels.json"], rebuild, 1),
    "qlora-rebuild-planner": (
        [DIR + "call2/all-results.json"]
        + [DIR + f"plans/{p}-{w}.json" for p, _ in HELD_OUT.values() for w in ("before", "after")],
        planner,
        1,
    ),
}

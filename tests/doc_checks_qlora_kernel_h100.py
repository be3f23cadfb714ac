"""test_doc_figures' checks for docs/benchmarks/2026-12-07-qlora-kernel-h100.md (issue 26, QLoRA
speed: the Triton NF4 rebuild's program sizes, and the 8B runs with it beside stock, on an H100)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from doc_checks_qlora_kernel import format_rows

DOC = "docs/benchmarks/2026-12-07-qlora-kernel-h100.md"
DIR = "2026-12-07-qlora-kernel-h100/"
DATA = Path(__file__).resolve().parents[1] / "docs" / "benchmarks" / "data"
RUNS = {  # row: the run's name in all-results.json
    "zerofit, 2 x 8, Triton rebuild": "8b-qlora-host-2x8-kernel",
    "zerofit, 2 x 8, compiled torch ops": "8b-qlora-host-2x8-torchops",
}
STOCK = "8b-qlora-stock-liger-compile"
KERNEL64 = "zerofit, 2 x 8, Triton rebuild at 64 x 2"


def _load(rel: str) -> Any:
    return json.loads((DATA / DIR / rel).read_text())


def formats() -> dict[str, list]:
    """Call 9's formats table, as the H200 page's (`doc_checks_qlora_kernel.format_rows`)."""
    return format_rows(_load("call9/formats.json")["formats"])


def sweep() -> dict[str, list]:
    """The five fastest program sizes (scale blocks | warps): the kernel's rebuild ms."""
    fastest = _load("call9/formats.json")["kernel_sweep"][:5]
    return {f"{r['rows']} | {r['warps']}": [r["rebuild_ms"]] for r in fastest}


def _against_stock(call: str, runs: dict[str, str]) -> dict[str, list]:
    """A call's stock row and each of `runs` (row: name in all-results.json): real tokens/s, step
    s, peak allocated GiB and the ratio to stock's real tokens/s (one call's medians)."""
    res = _load(f"{call}/all-results.json")["results"]
    stock = res[STOCK]
    base = stock["real_tokens_per_s"]
    out = {
        "stock, compiled + Liger, 4 x 4, full AC": [
            base,
            stock["step_s_median"],
            stock["peak_allocated_gib"],
            1.0,
        ]
    }
    for row, name in runs.items():
        r = res[name]["results"][0]
        tps = r["real_tokens_per_s"]
        out[row] = [tps, r["step_time_s"], r["mem_alloc_gib"], tps / base]
    return out


def runs() -> dict[str, list]:
    """Call 9: stock, zerofit with the kernel at 32 x 4, and with its compiled torch ops."""
    return _against_stock("call9", RUNS)


def runs64() -> dict[str, list]:
    """Call 10: stock and zerofit with the kernel at 64 x 2."""
    return _against_stock("call10", {KERNEL64: "8b-qlora-host-2x8-kernel64"})


def profile() -> dict[str, list]:
    """Call 10's profiled step: device ms by kind of kernel, the rebuild's ms and calls, busy."""
    d = _load("call10/8b-qlora-host-2x8-kernel64-kernels.json")
    kinds = d["device_ms_by_kind"]
    rebuild = next(k for k in d["top"] if k["name"] == "_rebuild")
    return {
        "matmul": [kinds["matmul"], "-"],
        "triton (Inductor's)": [kinds["triton"], "-"],
        "attention": [kinds["attention"], "-"],
        "other": [kinds["other"], "-"],
        "of which the NF4 rebuild (`_rebuild`)": [rebuild["total_ms"], rebuild["calls"]],
        "copy": [kinds["copy"], "-"],
        "busy in all": [d["busy_ms"], d["kernels"]],
    }


PLANS = [DIR + f"plans-recompute/first-{k}.json" for k in (4, 8, 12)]


def recompute_plan() -> dict[str, list]:
    """The as-configured forecast at each k: allocated and reserved GiB, step s, fits (yes/no)."""
    rows = {}
    for rel in PLANS:
        a = json.loads((DATA / rel).read_text())["as_configured"]
        k = str(a["config"]["parallel.ac_blocks"])
        fits = "yes" if a["fits"] else "no"
        rows[k] = [a["peak_allocated_gib"], a["peak_reserved_gib"], a["step_time_s"], fits]
    return rows


def dropout() -> dict[str, list]:
    """Call 10's 40 largest kernels: the Triton ones whose names draw a dropout mask
    (bernoulli), unpack one (rshift without bernoulli), and all Triton ones, in device ms."""
    top = _load("call10/8b-qlora-host-2x8-kernel64-kernels.json")["top"]
    triton = [k for k in top if k["name"].startswith("triton")]
    draw = sum(k["total_ms"] for k in triton if "bernoulli" in k["name"])
    unpack = sum(
        k["total_ms"] for k in triton if "rshift" in k["name"] and "bernoulli" not in k["name"]
    )
    return {
        "drawing a mask (`bernoulli` in the name)": [draw],
        "unpacking one (`rshift`, no `bernoulli`)": [unpack],
        "all Triton kernels listed": [sum(k["total_ms"] for k in triton)],
    }


CALL10_KERNELS = DIR + "call10/8b-qlora-host-2x8-kernel64-kernels.json"
QLORA_KERNEL_H100: dict[str, tuple[list[str], Callable[[], Any], int]] = {
    "qlora-h100-formats": ([DIR + "call9/formats.json"], formats, 1),
    "qlora-h100-sweep": ([DIR + "call9/formats.json"], sweep, 2),
    "qlora-h100-runs": ([DIR + "call9/all-results.json"], runs, 1),
    "qlora-h100-runs64": ([DIR + "call10/all-results.json"], runs64, 1),
    "qlora-h100-profile": ([CALL10_KERNELS], profile, 1),
    "qlora-h100-dropout": ([CALL10_KERNELS], dropout, 1),
    "qlora-h100-recompute-plan": (PLANS, recompute_plan, 1),
}

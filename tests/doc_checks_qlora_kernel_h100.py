"""test_doc_figures' checks for docs/benchmarks/2026-12-07-qlora-kernel-h100.md (issue 26, QLoRA
speed: the Triton NF4 rebuild's program sizes, and the 8B runs with it beside stock, on an H100)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

DOC = "docs/benchmarks/2026-12-07-qlora-kernel-h100.md"
DIR = "2026-12-07-qlora-kernel-h100/"
DATA = Path(__file__).resolve().parents[1] / "docs" / "benchmarks" / "data"
FORMATS = {  # row: the format's name in nf4_formats.py's results
    "zerofit, torch ops, eager": "zerofit pieces",
    "zerofit, torch ops, compiled": "zerofit pieces, compiled",
    "zerofit, Triton kernel (32 blocks x 4 warps a program)": "zerofit pieces, Triton kernel",
    "torchao NF4Tensor": "torchao NF4Tensor",
    "bitsandbytes, nested": "bitsandbytes Params4bit (nested)",
}
RUNS = {  # row: the run's name in all-results.json
    "zerofit, 2 x 8, Triton rebuild": "8b-qlora-host-2x8-kernel",
    "zerofit, 2 x 8, compiled torch ops": "8b-qlora-host-2x8-torchops",
}
STOCK = "8b-qlora-stock-liger-compile"


def _load(rel: str) -> Any:
    return json.loads((DATA / DIR / rel).read_text())


def formats() -> dict[str, list]:
    """Per format: rebuild ms for one 8B block's weights, the same bits as the torch ops."""
    got = _load("call9/formats.json")["formats"]
    return {
        row: [got[name]["rebuild_ms"], "yes" if got[name]["same_bits_as_torch_ops"] else "no"]
        for row, name in FORMATS.items()
    }


def sweep() -> dict[str, list]:
    """The five fastest program sizes (scale blocks | warps): the kernel's rebuild ms."""
    fastest = _load("call9/formats.json")["kernel_sweep"][:5]
    return {f"{r['rows']} | {r['warps']}": [r["rebuild_ms"]] for r in fastest}


def runs() -> dict[str, list]:
    """Real tokens/s, step s, peak allocated GiB and the ratio to stock's real tokens/s (one
    call's medians)."""
    res = _load("call9/all-results.json")["results"]
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
    for row, name in RUNS.items():
        r = res[name]["results"][0]
        tps = r["real_tokens_per_s"]
        out[row] = [tps, r["step_time_s"], r["mem_alloc_gib"], tps / base]
    return out


QLORA_KERNEL_H100: dict[str, tuple[list[str], Callable[[], Any], int]] = {
    "qlora-h100-formats": ([DIR + "call9/formats.json"], formats, 1),
    "qlora-h100-sweep": ([DIR + "call9/formats.json"], sweep, 2),
    "qlora-h100-runs": ([DIR + "call9/all-results.json"], runs, 1),
}


def runs64() -> dict[str, list]:
    """Call 10: stock and zerofit at the 64 x 2 kernel, as `runs`."""
    res = _load("call10/all-results.json")["results"]
    stock = res[STOCK]
    base = stock["real_tokens_per_s"]
    r = res["8b-qlora-host-2x8-kernel64"]["results"][0]
    tps = r["real_tokens_per_s"]
    return {
        "stock, compiled + Liger, 4 x 4, full AC": [
            base,
            stock["step_s_median"],
            stock["peak_allocated_gib"],
            1.0,
        ],
        "zerofit, 2 x 8, Triton rebuild at 64 x 2": [
            tps,
            r["step_time_s"],
            r["mem_alloc_gib"],
            tps / base,
        ],
    }


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


QLORA_KERNEL_H100.update(
    {
        "qlora-h100-runs64": ([DIR + "call10/all-results.json"], runs64, 1),
        "qlora-h100-profile": (
            [DIR + "call10/8b-qlora-host-2x8-kernel64-kernels.json"],
            profile,
            1,
        ),
    }
)


def readme_qlora() -> list[str]:
    """The README's QLoRA sentence: call 10's planned split against stock, and its memory."""
    res = _load("call10/all-results.json")["results"]
    stock = res[STOCK]
    ours = res["8b-qlora-host-2x8-kernel64"]["results"][0]
    ratio = ours["real_tokens_per_s"] / stock["real_tokens_per_s"]
    return [
        f"runs {ours['real_tokens_per_s']:,.0f} real tokens/s at {ours['mem_alloc_gib']:.2f} GiB",
        f"{ratio:.3f}x transformers + PEFT + bitsandbytes + Liger Kernel compiled in the same call "
        f"({stock['real_tokens_per_s']:,.0f} at {stock['peak_allocated_gib']:.2f} GiB)",
    ]


README_QLORA = ([DIR + "call10/all-results.json"], readme_qlora)
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


QLORA_KERNEL_H100["qlora-h100-recompute-plan"] = (PLANS, recompute_plan, 1)


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


QLORA_KERNEL_H100["qlora-h100-dropout"] = (
    [DIR + "call10/8b-qlora-host-2x8-kernel64-kernels.json"],
    dropout,
    1,
)

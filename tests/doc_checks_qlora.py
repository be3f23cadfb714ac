"""test_doc_figures' checks for docs/benchmarks/2026-12-05-qlora-h200.md (issue 26, QLoRA: the
first H200 calls): each table cell from the raw data of the call it names."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from doc_checks_speed2 import _load

DOC = "docs/benchmarks/2026-12-05-qlora-h200.md"
Q = "2026-12-05-qlora-h200/"
FORMATS, CALL1 = Q + "call1/nf4-formats-8b.json", Q + "call1/all-results.json"
ZF_1B, CALL2_8B = Q + "call2/1b-zerofit-results.json", Q + "call2/8b-all-results.json"
PLAN_8B, PLAN_70B = Q + "plans/plan-8b-23gib-h200.json", Q + "plans/plan-70b-1xh200.json"
PLAN_2X4090, PLAN_1B = Q + "plans/plan-70b-2x4090.json", Q + "plans/plan-1b-4x2-h200.json"
QUALITY, CALL4_8B = Q + "call3-h100/quality.json", Q + "call4-h100/8b-all-results.json"
AC_211, AC_213 = Q + "cpu-ac/torch-2.11.json", Q + "cpu-ac/torch-2.13.json"
C6 = Q + "call6-h200/"
C6_8B, C6_70B, C6_SPLITS = (
    C6 + "8b-all-results.json",
    C6 + "70b-all-results.json",
    C6 + "8b-splits-results.json",
)
PLAN_70B_4X1 = Q + "plans-v2/plan-70b-1xh200-4x1.json"
PLAN_8B_V2 = Q + "plans-v2/plan-8b-23gib-h200.json"


def formats() -> dict[str, list]:
    rows = _load(FORMATS)["formats"]
    return {
        name: [r["bytes_per_weight"], 100 * r["mean_abs_error_rel"], r["rebuild_ms"]]
        for name, r in rows.items()
    }


def _stock(r: dict, call: str) -> list:
    return [r["real_tokens_per_s"], r["peak_allocated_gib"], r["built_gib"], call]


def stock_8b() -> dict[str, list]:
    c2 = _load(CALL2_8B)
    return {
        "stock + Liger, eager": _stock(c2["8b-qlora-stock-liger"], "2"),
        "stock + Liger, compiled": _stock(c2["8b-qlora-stock-liger-compile"], "2"),
    }


def one_b() -> dict[str, list]:
    stock = _load(CALL1)["1b-qlora-stock-liger"]
    zf = _load(ZF_1B)["results"][0]
    return {
        "stock + Liger, eager": [stock["real_tokens_per_s"], stock["peak_allocated_gib"], "1"],
        "zerofit, compiled": [zf["real_tokens_per_s"], zf["mem_alloc_gib"], "2"],
    }


def recommended(rel: str, strategy: str | None = None) -> dict:
    """The plan's option for `strategy`, by default the one it recommends."""
    plan = _load(rel)
    name = strategy or plan["recommendation"]
    return next(o for o in plan["options"] if o["strategy"] == name)


def heldout_row(option: dict, run: dict) -> list:
    """A forecast beside its measured run: strategy, memory forecast, measured and % over, then
    tokens/s the same."""
    mem, tps = option["peak_allocated_gib"], option["tokens_per_s"]
    return [
        option["strategy"],
        mem,
        run["mem_alloc_gib"],
        100 * (mem / run["mem_alloc_gib"] - 1),
        tps,
        run["tokens_per_s"],
        100 * (tps / run["tokens_per_s"] - 1),
    ]


def forecasts() -> dict[str, list]:
    out = {}
    for label, rel in (
        ("8B, one H200 capped at 23 GiB", PLAN_8B),
        ("70B, one H200", PLAN_70B),
        ("70B, 2x RTX 4090", PLAN_2X4090),
    ):
        o = recommended(rel)
        split = f"{o['micro_batch_size']} x {o['grad_accum_steps']}"
        out[label] = [
            o["strategy"],
            split,
            o["peak_allocated_gib"],
            o["host_gib_per_gpu"],
            o["tokens_per_s"],
        ]
    return out


def heldout_1b() -> list[str]:
    plan = next(o for o in _load(PLAN_1B)["options"] if o["strategy"] == "FSDP full-shard")
    zf = _load(ZF_1B)["results"][0]
    mem, tps = plan["peak_allocated_gib"], plan["tokens_per_s"]
    return [
        f"forecasts {mem:.1f} GiB peak allocated against {zf['mem_alloc_gib']:.1f} GiB measured "
        f"({100 * (mem / zf['mem_alloc_gib'] - 1):.0f}% over)",
        f"{tps:,.0f} tokens/s against {zf['tokens_per_s']:,.0f} "
        f"({100 * (tps / zf['tokens_per_s'] - 1):.0f}% over)",
    ]


def quality() -> dict[str, list]:
    q = _load(QUALITY)
    lora, qlora = q["lora_eval_loss"], q["qlora_eval_loss"]
    return {step: [lora[step], qlora[step], 100 * (qlora[step] / lora[step] - 1)] for step in lora}


def h100_8b() -> dict[str, list]:
    calls = _load(CALL4_8B)
    stock = calls["8b-qlora-stock-liger-compile"]
    zf = {r["name"]: r for r in calls["8b-qlora-zerofit"]["results"]}
    rows = {
        "stock + Liger, compiled": ["ok", stock["real_tokens_per_s"], stock["peak_allocated_gib"]]
    }
    for label, name in (
        ("zerofit, recipe defaults", "recipe defaults"),
        ("zerofit, fsdp + full AC as stock", "fsdp, full AC as stock"),
    ):
        rows[label] = [zf[name]["status"], "-", "-"]
    return rows


def cpu_ac() -> dict[str, list]:
    old, new = _load(AC_211)["saved_mib"], _load(AC_213)["saved_mib"]
    return {way: [old[way], new[way]] for way in old}


def h200_8b_fixed() -> dict[str, list]:
    calls = _load(C6_8B)
    stock = calls["8b-qlora-stock-liger-compile"]
    base = stock["real_tokens_per_s"]
    zf = {r["name"]: r for r in calls["8b-qlora-zerofit"]["results"]}
    rows = {"stock + Liger, compiled, full AC": [base, stock["peak_allocated_gib"], 1.0]}
    for label, name in (
        ("zerofit, recipe defaults (FSDP + AC first 30)", "recipe defaults"),
        ("zerofit, FSDP + full AC as stock", "fsdp, full AC as stock"),
    ):
        r = zf[name]
        rows[label] = [r["real_tokens_per_s"], r["mem_alloc_gib"], r["real_tokens_per_s"] / base]
    return rows


def h200_8b_splits() -> dict[str, list]:
    rows = {}
    for r in _load(C6_SPLITS)["results"]:
        ok = r["status"] == "ok"
        rows[r["name"]] = [r["status"]] + (
            [r["real_tokens_per_s"], r["mem_alloc_gib"]] if ok else ["-", "-"]
        )
    return rows


def heldout_v2() -> dict[str, list]:
    r70 = _load(C6_70B)["70b-qlora-zerofit"]["results"][0]
    r8 = {r["name"]: r for r in _load(C6_8B)["8b-qlora-zerofit"]["results"]}["recipe defaults"]
    return {
        "70B, 4 x 1, one H200": heldout_row(recommended(PLAN_70B_4X1), r70),
        "8B, 4 x 4, one H200 capped at 23 GiB": heldout_row(recommended(PLAN_8B_V2), r8),
    }


def h200_70b() -> dict[str, list]:
    r = _load(C6_70B)["70b-qlora-zerofit"]["results"][0]
    return {
        "zerofit, recipe defaults at 4 x 1": [
            r["real_tokens_per_s"],
            r["mfu"] * 100,
            r["mem_alloc_gib"],
            r["host_rss_gib"],
        ]
    }


QLORA: dict[str, tuple[list[str], Callable[[], Any], int]] = {
    "qlora-formats": ([FORMATS], formats, 1),
    "qlora-8b-stock": ([CALL2_8B], stock_8b, 1),
    "qlora-1b": ([CALL1, ZF_1B], one_b, 1),
    "qlora-forecasts": ([PLAN_8B, PLAN_70B, PLAN_2X4090], forecasts, 1),
    "qlora-1b-heldout": ([PLAN_1B, ZF_1B], heldout_1b, 1),
    "qlora-quality": ([QUALITY], quality, 1),
    "qlora-8b-h100": ([CALL4_8B], h100_8b, 1),
    "qlora-ac-cpu": ([AC_211, AC_213], cpu_ac, 1),
    "qlora-8b-fixed": ([C6_8B], h200_8b_fixed, 1),
    "qlora-8b-splits": ([C6_SPLITS], h200_8b_splits, 1),
    "qlora-70b": ([C6_70B], h200_70b, 1),
    "qlora-heldout-v2": ([PLAN_70B_4X1, PLAN_8B_V2, C6_70B, C6_8B], heldout_v2, 1),
}

"""test_doc_figures' checks for docs/benchmarks/2026-12-08-qlora-recompute.md (issue 26, QLoRA
speed: 8B on a rehearsed 24 GB card recomputing fewer blocks, the strongest stock split, and the
grouped key/value heads passed as they are), on an H100."""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

DOC = "docs/benchmarks/2026-12-08-qlora-recompute.md"
DIR = "2026-12-08-qlora-recompute/"
ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "docs" / "benchmarks" / "data"
STOCK = "8b-qlora-stock-liger-compile"
ZEROFIT = "8b-qlora-recompute"
STOCK_ROW = "stock, compiled + Liger, 4 x 4, full AC"
# the planner's forecasts written before the runs: k = 4, 8, 12 on 2026-12-07, 0 and 2 today
PLANS = {
    0: DIR + "plans/first-0.json",
    2: DIR + "plans/first-2.json",
    **{k: f"2026-12-07-qlora-kernel-h100/plans-recompute/first-{k}.json" for k in (4, 8, 12)},
}


def _load(rel: str) -> Any:
    return json.loads((DATA / rel).read_text())


def _results(call: int) -> dict[str, Any]:
    return _load(f"{DIR}call{call}/all-results.json")["results"]


def _row(name: str) -> str:
    """A bench variant's name ("2 x 8, first 4", "2 x 8, no AC") as the page's rows say it."""
    return "zerofit, " + name


def _against_stock(call: int, stock: str) -> dict[str, list]:
    """One call: stock and each zerofit variant: real tokens/s, step s, peak allocated GiB,
    peak reserved GiB (stock: -), and the ratio to stock's real tokens/s (one call's medians)."""
    res = _results(call)
    s = res[stock]
    base = s["real_tokens_per_s"]
    out = {STOCK_ROW: [base, s["step_s_median"], s["peak_allocated_gib"], "-", 1.0]}
    for r in res[ZEROFIT]["results"]:
        tps = r["real_tokens_per_s"]
        out[_row(r["name"])] = [
            tps,
            r["step_time_s"],
            r["mem_alloc_gib"],
            r["mem_reserved_gib"],
            tps / base,
        ]
    return out


def call11() -> dict[str, list]:
    return _against_stock(11, STOCK)


def call12() -> dict[str, list]:
    return _against_stock(12, STOCK + "-4x4-ac")


def call13() -> dict[str, list]:
    return _against_stock(13, STOCK)


def stock_splits() -> dict[str, list]:
    """Call 12's stock splits: real tokens/s, step s and peak allocated GiB, or the OOM its log
    shows (at the 23 GiB cap)."""
    res = _results(12)
    out = {}
    for row, tag in (
        ("4 x 4, full AC", "4x4-ac"),
        ("1 x 16, no AC", "1x16-noac"),
        ("2 x 8, no AC", "2x8-noac"),
    ):
        r = res.get(f"{STOCK}-{tag}")
        if r is None:
            log = (DATA / f"{DIR}call12/{STOCK}-{tag}-log.txt").read_text()
            assert "CUDA out of memory" in log and "23.00 GiB allowed" in log
            out[row] = ["out of memory", "-", "-"]
        else:
            out[row] = [r["real_tokens_per_s"], r["step_s_median"], r["peak_allocated_gib"]]
    return out


def plans_before() -> dict[str, list]:
    """The as-configured forecasts written before the runs (2 x 8, first k): allocated GiB,
    step s, and whether the planner said it fits."""
    rows = {}
    for k, rel in sorted(PLANS.items()):
        a = _load(rel)["as_configured"]
        rows[str(k)] = [a["peak_allocated_gib"], a["step_time_s"], "yes" if a["fits"] else "no"]
    return rows


@functools.cache  # the corpus is forecast once (seconds), however often a check is read
def _forecasts() -> dict[str, Any]:
    """Today's planner on call 13's zerofit runs (tools/planner_residuals.py)."""
    tools = str(ROOT / "tools")
    if tools not in sys.path:
        sys.path.insert(0, tools)
    import planner_residuals as pr  # here: a tool, not a package (imported when checked)

    with pr.fixture_models():  # the runs' model folders, as their configs name them
        found = pr.bench_runs(DATA / DIR / "call13/all-results.json")
        runs = [r for r in found if isinstance(r, pr.Run)]
        return {x.run.key.split(":", 1)[1]: x for x in map(pr.row, runs)}


def heldout() -> dict[str, list]:
    """Call 13 (held out): measured and forecast peak allocated GiB and step s, errors in %."""
    out = {}
    for r in _results(13)[ZEROFIT]["results"]:
        x = _forecasts()[r["name"]]
        mem = r["mem_alloc_gib"]
        out[_row(r["name"])] = [
            mem,
            mem * (1 + x.memory_error),
            100 * x.memory_error,
            x.run.step_s,
            x.forecast_s,
            100 * x.after,
        ]
    return out


def per_block() -> dict[str, list]:
    """Bytes a block keeps, per token and hidden unit: call 13's peak per block recomputed less
    (0 to 4 blocks, 4,096 tokens of hidden 4,096; a recomputed block keeps its 2-byte input),
    and the CPU listing's."""
    res = {r["name"]: r["mem_alloc_gib"] for r in _results(13)[ZEROFIT]["results"]}
    gpu = (res["2 x 8, no AC"] - res["2 x 8, first 4"]) / 4 * 2**30 / (4096 * 4096) + 2
    cpu = _load("2026-12-07-qlora-kernel-h200/cpu-block/block-saved.json")["ways"]["compiled"]
    return {
        "H100, call 13 (key/value heads as they are)": [gpu],
        "CPU listing, tensor by tensor": [cpu["bytes_per_token_h"]],
    }


def gqa() -> dict[str, list]:
    """Peak allocated GiB with the key/value heads repeated (call 12) and as they are (call 13)."""
    before = {r["name"]: r["mem_alloc_gib"] for r in _results(12)[ZEROFIT]["results"]}
    after = {r["name"]: r for r in _results(13)[ZEROFIT]["results"]}
    return {
        _row(n): [b, after[n]["mem_alloc_gib"], after[n]["mem_alloc_gib"] - b]
        for n, b in before.items()
    }


def readme_qlora() -> list[str]:
    """The README's QLoRA sentence: call 13, no AC and first 4, against stock."""
    rows = call13()
    stock, none, four = rows[STOCK_ROW], rows[_row("2 x 8, no AC")], rows[_row("2 x 8, first 4")]
    return [
        f"runs {none[0]:,.0f} real tokens/s at {none[2]:.2f} GiB without recomputation",
        f"{none[4]:.3f}x transformers + PEFT + bitsandbytes + Liger Kernel compiled in the same "
        f"call ({stock[0]:,.0f} at {stock[2]:.2f} GiB",
        f"recomputing the first 4 blocks, {four[0]:,.0f} at {four[2]:.2f} GiB, {four[4]:.3f}x",
    ]


def recipe() -> dict[str, list]:
    """The recipe's plan on a 23 GiB H100 (plans/recipe.json): its pick, allocated and reserved
    GiB, and step s, as configured (backend auto: the pick)."""
    a = _load(DIR + "plans/recipe.json")["as_configured"]
    row = f"8B, {a['micro_batch_size']} x {a['grad_accum_steps']}, `backend: auto`"
    return {row: [a["strategy"], a["peak_allocated_gib"], a["peak_reserved_gib"], a["step_time_s"]]}


C11, C12, C13 = (DIR + f"call{c}/all-results.json" for c in (11, 12, 13))
README_QLORA = ([C13], readme_qlora)
QLORA_RECOMPUTE: dict[str, tuple[list[str], Callable[[], Any], int]] = {
    "qlora-recompute-call11": ([C11], call11, 1),
    "qlora-recompute-stock": ([C12], stock_splits, 1),
    "qlora-recompute-call12": ([C12], call12, 1),
    "qlora-recompute-call13": ([C13], call13, 1),
    "qlora-recompute-plans": (sorted(set(PLANS.values())), plans_before, 1),
    "qlora-recompute-gqa": ([C12, C13], gqa, 1),
    "qlora-recompute-block": ([C13], per_block, 1),
    "qlora-recompute-heldout": ([C13], heldout, 1),
    "qlora-recompute-recipe": ([DIR + "plans/recipe.json"], recipe, 1),
}

"""test_doc_figures' checks for docs/benchmarks/2026-12-05-qlora-session4.md (issue 26, QLoRA, the
fourth session: what a LoRA block keeps, the H100 calls, the planner held out, host memory while
loading): each table cell from the raw data it names."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from doc_checks_qlora import heldout_row, recommended
from doc_checks_speed2 import _load

DOC = "docs/benchmarks/2026-12-05-qlora-session4.md"
Q = "2026-12-05-qlora-h200/"
BEFORE, NOW = (
    Q + "cpu-ac/block-bytes-before-torch-2.13.json",
    Q + "cpu-ac/block-bytes-torch-2.13.json",
)
S4 = Q + "session4-h100/"
STOCK, CALL2, CALL3 = (
    S4 + "call1-stock-results.json",
    S4 + "call2-results.json",
    S4 + "call3-profile-results.json",
)
PLANS = {split: Q + f"plans-v3/plan-8b-23gib-h100-{split}.json" for split in ("4x4", "2x8", "1x16")}
RSS = Q + "cpu-host-rss/cpu-1b.json"


def block_bytes() -> dict[str, list]:
    old, new = _load(BEFORE)["bytes_per_token_h"], _load(NOW)["bytes_per_token_h"]
    return {way: [old[way], new[way]] for way in old}


def _runs() -> dict[str, dict]:
    runs = {f"{r['name']} (call 2)": r for r in _load(CALL2)["results"]}
    runs.update({f"{r['name']} (call 3)": r for r in _load(CALL3)["results"]})
    return runs


def h100_8b() -> dict[str, list]:
    stock = _load(STOCK)
    rows = {
        "stock + Liger, compiled, full AC (call 1)": [
            "4 x 4",
            stock["real_tokens_per_s"],
            stock["peak_allocated_gib"],
            "-",
        ]
    }
    splits = {"ddp 1 x 16": "1 x 16", "recipe d": "4 x 4", "2 x 8, p": "2 x 8"}
    for label, r in _runs().items():
        profile = r.get("profile")
        idle = 100 * profile["breakdown"]["idle"] if profile else "-"
        split = next(v for k, v in splits.items() if label.startswith(k))
        rows[f"zerofit, {label}"] = [split, r["real_tokens_per_s"], r["mem_alloc_gib"], idle]
    return rows


def heldout() -> dict[str, list]:
    runs = _runs()
    return {
        label: heldout_row(recommended(PLANS[split], strategy), runs[run])
        for label, split, strategy, run in (
            ("4 x 4", "4x4", None, "recipe defaults (4 x 4) (call 2)"),
            ("2 x 8", "2x8", None, "2 x 8, planner (call 3)"),
            ("1 x 16", "1x16", "DDP", "ddp 1 x 16, no AC (call 2)"),
        )
    }


def host_rss() -> dict[str, list]:
    ways = _load(RSS)["ways"]
    return {
        name: [w["peak_anon_load_gib"], w["peak_anon_run_gib"], w["peak_file_gib"]]
        for name, w in ways.items()
    }


QLORA4: dict[str, tuple[list[str], Callable[[], Any], int]] = {
    "qlora4-block-bytes": ([BEFORE, NOW], block_bytes, 1),
    "qlora4-h100-8b": ([STOCK, CALL2, CALL3], h100_8b, 1),
    "qlora4-heldout": ([*PLANS.values(), CALL2, CALL3], heldout, 1),
    "qlora4-host-rss": ([RSS], host_rss, 1),
}

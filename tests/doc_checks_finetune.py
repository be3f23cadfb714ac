"""test_doc_figures' checks for docs/benchmarks/2026-12-03-finetune-h200.md (issue 13's H200
figures): each table row and ratio from the raw data of the call it names."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

DATA = Path(__file__).resolve().parents[1] / "docs" / "benchmarks" / "data"
DOC = "docs/benchmarks/2026-12-03-finetune-h200.md"
FT = "2026-12-03-finetune-h200/"
STOCK_1B, ZF_1B = FT + "1b/stock.json", FT + "1b/zerofit-results.json"
MBS16 = FT + "rest/1b-zerofit-mbs16-results.json"
LORA_STOCK, PRINTED = FT + "rest/8b-lora-stock.json", FT + "rest/printed-results.json"
P_SDPA, P_FLEX, P_ZF = (FT + f"probe/{f}" for f in ("stock-sdpa.json", "stock-flex.json", "zerofit-results.json"))  # fmt: skip


def _load(rel: str) -> Any:
    return json.loads((DATA / rel).read_text())


def _zerofit(rel: str) -> dict[str, dict]:
    return {r["name"]: r for r in _load(rel)["results"]}


def _stock_row(r: dict) -> list:
    return [r["real_tokens_per_s"], 100 * r["mfu"], r["step_s_median"], r["peak_allocated_gib"]]


def _zf_row(r: dict) -> list:
    return [r["real_tokens_per_s"], 100 * r["mfu"], r["step_time_s"], r["mem_alloc_gib"]]


def _speedup_1b() -> float:
    z = _zerofit(ZF_1B)["compile"]["real_tokens_per_s"]
    return z / _load(STOCK_1B)["real_tokens_per_s"]


def _speedup_lora() -> float:
    z = _load(PRINTED)["zerofit"]["8b-lora-zerofit"]["real_tokens_per_s"]
    return z / _load(LORA_STOCK)["real_tokens_per_s"]


def _speedup_8b() -> float:
    p = _load(PRINTED)
    return p["zerofit"]["8b-zerofit"]["real_tokens_per_s"] / p["8b-stock"]["real_tokens_per_s"]


def ft_1b() -> dict[str, list]:
    z = _zerofit(ZF_1B)
    return {
        "transformers + FSDP2": _stock_row(_load(STOCK_1B)),
        "zerofit, eager": _zf_row(z["eager"]),
        "zerofit, per-block compile": _zf_row(z["compile"]),
    }


def ft_1b_ratio() -> list[str]:
    s, z = _load(STOCK_1B), _zerofit(ZF_1B)["compile"]
    speed = _speedup_1b()
    mem = z["mem_alloc_gib"] / s["peak_allocated_gib"]
    return [
        f"zerofit with compile runs at {speed:.3f}x the stock stack's real tokens/s, with "
        f"{mem:.3f}x its peak memory",
        "The 1.3x goal is missed here" if speed < 1.3 else "?",
    ]


def ft_1b_mbs16() -> list[str]:
    r = _zerofit(MBS16)["compile mbs16"]
    return [f"that ran {r['real_tokens_per_s']:,.0f} real tokens/s at {r['mem_alloc_gib']:.1f} GiB"]


def ft_lora() -> dict[str, list]:
    z = _load(PRINTED)["zerofit"]["8b-lora-zerofit"]
    return {
        "transformers + PEFT + FSDP2": _stock_row(_load(LORA_STOCK)),
        "zerofit, per-block compile": _zf_row(z),
    }


def ft_lora_ratio() -> list[str]:
    s, z = _load(LORA_STOCK), _load(PRINTED)["zerofit"]["8b-lora-zerofit"]
    speed = _speedup_lora()
    met = "met" if speed >= 1.3 else "missed"
    mem = z["mem_alloc_gib"] / s["peak_allocated_gib"]
    return [
        f"zerofit runs at {speed:.3f}x the stock stack's real tokens/s (goal 1.3x: {met}), with "
        f"{mem:.3f}x its peak memory"
    ]


def ft_8b() -> dict[str, list]:
    p = _load(PRINTED)
    return {
        "transformers + FSDP2": _stock_row(p["8b-stock"]),
        "zerofit, per-block compile": _zf_row(p["zerofit"]["8b-zerofit"]),
    }


def ft_8b_ratio() -> list[str]:
    speed = _speedup_8b()
    return [
        f"zerofit runs at {speed:.3f}x the stock stack's real tokens/s",
        "The 1.3x goal is missed" if speed < 1.3 else "?",
    ]


def ft_probe() -> dict[str, list]:
    z = _zerofit(P_ZF)
    return {
        "transformers + FSDP2 (SDPA, dense mask)": _stock_row(_load(P_SDPA)),
        "transformers + FSDP2 (flex_attention)": _stock_row(_load(P_FLEX)),
        "zerofit, eager (dense mask)": _zf_row(z["eager"]),
        "zerofit, per-block compile (dense mask)": _zf_row(z["compile"]),
    }


def ft_probe_ratio() -> list[str]:
    s, z = _load(P_SDPA)["real_tokens_per_s"], _zerofit(P_ZF)
    return [
        f"compile without varlen ran {z['compile']['real_tokens_per_s'] / s:.3f}x",
        f"Eager ran {z['eager']['real_tokens_per_s'] / s:.3f}x",
    ]


# name -> (data files, expected)
FINETUNE: dict[str, tuple[list[str], Callable[[], Any]]] = {
    "ft-1b": ([STOCK_1B, ZF_1B], ft_1b),
    "ft-1b-ratio": ([STOCK_1B, ZF_1B], ft_1b_ratio),
    "ft-1b-mbs16": ([MBS16], ft_1b_mbs16),
    "ft-lora": ([LORA_STOCK, PRINTED], ft_lora),
    "ft-lora-ratio": ([LORA_STOCK, PRINTED], ft_lora_ratio),
    "ft-8b": ([PRINTED], ft_8b),
    "ft-8b-ratio": ([PRINTED], ft_8b_ratio),
    "ft-probe": ([P_SDPA, P_FLEX, P_ZF], ft_probe),
    "ft-probe-ratio": ([P_SDPA, P_ZF], ft_probe_ratio),
}

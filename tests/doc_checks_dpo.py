"""test_doc_figures' checks for docs/benchmarks/2026-12-06-dpo-curve-cpu.md (issue 28: DPO's
preference accuracy on a base pretrained here): each table cell from the curve's results.json."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

DOC = "docs/benchmarks/2026-12-06-dpo-curve-cpu.md"
CURVE = "2026-12-06-dpo-curve-cpu/results.json"
DATA = Path(__file__).resolve().parents[1] / "docs" / "benchmarks" / "data"


def held_out() -> dict[str, list]:
    """Per eval step: the held-out pairs' DPO loss, preference accuracy (%) and reward margin."""
    curve = json.loads((DATA / CURVE).read_text())["curve"]
    return {
        str(r["step"]): [r["eval_loss"], 100 * r["eval_dpo_accuracy"], r["eval_dpo_margin"]]
        for r in curve
        if "eval_dpo_accuracy" in r
    }


def first_window() -> list[str]:
    """The train pairs' accuracy over the first logging window, then the first held-out one."""
    curve = json.loads((DATA / CURVE).read_text())["curve"]
    first = next(r for r in curve if "dpo_accuracy" in r)
    held = next(r for r in curve if "eval_dpo_accuracy" in r)
    return [
        f"{100 * first['dpo_accuracy']:.0f}% over steps 1-{first['step']} on the train pairs, "
        f"then {100 * held['eval_dpo_accuracy']:.1f}% held out at step {held['step']}"
    ]


DPO_CURVE: dict[str, tuple[list[str], Callable[[], Any], int]] = {
    "dpo-curve": ([CURVE], held_out, 1),
    "dpo-curve-first": ([CURVE], first_window, 1),
}

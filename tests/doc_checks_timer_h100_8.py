"""test_doc_figures' checks for docs/benchmarks/2026-12-07-timer-h100-8.md (issue 27, item 4: the
eighth held-out call): DeepSpeed's throughput timer off (zerofit's JSON since 2026-12-07) against
on (benchmarks/ds_timer_on.json) in the same call, the pairs' losses, the call's probe, and its
runs as the call forecast them."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from doc_checks_host_probe_h100_2 import as_called, called_rows, ds_probe_table

DOC = "docs/benchmarks/2026-12-07-timer-h100-8.md"
CALL8 = "2026-12-07-timer-h100-8/"
ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "docs" / "benchmarks" / "data"
ON = " timer on"  # the suffix of a pair's variant with the timer on


def _bundle() -> dict[str, Any]:
    return json.loads((DATA / CALL8 / "all-results.json").read_text())


def _pairs() -> dict[str, tuple[dict, dict]]:
    """Per group: (its variant with the timer off, the same with it on)."""
    out = {}
    for group, result in _bundle()["results"].items():
        by_name = {r["name"]: r for r in result["results"]}
        on = [n for n in by_name if n.endswith(ON)]
        out[group] = (by_name[on[0].removesuffix(ON)], by_name[on[0]])
    return out


def timer_ab() -> dict[str, list]:
    """Per group: median step s with the timer off, with it on, and how much longer on is (%)."""
    return {
        group: [
            off["step_time_s"],
            on["step_time_s"],
            100 * (on["step_time_s"] / off["step_time_s"] - 1),
        ]
        for group, (off, on) in _pairs().items()
    }


def _losses() -> dict[str, list[float]]:
    """Each run's per-step losses, keyed by group and variant folder."""
    return {k: v for k, v in _bundle()["step_losses"].items() if v}


def losses() -> list[str]:
    """The pairs' first-step losses are equal; how far their last ones are apart at most."""
    runs = _losses()
    pairs = []
    for key, off in runs.items():
        if key.split("/")[1].startswith("00-"):
            on = [v for k, v in runs.items() if k.split("/")[0] == key.split("/")[0] and k != key]
            pairs.append((off, on[0]))
    same = sum(a[0] == b[0] for a, b in pairs)
    apart = max(abs(a[-1] / b[-1] - 1) for a, b in pairs)
    return [
        f"the first step's loss is the same in {same} of {len(pairs)} pairs",
        f"the last ones are at most {100 * apart:.1f}% apart",
    ]


def called_summary() -> list[str]:
    """Of the runs with the timer off (zerofit's runs as they now are: held out), how many within
    10%; memory within 5% over all the call's runs."""
    rows = called_rows(CALL8)
    held = [v for name, v in rows.items() if not name.endswith(ON)]
    hits = sum(abs(err) <= 10 for _, _, err, _ in held)
    memory = sum(abs(mem) <= 5 for _, _, _, mem in rows.values())
    return [
        f"Held out (the timer off): {hits} of {len(held)} within 10%",
        f"memory within 5% in {memory} of {len(rows)}",
    ]


TIMER_H100_8: dict[str, tuple[list[str], Callable[[], Any], int]] = {
    "timer-h100-8-ab": ([CALL8 + "all-results.json"], timer_ab, 1),
    "timer-h100-8-losses": ([CALL8 + "all-results.json"], losses, 1),
    "timer-h100-8-probe": ([CALL8 + "host-probe.json"], ds_probe_table(CALL8), 1),
    "timer-h100-8-called": ([CALL8 + "heldout-forecast.json"], as_called(CALL8), 1),
    "timer-h100-8-called-summary": ([CALL8 + "heldout-forecast.json"], called_summary, 1),
}

"""test_doc_figures' checks for docs/benchmarks/2026-12-07-host-probe-h100-7.md (issue 27: the
seventh held-out call of the host probe, its PCIe rate, and a profiled ZeRO-1 step): the call's
probe as `plan --host-probe --json` wrote it, its runs as the call forecast them (its
heldout-forecast.json), and the profiled run's time breakdown (`bench --profile`'s summary)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from doc_checks_host_probe_h100_2 import as_called, as_called_summary, ds_probe_table, profile_row

DOC = "docs/benchmarks/2026-12-07-host-probe-h100-7.md"
CALL7 = "2026-12-07-host-probe-h100-7/"
ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "docs" / "benchmarks" / "data"
PROFILES = {  # the profiled runs' summaries, as benchmarks/bundle_results.py gathered them
    "new8-zero1-15x4p": "new8-zero1-15x4p/00-zero1_eager_1x1024_x4/profile/summary.json",
    "new8-zero3-15x3p": "new8-zero3-15x3p/00-zero3_eager_1x512_x3/profile/summary.json",
}


def _profile(name: str) -> dict[str, Any]:
    files = json.loads((DATA / CALL7 / "all-results.json").read_text())["files"]
    return files[PROFILES[name]]


def profile() -> dict[str, list]:
    """ms a step of each run's profiled steps: wall, each part, DeepSpeed's fused Adam kernel."""
    return {name: profile_row(_profile(name), "AdamFunctor") for name in PROFILES}


def waits() -> dict[str, list]:
    """The ZeRO-1 run's host time in reads of device values (each a synchronisation): ms a
    step, and reads a step."""
    p = _profile("new8-zero1-15x4p")
    read = [k for k in p["top_host"] if k["name"] == "aten::_local_scalar_dense"]
    return {"new8-zero1-15x4p": [read[0]["total_ms"] / p["steps"], read[0]["calls"] / p["steps"]]}


HOST_PROBE_H100_7: dict[str, tuple[list[str], Callable[[], Any], int]] = {
    "host-probe-h100-7-probe": ([CALL7 + "host-probe.json"], ds_probe_table(CALL7), 1),
    "host-probe-h100-7-called": ([CALL7 + "heldout-forecast.json"], as_called(CALL7), 1),
    "host-probe-h100-7-called-summary": (
        [CALL7 + "heldout-forecast.json"],
        as_called_summary(CALL7, ("new8-zero1-15x4p", "new8-zero3-15x3p")),
        1,
    ),
    "host-probe-h100-7-profile": ([CALL7 + "all-results.json"], profile, 1),
    "host-probe-h100-7-waits": ([CALL7 + "all-results.json"], waits, 1),
}

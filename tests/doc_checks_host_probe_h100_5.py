"""test_doc_figures' checks for docs/benchmarks/2026-12-07-host-probe-h100-5.md (issue 27: the
fifth and sixth held-out calls of the host probe, and the changes between them): each call's
probe as `plan --host-probe --json` wrote it, its runs as the call forecast them (its
heldout-forecast.json) and as today's planner forecasts them (tools/planner_residuals.py), and
the profiled runs' time breakdown (`bench --profile`'s summary.json)."""

from __future__ import annotations

import json
from pathlib import Path

from doc_checks_host_probe_h100_2 import (
    KINDS,
    as_called,
    as_called_summary,
    probe_table,
    profile_row,
    runs_summary,
    runs_table,
)

DOC = "docs/benchmarks/2026-12-07-host-probe-h100-5.md"
CALL5 = "2026-12-07-host-probe-h100-5/"
CALL6 = "2026-12-07-host-probe-h100-6/"
ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "docs" / "benchmarks" / "data"


def profiles() -> dict[str, list]:
    """Per profiled run: ms a step of its profiled steps (wall), then of each part of it; and
    the fused AdamW kernel's ms a step."""
    out = {}
    for name in ("new5-ddp-c15p", "new5-ddp-c21"):
        p = json.loads((DATA / CALL5 / f"profile-{name}.json").read_text())
        out[name] = profile_row(p, "FusedAdamMathFunctor")
    return out


HOST_PROBE_H100_5 = {
    "host-probe-h100-5-probe": ([CALL5 + "host-probe.json"], probe_table(CALL5, KINDS), 1),
    "host-probe-h100-5-called": ([CALL5 + "heldout-forecast.json"], as_called(CALL5), 1),
    "host-probe-h100-5-called-summary": (
        [CALL5 + "heldout-forecast.json"],
        as_called_summary(CALL5, ("new5-ddp-c15p",)),
        1,
    ),
    "host-probe-h100-5-profiles": (
        [CALL5 + "profile-new5-ddp-c15p.json", CALL5 + "profile-new5-ddp-c21.json"],
        profiles,
        1,
    ),
    "host-probe-h100-5": ([CALL5 + "all-results.json"], runs_table(CALL5), 1),
    "host-probe-h100-5-summary": ([CALL5 + "all-results.json"], runs_summary(CALL5), 1),
}
HOST_PROBE_H100_5.update(
    {
        "host-probe-h100-6-probe": (
            [CALL6 + "host-probe.json"],
            probe_table(CALL6, (*KINDS, "deepspeed/zero1-accumulating")),
            1,
        ),
        "host-probe-h100-6-called": ([CALL6 + "heldout-forecast.json"], as_called(CALL6), 1),
        "host-probe-h100-6-called-summary": (
            [CALL6 + "heldout-forecast.json"],
            as_called_summary(CALL6, ()),
            1,
        ),
    }
)

"""test_doc_figures' checks for docs/benchmarks/2026-12-06-host-probe-h100.md (issue 27: the
host's speed as a planner input): the runs of the call forecast again by today's planner
(tools/planner_residuals.py) from the committed results, with the fitted constants and with the
host probe saved beside them; the two probes' rates as `plan --host-probe --json` wrote them."""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from zerofit.planner.shape import with_host

DOC = "docs/benchmarks/2026-12-06-host-probe-h100.md"
FOLDER = "2026-12-06-host-probe-h100/"
RESULTS = FOLDER + "all-results.json"
PROBES = [FOLDER + "host-probe.json", FOLDER + "host-probe-after.json"]
ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "docs" / "benchmarks" / "data"


@functools.cache  # the runs are forecast once (seconds), however often a check is read
def _rows() -> tuple:
    tools = str(ROOT / "tools")
    if tools not in sys.path:
        sys.path.insert(0, tools)
    import planner_residuals as pr  # here: a tool, not a package (imported when checked)

    runs = [r for r in pr.bench_runs(DATA / RESULTS) if isinstance(r, pr.Run)]
    assert len(runs) == 12 and all(r.hw.host_from.startswith("probed: ") for r in runs)
    fitted = [replace(r, hw=with_host(r.hw, None, None)) for r in runs]  # the constants
    return tuple((pr.row(r), pr.row(f)) for r, f in zip(runs, fitted, strict=True))


def runs_table() -> dict[str, list]:
    """Per run: measured s; error % of the roofline, of the fitted host constants, of the
    probed host; the memory forecast's error %."""
    return {
        probed.run.key.split(":", 1)[1]: [
            probed.run.step_s,
            100 * probed.before,
            100 * fitted.after,
            100 * probed.after,
            100 * probed.memory_error,
        ]
        for probed, fitted in _rows()
    }


def runs_summary() -> list[str]:
    rows = _rows()

    def hits(errors: list[float]) -> str:
        return f"{sum(abs(e) <= 0.10 for e in errors)} of {len(errors)}"

    return [
        f"the roofline alone is within 10% in {hits([p.before for p, _ in rows])}",
        f"with the fitted constants, {hits([f.after for _, f in rows])}",
        f"with the probed host, {hits([p.after for p, _ in rows])}",
    ]


def probes_table() -> dict[str, list]:
    """Per probe: microseconds per eager launch, per compiled launch, per FSDP2 hook call."""
    out = {}
    for name, path in zip(("before the runs", "after the runs"), PROBES, strict=True):
        hw = json.loads((DATA / path).read_text())["hardware"]
        out[name] = [hw["host_launch_us"], hw["host_compiled_launch_us"], hw["host_hook_us"]]
    return out


HOST_PROBE_H100: dict[str, tuple[list[str], Callable[[], Any], int]] = {
    "host-probe-h100": ([RESULTS, PROBES[0]], runs_table, 1),
    "host-probe-h100-summary": ([RESULTS, PROBES[0]], runs_summary, 1),
    "host-probe-h100-probes": (PROBES, probes_table, 1),
}

"""test_doc_figures' checks for docs/benchmarks/2026-12-06-planner-heldout-h100.md (issue 27: the
planner held out on an H100): each row forecast again by today's planner
(tools/planner_residuals.py) from the committed bench results."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

DOC = "docs/benchmarks/2026-12-06-planner-heldout-h100.md"
RESULTS = "2026-12-06-planner-heldout-h100/all-results.json"
TOOLS = Path(__file__).resolve().parents[1] / "tools"


@functools.cache  # the corpus is forecast once (seconds), however often a check is read
def _rows() -> tuple:
    if str(TOOLS) not in sys.path:
        sys.path.insert(0, str(TOOLS))
    import planner_residuals as pr  # here: a tool, not a package (imported when checked)

    path = Path(__file__).resolve().parents[1] / "docs" / "benchmarks" / "data" / RESULTS
    runs = [r for r in pr.bench_runs(path) if isinstance(r, pr.Run)]
    rows = tuple(pr.row(r) for r in runs)
    assert len(rows) == 8 and all(x.group == "held out" for x in rows)
    return rows


def heldout_table() -> dict[str, list]:
    """Per run: measured s, the roofline's s and error %, with the host term s and error %,
    the memory forecast's error %."""
    return {
        x.run.key.split(":", 1)[1]: [
            x.run.step_s,
            x.roofline_s,
            100 * x.before,
            x.forecast_s,
            100 * x.after,
            100 * x.memory_error,
        ]
        for x in _rows()
    }


def heldout_summary() -> list[str]:
    rows = _rows()
    roof = sum(abs(x.before) <= 0.10 for x in rows)
    host = sum(abs(x.after) <= 0.10 for x in rows)
    mem = sum(abs(x.memory_error) <= 0.05 for x in rows)
    return [
        f"the roofline alone is within 10% in {roof} of 8 runs",
        f"with the host term, {host} of 8",
        f"Peak memory is within 5% in {mem} of 8",
    ]


HELDOUT_H100: dict[str, tuple[list[str], Callable[[], Any], int]] = {
    "heldout-h100": ([RESULTS], heldout_table, 1),
    "heldout-h100-summary": ([RESULTS], heldout_summary, 1),
}

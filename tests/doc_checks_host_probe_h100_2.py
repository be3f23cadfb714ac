"""test_doc_figures' checks for docs/benchmarks/2026-12-06-host-probe-h100-2.md (issue 27: the
host probe's second version on an H100, and the changes it led to): a call's runs forecast again
by today's planner (tools/planner_residuals.py) from the committed results, with the host probe
saved beside them; each probe's rates as `plan --host-probe --json` wrote them."""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

DOC = "docs/benchmarks/2026-12-06-host-probe-h100-2.md"
CALL2 = "2026-12-06-host-probe-h100-2/"
ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "docs" / "benchmarks" / "data"


@functools.cache  # the runs are forecast once (seconds), however often a check is read
def _rows(folder: str) -> tuple:
    tools = str(ROOT / "tools")
    if tools not in sys.path:
        sys.path.insert(0, tools)
    import planner_residuals as pr  # here: a tool, not a package (imported when checked)

    runs = [r for r in pr.bench_runs(DATA / folder / "all-results.json") if isinstance(r, pr.Run)]
    assert runs and all(r.hw.host_from.startswith("probed: ") for r in runs)
    return tuple(pr.row(r) for r in runs)


def runs_table(folder: str) -> Callable[[], dict[str, list]]:
    """Per run: measured s; error % of the roofline, of the probed host; memory error %."""

    def table() -> dict[str, list]:
        return {
            row.run.key.split(":", 1)[1]: [
                row.run.step_s,
                100 * row.before,
                100 * row.after,
                100 * row.memory_error,
            ]
            for row in _rows(folder)
        }

    return table


def runs_summary(folder: str) -> Callable[[], list[str]]:
    def summary() -> list[str]:
        rows = _rows(folder)
        hits = sum(abs(r.after) <= 0.10 for r in rows)
        memory = sum(abs(r.memory_error) <= 0.05 for r in rows)
        return [
            f"with the probed host, {hits} of {len(rows)} within 10%",
            f"memory within 5% in {memory} of {len(rows)}",
        ]

    return summary


def probes_table(folder: str) -> Callable[[], dict[str, list]]:
    """Per probe: us per eager launch, per compiled launch; us per hook call of each engine
    (sharded, then alone where probed); each host optimizer's GB/s."""

    def table() -> dict[str, list]:
        out = {}
        for name, file in (
            ("before the runs", "host-probe.json"),
            ("after", "host-probe-after.json"),
        ):
            hw = json.loads((DATA / folder / file).read_text())["hardware"]
            hooks = hw["host_hooks_us"]
            adam = hw.get("host_adam_gb_per_s") or {}
            out[name] = [
                hw["host_launch_us"],
                hw["host_compiled_launch_us"],
                [hooks[k] for k in ("fsdp", "fsdp@1") if k in hooks],
                [hooks[k] for k in ("deepspeed", "deepspeed@1") if k in hooks],
                *[[v] for v in adam.values()],
            ]
        return out

    return table


HOST_PROBE_H100_2: dict[str, tuple[list[str], Callable[[], Any], int]] = {
    "host-probe-h100-2": ([CALL2 + "all-results.json"], runs_table(CALL2), 1),
    "host-probe-h100-2-summary": ([CALL2 + "all-results.json"], runs_summary(CALL2), 1),
    "host-probe-h100-2-probes": (
        [CALL2 + "host-probe.json", CALL2 + "host-probe-after.json"],
        probes_table(CALL2),
        1,
    ),
}


CALL3 = "2026-12-06-host-probe-h100-3/"


def probe3_table() -> dict[str, list]:
    """The third call's probe: us per launch (eager, compiled), us per hook call of FSDP2 and
    ZeRO-3 (a rank alone, then sharded), GB/s of each host optimizer."""
    hw = json.loads((DATA / CALL3 / "host-probe.json").read_text())["hardware"]
    hooks, adam = hw["host_hooks_us"], hw["host_adam_gb_per_s"]
    return {
        "before the runs": [
            hw["host_launch_us"],
            hw["host_compiled_launch_us"],
            [hooks["fsdp@1"], hooks["fsdp"]],
            [hooks["deepspeed@1"], hooks["deepspeed"]],
            adam["fsdp fused"],
            adam["fsdp foreach"],
            adam["deepspeed offload step"],
        ]
    }


HOST_PROBE_H100_2.update(
    {
        "host-probe-h100-3": ([CALL3 + "all-results.json"], runs_table(CALL3), 1),
        "host-probe-h100-3-summary": ([CALL3 + "all-results.json"], runs_summary(CALL3), 1),
        "host-probe-h100-3-probe": ([CALL3 + "host-probe.json"], probe3_table, 1),
    }
)


CALL4 = "2026-12-06-host-probe-h100-4/"


def probe4_table() -> dict[str, list]:
    """The fourth call's probe: us per launch (eager, compiled); us per hook call, a rank alone
    then sharded, of eager and compiled FSDP2, ZeRO-3, ZeRO-1/2; GB/s of each host optimizer."""
    hw = json.loads((DATA / CALL4 / "host-probe.json").read_text())["hardware"]
    hooks, adam = hw["host_hooks_us"], hw["host_adam_gb_per_s"]
    kinds = ("fsdp", "fsdp/compiled", "deepspeed", "deepspeed/zero12")
    return {
        "before the runs": [
            hw["host_launch_us"],
            hw["host_compiled_launch_us"],
            *[[hooks[f"{k}@1"], hooks[k]] for k in kinds],
            adam["fsdp fused"],
            adam["fsdp foreach"],
            adam["deepspeed offload step"],
        ]
    }


def as_called4() -> dict[str, list]:
    """Per run as the call forecast it (its heldout-forecast.json, the planner at 6b9f4ea):
    measured s, forecast s, error %, memory error %."""
    rows = json.loads((DATA / CALL4 / "heldout-forecast.json").read_text())
    out = {}
    for r in rows:
        err = r["forecast_step_s"] / r["measured_step_s"] - 1
        memory = r["forecast_alloc_gib"] / r["measured_alloc_gib"] - 1
        out[r["run"].split(":", 1)[1]] = [
            r["measured_step_s"],
            r["forecast_step_s"],
            100 * err,
            100 * memory,
        ]
    return out


def as_called4_summary() -> list[str]:
    rows = as_called4().values()
    hits = sum(abs(err) <= 10 for _, _, err, _ in rows)
    memory = sum(abs(mem) <= 5 for _, _, _, mem in rows)
    return [f"{hits} of {len(rows)} within 10%", f"memory within 5% in {memory} of {len(rows)}"]


HOST_PROBE_H100_2.update(
    {
        "host-probe-h100-4-probe": ([CALL4 + "host-probe.json"], probe4_table, 1),
        "host-probe-h100-4-called": ([CALL4 + "heldout-forecast.json"], as_called4, 1),
        "host-probe-h100-4-called-summary": (
            [CALL4 + "heldout-forecast.json"],
            as_called4_summary,
            1,
        ),
        "host-probe-h100-4": ([CALL4 + "all-results.json"], runs_table(CALL4), 1),
        "host-probe-h100-4-summary": ([CALL4 + "all-results.json"], runs_summary(CALL4), 1),
    }
)

"""test_doc_figures' checks for docs/benchmarks/2026-12-07-host-probe-h100-5.md (issue 27: the
fifth and sixth held-out calls of the host probe, and the changes between them): each call's
probe as `plan --host-probe --json` wrote it, its runs as the call forecast them (its
heldout-forecast.json) and as today's planner forecasts them (tools/planner_residuals.py), and
the profiled runs' time breakdown (`bench --profile`'s summary.json)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from doc_checks_host_probe_h100_2 import runs_summary, runs_table

DOC = "docs/benchmarks/2026-12-07-host-probe-h100-5.md"
CALL5 = "2026-12-07-host-probe-h100-5/"
CALL6 = "2026-12-07-host-probe-h100-6/"
ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "docs" / "benchmarks" / "data"
KINDS = ("fsdp", "fsdp/compiled", "deepspeed", "deepspeed/zero12")
PARTS = ("compute", "optimizer", "idle", "host")


def probe_table(folder: str, kinds: tuple[str, ...] = KINDS) -> Callable[[], dict[str, list]]:
    """A call's probe: us per launch (eager, compiled); us per hook call of each kind, a rank
    alone then sharded; GB/s of each host optimizer."""

    def table() -> dict[str, list]:
        hw = json.loads((DATA / folder / "host-probe.json").read_text())["hardware"]
        hooks, adam = hw["host_hooks_us"], hw["host_adam_gb_per_s"]
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

    return table


def _called(folder: str, drop: tuple[str, ...] = ()) -> dict[str, list]:
    """Per run of `folder`'s heldout-forecast.json, but those of the groups in `drop`."""
    rows = json.loads((DATA / folder / "heldout-forecast.json").read_text())
    out = {}
    for r in rows:
        if r["run"].split("/", 1)[0] in drop:
            continue
        err = r["forecast_step_s"] / r["measured_step_s"] - 1
        memory = r["forecast_alloc_gib"] / r["measured_alloc_gib"] - 1
        name = r["run"].split(":", 1)[1]
        out[name] = [r["measured_step_s"], r["forecast_step_s"], 100 * err, 100 * memory]
    return out


def as_called(folder: str) -> Callable[[], dict[str, list]]:
    """Per run as the call forecast it: measured s, forecast s, error %, memory error %."""
    return lambda: _called(folder)


def as_called_summary(folder: str, repeats: tuple[str, ...] = ()) -> Callable[[], list[str]]:
    """Within 10% and memory within 5% as called; then among the runs held out (all but the
    groups in `repeats`, which an earlier call ran)."""

    def summary() -> list[str]:
        rows = _called(folder).values()
        hits = sum(abs(err) <= 10 for _, _, err, _ in rows)
        memory = sum(abs(mem) <= 5 for _, _, _, mem in rows)
        held = _called(folder, repeats).values()
        held_hits = sum(abs(err) <= 10 for _, _, err, _ in held)
        words = {3: "three", 4: "four", 5: "five", 6: "six"}
        n = words.get(len(held), len(held))
        return [
            f"{hits} of {len(rows)} within 10%; memory within 5% in {memory} of {len(rows)}",
            f"f the {n} held out, {held_hits} {'is' if held_hits == 1 else 'are'} within 10%",
        ]

    return summary


def profiles() -> dict[str, list]:
    """Per profiled run: ms a step of its profiled steps (wall), then of each part of it; and
    the fused AdamW kernel's ms a step."""
    out = {}
    for name in ("new5-ddp-c15p", "new5-ddp-c21"):
        p = json.loads((DATA / CALL5 / f"profile-{name}.json").read_text())
        steps = p["steps"]
        adam = sum(k["total_ms"] for k in p["top"] if "FusedAdamMathFunctor" in k["name"])
        parts = [p["breakdown_ms"][part] / steps for part in PARTS]
        out[name] = [p["wall_ms"] / steps, *parts, adam / steps]
    return out


HOST_PROBE_H100_5 = {
    "host-probe-h100-5-probe": ([CALL5 + "host-probe.json"], probe_table(CALL5), 1),
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
            as_called_summary(CALL6),
            1,
        ),
    }
)

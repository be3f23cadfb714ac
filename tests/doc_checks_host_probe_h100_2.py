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


ADAMS = ("fsdp fused", "fsdp foreach", "deepspeed offload step")  # the host optimizers probed


def probe_table(
    folder: str, kinds: tuple[str, ...], adams: tuple[str, ...] = ADAMS, pcie: bool = False
) -> Callable[[], dict[str, list]]:
    """A call's probe: us per launch (eager, compiled); us per hook call of each kind, a rank
    alone then sharded; GB/s of each host optimizer in `adams`; with `pcie`, the probed PCIe
    GB/s."""

    def table() -> dict[str, list]:
        hw = json.loads((DATA / folder / "host-probe.json").read_text())["hardware"]
        hooks, adam = hw["host_hooks_us"], hw["host_adam_gb_per_s"]
        return {
            "before the runs": [
                hw["host_launch_us"],
                hw["host_compiled_launch_us"],
                *[[hooks[f"{k}@1"], hooks[k]] for k in kinds],
                *[adam[a] for a in adams],
                *([hw["pcie_bw_gbs"]] if pcie else []),
            ]
        }

    return table


# the seventh call on: DeepSpeed's three kinds of hook, its two host optimizers, and the PCIe rate
DS_HOOKS = ("deepspeed", "deepspeed/zero12", "deepspeed/zero1-accumulating")
DS_ADAMS = ("fsdp fused", "deepspeed offload step")


def ds_probe_table(folder: str) -> Callable[[], dict[str, list]]:
    """A probe of the seventh call on, as those write-ups table it (`probe_table`)."""
    return probe_table(folder, DS_HOOKS, DS_ADAMS, pcie=True)


PARTS = ("compute", "optimizer", "idle", "host")  # a profile's parts, as the write-ups table them


def profile_row(summary: dict[str, Any], adam_kernel: str) -> list[float]:
    """ms a step of a profile's steps (`bench --profile`'s summary.json): wall, each of PARTS,
    and the kernels whose name holds `adam_kernel`."""
    steps = summary["steps"]
    parts = [summary["breakdown_ms"][part] / steps for part in PARTS]
    adam = sum(k["total_ms"] for k in summary["top"] if adam_kernel in k["name"])
    return [summary["wall_ms"] / steps, *parts, adam / steps]


def called_rows(folder: str, drop: tuple[str, ...] = ()) -> dict[str, list]:
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
    return lambda: called_rows(folder)


def as_called_summary(
    folder: str, repeats: tuple[str, ...] | None = None
) -> Callable[[], list[str]]:
    """Within 10% and memory within 5% as called; given `repeats` (groups an earlier call ran),
    also among the runs held out, all but those."""

    def summary() -> list[str]:
        rows = called_rows(folder).values()
        hits = sum(abs(err) <= 10 for _, _, err, _ in rows)
        memory = sum(abs(mem) <= 5 for _, _, _, mem in rows)
        held = called_rows(folder, repeats or ()).values()
        held_hits = sum(abs(err) <= 10 for _, _, err, _ in held)
        said = f"{hits} of {len(rows)} within 10%; memory within 5% in {memory} of {len(rows)}"
        if repeats is None:
            return [said]
        words = {3: "three", 4: "four", 5: "five", 6: "six"}
        n = words.get(len(held), len(held))
        verb = "is" if held_hits == 1 else "are"
        return [said, f"the {n} held out, {held_hits} {verb} within 10%"]

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


HOST_PROBE_H100_2.update(
    {
        "host-probe-h100-3": ([CALL3 + "all-results.json"], runs_table(CALL3), 1),
        "host-probe-h100-3-summary": ([CALL3 + "all-results.json"], runs_summary(CALL3), 1),
        "host-probe-h100-3-probe": (
            [CALL3 + "host-probe.json"],
            probe_table(CALL3, ("fsdp", "deepspeed")),
            1,
        ),
    }
)


CALL4 = "2026-12-06-host-probe-h100-4/"
# the hook kinds probed apart since the fourth call (the sixth's adds ZeRO-1 off the boundary)
KINDS = ("fsdp", "fsdp/compiled", "deepspeed", "deepspeed/zero12")


HOST_PROBE_H100_2.update(
    {
        "host-probe-h100-4-probe": ([CALL4 + "host-probe.json"], probe_table(CALL4, KINDS), 1),
        "host-probe-h100-4-called": ([CALL4 + "heldout-forecast.json"], as_called(CALL4), 1),
        "host-probe-h100-4-called-summary": (
            [CALL4 + "heldout-forecast.json"],
            as_called_summary(CALL4),
            1,
        ),
        "host-probe-h100-4": ([CALL4 + "all-results.json"], runs_table(CALL4), 1),
        "host-probe-h100-4-summary": ([CALL4 + "all-results.json"], runs_summary(CALL4), 1),
    }
)

"""test_doc_figures' checks for docs/benchmarks/2026-12-07-ds-spy-h100-9.md (issue 27, item 4):
the ninth and eleventh calls' py-spy samples of host-bound DeepSpeed runs (benchmarks/ds_spy.sh:
where the step's host time goes), and the tenth call's four held-out ZeRO-1/2 runs as the call forecast them
and with the step's waits charged (the patch beside the data, not adopted)."""

from __future__ import annotations

import json
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from doc_checks_host_probe_h100_2 import as_called, ds_probe_table

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import spy_summary  # noqa: E402 - benchmarks/ is not a package: its reader of py-spy's stacks

DOC = "docs/benchmarks/2026-12-07-ds-spy-h100-9.md"
CALL9 = "2026-12-07-ds-spy-h100-9/"
CALL10 = "2026-12-07-heldout-h100-10/"
CALL11 = "2026-12-07-ds-spy-h100-11/"
DATA = ROOT / "docs" / "benchmarks" / "data"
RUNS = ("z1", "z2")
# leaves that wait on the GPU: a read of a device value, a copy from a Python number, a sync
WAITS = ("is_invalid_grad_norm", "mask_nan_or_inf_with_val_inplace", "synchronize", "item")


def _main_thread(folder: str, run: str) -> list[tuple[list[str], int]]:
    """The worker's training thread: the stacks that run zerofit's trainer."""
    stacks = spy_summary.read(str(DATA / folder / f"{run}-spy.txt.gz"))
    found = [v for v in stacks.values() if any("Trainer.fit" in f for fr, _ in v for f in fr)]
    return found[0]


def _step_s(folder: str, run: str) -> float:
    """Median step time of the run's logged steps after the third."""
    rows = json.loads((DATA / folder / "all-results.json").read_text())["metrics"]
    times = [r["step_time_s"] for r in rows[f"{run}/metrics.jsonl"] if r.get("step", 0) > 3]
    return statistics.median(t for t in times if t is not None)


def _share(stacks: list[tuple[list[str], int]], hit: Callable[[list[str]], bool]) -> float:
    return sum(c for fr, c in stacks if fr and hit(fr)) / sum(c for _, c in stacks)


def _in_step(frames: list[str]) -> bool:
    return any("_take_model_step" in f for f in frames)


def spied(folder: str, runs: tuple[str, ...]) -> Callable[[], dict[str, list]]:
    """Per run: median step s; % of the training thread's samples in DeepSpeed's optimizer step,
    waiting on the GPU in it (a leaf that reads the device or synchronises), launching ZeRO-1/2's
    overflow check; ms a step waiting there."""

    def table() -> dict[str, list]:
        out = {}
        for run in runs:
            main = _main_thread(folder, run)
            step = _share(main, _in_step)
            waits = _share(main, lambda fr: _in_step(fr) and any(w in fr[-1] for w in WAITS))
            check = _share(main, lambda fr: "has_inf_or_nan" in fr[-1])
            seconds = _step_s(folder, run)
            out[run] = [seconds, 100 * step, 100 * waits, 100 * check, 1e3 * waits * seconds]
        return out

    return table


def _rows(name: str) -> dict[str, dict[str, Any]]:
    rows = json.loads((DATA / CALL10 / name).read_text())
    return {r["run"].split(":", 1)[1]: r for r in rows}


def preview() -> dict[str, list]:
    """Per held-out run: measured s; today's forecast and its error %; the forecast with the
    step's waits charged (waited-term.patch) and its error %."""
    today, waited = _rows("heldout-forecast.json"), _rows("waited-preview-forecast.json")
    out = {}
    for name, r in today.items():
        measured = r["measured_step_s"]
        a, b = r["forecast_step_s"], waited[name]["forecast_step_s"]
        out[name] = [measured, a, 100 * (a / measured - 1), b, 100 * (b / measured - 1)]
    return out


def preview_summary() -> list[str]:
    """Within 10%, and the median |error|, today and with the waits charged."""
    rows = preview().values()
    said = []
    for at in (2, 4):
        errors = [abs(r[at]) for r in rows]
        hits = sum(e <= 10 for e in errors)
        said.append(
            f"{hits} of {len(errors)} within 10% (median |error| {statistics.median(errors):.1f}%)"
        )
    return said


DS_SPY_H100_9: dict[str, tuple[list[str], Callable[[], Any], int]] = {
    "ds-spy-h100-9-spied": (
        [CALL9 + "z1-spy.txt.gz", CALL9 + "z2-spy.txt.gz", CALL9 + "all-results.json"],
        spied(CALL9, RUNS),
        1,
    ),
    "ds-spy-h100-11-spied": (
        [CALL11 + "z3-spy.txt.gz", CALL11 + "z2b-spy.txt.gz", CALL11 + "all-results.json"],
        spied(CALL11, ("z3", "z2b")),
        1,
    ),
    "ds-spy-h100-10-probe": ([CALL10 + "host-probe.json"], ds_probe_table(CALL10), 1),
    "ds-spy-h100-10-called": ([CALL10 + "heldout-forecast.json"], as_called(CALL10), 1),
    "ds-spy-h100-10-preview": (
        [CALL10 + "heldout-forecast.json", CALL10 + "waited-preview-forecast.json"],
        preview,
        1,
    ),
    "ds-spy-h100-10-preview-summary": (
        [CALL10 + "heldout-forecast.json", CALL10 + "waited-preview-forecast.json"],
        preview_summary,
        1,
    ),
}

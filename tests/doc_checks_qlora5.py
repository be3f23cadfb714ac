"""test_doc_figures' checks for docs/benchmarks/2026-12-05-qlora-session5.md (issue 26, QLoRA, the
fifth session: the host's syncs out of forward, both stacks in one call): each table cell from
the raw data it names."""

from __future__ import annotations

import json
import re
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

from doc_checks_speed2 import _load

DOC = "docs/benchmarks/2026-12-05-qlora-session5.md"
S5 = "2026-12-05-qlora-h200/session5-h100/"
DATA = Path(__file__).resolve().parents[1] / "docs" / "benchmarks" / "data"
PROBES = {"1": ("call1-probe", "5301257 (the session's start)"),
          "3": ("call3-probe", "+ rebuild in one kernel, bounds on the host")}  # fmt: skip
CALL2, CALL4 = S5 + "call2-all-results.json", S5 + "call4/all-results.json"
WAITS = ("doc_bounds (", "find_packed_sequence_indices (")
LAUNCH = "StaticallyLaunchedTritonKernel.run ("


def _threads(summary: str) -> list[tuple[str, int, dict[str, float]]]:
    """(thread header, samples, {frame: self share %}) of each thread in a spy_summary.py text."""
    out = []
    for block in summary.split("\nprocess "):
        lines = block.splitlines()
        samples = int(lines[1].split()[0])
        self_part = lines[lines.index("  self:") + 1 : lines.index("  inclusive:")]
        shares = {}
        for line in self_part:
            m = re.match(r"\s*([\d.]+)%\s+(.*)", line)
            shares.setdefault(m[2], float(m[1]))
        out.append((lines[0], samples, shares))
    return out


def _share(shares: dict[str, float], starts: tuple[str, ...]) -> float:
    return sum(v for k, v in shares.items() if k.startswith(starts))


def probe() -> dict[str, list]:
    rows = {}
    for call, (folder, code) in PROBES.items():
        threads = _threads((DATA / S5 / folder / "summary.txt").read_text())
        main = next(t for t in threads if "MainThread" in t[0])
        back = max((t for t in threads if t is not main), key=lambda t: t[1])
        text = (DATA / S5 / folder / "metrics.jsonl").read_text()
        steps = [r for r in map(json.loads, text.splitlines()) if r.get("step", 0) >= 5]
        real = statistics.median(r["real_tokens_per_s"] for r in steps if "real_tokens_per_s" in r)
        rows[call] = [code, main[1], _share(main[2], WAITS), back[1],
                      _share(back[2], (LAUNCH,)), real]  # fmt: skip
    return rows


def _zerofit(groups: dict, prefix: str) -> dict[str, dict]:
    return {r["name"]: r for k, g in groups.items() if k.startswith(prefix) for r in g["results"]}


def h100_8b() -> dict[str, list]:
    rows = {}
    codes = {
        "2": "+ rebuild in one kernel, bounds on the host",
        "4": "+ the prepared mask (this commit)",
    }
    for call, path in (("2", CALL2), ("4", CALL4)):
        groups = _load(path)
        stock = groups["8b-qlora-stock-liger-compile"]
        base = stock["real_tokens_per_s"]
        label = f"{call} | {codes[call]} | stock + Liger, compiled, full AC, 4 x 4"
        rows[label] = [base, stock["peak_allocated_gib"], 1.0]
        runs = _zerofit(groups, "8b-qlora-host")
        for name, run in (("2 x 8, planner's choice", "2 x 8, planner's choice"),
                          ("1 x 16, no AC", "ddp 1 x 16, no AC")):  # fmt: skip
            r = runs[run]
            rows[f"{call} | same | zerofit {name}"] = [
                r["real_tokens_per_s"],
                r["mem_alloc_gib"],
                r["real_tokens_per_s"] / base,
            ]
    return rows


QLORA5: dict[str, tuple[list[str], Callable[[], Any], int]] = {
    "qlora5-probe": (
        [S5 + f"{f}/{n}" for f, _ in PROBES.values() for n in ("summary.txt", "metrics.jsonl")],
        probe,
        1,
    ),
    "qlora5-h100-8b": ([CALL2, CALL4], h100_8b, 3),
}

"""test_doc_figures' checks for docs/benchmarks/2026-12-04-speed2-h200.md (issue 14's 24 GB runs
and the held-out re-run): each table row and sentence from the bundled raw data of the call it
names; the planner's forecasts of those runs are today's (they change when the planner does)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from doc_checks_speed2 import _load, _row, _runs

DOC = "docs/benchmarks/2026-12-04-speed2-h200.md"
S4 = "2026-12-04-speed2-h200/"
C10, C10B, C13 = S4 + "c10-all-results.json", S4 + "c10b-all-results.json", S4 + "c13-all-results.json"  # fmt: skip
PLANS = {m: S4 + f"plans/{m}-plan.json" for m in ("1.5b", "3.6b")}
A_WARM = "2026-12-04-planner-heldout/a-measured.json"
A_OLD = "2026-12-03-planner-heldout/a-measured.json"
HELDOUT_ALL = [A_OLD, *(f"2026-12-03-planner-heldout/{c}-measured.json" for c in "bcd"), A_WARM]
ZERO12 = [A_WARM, *HELDOUT_ALL[1:4]]  # a (the warm re-run), b, c, d
RUNS = [  # (group results.json under data/, variant): the runs the forecast table covers
    (S4 + "24gb-1.5b-results.json", "planned for 24GB"),
    (S4 + "24gb-1.5b-results.json", "planned for 24GB + compile"),
    (S4 + "24gb-3.6b-results.json", "planned for 24GB"),
    (S4 + "24gb-3.6b-compile-results.json", "planned for 24GB + compile"),
    (S4 + "24gb-1.5b-levers-results.json", "fsdp offload fused adamw 16x4"),
    (S4 + "24gb-1.5b-levers-results.json", "fsdp offload foreach adamw 16x4"),
    (S4 + "24gb-1.5b-levers-results.json", "zero3 optim+params cpu 8x8 compile"),
    (S4 + "24gb-1.5b-levers-results.json", "zero3 optim cpu 8x8 compile"),
]


def rehearsal() -> dict[str, list]:
    one, three = _runs(C10, "24gb-1.5b"), _runs(C10, "24gb-3.6b")
    compiled = _runs(C10B, "24gb-3.6b-compile")["planned for 24GB + compile"]
    return {
        "1.5B | eager (as planned)": _row(one["planned for 24GB"]),
        "1.5B | compiled": _row(one["planned for 24GB + compile"]),
        "3.6B | eager (as planned)": _row(three["planned for 24GB"]),
        "3.6B | compiled": _row(compiled),
    }


def rehearsal_plans() -> list[str]:
    out = []
    for rel in PLANS.values():
        o = _load(rel)["options"][0]
        assert o["config"]["parallel.compile"] is False  # planned eager, as the doc says
        out.append(
            f"{o['strategy']} at micro-batch {o['micro_batch_size']} x accumulation "
            f"{o['grad_accum_steps']}, forecast {o['tokens_per_s']:,.0f} tokens/s"
        )
    return out


def rehearsal_summary() -> list[str]:
    r = rehearsal()
    one, three = r["1.5B | compiled"], r["3.6B | compiled"]
    return [
        f"1.5B reaches {one[1]:.1f}% MFU compiled (goal 25%)",
        f"the 3.6B shape {three[1]:.1f}% (goal 20%)",
        f"compile gives {one[0] / r['1.5B | eager (as planned)'][0]:.3f}x and "
        f"{three[0] / r['3.6B | eager (as planned)'][0]:.3f}x",
    ]


def levers() -> dict[str, list]:
    return {name: _row(r) for name, r in _runs(C13, "24gb-1.5b-levers").items()}


def levers_summary() -> list[str]:
    r = _runs(C13, "24gb-1.5b-levers")
    fused, foreach = r["fsdp offload fused adamw 16x4"], r["fsdp offload foreach adamw 16x4"]
    best = r["zero3 optim+params cpu 8x8 compile"]
    return [
        f"fused CPU AdamW runs {fused['tokens_per_s'] / foreach['tokens_per_s']:.3f}x the foreach "
        "update",
        f"{best['tokens_per_s']:,.0f} tokens/s ({100 * best['mfu']:.1f}% MFU)",
        "above the 25% goal" if best["mfu"] >= 0.25 and fused["mfu"] >= 0.25 else "?",
        f"FSDP2 offload with the fused update {100 * fused['mfu']:.1f}%",
    ]


def forecasts() -> dict[str, list]:
    out = {}
    from test_planner_measured import forecast

    for results, variant in RUNS:
        tps, mem, run = forecast(results, variant)
        got, used = run["tokens_per_s"], run["mem_alloc_gib"]
        size = "3.6B" if "3.6b" in results else "1.5B"
        out[f"{size} | {variant}"] = [
            [tps, got],
            100 * (tps / got - 1),
            [mem, used],
            100 * (mem / used - 1),
        ]
    return out


def _a_rows(rel: str) -> dict[str, dict]:
    return {r["strategy"]: r for r in _load(rel)["rows"]}


def heldout_a() -> dict[str, list]:
    old = _a_rows(A_OLD)
    out = {}
    for name, r in _a_rows(A_WARM).items():
        before = old.get(name)
        out[name] = [
            [r["predicted_step_s"], r["measured_step_s"]],
            100 * r["step_time_error"],
            before["measured_step_s"] if before else "-",
            100 * r["memory_error"],
        ]
    return out


def heldout_a_summary() -> list[str]:
    from test_planner_measured import heldout_errors

    d = _load(A_WARM)
    rows = d["rows"]
    mem = sum(abs(r["memory_error"]) <= 0.05 for r in rows)
    step = sum(abs(r["step_time_error"]) <= 0.10 for r in rows)
    today = [heldout_errors(d["meta"], r) for r in rows]
    off = next(r for r in rows if "CPU offload" in r["strategy"])
    off_now = heldout_errors(d["meta"], off)[1]
    return [
        f"memory within 5% in {mem} of {len(rows)}, the step time within 10% in {step} of "
        f"{len(rows)}",
        f"with today's planner {sum(abs(t) <= 0.10 for _, t in today)} of {len(rows)}",
        f"FSDP2 offload's forecast goes from {100 * off['step_time_error']:+.1f}% to "
        f"{100 * off_now:+.1f}%",
    ]


def zero12() -> dict[str, list]:
    from test_planner_measured import heldout_errors

    out = {}
    for rel in ZERO12:
        d = _load(rel)
        for r in d["rows"]:
            if r["strategy"].startswith(("ZeRO-1", "ZeRO-2")):
                memory, _ = heldout_errors(d["meta"], r)
                out[f"{rel.split('/')[-1][0]}: {r['strategy']}"] = [
                    r["measured_alloc_gib"],
                    100 * r["memory_error"],
                    100 * memory,
                ]
    return out


def heldout_memory_now() -> list[str]:
    from test_planner_measured import heldout_errors

    rows = [(d["meta"], r) for d in map(_load, HELDOUT_ALL) for r in d["rows"]]
    hits = sum(abs(heldout_errors(meta, r)[0]) <= 0.05 for meta, r in rows)
    worst = max(abs(v[2]) for v in zero12().values())
    return [
        f"every ZeRO-1/2 row within {worst:.1f}%",
        f"peak memory within 5% in {hits} of {len(rows)} held-out runs",
    ]


# name -> (data files, expected, key cells of a table row)
SPEED2B: dict[str, tuple[list[str], Callable[[], Any], int]] = {
    "s2b-rehearsal": ([C10, C10B], rehearsal, 2),
    "s2b-rehearsal-plans": (list(PLANS.values()), rehearsal_plans, 1),
    "s2b-rehearsal-summary": ([C10, C10B], rehearsal_summary, 1),
    "s2b-levers": ([C13], levers, 1),
    "s2b-levers-summary": ([C13], levers_summary, 1),
    "s2b-forecasts": (list(dict.fromkeys(rel for rel, _ in RUNS)), forecasts, 2),
    "s2b-heldout-a": ([A_WARM, A_OLD], heldout_a, 1),
    "s2b-heldout-a-summary": ([A_WARM], heldout_a_summary, 1),
    "s2b-zero12": (ZERO12, zero12, 1),
    "s2b-heldout-memory": (HELDOUT_ALL, heldout_memory_now, 1),
}


# The figures docs/benchmarks.md (the index of the write-ups) quotes from these calls.


def index_24gb() -> list[str]:
    s, lv = rehearsal_summary(), levers_summary()
    return [s[0], s[1], lv[1], lv[0]]


# (data files, expected) of each paragraph
INDEX_24GB = ([C10, C10B, C13], index_24gb)
INDEX_PLANNER_TODAY = (HELDOUT_ALL, lambda: heldout_memory_now()[1:])

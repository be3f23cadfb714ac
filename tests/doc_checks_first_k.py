"""test_doc_figures' checks for docs/benchmarks/2026-12-04-first-k-h200.md (issue 14: recomputing
the first k blocks): each table row and sentence from the bundled raw data of the call it names;
the planner's forecasts of those runs are today's (they change when the planner does)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from doc_checks_speed2 import _load, _row, _runs

DOC = "docs/benchmarks/2026-12-04-first-k-h200.md"
FK = "2026-12-04-first-k-h200/"
C17, C18 = FK + "c17-all-results.json", FK + "c18-all-results.json"
C19, ACCUM = FK + "c19-all-results.json", FK + "8b-fp32-accum-results.json"
WHY, PLANNED = FK + "8b-fp32-first-k-why-results.json", FK + "24gb-1.5b-first-k-results.json"
PLAN = FK + "plans/1.5b-plan.json"
GROUP17, GROUP18 = "8b-fp32-first-k-why", "24gb-1.5b-first-k"
FULL4, FIRST20 = "fsdp fp32-states AC mbs4", "fsdp fp32-states AC first 20 mbs4"
FULL2, FIRST16 = "fsdp fp32-states AC mbs2", "fsdp fp32-states AC first 16 mbs2"
AS_PLANNED, AS_FULL = "planned for 24GB", "planned for 24GB, full AC"
L8 = 32  # the 8B shape's blocks
GIB = 2**30


def _c17() -> dict[str, dict]:
    return _runs(C17, GROUP17)


def _variant_dir(variant: str) -> str:
    """A c17 variant's run folder inside the bundle (`GROUP17/NN-name`)."""
    return GROUP17 + "/" + _c17()[variant]["run_dir"].split(f"{GROUP17}/")[1]


def _profile(variant: str) -> dict:
    return _load(C17)["files"][f"{_variant_dir(variant)}/profile/summary.json"]


def _row_reserved(r: dict) -> list:
    """A table row: `_row`'s figures, then peak reserved GiB and the allocator's retries."""
    return [*_row(r), r["mem_reserved_gib"], r["alloc_retries"]]


def runs_8b() -> dict[str, list]:
    return {name: _row_reserved(r) for name, r in _c17().items()}


def profiles_8b() -> dict[str, list]:
    out = {}
    for name in _c17():
        p = _profile(name)
        ms, share = p["breakdown_ms"], p["breakdown"]
        out[name] = [
            ms["compute"],
            100 * share["compute"],
            100 * share["optimizer"],
            100 * share["idle"],
        ]
    return out


def _recompute(k: int) -> float:
    """The planner's compute time of recomputing k of L8 blocks, relative to full AC."""
    return (1 + k / L8 / 3) / (4 / 3)


def summary_8b() -> list[str]:
    r = _c17()
    best = r[FULL4]
    c = {name: _profile(name)["breakdown_ms"]["compute"] for name in r}
    idle = {name: 100 * _profile(name)["breakdown"]["idle"] for name in r}
    return [
        f"first_k 20 runs {r[FIRST20]['tokens_per_s'] / best['tokens_per_s']:.3f}x full AC at "
        f"micro-batch 4 and first_k 16 {r[FIRST16]['tokens_per_s'] / r[FULL2]['tokens_per_s']:.3f}x "
        "at micro-batch 2",
        f"compute time falls to {c[FIRST20] / c[FULL4]:.3f}x and {c[FIRST16] / c[FULL2]:.3f}x of "
        f"full AC's, where the planner's recompute share gives {_recompute(20):.3f}x and "
        f"{_recompute(16):.3f}x",
        f"idle time goes from {idle[FULL4]:.1f}% to {idle[FIRST20]:.1f}% and from {idle[FULL2]:.1f}% "
        f"to {idle[FIRST16]:.1f}%",
        f"{r[FIRST20]['alloc_retries']} retried allocations in each first_k run and none in the "
        f"full AC runs"
        if r[FIRST20]["alloc_retries"] == r[FIRST16]["alloc_retries"]
        and r[FULL4]["alloc_retries"] == r[FULL2]["alloc_retries"] == 0
        else "?",
        f"reserved {r[FIRST20]['mem_reserved_gib']:.1f} and {r[FIRST16]['mem_reserved_gib']:.1f} GiB",
        f"{best['tokens_per_s']:,.0f} tokens/s ({100 * best['mfu']:.1f}% MFU). The goal is "
        "10,000 (52%)",
    ]


RUNS = [(WHY, v) for v in (FULL4, FIRST20, FULL2, FIRST16)] + [
    (PLANNED, v) for v in (AS_PLANNED, AS_FULL)
]


def forecasts() -> dict[str, list]:
    from test_planner_measured import forecast

    out = {}
    for results, variant in RUNS:
        tps, mem, run = forecast(results, variant)
        got, used = run["tokens_per_s"], run["mem_alloc_gib"]
        out[variant] = [[tps, got], 100 * (tps / got - 1), [mem, used], 100 * (mem / used - 1)]
    return out


def forecasts_summary() -> list[str]:
    rows = forecasts()
    eight = [rows[v][3] for _, v in RUNS[:4]]
    small = [rows[v][3] for _, v in RUNS[4:]]
    return [
        f"peak memory off by {min(eight):+.1f}% to {max(eight):+.1f}% at 8B, within the 5% goal"
        if max(map(abs, eight)) <= 5
        else "?",
        f"{min(small):+.1f}% for both runs on the 24 GB card"
        if f"{min(small):+.1f}" == f"{max(small):+.1f}"
        else "?",
        f"overestimates first_k 16's speed by {rows[FIRST16][1]:+.1f}%",
    ]


def fit_rule() -> list[str]:
    """The c17 runs against `zerofit plan --gpu H200`'s fit rule: forecast totals and the limit."""
    from test_planner_measured import replay

    from zerofit.models.shape import shape_from_config
    from zerofit.planner.gpus import find_gpu
    from zerofit.planner.memory import FRAGMENTATION, estimate, strategy_for, workload_for
    from zerofit.planner.plan import HEADROOM

    def total(variant: str) -> float:
        cfg, _ = replay(WHY, variant)
        return (
            estimate(shape_from_config(cfg), workload_for(cfg, 1), strategy_for(cfg)).peak_reserved
            / GIB
        )

    card = find_gpu("H200").memory / GIB
    r = _c17()
    return [
        f"with the CUDA context and {FRAGMENTATION:.0%} fragmentation, must stay within "
        f"{1 - HEADROOM:.0%} of the GPU's memory",
        f"forecast totals of {total(FULL4):.1f} GiB for full AC at micro-batch 4 and "
        f"{total(FIRST20):.1f} and {total(FIRST16):.1f} GiB for the first_k runs",
        f"over the {card * (1 - HEADROOM):.1f} GiB the rule allows of the card's {card:.1f}",
        f"reserved {r[FULL4]['mem_reserved_gib']:.1f} GiB",
    ]


def planned_24gb() -> list[str]:
    o = _load(PLAN)["options"]
    best, full = o[0], next(x for x in o if x["strategy"] == o[0]["strategy"].split(" first")[0])
    r = _runs(C18, GROUP18)
    got, base = r[AS_PLANNED], r[AS_FULL]
    return [
        f"{best['strategy']} at micro-batch {best['micro_batch_size']} x accumulation "
        f"{best['grad_accum_steps']}, forecast {best['tokens_per_s']:,.0f} tokens/s",
        f"{best['tokens_per_s'] / full['tokens_per_s']:.3f}x the same strategy with full AC "
        f"({full['tokens_per_s']:,.0f})",
        f"{got['tokens_per_s']:,.0f} tokens/s ({100 * got['mfu']:.1f}% MFU); the goal is 25%",
        f"with full AC {base['tokens_per_s']:,.0f} ({100 * base['mfu']:.1f}%)",
        f"{got['tokens_per_s'] / base['tokens_per_s']:.3f}x",
        f"peak reserved {got['mem_reserved_gib']:.1f} GiB of the 22.4 GiB cap, "
        f"{got['alloc_retries']} retried allocations",
    ]


def accum_8b() -> dict[str, list]:
    """c19's rows beside c17's one-micro-batch run (the table's first row)."""
    rows = {FULL4: _c17()[FULL4], **_runs(C19, "8b-fp32-accum")}
    return {name: _row_reserved(r) for name, r in rows.items()}


def accum_summary() -> list[str]:
    from test_planner_measured import errors

    r = _runs(C19, "8b-fp32-accum")
    ga8 = r["fsdp fp32-states AC mbs4 ga8"]
    speed = [100 * errors(ACCUM, v)[0] for v in r]
    return [
        f"{ga8['tokens_per_s']:,.0f} tokens/s ({100 * ga8['mfu']:.1f}% MFU), "
        f"{100 * (1 - ga8['tokens_per_s'] / 10_000):.1f}% short of 10,000",
        f"peak allocated {ga8['mem_alloc_gib']:.1f} GiB and {ga8['alloc_retries']} retried "
        "allocations",
        f"the planner forecasts {speed[0]:+.1f}% and {speed[1]:+.1f}%",
    ]


def losses() -> list[str]:
    c17 = _load(C17)["step_losses"]
    loss = c17[f"{_variant_dir(FULL4)}/summary.json"]
    steps = {len(v) for v in _load(C19)["step_losses"].values()}
    return [
        f"c17's {len(loss)}-step runs show it: up from {loss[0]:.1f} at step 1 to about "
        f"{max(loss):.0f}, then down to {loss[-1]:.1f} by step {len(loss)}",
        f"c19's {steps.pop()}-step runs" if len(steps) == 1 else "?",
    ]


# name -> (data files, expected, key cells of a table row)
FIRST_K: dict[str, tuple[list[str], Callable[[], Any], int]] = {
    "fk-8b": ([C17], runs_8b, 1),
    "fk-8b-profile": ([C17], profiles_8b, 1),
    "fk-8b-summary": ([C17], summary_8b, 1),
    "fk-forecasts": ([WHY, PLANNED], forecasts, 1),
    "fk-forecasts-summary": ([WHY, PLANNED], forecasts_summary, 1),
    "fk-fit-rule": ([WHY, C17], fit_rule, 1),
    "fk-24gb": ([PLAN, C18], planned_24gb, 1),
    "fk-accum": ([C17, C19], accum_8b, 1),
    "fk-accum-summary": ([C19, ACCUM], accum_summary, 1),
    "fk-losses": ([C17, C19], losses, 1),
}


def index_first_k() -> list[str]:
    """The figures docs/benchmarks.md quotes from these calls."""
    r, got = _c17()[FULL4], _runs(C18, GROUP18)[AS_PLANNED]
    ga8 = _runs(C19, "8b-fp32-accum")["fsdp fp32-states AC mbs4 ga8"]
    return [
        f"{r['tokens_per_s']:,.0f} tokens/s ({100 * r['mfu']:.1f}% MFU)",
        f"{ga8['tokens_per_s']:,.0f} tokens/s ({100 * ga8['mfu']:.1f}% MFU) with 8 micro-batches "
        "per optimizer step (goal 10,000)",
        f"{got['tokens_per_s']:,.0f} tokens/s ({100 * got['mfu']:.1f}% MFU)",
    ]


INDEX_FIRST_K = ([C17, C18, C19], index_first_k)

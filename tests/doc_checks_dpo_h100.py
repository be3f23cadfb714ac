"""test_doc_figures' checks for docs/benchmarks/2026-12-06-dpo-h100.md (issue 28: zerofit's DPO
beside TRL's DPOTrainer on one H100): each table cell from its results.json, each ratio from the
medians of one device call (8B: call 4, 1B: call 5)."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

from doc_checks_speed2 import _load

DOC = "docs/benchmarks/2026-12-06-dpo-h100.md"
D = "2026-12-06-dpo-h100/"
TRL_8B, LIGER_8B = D + "8b/8b-dpo-trl/results.json", D + "8b/8b-dpo-trl-liger/results.json"
ZF_8B = D + "8b/8b-dpo-zerofit/results.json"
TRL_1B, ZF_1B = D + "1b/1b-dpo-trl/results.json", D + "1b/1b-dpo-zerofit/results.json"


def _zerofit(rel: str) -> dict:
    (result,) = _load(rel)["results"]
    assert result["status"] == "ok" and result["measured_steps"] == 10
    return result


def _trl(rel: str) -> dict:
    run = _load(rel)
    assert len(run["step_times"]) == 13  # 3 warm-up steps, then the 10 timed ones
    return run


def dpo_table() -> dict[str, list]:
    """Per stack: real tokens/s, median step s, peak allocated GiB, zerofit's tokens/s over it."""
    trl8, liger8, zf8 = _trl(TRL_8B), _trl(LIGER_8B), _zerofit(ZF_8B)
    trl1, zf1 = _trl(TRL_1B), _zerofit(ZF_1B)

    def stock(run: dict, zf: dict) -> list:
        ratio = zf["real_tokens_per_s"] / run["real_tokens_per_s"]
        return [run["real_tokens_per_s"], run["step_s_median"], run["peak_allocated_gib"], ratio]

    def ours(zf: dict) -> list:
        return [zf["real_tokens_per_s"], zf["step_time_s"], zf["mem_alloc_gib"], "–"]

    return {
        "8B LoRA | TRL + PEFT, gradient checkpointing": stock(trl8, zf8),
        "8B LoRA | TRL + PEFT + Liger Kernel, gradient checkpointing": stock(liger8, zf8),
        "8B LoRA | zerofit, configs/dpo-lora.yaml": ours(zf8),
        "1B full | TRL, a frozen copy as the reference": stock(trl1, zf1),
        "1B full | zerofit, the reference's log-probs computed first": ours(zf1),
    }


def readme_dpo() -> list[str]:
    """The README's DPO headline: zerofit against the faster TRL run (8B), and TRL (1B)."""
    liger8, zf8 = _trl(LIGER_8B), _zerofit(ZF_8B)
    trl1, zf1 = _trl(TRL_1B), _zerofit(ZF_1B)
    r8 = zf8["real_tokens_per_s"] / liger8["real_tokens_per_s"]
    r1 = zf1["real_tokens_per_s"] / trl1["real_tokens_per_s"]
    return [
        f"8B LoRA DPO runs {zf8['real_tokens_per_s']:,.0f} real tokens/s, {r8:.2f}x TRL + PEFT + "
        f"Liger Kernel in the same call, but at {zf8['mem_alloc_gib']:.1f} GiB against its "
        f"{liger8['peak_allocated_gib']:.1f}",
        f"1B full DPO runs {zf1['real_tokens_per_s']:,.0f}, {r1:.2f}x TRL, at "
        f"{zf1['mem_alloc_gib']:.1f} GiB against {trl1['peak_allocated_gib']:.1f}",
        *readme_dpo_mem(),
        *readme_dpo_ac(),
        *readme_dpo_ac2(),
    ]


def readme_dpo_ac() -> list[str]:
    """The README's sentence on the recomputing call: DDP at 4 pairs x 2 against TRL + Liger."""
    return _readme_against(GC, ZF_AC, "DDP + full AC, 4 pairs x 2", "against {:.1f} GiB")


def readme_dpo_ac2() -> list[str]:
    """The README's sentence on TRL's memory: DDP + AC at one pair a micro-batch (one call)."""
    return _readme_against(GC2, ZF_AC2, "DDP + full AC, 1 pair x 8", "against its {:.2f} GiB")


def _readme_against(gc_path: str, zf_path: str, variant: str, trl_memory: str) -> list[str]:
    """A README sentence: one zerofit run of a recomputing call against its TRL + Liger run."""
    gc, zf = _trl(gc_path), _recomputing_runs(zf_path)[variant]
    ratio = zf["real_tokens_per_s"] / gc["real_tokens_per_s"]
    return [
        f"runs {zf['real_tokens_per_s']:,.0f} real tokens/s, {ratio:.2f}x TRL + PEFT + Liger "
        f"Kernel's {gc['real_tokens_per_s']:,.0f}, at {zf['mem_alloc_gib']:.1f} GiB "
        + trl_memory.format(gc["peak_allocated_gib"]),
    ]


def readme_dpo_mem() -> list[str]:
    """The README's matched-memory sentence: neither side recomputing (one call)."""
    nogc, (pick, _) = _trl(NOGC), _load(ZF_MEM)["results"]
    ratio = pick["real_tokens_per_s"] / nogc["real_tokens_per_s"]
    return [
        f"8B LoRA DPO runs {pick['real_tokens_per_s']:,.0f} real tokens/s, {ratio:.2f}x TRL + "
        f"PEFT + Liger Kernel's {nogc['real_tokens_per_s']:,.0f}, at {pick['mem_alloc_gib']:.1f} "
        f"GiB against {nogc['peak_allocated_gib']:.1f} GiB",
    ]


DPO_H100: dict[str, tuple[list[str], Callable[[], Any], int]] = {
    "dpo-h100": ([TRL_8B, LIGER_8B, ZF_8B, TRL_1B, ZF_1B], dpo_table, 2),
}


MEM = "2026-12-06-dpo-8b-mem-h100/"
NOGC, ZF_MEM = MEM + "8b-dpo-trl-liger-nogc/results.json", MEM + "8b-dpo-zerofit-mem/results.json"


def dpo_8b_mem() -> dict[str, list]:
    """The matched-memory call: TRL + Liger without checkpointing, zerofit's two variants."""
    nogc, runs = _trl(NOGC), _load(ZF_MEM)["results"]
    assert [r["status"] for r in runs] == ["ok", "ok"]
    pick, capped = runs
    assert "parallel.activation_checkpointing=full" in pick["overrides"]
    assert "train.gpu_memory_limit=20GiB" in capped["overrides"]

    def ours(zf: dict) -> list:
        ratio = zf["real_tokens_per_s"] / nogc["real_tokens_per_s"]
        return [zf["real_tokens_per_s"], zf["step_time_s"], zf["mem_alloc_gib"], ratio]

    return {
        "TRL + PEFT + Liger Kernel, no gradient checkpointing": [
            nogc["real_tokens_per_s"],
            nogc["step_s_median"],
            nogc["peak_allocated_gib"],
            "–",
        ],
        "zerofit, the planner's pick (the variant that asked for full AC)": ours(pick),
        "zerofit, planned for a 20 GiB card (`train.gpu_memory_limit=20GiB`)": ours(capped),
    }


DPO_H100["dpo-8b-mem"] = ([NOGC, ZF_MEM], dpo_8b_mem, 1)


AC = "2026-12-06-dpo-8b-ac-h100/"
GC, ZF_AC = AC + "8b-dpo-trl-liger/results.json", AC + "8b-dpo-zerofit-ac/results.json"
AC_ROWS = {  # the doc's row -> (the bench variant, the plan JSON of its config)
    "zerofit, DDP + full AC, 4 pairs x 2": ("DDP + full AC, 4 pairs x 2", "plan-ddp42.json"),
    "zerofit, DDP + full AC, 2 pairs x 4": ("DDP + full AC, 2 pairs x 4", "plan-ddp24.json"),
    "zerofit, `backend: auto` + full AC written (ran as FSDP full-shard without AC: see below), 2 pairs x 4": (
        "auto + full AC, 2 pairs x 4",
        "plan-auto.json",
    ),
}


def _recomputing_runs(rel: str) -> dict[str, dict]:
    """A recomputing call's zerofit runs by variant (each ran 10 steps with full AC written)."""
    runs = {r["name"]: r for r in _load(rel)["results"]}
    assert all(r["status"] == "ok" and r["measured_steps"] == 10 for r in runs.values())
    assert all("parallel.activation_checkpointing=full" in r["overrides"] for r in runs.values())
    return runs


def _recomputing_table(gc_path: str, zf_path: str, rows: dict) -> dict[str, list]:
    """A recomputing call: TRL + Liger with gradient checkpointing, then each of zerofit's runs."""
    gc, runs = _trl(gc_path), _recomputing_runs(zf_path)
    assert gc["stack"] == "trl-dpo+peft+liger+gc" and gc["micro"] * gc["accum"] == 8
    row = "TRL + PEFT + Liger Kernel, gradient checkpointing, 4 pairs x 2"
    out = {row: [gc["real_tokens_per_s"], gc["step_s_median"], gc["peak_allocated_gib"], "–"]}
    for row, (name, _) in rows.items():
        zf = runs[name]
        ratio = zf["real_tokens_per_s"] / gc["real_tokens_per_s"]
        out[row] = [zf["real_tokens_per_s"], zf["step_time_s"], zf["mem_alloc_gib"], ratio]
    return out


def _plan_errors(folder: str, zf_path: str, rows: dict) -> dict[str, list]:
    """Each zerofit run against `plan --json`'s as-configured row for its config."""
    runs, out = _recomputing_runs(zf_path), {}
    for row, (name, plan) in rows.items():
        zf, f = runs[name], _load(folder + plan)["as_configured"]
        out[row.removeprefix("zerofit, ")] = [
            f["peak_allocated_gib"],
            100 * (f["peak_allocated_gib"] / zf["mem_alloc_gib"] - 1),
            f["step_time_s"],
            100 * (f["step_time_s"] / zf["step_time_s"] - 1),
        ]
    return out


def _plans(folder: str, rows: dict) -> list[str]:
    return list(dict.fromkeys(folder + plan for _, plan in rows.values()))


DPO_H100["dpo-8b-ac"] = ([GC, ZF_AC], partial(_recomputing_table, GC, ZF_AC, AC_ROWS), 1)
DPO_H100["dpo-8b-ac-plan"] = (
    [ZF_AC, *_plans(AC, AC_ROWS)],
    partial(_plan_errors, AC, ZF_AC, AC_ROWS),
    1,
)
AC2 = "2026-12-06-dpo-8b-ac2-h100/"
GC2, ZF_AC2 = AC2 + "8b-dpo-trl-liger/results.json", AC2 + "8b-dpo-zerofit-ac2/results.json"
AC2_ROWS = {  # the doc's row -> (the bench variant, the plan JSON of its resolved config)
    "zerofit, `backend: auto` + full AC (resolved to FSDP full-shard + AC), 2 pairs x 4": (
        "auto + full AC, 2 pairs x 4",
        "plan-fsdp24.json",
    ),
    "zerofit, `backend: auto` + full AC (resolved to DDP + AC), 1 pair x 8": (
        "auto + full AC, 1 pair x 8",
        "plan-ddp18.json",
    ),
    "zerofit, DDP + full AC, 1 pair x 8": ("DDP + full AC, 1 pair x 8", "plan-ddp18.json"),
}


DPO_H100["dpo-8b-ac2"] = ([GC2, ZF_AC2], partial(_recomputing_table, GC2, ZF_AC2, AC2_ROWS), 1)
DPO_H100["dpo-8b-ac2-plan"] = (
    [ZF_AC2, *_plans(AC2, AC2_ROWS)],
    partial(_plan_errors, AC2, ZF_AC2, AC2_ROWS),
    1,
)
README_DPO = (
    [LIGER_8B, ZF_8B, TRL_1B, ZF_1B, NOGC, ZF_MEM, GC, ZF_AC, GC2, ZF_AC2],
    readme_dpo,
)

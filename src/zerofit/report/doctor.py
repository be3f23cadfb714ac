"""`zerofit doctor RUN_DIR`: the seed's OOM checklist, executable, and the OOM diagnosis.

Each check reads what the run wrote (config.yaml, sharding/rank*.json, precision.json, env.json,
metrics.jsonl) and returns a verdict: ok, warn or FAIL, with one line of why and what to do.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from zerofit.backends import engine_of, engines
from zerofit.backends.terms import GIB
from zerofit.config import Config, with_fields
from zerofit.errors import UserError
from zerofit.launch.run_config import load_config
from zerofit.models.shape import shape_from_config
from zerofit.planner.gpus import gpu_named
from zerofit.planner.memory import predicted_peak, strategy_for, workload_for
from zerofit.planner.shape import Hardware, with_gpu
from zerofit.planner.speed import predict

if TYPE_CHECKING:
    from rich.console import Console

# A run this much slower than its forecast is worth a look (the roofline's own error reaches
# ~50% held out: docs/benchmarks), and what to look at.
SLOW = 0.5
SLOW_WHY = (
    "; over half below the forecast: a slow data loader, CPU-bound steps, a slower NCCL "
    "transport (see environment) or frequent checkpoints?"
)


@dataclass
class Finding:
    check: str
    status: str  # ok | warn | FAIL
    message: str


def _json(path: Path) -> Any:
    return json.loads(path.read_text()) if path.is_file() else None


def check_sharding(cfg: Config, run: Path) -> Finding:
    files = sorted((run / "sharding").glob("rank*.json"))
    if not files:
        return Finding(
            "sharding", "warn", "no sharding/rank*.json: the run stopped before its model was built"
        )
    reports = [json.loads(f.read_text()) for f in files]
    world = reports[0]["world_size"]
    share = max(r["local_numel"] / r["global_numel"] for r in reports)
    eng = engine_of(cfg)
    opts = eng.opts(cfg)
    expect = eng.shard_share(opts, world)
    text = f"each rank holds {100 * share:.1f}% of the {reports[0]['global_numel']:,} parameters ({world} ranks)"
    verdict = eng.unsharded(opts, world) if world > 1 and share > 0.99 else None
    if verdict is not None:
        status, why = verdict
        return Finding("sharding", status, f"parameters are NOT sharded: {text}{why}")
    if share > expect * 1.05 + 1e-9:
        return Finding("sharding", "warn", f"{text}; expected about {100 * expect:.1f}%")
    return Finding("sharding", "ok", text)


def check_precision(cfg: Config, run: Path) -> Finding:
    rep = _json(run / "precision.json")
    if rep is None:
        return Finding(
            "precision", "warn", "no precision.json: the run stopped before its first step"
        )
    eff = rep["effective"]
    text = ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in eff.items())
    if eff.get("compute") == "fp16" and cfg.precision.param_dtype != "fp16":
        return Finding(
            "precision",
            "FAIL",
            f"compute runs in fp16 but precision.param_dtype is "
            f"{cfg.precision.param_dtype}: a manual .half() on the model or inputs? Use precision.* instead "
            "(fp16 without the engine's loss scaling overflows)",
        )
    if eff.get("master_weights") in ("fp16", "bf16") and cfg.precision.master_dtype == "fp32":
        return Finding(
            "precision",
            "FAIL",
            f"master weights are {eff['master_weights']} but precision.master_dtype is fp32: "
            "the model was cast (.half()/.bfloat16()) before the engine wrapped it",
        )
    if rep["warnings"]:
        return Finding("precision", "warn", f"{text}; " + "; ".join(rep["warnings"]))
    return Finding("precision", "ok", text)


def check_batch(cfg: Config, run: Path) -> Finding:
    world = (_json(run / "summary.json") or {}).get("world_size") or (
        _json(run / "env.json") or {}
    ).get("world_size")
    t = cfg.train
    if world is None:
        return Finding("batch", "warn", "world size unknown (no summary.json or env.json)")
    total = t.micro_batch_size * t.grad_accum_steps * world
    text = (
        f"micro_batch_size {t.micro_batch_size} x grad_accum_steps {t.grad_accum_steps} x {world} ranks = "
        f"{total} sequences = {total * cfg.model.seq_len:,} tokens per optimizer step"
    )
    if t.global_batch_size is not None and t.global_batch_size != total:
        return Finding(
            "batch", "FAIL", f"{text}, but train.global_batch_size is {t.global_batch_size}"
        )
    return Finding("batch", "ok", text)


def check_environment(run: Path) -> Finding:
    env = _json(run / "env.json")
    if env is None:
        return Finding("environment", "warn", "no env.json")
    issues = []
    variables = env.get("env", {})
    if variables.get("CUDA_LAUNCH_BLOCKING") == "1":
        issues.append("CUDA_LAUNCH_BLOCKING=1 serializes every kernel (debug only)")
    for var in ("NCCL_P2P_DISABLE", "NCCL_IB_DISABLE", "NCCL_SHM_DISABLE"):
        if variables.get(var) == "1":
            issues.append(f"{var}=1 forces a slower transport")
    if variables.get("NCCL_DEBUG") in ("INFO", "TRACE"):
        issues.append(f"NCCL_DEBUG={variables['NCCL_DEBUG']} is verbose")
    gpus = env.get("gpus", [])
    if env.get("device") == "cuda" and len(set(gpus)) > 1:
        issues.append(f"mixed GPU models: {sorted(set(gpus))}: the slowest sets the pace")
    text = f"torch {env.get('torch')}, {env.get('device')}" + (
        f", {len(gpus)} x {gpus[0]}" if gpus else ""
    )
    return Finding(
        "environment",
        "warn" if issues else "ok",
        text + ("; " + "; ".join(issues) if issues else ""),
    )


def check_memory(cfg: Config, run: Path) -> Finding:
    peaks = [(r["step"], r["mem_alloc_gib"]) for r in _metrics(run) if "mem_alloc_gib" in r]
    if not peaks:
        return Finding(
            "memory", "ok", "no GPU memory in metrics.jsonl (a CPU run): nothing to compare"
        )
    world = (_json(run / "summary.json") or {}).get("world_size") or 1
    predicted, _ = predicted_peak(cfg, world)
    timeline = "  ".join(f"{s}:{g:.1f}" for s, g in peaks[:8]) + (" ..." if len(peaks) > 8 else "")
    measured = max(g for _, g in peaks)
    text = (
        f"peak allocated by step (GiB): {timeline}; planner predicted {predicted:.1f} GiB, "
        f"measured {measured:.1f} ({percent(measured, predicted)})"
    )
    if len(peaks) >= 4 and peaks[-1][1] > peaks[len(peaks) // 2][1] * 1.05:
        return Finding(
            "memory",
            "warn",
            text
            + "; still growing in the second half of the run: a leak (tensors kept across steps)?",
        )
    if measured > predicted * 1.15:
        return Finding(
            "memory",
            "warn",
            text + f"; measured is {100 * (measured / predicted - 1):.0f}% above the plan",
        )
    return Finding("memory", "ok", text)


def percent(measured: float, predicted: float) -> str:
    """The forecast's error as the run saw it: measured against predicted, signed."""
    return f"{100 * (measured / predicted - 1):+.0f}% against the forecast"


def _metrics(run: Path) -> list[dict[str, Any]]:
    path = run / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []


def forecast_hardware(env: dict[str, Any], world: int) -> tuple[Hardware, str]:
    """The machine a run had, as the planner describes it: its card (env.json's device names;
    one the planner's table lacks gets an H200's figures, and the words say so), the GPUs one
    node saw, the nodes the world size makes."""
    names = env.get("gpus") or []
    per_node = len(names) if names and world % len(names) == 0 else world
    hw = Hardware(gpus_per_node=per_node, gpu_mem=0, nodes=world // per_node)
    gpu = gpu_named(names[0]) if names else None
    if gpu is not None:
        return with_gpu(hw, gpu), gpu.name
    card = names[0] if names else "GPU"
    return hw, f"{card} (not in the planner's table: an H200's figures assumed)"


def check_speed(cfg: Config, run: Path) -> Finding:
    """Measured tokens/s (metrics.jsonl: the median of the logged windows after the first, which
    holds the warm-up and compilation) against the planner's roofline for the run's config."""
    env = _json(run / "env.json") or {}
    # every place of the rows, as the roofline counts them (DPO's repeated prompts added back)
    rates = [
        r["tokens_per_s"] + r.get("repeated_tokens_per_s", 0.0)
        for r in _metrics(run)
        if "tokens_per_s" in r
    ]
    if env.get("device") != "cuda" or not rates:
        why = "a CPU run" if env.get("device") == "cpu" else "no tokens/s in metrics.jsonl"
        return Finding("speed", "ok", f"{why}: nothing to compare with the forecast")
    world = (_json(run / "summary.json") or {}).get("world_size") or env.get("world_size") or 1
    hw, card = forecast_hardware(env, world)
    m, w = shape_from_config(cfg), workload_for(cfg, world)
    predicted = predict(m, w, strategy_for(cfg), hw).tokens_per_s
    kept = rates[1:] or rates
    measured = statistics.median(kept)
    windows = f"median of {len(kept)} logged window{'s' * (len(kept) > 1)}" + (
        " after the first" if len(rates) > 1 else ", warm-up included"
    )
    text = (
        f"measured {measured:,.0f} tokens/s ({windows}), planner predicted {predicted:,.0f} on "
        f"{world} x {card}: {percent(measured, predicted)}"
    )
    slow = measured < predicted * (1 - SLOW)
    return Finding("speed", "warn" if slow else "ok", text + (SLOW_WHY if slow else ""))


def diagnose(run: Path) -> list[Finding]:
    files = sorted(run.glob("config*.yaml"))
    if not files:
        raise UserError(f"{run} is not a zerofit run directory (no config.yaml)")
    cfg = load_config(files[-1])
    return [
        check_sharding(cfg, run),
        check_precision(cfg, run),
        check_batch(cfg, run),
        check_environment(run),
        check_memory(cfg, run),
        check_speed(cfg, run),
    ]


def _checkpointing_remedies(cfg: Config) -> list[tuple[str, dict[str, Any]]]:
    """Recompute more: under first_k, each larger count of first blocks, fewest first; then
    every block (nothing under full)."""
    p = cfg.parallel
    full = {"parallel.activation_checkpointing": "full", "parallel.ac_blocks": None}
    if p.activation_checkpointing == "full":
        return []  # every block recomputes already
    if p.activation_checkpointing != "first_k":
        return [("turn on activation checkpointing", full)]
    k, n = p.ac_blocks or 0, shape_from_config(cfg).n_layers
    more = [
        (f"recompute the first {j} blocks (parallel.ac_blocks: {j})", {"parallel.ac_blocks": j})
        for j in range(k + 1, n)
    ]
    return [*more, (f"recompute all {n} blocks (parallel.activation_checkpointing: full)", full)]


def oom_advice(cfg: Config, world: int, gpu_mem: int) -> str:
    """Why a run ran out of memory (its biggest component) and the planner's next step, on the
    card's memory or, with `train.gpu_memory_limit`, the cap the run had."""
    limit, capped = cfg.train.gpu_memory_limit, False
    if limit is not None and limit < gpu_mem:
        gpu_mem, capped = limit, True
    predicted, parts = predicted_peak(cfg, world)
    biggest = max((k for k in parts if k != "overhead"), key=parts.get)  # type: ignore[arg-type]
    tries: list[tuple[str, dict[str, Any]]] = [*_checkpointing_remedies(cfg)]
    mb = cfg.train.micro_batch_size
    if mb > 1:  # never advise lowering a micro-batch that is already 1
        tries.append(
            (
                f"halve the micro-batch to {mb // 2} (and double grad_accum_steps)",
                {
                    "train.micro_batch_size": mb // 2,
                    "train.grad_accum_steps": cfg.train.grad_accum_steps * 2,
                },
            )
        )
    for eng in engines().values():
        tries += eng.remedies(cfg)
    advice = f"biggest component: {biggest} ({parts[biggest]:.1f} GiB of a predicted {predicted:.1f} GiB peak allocated)"
    if capped:
        advice += f"; the GPU was capped at {gpu_mem / GIB:.1f} GiB by train.gpu_memory_limit"
    for text, fields in tries:
        try:
            new = with_fields(cfg, fields)
        except UserError:  # a remedy this config cannot take
            continue
        peak, _ = predicted_peak(new, world)
        if peak * 1.1 + 0.6 < gpu_mem / GIB:
            return f"{advice}; next step: {text} (predicted {peak:.1f} GiB)"
    return f"{advice}; no single change fits: run `zerofit plan -c config.yaml` for the options"


def print_report(findings: list[Finding], console: Console | None = None) -> int:
    """One line a finding: its status, its check and its message. On a terminal the message wraps
    under itself within ``table_width`` (100 columns or the terminal's width); elsewhere (a pipe,
    a log) each finding is one whole line."""
    from rich.console import Console  # light CLI start: every `zerofit` run imports this module
    from rich.table import Table  # light CLI start, as above
    from rich.text import Text  # light CLI start, as above

    from zerofit.report.tables import Widened, table_width  # imports rich: light CLI start

    console = console or Console()
    width = table_width(console)
    colour = {"ok": "green", "warn": "yellow", "FAIL": "bold red"}
    for f in findings:
        if width is None:
            console.print(f"{f.status:>4}  {f.check:<12} {f.message}", soft_wrap=True, markup=False)
            continue
        grid = Table.grid(padding=(0, 1))
        grid.add_column(width=5, justify="right")
        grid.add_column(width=12)
        grid.add_column(overflow="fold")
        grid.add_row(Text(f.status, style=colour[f.status]), Text(f.check), Text(f.message))
        console.print(Widened(grid, width), crop=False)
    return 1 if any(f.status == "FAIL" for f in findings) else 0

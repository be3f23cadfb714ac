"""The planner against real H200 runs, read from their committed results.json.

Each bench call's config is replayed from its `meta.command` and each variant's overrides, then
predicted on one H200 and compared with the run's median tokens/s and peak allocated memory.

- **In-sample**: the runs the planner's constants were fitted on (`EFFICIENCY`/`COMPILE_GAIN` per
  engine, `WIDTH_GAIN`, the CPU Adam rate, the compiled-activation count), and later re-measurements
  of the same configurations, and the 2026-12-03 24 GB rehearsal the offload terms were checked on.
  Passing here shows the fit, not a forecast.
- **Held-out**: runs used in no fit. Their errors are what to expect of a new configuration.
- **Held-out `--measure-out` files**: every JSON that `zerofit plan --measure K --measure-out PATH`
  wrote under data/2026-12-0?-planner-heldout*/, one test per row (named `held-out:...`): each row
  forecast again with today's planner, memory within HELDOUT_MEMORY and step time within
  HELDOUT_TIME of what was measured; the rows it misses are listed (HELDOUT_MISSES, strict xfail,
  with the miss) rather than left out.
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict
from pathlib import Path

import pytest

from zerofit.commands import plan_measure
from zerofit.launch.child_run import Outcome
from zerofit.launch.run_config import load_config
from zerofit.models.shape import shape_from_config
from zerofit.planner.memory import estimate, strategy_for, workload_for
from zerofit.planner.plan import evaluate
from zerofit.planner.shape import Hardware
from zerofit.planner.speed import predict

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
from planner_corpus import REHEARSAL_1_5B, command_parts  # noqa: E402  (the residual tool's copy of the plan)

DATA = ROOT / "docs" / "benchmarks" / "data"
H200 = Hardware(gpus_per_node=1, gpu_mem=141 * 10**9, cpu_mem=125 * 2**30)
GIB = 2**30

S4 = "2026-12-04-speed2-h200/"
FK = "2026-12-04-first-k-h200/"
# Runs whose config file lay outside the repository, kept beside their results under data/ (the
# plans `zerofit plan --write` wrote there, and the call's shared config): results -> that copy.
CONFIG_COPY = {
    S4 + "24gb-1.5b-results.json": S4 + "plans/1.5b-24gb.yaml",
    S4 + "24gb-3.6b-results.json": S4 + "plans/3.6b-24gb.yaml",
    S4 + "24gb-3.6b-compile-results.json": S4 + "plans/3.6b-24gb.yaml",
    S4 + "24gb-1.5b-levers-results.json": S4 + "plans/1.5b-levers.yaml",
    FK + "24gb-1.5b-first-k-results.json": FK + "plans/1.5b-24gb.yaml",
}
IN_SAMPLE = [  # (results.json, variant, speed tolerance): the fitted runs and their repeats
    ("2026-12-02-speed/pair-1b-results.json", "fsdp mbs8 ga2", 0.10),
    ("2026-12-02-speed/pair-1b-results.json", "zero3 mbs8 ga2", 0.10),
    ("2026-12-02-speed/all-13b-results.json", "zero3 optim 50% cpu bf16-states", 0.20),
    ("2026-12-03-house-h200/8b/results.json", "fsdp bf16-states mbs2 ga2", 0.10),
    ("2026-12-03-house-h200/8b/results.json", "zero3 bf16-states mbs2 ga2", 0.10),
    ("2026-12-03-house-h200/1b/results.json", "fsdp mbs8 ga2", 0.10),
    ("2026-12-03-house-h200/1b/results.json", "zero3 mbs8 ga2", 0.10),
    ("2026-12-03-house-h200/13b/results.json", "zero3 optim 50% cpu bf16-states", 0.20),
    # The 24 GB rehearsal (ZeRO-3 optimizer offload at micro-batch 1 x 64, eager: the plan had
    # dropped compile). In-sample: it is the run the per-micro-batch offload copies and DeepSpeed's
    # sub-group placement were checked on (backends/deepspeed/spec.py); no constant was refitted.
    ("2026-12-03-speed2-h200/c2/24gb-1.5b-results.json", "planned for 24GB", 0.20),
    # FSDP2 CPU offload on a 24 GB cap (llama3-1b, 16 x 4, AC, compile): the pair the CPU AdamW
    # rates were fitted on (backends/fsdp/spec.py: FUSED_CPU_ADAM_BW, FOREACH_CPU_ADAM_BW).
    (S4 + "24gb-1.5b-levers-results.json", "fsdp offload fused adamw 16x4", 0.05),
    (S4 + "24gb-1.5b-levers-results.json", "fsdp offload foreach adamw 16x4", 0.05),
]
# Runs whose config file was not kept (a path outside the repository): the fields it ran with.
REBUILT = {
    # what `zerofit plan --write` wrote (c2/1.5b-plan-a87e507.json, its first option), + the call's
    "2026-12-03-speed2-h200/c2/24gb-1.5b-results.json": REHEARSAL_1_5B,
}
HELD_OUT = [  # (results.json, variant, stated speed error bound): in no fit
    ("2026-12-02-speed/first-call-8b-results.json", "fsdp bf16-states mbs1 ga4", 0.12),
    ("2026-12-02-speed/first-call-8b-results.json", "fsdp bf16-states mbs2 ga2", 0.12),
    # The 2026-12-04 24 GB runs of DeepSpeed offload (speed2_h200.sh c10, c13): no constant was
    # fitted on them. Their misses are in RUN_MISSES.
    (S4 + "24gb-1.5b-results.json", "planned for 24GB", 0.10),
    (S4 + "24gb-1.5b-results.json", "planned for 24GB + compile", 0.10),
    (S4 + "24gb-3.6b-results.json", "planned for 24GB", 0.10),
    (S4 + "24gb-3.6b-compile-results.json", "planned for 24GB + compile", 0.10),
    (S4 + "24gb-1.5b-levers-results.json", "zero3 optim+params cpu 8x8 compile", 0.10),
    (S4 + "24gb-1.5b-levers-results.json", "zero3 optim cpu 8x8 compile", 0.10),
    # Recomputing the first k blocks (speed2_h200.sh c17, c18; docs/benchmarks/
    # 2026-12-04-first-k-h200.md): no constant was fitted for first_k, its memory and recompute
    # follow from the per-block terms. At 8B with fp32 masters the card is nearly full and
    # first_k's retried allocations idle the GPU (a speed miss, RUN_MISSES).
    (FK + "8b-fp32-first-k-why-results.json", "fsdp fp32-states AC mbs4", 0.10),
    (FK + "8b-fp32-first-k-why-results.json", "fsdp fp32-states AC first 20 mbs4", 0.10),
    (FK + "8b-fp32-first-k-why-results.json", "fsdp fp32-states AC mbs2", 0.10),
    (FK + "8b-fp32-first-k-why-results.json", "fsdp fp32-states AC first 16 mbs2", 0.10),
    (FK + "24gb-1.5b-first-k-results.json", "planned for 24GB", 0.10),
    (FK + "24gb-1.5b-first-k-results.json", "planned for 24GB, full AC", 0.10),
    # c19: the same 8B run with 4 and 8 micro-batches per optimizer step (speed misses: the
    # planner has no term of its own for the AdamW step, so it does not see accumulation spread it)
    (FK + "8b-fp32-accum-results.json", "fsdp fp32-states AC mbs4 ga4", 0.10),
    (FK + "8b-fp32-accum-results.json", "fsdp fp32-states AC mbs4 ga8", 0.10),
]
# What today's forecast misses among the runs above (strict xfail: fixing one makes it XPASS).
# ZeRO-3 offload with compile and AC, and the 3.6B shape eager, run faster than forecast; memory
# is over-forecast for ZeRO-3 compiled with the parameters on the GPU and for FSDP2 offload at
# micro-batch 16.
RUN_MISSES = {  # (results.json, variant) -> {"speed" | "memory": the miss}
    (S4 + "24gb-1.5b-results.json", "planned for 24GB + compile"): {"speed": "-11.6%"},
    (S4 + "24gb-3.6b-results.json", "planned for 24GB"): {"speed": "-25.5%"},
    (S4 + "24gb-3.6b-compile-results.json", "planned for 24GB + compile"): {"speed": "-25.3%"},
    (S4 + "24gb-1.5b-levers-results.json", "zero3 optim+params cpu 8x8 compile"): {
        "speed": "-23.7%"
    },
    (S4 + "24gb-1.5b-levers-results.json", "zero3 optim cpu 8x8 compile"): {"memory": "+20.6%"},
    (S4 + "24gb-1.5b-levers-results.json", "fsdp offload fused adamw 16x4"): {"memory": "+28.3%"},
    (S4 + "24gb-1.5b-levers-results.json", "fsdp offload foreach adamw 16x4"): {"memory": "+28.3%"},
    (FK + "8b-fp32-first-k-why-results.json", "fsdp fp32-states AC first 16 mbs2"): {
        "speed": "+25.1%"
    },
    (FK + "8b-fp32-accum-results.json", "fsdp fp32-states AC mbs4 ga4"): {"speed": "-10.7%"},
    (FK + "8b-fp32-accum-results.json", "fsdp fp32-states AC mbs4 ga8"): {"speed": "-12.1%"},
}
MEMORY_TOLERANCE = 0.10
HELDOUT_GLOB = "2026-12-0?-planner-heldout*/**/*.json"
# Held-out rows the forecast misses, by today's planner (strict xfail: a planner that comes within
# the bounds makes them XPASS, and the entry must go). The 2026-12-03 files (speed2_h200.sh c3/c8;
# eager, 4,096 or 2,048 tokens per step, steps of 0.1-0.7 s): peak memory is within 5% for every
# DDP/FSDP row and off by up to 15% for ZeRO-1/2; the step time is under-forecast everywhere but
# the offload rows (-3% to -9%), most where activation checkpointing or DeepSpeed adds host work.
# Part of that is the measurement: `--measure` then warmed up 2 steps, so its first timed step
# still recorded CUDA allocations (now WARMUP >= MEMORY_HISTORY_STEPS); how much is not known
# until a re-run. The 2026-12-04 re-run of a (3-step warm-up) answered it: DDP within 10%, the
# rest still under-forecast. The same day ZeRO-1/2's memory terms were derived from DeepSpeed's
# source (no constant fitted): every ZeRO-1/2 row within 3.3% (was up to 15.2%), and ZeRO-3's:
# every memory row within 5%.
HELDOUT_MISSES = {  # file under data/ -> strategy -> what missed (`python tests/<this file>`)
    # With the host term (planner.speed.host_seconds, 2026-12-05), fitted on the 2026-12-04 file:
    # the 2026-12-03 files (held out) go from a median |error| of 56% to 22%, still under: their
    # first timed step recorded allocations, which slows the host (12-03 a is 1.24x 12-04 a).
    "2026-12-03-planner-heldout/a-measured.json": {
        "DDP": "step time -15.8%",
        "FSDP grad-op + AC": "step time -26.0%",
        "ZeRO-1": "step time -22.4%",
        "ZeRO-2 + SAC": "step time -28.7%",
        "ZeRO-3 + AC": "step time -22.4%",
    },
    "2026-12-03-planner-heldout/b-measured.json": {
        "DDP": "step time -19.9%",
        "FSDP full-shard + SAC": "step time -27.0%",
        "FSDP grad-op + AC": "step time -26.4%",
        "ZeRO-1": "step time -11.3%",
        "ZeRO-2 + SAC": "step time -35.3%",
        "ZeRO-3 + AC": "step time -24.8%",
    },
    "2026-12-03-planner-heldout/c-measured.json": {
        "DDP": "step time -39.0%",
        "FSDP full-shard + SAC": "step time -18.4%",
        "FSDP grad-op + AC": "step time -26.9%",
        "ZeRO-1": "step time -44.7%",
        "ZeRO-2 + SAC": "step time -22.4%",
        "ZeRO-3 + AC": "step time -27.6%",
    },
    "2026-12-03-planner-heldout/d-measured.json": {
        "DDP": "step time -21.5%",
        "FSDP grad-op + AC": "step time -16.9%",
        "ZeRO-1": "step time -21.8%",
        "ZeRO-2 + SAC": "step time -39.2%",
        "ZeRO-3 + AC": "step time -32.9%",
    },
    # the fit set itself: the two rows the fit leaves outside 10%
    "2026-12-04-planner-heldout/a-measured.json": {
        "FSDP full-shard + SAC": "step time -15.3%",
        "ZeRO-3 + AC": "step time +10.2%",
    },
}
HELDOUT_MEMORY = plan_measure.MEMORY_BOUND  # 5%, as `--measure` counts its hits
HELDOUT_TIME = plan_measure.TIME_BOUND  # 10%


def replay(results: str, variant: str) -> tuple[object, dict]:
    """The config a bench variant ran with, and its measured result."""
    data = json.loads((DATA / results).read_text())
    if results in REBUILT:
        run = next(r for r in data["results"] if r["name"] == variant)
        return load_config(None, [*REBUILT[results], *run["overrides"]]), run
    run = next(r for r in data["results"] if r["name"] == variant)
    if results in CONFIG_COPY:  # a config outside the repository; the variant's own overrides
        return load_config(str(DATA / CONFIG_COPY[results]), run["overrides"]), run
    config, shared = command_parts(data["meta"]["command"])
    config = str(ROOT / config) if config else None
    return load_config(config, [*shared, *run["overrides"]]), run


def forecast(results: str, variant: str) -> tuple[float, float, dict]:
    """Today's forecast of a bench variant on one H200: (tokens/s, peak allocated GiB, the run)."""
    cfg, run = replay(results, variant)
    shape, work, strategy = shape_from_config(cfg), workload_for(cfg, 1), strategy_for(cfg)
    tps = predict(shape, work, strategy, H200).tokens_per_s
    return tps, estimate(shape, work, strategy).peak_allocated / GIB, run


def errors(results: str, variant: str) -> tuple[float, float]:
    """(speed error, memory error) of the prediction: predicted / measured - 1."""
    tps, memory, run = forecast(results, variant)
    return tps / run["tokens_per_s"] - 1, memory / run["mem_alloc_gib"] - 1


def checked(runs: list[tuple[str, str, float]], what: str) -> list:
    """One pytest param per run for `what` ("speed" or "memory"), strict xfail where RUN_MISSES
    lists that run's miss."""
    params = []
    for results, variant, bound in runs:
        miss = RUN_MISSES.get((results, variant), {}).get(what)
        marks = [pytest.mark.xfail(strict=True, reason=f"{what} {miss}")] if miss else []
        params.append(pytest.param(results, variant, bound, marks=marks, id=f"{variant}-{what}"))
    return params


@pytest.mark.parametrize(("results", "variant", "tolerance"), checked(IN_SAMPLE, "speed"))
def test_in_sample_runs_fit_speed(results: str, variant: str, tolerance: float) -> None:
    speed, _ = errors(results, variant)
    assert abs(speed) < tolerance, f"speed {speed:+.1%}"


@pytest.mark.parametrize(("results", "variant", "tolerance"), checked(IN_SAMPLE, "memory"))
def test_in_sample_runs_fit_memory(results: str, variant: str, tolerance: float) -> None:
    _, memory = errors(results, variant)
    assert abs(memory) < MEMORY_TOLERANCE, f"memory {memory:+.1%}"


@pytest.mark.parametrize(("results", "variant", "bound"), checked(HELD_OUT, "speed"))
def test_held_out_runs_within_the_stated_speed_error(results: str, variant: str, bound: float):
    speed, _ = errors(results, variant)
    assert abs(speed) < bound, f"speed {speed:+.1%}"


@pytest.mark.parametrize(("results", "variant", "bound"), checked(HELD_OUT, "memory"))
def test_held_out_runs_within_the_memory_tolerance(results: str, variant: str, bound: float):
    _, memory = errors(results, variant)
    assert abs(memory) < MEMORY_TOLERANCE, f"memory {memory:+.1%}"


def test_every_listed_miss_names_a_checked_run() -> None:
    runs = {(r, v) for r, v, _ in [*IN_SAMPLE, *HELD_OUT]}
    assert set(RUN_MISSES) <= runs


def test_replay_reads_the_run_it_names() -> None:
    cfg, run = replay("2026-12-02-speed/all-13b-results.json", "zero3 optim 50% cpu bf16-states")
    assert cfg.model.preset == "13b" and cfg.train.grad_accum_steps == 2
    assert cfg.parallel.deepspeed.offload_ratio == 0.5 and run["tokens_per_s"] > 0
    cfg, run = replay("2026-12-03-speed2-h200/c2/24gb-1.5b-results.json", "planned for 24GB")
    assert cfg.train.gpu_memory_limit == 24 * 10**9 and run["step_time_s"] > 15  # the call's cap
    assert not cfg.parallel.compile and cfg.parallel.deepspeed.offload_ratio == 0.7


def test_the_rebuilt_config_is_what_the_plan_wrote() -> None:
    """REBUILT's fields against the plan the run was written from, where that file is kept."""
    plan = DATA / "2026-12-03-speed2-h200/c2/1.5b-plan-a87e507.json"
    if not plan.exists():
        pytest.skip(f"{plan.name} is not in this checkout")
    first = json.loads(plan.read_text())["options"][0]
    rebuilt = REBUILT["2026-12-03-speed2-h200/c2/24gb-1.5b-results.json"]
    fields = dict(f.split("=", 1) for f in rebuilt)
    for key, value in first["config"].items():
        expected = str(value).lower() if isinstance(value, bool) else str(value)
        assert fields[key] == expected, key
    assert fields["train.micro_batch_size"] == str(first["micro_batch_size"])
    assert fields["train.grad_accum_steps"] == str(first["grad_accum_steps"])


def heldout_rows(data: Path = DATA) -> list:
    """One pytest param per row of every `--measure-out` file under `data` (HELDOUT_GLOB), its id
    `held-out:<folder>/<file>:<strategy>`; one skipped param saying why when there are none."""
    params = []
    for path in sorted(data.glob(HELDOUT_GLOB)):
        found = json.loads(path.read_text())
        if not isinstance(found, dict) or "shape" not in found.get("meta", {}):
            continue  # not a --measure-out file (a bench results.json, say)
        name = path.relative_to(data).as_posix()
        for row in found["rows"]:
            miss = HELDOUT_MISSES.get(name, {}).get(row["strategy"])
            marks = [pytest.mark.xfail(strict=True, reason=f"missed: {miss}")] if miss else []
            rid = f"held-out:{name}:{row['strategy']}"
            params.append(pytest.param(found["meta"], row, id=rid, marks=marks))
    if not params:
        reason = f"no held-out `zerofit plan --measure-out` files under {DATA.name}/{HELDOUT_GLOB}"
        params.append(pytest.param(None, None, id="held-out:none", marks=pytest.mark.skip(reason)))
    return params


def heldout_errors(meta: dict, row: dict) -> tuple[float, float]:
    """(memory error, step time error) of today's forecast for a `--measure-out` row:
    predicted / measured - 1. AssertionError for an OOM the planner still says fits."""
    m, w, hw, s = plan_measure.replay(meta, row)
    if row["status"] == "oom":
        option = evaluate(m, w, hw, s)
        assert not option.fits, f"OOM, yet forecast to fit: {row['failure']}"
        pytest.skip(f"OOM, and the planner now says it does not fit ({option.why_not})")
    if row["status"] != "ok":
        pytest.skip(f"the run failed ({row['failure']}): no measurement to check")
    memory = estimate(m, w, s).peak_allocated / GIB / row["measured_alloc_gib"] - 1
    time = predict(m, w, s, hw).step_time / row["measured_step_s"] - 1
    return memory, time


def current_misses(data: Path = DATA) -> dict[str, dict[str, str]]:
    """HELDOUT_MISSES as today's planner gives it: every held-out row outside a bound."""
    out: dict[str, dict[str, str]] = {}
    for path in sorted(data.glob(HELDOUT_GLOB)):
        found = json.loads(path.read_text())
        if not isinstance(found, dict) or "shape" not in found.get("meta", {}):
            continue
        for row in found["rows"]:
            if row["status"] != "ok":
                continue
            memory, time = heldout_errors(found["meta"], row)
            parts = [f"memory {memory:+.1%}"] if abs(memory) > HELDOUT_MEMORY else []
            parts += [f"step time {time:+.1%}"] if abs(time) > HELDOUT_TIME else []
            if parts:
                name = path.relative_to(data).as_posix()
                out.setdefault(name, {})[row["strategy"]] = ", ".join(parts)
    return out


def test_the_listed_misses_are_todays() -> None:
    """Each miss as listed is what today's planner misses by: a change to the planner that moves
    one (either way) updates the list (`python tests/test_planner_measured.py` prints it)."""
    assert current_misses() == HELDOUT_MISSES


@pytest.mark.parametrize(("meta", "row"), heldout_rows())
def test_held_out_measure_out_rows(meta: dict, row: dict) -> None:
    memory, time = heldout_errors(meta, row)
    assert abs(memory) <= HELDOUT_MEMORY, f"memory {memory:+.1%} (bound {HELDOUT_MEMORY:.0%})"
    assert abs(time) <= HELDOUT_TIME, f"step time {time:+.1%} (bound {HELDOUT_TIME:.0%})"


def test_heldout_loader_reads_a_measure_out_file(tmp_path: Path) -> None:
    """A file as `--measure-out` writes it is found by the glob and forecast again; one that is
    off by more than the bounds gives errors past them."""
    m, hw = shape_from_config(load_config(None, ["model.preset=tiny"])), H200
    w, s = workload_for(load_config(None, ["model.preset=tiny"]), 1), strategy_for(load_config())
    option = evaluate(m, w, hw, s)
    summary = {"step_times_s": [1.0, 1.0, 1.0], "tokens_per_step": w.tokens, "world_size": 1}
    summary |= {"flops_per_token": 1.0, "device": "cuda"}
    rows = []
    for off in (1.02, 1.5):  # measured = forecast / off: errors +2% and +50%
        summary["mem_alloc_gib"] = option.memory.peak_allocated / GIB / off
        summary["step_times_s"] = [9.0, option.speed.step_time / off]
        outcome = Outcome(0, 1.0, dict(summary), tmp_path / "log")
        row = plan_measure.compare(option, outcome, warmup=1)
        rows.append(row | {"workload": asdict(w), "strategy": f"fsdp {off}"})
    folder = tmp_path / "2026-12-04-planner-heldout-h200"
    folder.mkdir()
    head = plan_measure.meta(m, w, hw, plan_measure.Settings(2, 1, None))
    (folder / "rows.json").write_text(json.dumps({"meta": head, "rows": rows}))
    (folder / "results.json").write_text(json.dumps({"meta": {}, "results": []}))  # not one
    found = heldout_rows(tmp_path)
    assert [p.id for p in found] == [
        "held-out:2026-12-04-planner-heldout-h200/rows.json:fsdp 1.02",
        "held-out:2026-12-04-planner-heldout-h200/rows.json:fsdp 1.5",
    ]
    near, far = (heldout_errors(*p.values) for p in found)
    assert near == pytest.approx((0.02, 0.02)) and far == pytest.approx((0.5, 0.5))
    assert heldout_rows(tmp_path / "none")[0].id == "held-out:none"


if __name__ == "__main__":
    import pprint

    pprint.pprint(current_misses(), width=100, sort_dicts=False)

"""The planner against real H200 runs, read from their committed results.json.

Each bench call's config is replayed from its `meta.command` and each variant's overrides, then
predicted on one H200 and compared with the run's median tokens/s and peak allocated memory.

- **In-sample**: the runs the planner's constants were fitted on (`EFFICIENCY`/`COMPILE_GAIN` per
  engine, `WIDTH_GAIN`, the CPU Adam rate, the compiled-activation count), and later re-measurements
  of the same configurations. Passing here shows the fit, not a forecast.
- **Held-out**: runs used in no fit. Their errors are what to expect of a new configuration.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from zerofit.config import load_config
from zerofit.models.shape import shape_from_config
from zerofit.planner.memory import estimate, strategy_for, workload_for
from zerofit.planner.shape import Hardware
from zerofit.planner.speed import predict

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "docs" / "benchmarks" / "data"
H200 = Hardware(gpus_per_node=1, gpu_mem=141 * 10**9, cpu_mem=125 * 2**30)
GIB = 2**30

IN_SAMPLE = [  # (results.json, variant, speed tolerance): the fitted runs and their repeats
    ("2026-12-02-speed/pair-1b-results.json", "fsdp mbs8 ga2", 0.10),
    ("2026-12-02-speed/pair-1b-results.json", "zero3 mbs8 ga2", 0.10),
    ("2026-12-02-speed/all-13b-results.json", "zero3 optim 50% cpu bf16-states", 0.20),
    ("2026-12-03-house-h200/8b/results.json", "fsdp bf16-states mbs2 ga2", 0.10),
    ("2026-12-03-house-h200/8b/results.json", "zero3 bf16-states mbs2 ga2", 0.10),
    ("2026-12-03-house-h200/1b/results.json", "fsdp mbs8 ga2", 0.10),
    ("2026-12-03-house-h200/1b/results.json", "zero3 mbs8 ga2", 0.10),
    ("2026-12-03-house-h200/13b/results.json", "zero3 optim 50% cpu bf16-states", 0.20),
]
HELD_OUT = [  # (results.json, variant, stated speed error bound): in no fit
    ("2026-12-02-speed/first-call-8b-results.json", "fsdp bf16-states mbs1 ga4", 0.12),
    ("2026-12-02-speed/first-call-8b-results.json", "fsdp bf16-states mbs2 ga2", 0.12),
]
MEMORY_TOLERANCE = 0.10


def replay(results: str, variant: str) -> tuple[object, dict]:
    """The config a bench variant ran with, and its measured result."""
    data = json.loads((DATA / results).read_text())
    argv = shlex.split(data["meta"]["command"])[2:]  # after `zerofit bench`
    config, shared, i = None, [], 0
    while i < len(argv):
        arg = argv[i]
        if arg in ("-c", "--config"):
            config, i = str(ROOT / argv[i + 1]), i + 2
        elif arg.startswith("--") and "." in arg.split("=")[0]:
            if "=" in arg:
                shared.append(arg[2:])
                i += 1
            else:
                shared.append(f"{arg[2:]}={argv[i + 1]}")
                i += 2
        else:  # bench's own options (--warmup 2, --variant '...', ...)
            i += 2 if i + 1 < len(argv) and not argv[i + 1].startswith("--") else 1
    run = next(r for r in data["results"] if r["name"] == variant)
    return load_config(config, [*shared, *run["overrides"]]), run


def errors(results: str, variant: str) -> tuple[float, float]:
    """(speed error, memory error) of the prediction: predicted / measured - 1."""
    cfg, run = replay(results, variant)
    shape, work, strategy = shape_from_config(cfg), workload_for(cfg, 1), strategy_for(cfg)
    speed = predict(shape, work, strategy, H200).tokens_per_s / run["tokens_per_s"] - 1
    memory = estimate(shape, work, strategy).peak_allocated / GIB / run["mem_alloc_gib"] - 1
    return speed, memory


@pytest.mark.parametrize(("results", "variant", "tolerance"), IN_SAMPLE)
def test_in_sample_runs_fit(results: str, variant: str, tolerance: float) -> None:
    speed, memory = errors(results, variant)
    assert abs(speed) < tolerance, f"speed {speed:+.1%}"
    assert abs(memory) < MEMORY_TOLERANCE, f"memory {memory:+.1%}"


@pytest.mark.parametrize(("results", "variant", "bound"), HELD_OUT)
def test_held_out_runs_within_the_stated_error(results: str, variant: str, bound: float) -> None:
    speed, memory = errors(results, variant)
    assert abs(speed) < bound, f"speed {speed:+.1%}"
    assert abs(memory) < MEMORY_TOLERANCE, f"memory {memory:+.1%}"


def test_replay_reads_the_run_it_names() -> None:
    cfg, run = replay("2026-12-02-speed/all-13b-results.json", "zero3 optim 50% cpu bf16-states")
    assert cfg.model.preset == "13b" and cfg.train.grad_accum_steps == 2
    assert cfg.parallel.deepspeed.offload_ratio == 0.5 and run["tokens_per_s"] > 0

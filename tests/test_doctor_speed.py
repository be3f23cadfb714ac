"""`zerofit doctor` compares a run's speed to the forecast as it compares its memory, and its OOM
advice never lowers a micro-batch that is already 1. The runs are run directories written here
(config.yaml, env.json, summary.json, metrics.jsonl): no training."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from zerofit.cli import main
from zerofit.config import save_config
from zerofit.launch.run_config import load_config
from zerofit.models.shape import shape_from_config
from zerofit.planner.gpus import find_gpu
from zerofit.planner.memory import strategy_for, workload_for
from zerofit.planner.shape import Hardware, with_gpu
from zerofit.planner.speed import predict
from zerofit.report.doctor import diagnose, oom_advice

H100 = "NVIDIA H100 80GB HBM3"
RUN = ["model.preset=llama3-1b", "parallel.backend=fsdp", "precision.mode=bf16"]
RUN += ["parallel.compile=true", "train.micro_batch_size=2"]


def fake_run(root: Path, rates: list[float], device: str = "cuda", world: int = 8) -> Path:
    run = root / "run"
    run.mkdir()
    save_config(load_config(None, RUN), run / "config.yaml")
    gpus = [H100] * world if device == "cuda" else []
    env = {"torch": "2.11", "device": device, "world_size": world, "gpus": gpus, "env": {}}
    (run / "env.json").write_text(json.dumps(env))
    (run / "summary.json").write_text(json.dumps({"world_size": world}))
    records = [
        {"step": 10 * (i + 1), "tokens_per_s": r, "mem_alloc_gib": 20.0}
        for i, r in enumerate(rates)
    ]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return run


def forecast(world: int = 8) -> float:
    cfg = load_config(None, RUN)
    hw = with_gpu(Hardware(world, 0), find_gpu("H100 SXM"))
    m, w = shape_from_config(cfg), workload_for(cfg, world)
    return predict(m, w, strategy_for(cfg), hw).tokens_per_s


def test_doctor_compares_tokens_per_s_with_the_forecast(tmp_path: Path, capsys) -> None:
    predicted = forecast()
    measured = 0.9 * predicted
    run = fake_run(tmp_path, [0.2 * predicted, measured, measured * 1.01, measured * 0.99])
    speed = {f.check: f for f in diagnose(run)}["speed"]
    assert speed.status == "ok"
    assert f"measured {measured:,.0f} tokens/s (median of 3 logged windows after the first)" in (
        speed.message
    )
    assert f"planner predicted {predicted:,.0f} on 8 x H100 SXM: -10% against the forecast" in (
        speed.message
    )
    main(["doctor", str(run)])
    lines = [line for line in capsys.readouterr().out.splitlines() if "tokens/s" in line]
    assert len(lines) == 1 and re.search(r"speed .*-10% against the forecast", lines[0])


def test_memory_says_its_error_too(tmp_path: Path) -> None:
    memory = {f.check: f for f in diagnose(fake_run(tmp_path, [1.0, 1.0]))}["memory"]
    assert re.search(r"measured 20\.0 \([+-]\d+% against the forecast\)", memory.message)


def test_a_much_slower_run_is_a_warning(tmp_path: Path) -> None:
    run = fake_run(tmp_path, [1.0, 0.3 * forecast()])
    speed = {f.check: f for f in diagnose(run)}["speed"]
    assert speed.status == "warn" and "-70% against the forecast" in speed.message
    assert "over half below the forecast" in speed.message


def test_a_cpu_run_has_no_speed_to_compare(tmp_path: Path) -> None:
    speed = {f.check: f for f in diagnose(fake_run(tmp_path, [100.0], device="cpu"))}["speed"]
    assert speed.status == "ok" and "a CPU run: nothing to compare" in speed.message


@pytest.mark.parametrize("micro_batch", [1, 4])
def test_oom_advice_never_lowers_a_micro_batch_of_one(micro_batch: int) -> None:
    """A run that ran out of memory though its forecast fits (full AC already on): a micro-batch
    of 4 is halved; one of 1 is not "halved to 1"."""
    cfg = load_config(
        None,
        [
            "model.preset=llama3-1b",
            "precision.mode=bf16",
            "parallel.backend=fsdp",
            "parallel.activation_checkpointing=full",
            f"train.micro_batch_size={micro_batch}",
        ],
    )
    advice = oom_advice(cfg, world=1, gpu_mem=80 * 10**9)
    assert ("halve the micro-batch" in advice) == (micro_batch > 1), advice
    assert "turn on activation checkpointing" not in advice  # it is on

"""`zerofit bench`: variant expansion and the median (unit), and a real 2-process run of every engine."""

from __future__ import annotations

import dataclasses
import json
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from zerofit.backends import engines
from zerofit.bench.run import Result, expand, measure, parse_sweep, parse_variant
from zerofit.errors import UserError

OWNERS = {name: eng.own_keys() for name, eng in engines().items()}


def test_parse_sweep_and_variant() -> None:
    assert parse_sweep("train.micro_batch_size=1,2, 4") == (
        "train.micro_batch_size",
        ["1", "2", "4"],
    )
    v = parse_variant("big batch: train.micro_batch_size=8 parallel.compile=true")
    assert v.name == "big batch" and v.overrides == [
        "train.micro_batch_size=8",
        "parallel.compile=true",
    ]
    for bad in ("micro_batch_size=1", "train.steps=", "train.steps"):
        with pytest.raises(UserError):
            parse_sweep(bad)
    with pytest.raises(UserError):
        parse_variant("no colon train.steps=3")


def test_engine_keys_are_swept_for_their_engine_only() -> None:
    sweeps = [
        ("train.micro_batch_size", ["1", "2"]),
        ("parallel.deepspeed.reduce_bucket_size", ["1000", "2000", "3000"]),
        ("parallel.fsdp.reshard_after_forward", ["true", "false"]),
    ]
    variants = expand(["ddp", "fsdp", "deepspeed"], sweeps, OWNERS)
    per = {b: [v for v in variants if v.overrides[0] == f"parallel.backend={b}"] for b in OWNERS}
    assert len(per["ddp"]) == 2  # micro-batch only
    assert len(per["fsdp"]) == 2 * 2  # + reshard
    assert len(per["deepspeed"]) == 2 * 3  # + buckets
    assert all("reshard" not in o for v in per["deepspeed"] for o in v.overrides)
    assert len({v.name for v in variants}) == len(variants)


def test_best_overall_and_per_engine() -> None:
    from zerofit.bench.run import Result, best, best_lines

    rs = [
        Result("a", [], "fsdp", "ok", tokens_per_s=10.0),
        Result("b", [], "fsdp", "ok", tokens_per_s=30.0),
        Result("c", [], "deepspeed", "ok", tokens_per_s=20.0),
        Result("d", [], "deepspeed", "oom"),
    ]
    assert best(rs).name == "b" and best(rs, "deepspeed").name == "c"
    assert best_lines(rs) == [  # each variant named once: the overall best with its engine
        "best: b (fsdp, 30 tokens/s)",
        "best deepspeed: c (20 tokens/s)",
    ]
    assert best_lines(rs[:2]) == ["best: b (30 tokens/s)"]  # one engine: no engine named
    assert best([rs[3]]) is None and best_lines([rs[3]]) == []


def test_measure_takes_the_median_after_warmup() -> None:
    summary = {
        "step_times_s": [9.0, 5.0, 1.0, 2.0, 1.5, 100.0],  # first two are warm-up, one outlier
        "world_size": 2,
        "tokens_per_step": 3000,
        "flops_per_token": 1e9,
        "peak_flops": 1e12,
        "loss": 2.5,
        "mem_alloc_gib": 3.0,
        "mem_reserved_gib": 4.0,
    }
    m = measure(summary, warmup=2)
    assert m["step_time_s"] == 1.75 and m["measured_steps"] == 4
    assert m["tokens_per_s"] == pytest.approx(3000 / 1.75)
    assert m["tokens_per_s_per_gpu"] == pytest.approx(3000 / 1.75 / 2)
    assert m["mfu"] == pytest.approx(1e9 * 3000 / 1.75 / 2 / 1e12)
    assert m["final_loss"] == 2.5 and m["mem_reserved_gib"] == 4.0
    assert "real_tokens_per_s" not in m  # text rows: no padding to leave out
    summary["step_real_tokens"] = [1, 1, 2900, 2000, 2700, 2950]  # padded fine-tuning rows
    m = measure(summary, warmup=2)
    assert m["real_tokens_per_s"] == pytest.approx(statistics.median([2900, 1000, 1800, 29.5]))


def test_a_gpu_runs_peak_host_rss_reaches_results_json() -> None:
    summary = {"step_times_s": [1.0, 1.0], "world_size": 1, "tokens_per_step": 10}
    summary |= {"flops_per_token": 1.0, "loss": 1.0, "host_rss_gib": 7.5}
    result = Result("a", [], "fsdp", "ok")
    for key, value in measure(summary, warmup=1).items():
        setattr(result, key, value)
    assert dataclasses.asdict(result)["host_rss_gib"] == 7.5  # what results.json is written from


@pytest.mark.slow
@pytest.mark.dist
def test_bench_runs_every_engine_on_cpu(tmp_path: Path) -> None:
    """Two engines at 2 processes plus one variant that fails: all reported, table and charts
    written, the same data and seed give the same final loss under each engine. (bench runs
    each variant as `zerofit train` does, whatever its engine: DeepSpeed's training, its memory
    report and its parity with FSDP2 are tested in tests/test_deepspeed.py.)"""
    out = tmp_path / "bench"
    cmd = [sys.executable, "-m", "zerofit.cli", "bench", "--backends", "ddp,fsdp"]
    cmd += ["--nproc", "2", "--warmup", "1", "--steps", "3", "--out", str(out)]
    cmd += ["--variant", "too long: model.seq_len=4096 parallel.backend=fsdp"]
    cmd += ["--model.overrides", "{n_layers: 2}", "--data.max_tokens", "200000"]
    cmd += ["--train.micro_batch_size", "4", "--model.seq_len", "128"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    data = json.loads((out / "results.json").read_text())
    by_name = {r["name"]: r for r in data["results"]}
    assert set(by_name) == {"ddp", "fsdp", "too long"}
    assert by_name["too long"]["status"] == "failed"
    assert "seq_len" in by_name["too long"]["error"]
    ok = [by_name[n] for n in ("ddp", "fsdp")]
    for r in ok:
        assert r["status"] == "ok", r
        assert r["tokens_per_s"] > 0 and r["measured_steps"] == 3
        assert r["tokens_per_s_per_gpu"] == pytest.approx(r["tokens_per_s"] / 2)
        assert r["mem_alloc_gib"] > 0
    losses = [r["final_loss"] for r in ok]
    assert max(losses) - min(losses) < 1e-3 * losses[0], losses
    assert data["best"] in {"ddp", "fsdp"}
    md = (out / "results.md").read_text()
    assert "| ddp | ok |" in md and "too long: failed" in md
    for png in ("throughput.png", "memory.png"):
        assert (out / png).read_bytes()[:4] == b"\x89PNG"
    top = data["best"]  # several engines: the best of each is named once
    assert f"best: {top} ({top}, " in proc.stdout
    other = ({"ddp", "fsdp"} - {top}).pop()
    assert f"best {other}: {other}" in proc.stdout and f"best {top}:" not in proc.stdout

"""`zerofit bench --profile` / log.profile_steps: the step-time breakdown on synthetic events (CPU
and CUDA rules), reading a Chrome trace, the profiler's schedule in-process, and a real 2-process
bench on gloo."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from zerofit.bench.report import markdown
from zerofit.bench.run import Result, measure
from zerofit.cli import main
from zerofit.commands import plan_measure
from zerofit.report.profiling import (
    FORWARD_BACKWARD,
    KERNEL,
    OP,
    OPTIMIZER,
    PARTS,
    PHASE,
    STEP,
    Event,
    StepProfiler,
    analyze,
    events_from_trace,
    intersect,
    subtract,
    union,
)
from zerofit.train.periodic import MEMORY_HISTORY_STEPS


def test_interval_algebra() -> None:
    a = union([(5, 8), (0, 2), (1, 3), (9, 9)])
    assert a == [(0, 3), (5, 8)]
    assert intersect(a, [(2, 6)]) == [(2, 3), (5, 6)]
    assert subtract(a, [(1, 2), (4, 6), (7, 20)]) == [(0, 1), (2, 3), (6, 7)]
    assert subtract([(0, 10)], []) == [(0, 10)]


def _cpu_step(t: float) -> list[Event]:
    """One step of 100 us at t: data 0-10, forward/backward 10-60, optimizer 60-90; a gloo
    all-reduce on its own thread 45-70 overlaps the last compute op and the optimizer."""
    ev = [
        Event("zerofit/step", STEP, t, 100, 1),
        Event("zerofit/data", PHASE, t, 10, 1),
        Event(FORWARD_BACKWARD, PHASE, t + 10, 50, 1),
        Event(OPTIMIZER, PHASE, t + 60, 30, 1),
        Event("aten::stack", OP, t + 2, 4, 1),  # in the data phase: host
        Event("aten::mm", OP, t + 12, 28, 1),
        Event("aten::add", OP, t + 20, 5, 1),  # nested in aten::mm
        Event("c10d::allreduce_", OP, t + 45, 2, 1),
        Event("aten::mul", OP, t + 48, 10, 1),
        Event("gloo:all_reduce", OP, t + 45, 25, 2),
        Event("aten::add_", OP, t + 62, 23, 1),
    ]
    return ev


def test_cpu_breakdown_counts_overlap_once() -> None:
    events = _cpu_step(0) + _cpu_step(200) + [Event("aten::between", OP, 150, 10, 1)]
    s = analyze(events)
    assert s["device"] == "cpu" and s["steps"] == 2 and s["wall_ms"] == pytest.approx(0.2)
    # per step: communication 45-70 (25), optimizer 70-90 (20), compute 12-40 (28: mul 48-58
    # runs under the all-reduce), host the rest (27), idle 0
    assert s["breakdown"] == {
        "compute": 0.28,
        "communication": 0.25,
        "optimizer": 0.2,
        "host": 0.27,
        "idle": 0.0,
    }
    assert sum(s["breakdown"].values()) == pytest.approx(1.0)
    assert s["comm_overlap"] == pytest.approx(0.1)  # mul under the all-reduce, 10 of 100 us
    top = {t["name"]: t for t in s["top"]}
    assert "aten::between" not in top  # outside the profiled steps
    assert top["aten::mm"]["total_ms"] == pytest.approx(0.046)  # self: 28 - 5 nested, twice
    assert top["aten::mm"]["calls"] == 2 and top["aten::add"]["total_ms"] == pytest.approx(0.01)
    names = [t["name"] for t in s["top"]]
    assert names[:4] == ["gloo:all_reduce", "aten::add_", "aten::mm", "aten::mul"]
    assert sum(t["share"] for t in s["top"]) == pytest.approx(1.0)
    assert s["top_by"] == "self CPU time"


def _cuda_step() -> list[Event]:
    """One 100 us step: data 0-10, forward/backward 10-60, optimizer 60-95, bookkeeping 95-100."""
    return [
        Event("zerofit/step", STEP, 0, 100),
        Event("zerofit/data", PHASE, 0, 10),
        Event(FORWARD_BACKWARD, PHASE, 10, 50),
        Event(OPTIMIZER, PHASE, 60, 35),
        Event("Memcpy HtoD", KERNEL, 2, 3, launched_us=1),
        Event("gemm", KERNEL, 12, 18, launched_us=11),
        Event("gemm", KERNEL, 35, 20, launched_us=20),
        Event("ncclKernel_AllReduce", KERNEL, 40, 30, launched_us=41),
        Event("adam", KERNEL, 72, 8, launched_us=61),
        Event("adam", KERNEL, 85, 3, launched_us=62),
        Event("aten::mm", OP, 11, 2),  # host ops do not count when there are kernels
    ]


def test_device_breakdown_from_kernels() -> None:
    s = analyze(_cuda_step())
    assert s["device"] == "cuda" and s["top_by"] == "device time"
    ms = {k: v * 1e3 for k, v in s["breakdown_ms"].items()}  # in us
    # nccl 40-70; adam 72-80, 85-88 plus the idle device in the optimizer phase 70-72, 80-85,
    # 88-95; compute 2-5, 12-30, 35-40; idle in forward/backward 10-12, 30-35; host 0-2, 5-10,
    # 95-100
    assert ms == pytest.approx(
        {"compute": 26, "communication": 30, "optimizer": 25, "host": 12, "idle": 7}
    )
    assert sum(s["breakdown"].values()) == pytest.approx(1.0)
    assert s["comm_overlap"] == pytest.approx(0.15)  # gemm 40-55 under nccl
    assert [(t["name"], t["calls"]) for t in s["top"]] == [
        ("gemm", 2),
        ("ncclKernel_AllReduce", 1),
        ("adam", 2),
        ("Memcpy HtoD", 1),
    ]
    assert s["top"][0]["share"] == pytest.approx(38 / 82)
    # the host: aten::mm at 11-13 is its only op in the step
    assert s["host_busy"] == pytest.approx(0.02)
    assert [(t["name"], t["calls"], t["total_ms"]) for t in s["top_host"]] == [
        ("aten::mm", 1, 0.002)
    ]


def test_kernel_attribution_follows_the_launch() -> None:
    """A kernel launched in forward/backward that runs during the optimizer phase is compute;
    an NCCL kernel launched by the optimizer is communication."""
    events = [
        Event("zerofit/step", STEP, 0, 100),
        Event(FORWARD_BACKWARD, PHASE, 0, 50),
        Event(OPTIMIZER, PHASE, 50, 50),
        Event("gemm", KERNEL, 55, 15, launched_us=10),  # launched in backward, runs 55-70
        Event("ncclKernel_Broadcast", KERNEL, 70, 20, launched_us=55),
        Event("adam", KERNEL, 90, 10, launched_us=60),
    ]
    ms = {k: v * 1e3 for k, v in analyze(events)["breakdown_ms"].items()}
    # the idle device 50-55 is the optimizer's (the host is in it), 0-50 idle
    assert ms == pytest.approx(
        {"compute": 15, "communication": 20, "optimizer": 15, "host": 0, "idle": 50}
    )


def test_report_of_a_cuda_profile() -> None:
    from zerofit.bench.report import profile_markdown
    from zerofit.bench.run import Result

    profile = {**analyze(_cuda_step()), "trace": "rank0.pt.trace.json"}
    profile["top"][0]["name"] = "void gemm<128, 2>|x"
    r = Result("fsdp", [], "fsdp", "ok", profile_dir="runs/b/00-fsdp/profile", profile=profile)
    md = "\n".join(profile_markdown([r, Result("ddp", [], "ddp", "oom")], 3))
    assert "| fsdp | 26.0% | 30.0% | 25.0% | 12.0% | 7.0% | 15.0% | " in md
    assert "runs/b/00-fsdp/profile/rank0.pt.trace.json" in md and "| ddp |" not in md
    assert "### fsdp: top kernels by device time" in md
    assert "| `void gemm<128, 2>\\|x` | 2 | 0.04 | 46.3% |" in md


def test_no_step_range_is_an_error() -> None:
    with pytest.raises(ValueError, match="zerofit/step"):
        analyze([Event("aten::mm", OP, 0, 5)])


def test_events_from_a_chrome_trace() -> None:
    x = {"ph": "X", "pid": 1}
    trace = {
        "traceEvents": [
            {**x, "cat": "user_annotation", "name": "zerofit/step", "ts": 0, "dur": 100, "tid": 1},
            {**x, "cat": "user_annotation", "name": OPTIMIZER, "ts": 60, "dur": 35, "tid": 1},
            {**x, "cat": "user_annotation", "name": "ProfilerStep#3", "ts": 0, "dur": 101},
            {**x, "cat": "user_annotation", "name": "gloo:all_reduce", "ts": 5, "dur": 9, "tid": 7},
            {**x, "cat": "cpu_op", "name": "aten::mm", "ts": 11, "dur": 2, "tid": 1},
            {**x, "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 61.5, "dur": 3}
            | {"args": {"correlation": 9}},
            {**x, "cat": "kernel", "name": "adam", "ts": 72, "dur": 8, "args": {"correlation": 9}},
            {**x, "cat": "gpu_memcpy", "name": "Memcpy HtoD", "ts": 2, "dur": 3}
            | {"args": {"correlation": 99}},
            {"ph": "s", "cat": "ac2g", "name": "ac2g", "ts": 61.5, "id": 9},
            {"ph": "M", "name": "process_name", "args": {"name": "python"}},
        ]
    }
    events = events_from_trace(trace)
    assert [(e.name, e.kind) for e in events] == [
        ("zerofit/step", STEP),
        (OPTIMIZER, PHASE),
        ("gloo:all_reduce", OP),
        ("aten::mm", OP),
        ("adam", KERNEL),
        ("Memcpy HtoD", KERNEL),
    ]
    by_name = {e.name: e for e in events}
    assert by_name["adam"].launched_us == 61.5 and by_name["Memcpy HtoD"].launched_us is None
    assert by_name["gloo:all_reduce"].thread == 7


def _toy_steps(prof: StepProfiler, n: int) -> list[bool]:
    """n steps of a small matmul loop; whether the profiler ran in each."""
    seen = []
    x = torch.randn(64, 64)
    for _ in range(n):
        with prof.step():
            seen.append(prof.prof is not None)
            with prof.phase(FORWARD_BACKWARD):
                y = x @ x
            with prof.phase(OPTIMIZER):
                x = (x + 1e-3 * y).tanh()
    return seen


def test_profiler_runs_only_over_the_last_steps(tmp_path: Path) -> None:
    prof = StepProfiler(2, 5, tmp_path / "profile", cuda=False)
    assert _toy_steps(prof, 5) == [False, False, True, True, True]  # wait 2, warm-up 1, active 2
    assert prof.prof is None and not torch.autograd.profiler._is_profiler_enabled
    trace = json.loads((tmp_path / "profile" / "rank0.pt.trace.json").read_text())
    ranges = [e for e in trace["traceEvents"] if e.get("name") == "zerofit/step"]
    assert len(ranges) == 2  # the warm-up step is not in the trace
    summary = json.loads((tmp_path / "profile" / "summary.json").read_text())
    assert summary["steps"] == 2 and summary["trace"] == "rank0.pt.trace.json"
    assert sum(summary["breakdown"].values()) == pytest.approx(1.0, abs=1e-3)
    assert summary["breakdown"]["compute"] > 0 and summary["top"][0]["name"].startswith("aten::")


def test_profiling_off_records_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("record_function called with profiling off")

    monkeypatch.setattr(torch.profiler, "record_function", refuse)
    monkeypatch.setattr(torch.profiler, "profile", refuse)
    for prof in (StepProfiler.off(), StepProfiler(0, 4, tmp_path / "profile", cuda=False)):
        assert _toy_steps(prof, 4) == [False] * 4
    assert not (tmp_path / "profile").exists()


def test_a_failing_step_stops_the_profiler(tmp_path: Path) -> None:
    prof = StepProfiler(2, 2, tmp_path / "profile", cuda=False)
    with pytest.raises(RuntimeError, match="boom"), prof.step():
        raise RuntimeError("boom")
    assert prof.prof is None and not torch.autograd.profiler._is_profiler_enabled


def test_timing_leaves_out_the_profiled_steps() -> None:
    summary = {
        "step_times_s": [9.0, 1.0, 1.0, 1.0, 7.0, 8.0, 9.0],  # warm-up, 3 timed, 3 profiled
        "world_size": 1,
        "tokens_per_step": 100,
        "flops_per_token": 1.0,
    }
    m = measure(summary, warmup=1, count=3)
    assert m["step_time_s"] == 1.0 and m["measured_steps"] == 3


def test_bad_profile_value_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "--profile", "-1"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: --profile -1") and len(err.splitlines()) == 1


@pytest.mark.slow
@pytest.mark.dist
def test_bench_profile_on_cpu(tmp_path: Path) -> None:
    """2 gloo processes: the timed steps as before, then a trace and a breakdown per variant."""
    out = tmp_path / "bench"
    cmd = [sys.executable, "-m", "zerofit.cli", "bench", "--backends", "ddp", "--nproc", "2"]
    cmd += ["--warmup", "1", "--steps", "2", "--profile", "2", "--out", str(out)]
    cmd += ["--model.preset", "tiny", "--model.overrides", "{n_layers: 2}"]
    cmd += ["--model.seq_len", "64", "--data.max_tokens", "300000"]
    cmd += ["--train.micro_batch_size", "4", "--precision.mode", "fp32"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    r = json.loads((out / "results.json").read_text())["results"][0]
    assert r["status"] == "ok" and r["measured_steps"] == 2
    run = json.loads((Path(r["run_dir"]) / "summary.json").read_text())
    assert len(run["step_times_s"]) == 1 + 2 + 1 + 2  # warm-up, timed, profiler warm-up, profiled
    folder = Path(r["profile_dir"])
    trace_file = folder / r["profile"]["trace"]
    assert f"profile: {trace_file}" in proc.stdout
    trace = json.loads(trace_file.read_text())
    assert trace["traceEvents"]
    steps = [e for e in trace["traceEvents"] if e.get("name") == "zerofit/step"]
    assert len(steps) == 2  # only the profiled steps: the timed ones ran without the profiler
    p = r["profile"]
    assert p == json.loads((folder / "summary.json").read_text())
    assert all(0.0 <= p["breakdown"][part] <= 1.0 for part in PARTS)
    assert sum(p["breakdown"].values()) == pytest.approx(1.0, abs=1e-3)
    assert p["breakdown"]["communication"] > 0 and p["breakdown"]["compute"] > 0
    assert p["top"] and p["top"][0]["total_ms"] >= p["top"][-1]["total_ms"]
    md = (out / "results.md").read_text()
    assert "## Where the step time went" in md and str(trace_file) in md
    assert "### ddp: top ops by self CPU time" in md and f"| `{p['top'][0]['name']}` |" in md


@pytest.mark.parametrize(
    ("gpu", "warmup", "noted"),
    [("NVIDIA H200", 1, True), ("NVIDIA H200", 3, False), (None, 0, False)],
)
def test_a_warmup_inside_the_recorded_steps_is_noted(
    gpu: str | None, warmup: int, noted: bool
) -> None:
    """On a GPU the first MEMORY_HISTORY_STEPS steps record allocations (slower): timing any of
    them gets a note; on CPU nothing is recorded."""
    env = {"gpu": gpu, "torch": "2.11", "deepspeed": None}
    meta = {"date": "2026-12-03", "env": env, "nproc": 1, "command": "zerofit bench", "steps": 12}
    meta |= {"warmup": warmup, "profile_steps": 0}
    md = markdown([Result("fsdp", [], "fsdp", "failed", error="x")], meta)
    assert ("record" in md and f"--warmup {MEMORY_HISTORY_STEPS}" in md) == noted
    assert plan_measure.WARMUP >= MEMORY_HISTORY_STEPS  # --measure never times a recorded step

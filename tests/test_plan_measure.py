"""`zerofit plan --measure K`: which strategies run (the families first), what a row holds, and the
whole command on CPU writing its `--measure-out` JSON."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import write_config, zerofit

from zerofit.backends.terms import GIB, Workload
from zerofit.cli import main
from zerofit.commands.plan_measure import WARMUP, compare, family, pick, replay, summary_line
from zerofit.launch.child_run import TIMED_OUT, Outcome
from zerofit.models.shape import shape_from_preset
from zerofit.planner.memory import Memory, Strategy, estimate
from zerofit.planner.plan import Option
from zerofit.planner.shape import Hardware
from zerofit.planner.speed import Speed, predict


def option(step: float, fits: bool = True, host: float = 0.0, **strategy: object) -> Option:
    """A made-up option: `step` seconds, `host` bytes offloaded."""
    backend = str(strategy.pop("backend"))
    ac = str(strategy.pop("ac", "none"))
    s = Strategy.of(backend, activation_checkpointing=ac, **strategy)
    return Option(s, Memory(host=host), Speed(step, step, 0.0, 0.0, 1.0 / step, 0.5), fits)


def test_families_are_the_engine_options_without_their_offload_details() -> None:
    assert family(option(1.0, backend="fsdp")) == "FSDP full-shard | AC none"
    assert family(option(1.0, backend="fsdp", reshard_after_forward=False)) == (
        "FSDP grad-op | AC none"
    )
    offloads = option(1.0, host=1.0, backend="fsdp", cpu_offload=True)
    assert family(offloads) == "FSDP offload | AC none"
    both = option(1.0, host=1.0, backend="deepspeed", offload_optimizer="cpu", offload_param="cpu")
    assert family(both) == "ZeRO-3 offload | AC none"
    assert family(option(1.0, backend="deepspeed", stage=2, ac="full")) == "ZeRO-2 | AC full"
    assert family(option(1.0, backend="ddp", ac="selective", compile=True)) == (
        "DDP | AC selective | compiled"
    )


def test_pick_takes_each_engine_once_before_any_twice_and_spreads_the_ac_modes() -> None:
    zero3_optim = option(2.0, host=1.0, backend="deepspeed", offload_optimizer="cpu")
    zero3_both = option(
        2.5, host=2.0, backend="deepspeed", offload_optimizer="cpu", offload_param="cpu"
    )
    options = [
        option(0.5, fits=False, backend="fsdp", reshard_after_forward=False),  # never: no fit
        zero3_both,
        option(3.0, backend="ddp", ac="full"),
        option(1.1, backend="ddp"),
        zero3_optim,
        option(1.0, backend="fsdp"),
        option(1.3, backend="fsdp", ac="full"),
        option(1.2, backend="deepspeed"),
    ]
    picked = [o.strategy.label for o in pick(options, 10)]
    # round one: each engine once, fastest engine first; the 2nd engine (DDP) starts at its 2nd
    # fastest AC mode, so one round covers both modes; round two: the rest, then ZeRO-3's
    # second offload
    assert picked == [
        "FSDP full-shard",
        "DDP + AC",
        "ZeRO-3",
        "ZeRO-3 + optim->cpu",
        "FSDP full-shard + AC",
        "DDP",
        "ZeRO-3 + optim->cpu + params->cpu",
    ]
    assert [o.strategy.label for o in pick(options, 4)] == picked[:4]  # not DDP's faster mode
    assert pick(options, 0) == [] and pick([options[0]], 3) == []


def _outcome(tmp_path: Path, code: int, summary: dict | None, log: str = "") -> Outcome:
    (tmp_path / "log").write_text(log)
    return Outcome(code, 12.0, summary, tmp_path / "log")


def test_an_oom_is_a_failed_fit_and_the_summary_counts_it(tmp_path: Path) -> None:
    o = option(1.0, backend="fsdp")
    log = "step 1\ntorch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n"
    row = compare(o, _outcome(tmp_path, 1, None, log), warmup=2)
    assert row["status"] == "oom" and row["fits_held"] is False
    assert row["failure"].startswith("torch.OutOfMemoryError: CUDA out of memory")
    assert row["measured_step_s"] is None and row["measured_alloc_gib"] is None
    assert summary_line([row]).endswith("1 failed, 1 of them OOM though forecast to fit")


def test_a_row_compares_memory_and_the_median_step_after_warmup(tmp_path: Path) -> None:
    m = shape_from_preset("tiny")
    w = Workload(2, 128, 1)
    s = Strategy.of("fsdp")
    o = Option(s, estimate(m, w, s), predict(m, w, s, Hardware(1, 80 * GIB)), True)
    predicted = o.memory.peak_allocated / GIB
    summary = {
        "step_times_s": [9.0, 9.0, 0.2, 0.1, 0.3, 0.1],  # two warm-up steps, median 0.15
        "tokens_per_step": 256,
        "flops_per_token": 1e6,
        "world_size": 1,
        "mem_alloc_gib": predicted / 1.04,
        "mem_reserved_gib": predicted,
        "device": "cuda",
    }
    row = compare(o, _outcome(tmp_path, 0, summary), warmup=2)
    assert row["status"] == "ok" and row["measured_steps"] == 4
    assert row["measured_step_s"] == pytest.approx(0.15)
    assert row["measured_tokens_per_s"] == pytest.approx(256 / 0.15)
    assert row["memory_error"] == pytest.approx(0.04)
    assert row["step_time_error"] == pytest.approx(o.speed.step_time / 0.15 - 1)
    assert "memory within 5% in 1 of 1" in summary_line([row])


def test_a_run_stopped_at_its_timeout_is_a_timeout_row(tmp_path: Path) -> None:
    o = option(1.0, backend="fsdp")
    row = compare(o, _outcome(tmp_path, TIMED_OUT, None, "step 1\n"), warmup=2, timeout=90)
    assert row["status"] == "timeout" and row["fits_held"] is True
    assert row["failure"] == "no result within 90 s (--measure-timeout)"
    oom = compare(o, _outcome(tmp_path, 1, None, "CUDA out of memory\n"), warmup=2, timeout=90)
    assert summary_line([row, oom]).endswith(
        "2 failed, 1 of them OOM though forecast to fit, 1 stopped at --measure-timeout"
    )
    # without --measure-timeout, the code means what the log says
    assert compare(o, _outcome(tmp_path, TIMED_OUT, None, "x\n"), warmup=2)["status"] == "failed"


def test_measure_flags_without_measure_or_with_bad_values_are_one_line_errors(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    machine = ["--preset", "tiny", "--gpus", "1", "--gpu-mem", "80GB", "--cpu-mem", "64GiB"]
    cases = [
        ((), ("--measure-out", "x.json"), "need --measure K"),
        (("--measure", "1"), ("--measure-steps", "0"), "--measure-steps must be a whole number"),
        (("--measure", "1"), ("--measure-out", str(tmp_path)), "is a directory"),
        ((), ("--measure-timeout", "60"), "need --measure K"),
        (
            ("--measure", "1"),
            ("--measure-timeout", "0"),
            "--measure-timeout must be a finite number > 0",
        ),
        (
            ("--measure", "1"),
            ("--measure-timeout", "nan"),
            "--measure-timeout must be a finite number > 0",
        ),
        (
            ("--measure", "1"),
            ("--measure-timeout", "1m"),
            "--measure-timeout must be a finite number > 0",
        ),
    ]
    for measure, flags, message in cases:
        assert main(["plan", *machine, *measure, *flags]) == 2
        out, err = capsys.readouterr()
        assert err.startswith("error: ") and message in err and len(err.splitlines()) == 1
        assert out == ""  # refused before the plan is printed or anything runs


@pytest.mark.slow
@pytest.mark.dist
def test_plan_measure_runs_two_families_on_cpu_and_writes_the_rows(tmp_path: Path) -> None:
    cfg = write_config(tmp_path / "tiny.yaml")
    out = tmp_path / "data" / "heldout.json"
    machine = ["--gpus", "1", "--gpu-mem", "80GB", "--cpu-mem", "64GiB"]
    measure = ["--measure", "2", "--measure-steps", "2", "--measure-out", str(out)]
    r = zerofit("plan", "-c", str(cfg), *machine, *measure, cwd=tmp_path, timeout=900)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "measured 2 of 2:" in r.stdout and f"wrote {out}" in r.stdout
    data = json.loads(out.read_text())
    meta, rows = data["meta"], data["rows"]
    assert meta["config_summary"]["model"] == "tiny" and meta["config_summary"]["seq_len"] == 64
    assert meta["timed_steps"] == 2 and meta["warmup_steps"] == WARMUP and meta["torch"]
    assert meta["command"].startswith("zerofit plan -c ")
    assert len(rows) == 2 and len({r["family"] for r in rows}) == 2
    for row in rows:
        assert row["status"] == "ok", row["failure"]
        assert row["measured_step_s"] > 0 and row["measured_tokens_per_s"] > 0
        assert row["measured_steps"] == 2 and row["step_time_error"] is not None
        if row["device"] == "cpu":  # no allocator peak on CPU: null, the host RSS beside it
            assert row["measured_alloc_gib"] is None and row["memory_error"] is None
            assert row["host_rss_gib"] > 0
        else:
            assert row["measured_alloc_gib"] > 0 and row["memory_error"] is not None
        m, w, hw, s = replay(meta, row)  # the row forecasts again as it did
        assert estimate(m, w, s).peak_allocated / GIB == pytest.approx(row["predicted_alloc_gib"])
        assert predict(m, w, s, hw).step_time == pytest.approx(row["predicted_step_s"])


def test_zero3_compiled_inside_ac_stops_recording_cuda_allocations(monkeypatch, request) -> None:  # noqa: ANN001
    """ZeRO-3 compiles each block's forward inside its AC wrapper; with CUDA allocations being
    recorded that failed on torch 2.11 (pytorch/pytorch#179536), so recording stops there, and
    only there."""
    import torch
    import torch._dynamo.config as dynamo_config
    from torch import nn

    from zerofit.distributed.parallelize import apply_ac, apply_compile_forward
    from zerofit.models import loss

    # apply_compile_forward sets process-wide state: put it back after the test
    monkeypatch.setattr(loss, "COMPILE_CHUNKS", loss.COMPILE_CHUNKS)
    # set back by hand: monkeypatch undoing cache_size_limit (an alias of recompile_limit) left
    # Dynamo's config without recompile_limit for every later test in the process
    name = "recompile_limit" if hasattr(dynamo_config, "recompile_limit") else "cache_size_limit"
    limit = getattr(dynamo_config, name)
    request.addfinalizer(lambda: setattr(dynamo_config, name, limit))
    calls: list[dict] = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda.memory, "_record_memory_history", lambda **kw: calls.append(kw))
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: fn)
    plain = nn.ModuleList([nn.Linear(4, 4) for _ in range(2)])
    apply_compile_forward(plain)
    assert calls == []
    wrapped = nn.ModuleList([nn.Linear(4, 4) for _ in range(2)])
    apply_ac(wrapped, "full", 2)
    apply_compile_forward(wrapped)
    assert calls == [{"enabled": None}]

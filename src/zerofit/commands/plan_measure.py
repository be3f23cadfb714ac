"""`zerofit plan --measure K`: the planner's forecast checked against real runs on this machine.

K fitting strategies are picked so that they cover the strategy families first (`pick`): an engine
family is an engine's option set without its offload details (DDP, FSDP full-shard, FSDP grad-op,
ZeRO-1/2/3), or that engine offloading (FSDP offload, ZeRO-3 offload); a family is that times the
activation checkpointing mode (and compile). Engine families take turns, the fastest forecast
first, each starting its AC modes at a different one, so that K = the number of engines already
checks every engine and every AC mode; within a family, best predicted first. Each runs as its own `zerofit train` (`zerofit.launch.child_run`) for WARMUP + `--measure-steps`
steps; the median step time after warm-up comes from `zerofit.bench.run.measure`, the peak allocated
memory from the run's summary.json (GPU only: on CPU it is null, and the host RSS is given beside).

Errors are predicted / measured - 1. A run that fails is a row with its failure line; an OOM is a
failed prediction of "fits". `--measure-out PATH` writes the rows with what re-predicts them
(model shape, workload, hardware, each strategy's options): tests/test_planner_measured.py reads
such files under docs/benchmarks/data/*-planner-heldout*/ as held-out checks.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shlex
import statistics
import sys
import tempfile
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from zerofit.backends import library_versions
from zerofit.backends.terms import GIB, Adapters, Workload
from zerofit.bench.run import classify
from zerofit.bench.run import measure as median_of
from zerofit.config import Config, save_config, to_dict
from zerofit.errors import UserError
from zerofit.launch import child_run as runner
from zerofit.models.shape import ModelShape, ParamCounts
from zerofit.planner.memory import Strategy
from zerofit.planner.plan import Option
from zerofit.planner.shape import Hardware, parse_count, parse_positive
from zerofit.report.memory_history import MEMORY_HISTORY_STEPS

# Steps before the timed ones (allocator warm-up, first all-gathers, compile), and at least the
# steps a CUDA run records its allocations in (slower). The 2026-12-03 held-out files were
# measured with 2, so their first timed step was still recorded.
WARMUP = max(2, MEMORY_HISTORY_STEPS)
MEMORY_BOUND = 0.05  # |predicted / measured - 1| that counts as a hit
TIME_BOUND = 0.10


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--measure-steps",
        metavar="N",
        help=f"--measure: timed steps per strategy, after {WARMUP} warm-up steps (default 4)",
    )
    p.add_argument(
        "--measure-timeout",
        metavar="S",
        help="--measure: stop a strategy's run after S seconds (its row says so; default: none)",
    )
    p.add_argument(
        "--measure-out",
        metavar="PATH",
        help="--measure: write the predicted and measured rows as JSON to PATH",
    )


@dataclasses.dataclass(frozen=True)
class Settings:
    count: int  # strategies to run
    steps: int  # timed steps after WARMUP
    out: Path | None
    timeout: float | None = None  # seconds per strategy's run


def settings(args: argparse.Namespace) -> Settings | None:
    """The `--measure*` flags, checked (UserError) before anything runs; None when nothing is to
    be measured."""
    count = parse_count("--measure", str(args.measure), minimum=0) or 0
    steps_text, out = getattr(args, "measure_steps", None), getattr(args, "measure_out", None)
    limit = getattr(args, "measure_timeout", None)
    if not count:
        if steps_text is not None or out is not None or limit is not None:
            raise UserError(
                "--measure-steps, --measure-timeout and --measure-out need --measure K (K > 0)"
            )
        return None
    steps = parse_count("--measure-steps", steps_text) or 4
    path = Path(out) if out is not None else None
    if path is not None and path.is_dir():
        raise UserError(f"--measure-out {out}: is a directory; give a file path")
    return Settings(count, steps, path, parse_positive("--measure-timeout", limit))


def engine_family(o: Option) -> str:
    """An option's engine options without the offload details, or that engine offloading."""
    s = o.strategy
    engine = s.engine.label(s.options)
    offloads = o.memory.host > 0 or o.memory.nvme > 0
    return f"{engine.split()[0]} offload" if offloads else engine


def family(o: Option) -> str:
    """The family of an option: its engine family with the activation checkpointing mode (and
    compile)."""
    s = o.strategy
    name = f"{engine_family(o)} | AC {s.activation_checkpointing}"
    return name + (" | compiled" if s.compile else "")


def _rounds(groups: list[list[Option]]) -> list[Option]:
    """The groups' first members in order, then their second members, and so on."""
    longest = max((len(g) for g in groups), default=0)
    return [g[turn] for turn in range(longest) for g in groups if turn < len(g)]


def pick(options: list[Option], k: int) -> list[Option]:
    """Up to k fitting options, spread so that few runs check many different forecasts: the engine
    families take turns (the fastest forecast first), and each engine walks its AC/compile
    families from a different starting point (the i-th engine from its i-th fastest), so that a
    first round of one run per engine already mixes the AC modes. Within a family, best first."""
    engines: dict[str, dict[str, list[Option]]] = {}
    for o in sorted((o for o in options if o.fits), key=lambda o: o.speed.step_time):
        engines.setdefault(engine_family(o), {}).setdefault(family(o), []).append(o)
    queues = []
    for i, families in enumerate(engines.values()):
        ordered = list(families.values())
        start = i % len(ordered)
        queues.append(_rounds(ordered[start:] + ordered[:start]))
    return _rounds(queues)[:k]


def _error(predicted: float | None, measured: float | None) -> float | None:
    return predicted / measured - 1 if predicted is not None and measured else None


def compare(
    o: Option, outcome: runner.Outcome, warmup: int, timeout: float | None = None
) -> dict[str, Any]:
    """One row: predicted against measured memory, step time and tokens/s, or the failure (a
    run stopped at `timeout` seconds: status "timeout")."""
    s = o.strategy
    row: dict[str, Any] = {
        "strategy": s.label,
        "family": family(o),
        "plan": {
            "backend": s.backend,
            "activation_checkpointing": s.activation_checkpointing,
            "ac_blocks": s.ac_blocks,
            "compile": s.compile,
            "options": dataclasses.asdict(s.options),
        },
        "predicted_alloc_gib": o.memory.peak_allocated / GIB,
        "predicted_step_s": o.speed.step_time,
        "predicted_tokens_per_s": o.speed.tokens_per_s,
        "status": "ok",
        "failure": None,
        "wall_s": outcome.wall_s,
    }
    measured: dict[str, Any] = {"measured_alloc_gib": None, "measured_step_s": None}
    measured |= {"measured_tokens_per_s": None, "measured_reserved_gib": None}
    if not outcome.ok:
        status, line = classify(outcome.code, outcome.log())
        if timeout is not None and outcome.code == runner.TIMED_OUT:
            status, line = "timeout", f"no result within {timeout:g} s (--measure-timeout)"
        row["status"], row["failure"] = status, line
        row["fits_held"] = status != "oom"  # OOM: the forecast said it fits
        return row | measured
    summary = outcome.summary or {}
    timed = median_of(summary, warmup)
    measured = {
        "measured_alloc_gib": summary.get("mem_alloc_gib"),  # GPU only (CPU: host RSS below)
        "measured_reserved_gib": summary.get("mem_reserved_gib"),
        "host_rss_gib": summary.get("mem_rss_gib"),
        "measured_step_s": timed["step_time_s"],
        "measured_tokens_per_s": timed["tokens_per_s"],
        "measured_steps": timed["measured_steps"],
        "device": summary.get("device"),
    }
    row["fits_held"] = True
    row["memory_error"] = _error(row["predicted_alloc_gib"], measured["measured_alloc_gib"])
    row["step_time_error"] = _error(row["predicted_step_s"], measured["measured_step_s"])
    row["tokens_per_s_error"] = _error(
        row["predicted_tokens_per_s"], measured["measured_tokens_per_s"]
    )
    return row | measured


def run_one(o: Option, cfg: Config, st: Settings, w: Workload) -> dict[str, Any]:
    """Train `cfg` for WARMUP + st.steps steps in a scratch directory; its row, with the
    workload it was forecast at (the option's own micro-batch x accumulation, else `w`)."""
    total = WARMUP + st.steps
    forced = [f"train.steps={total}", f"log.every={total}", *runner.MEASURE_ONLY]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "cfg.yaml"
        save_config(cfg, path)
        got = runner.train(
            Path(tmp) / "run", forced, Path(tmp) / "log", str(path), w.world_size, st.timeout
        )
        row = compare(o, got, WARMUP, st.timeout)
    row["workload"] = dataclasses.asdict(getattr(o, "workload", None) or w)
    row["config"] = to_dict(cfg)
    return row


def _pct(x: float | None) -> str:
    return f"{100 * x:+.1f}%" if x is not None else "n/a"


def row_line(r: dict[str, Any]) -> str:
    """One printed line per strategy."""
    head = f"{r['strategy']:<36}"
    if r["status"] != "ok":
        verdict = " (forecast: fits)" if r["status"] == "oom" else ""
        return f"{head} {r['status'].upper()}{verdict}: {r['failure']}"
    got = r["measured_alloc_gib"]
    mem = f"{got:.2f} GiB ({_pct(r['memory_error'])})" if got is not None else "n/a (no GPU)"
    return (
        f"{head} memory {r['predicted_alloc_gib']:.2f} -> {mem}   step "
        f"{r['predicted_step_s']:.3g} -> {r['measured_step_s']:.3g} s "
        f"({_pct(r['step_time_error'])})   tokens/s {r['predicted_tokens_per_s']:,.0f} -> "
        f"{r['measured_tokens_per_s']:,.0f} ({_pct(r['tokens_per_s_error'])})"
    )


def summary_line(rows: list[dict[str, Any]]) -> str:
    """How many rows the forecast hit: memory within MEMORY_BOUND, step time within TIME_BOUND."""
    ok = [r for r in rows if r["status"] == "ok"]
    mem = [r["memory_error"] for r in ok if r.get("memory_error") is not None]
    time = [r["step_time_error"] for r in ok if r.get("step_time_error") is not None]
    mem_hits = sum(abs(e) <= MEMORY_BOUND for e in mem)
    time_hits = sum(abs(e) <= TIME_BOUND for e in time)
    ooms = sum(r["status"] == "oom" for r in rows)
    timeouts = sum(r["status"] == "timeout" for r in rows)
    line = (
        f"measured {len(ok)} of {len(rows)}: memory within {MEMORY_BOUND:.0%} in {mem_hits} of "
        f"{len(mem)}, step time within {TIME_BOUND:.0%} in {time_hits} of {len(time)}"
    )
    if time:
        line += f" (median |error| {statistics.median(abs(e) for e in time):.1%})"
    if len(rows) > len(ok):
        line += f"; {len(rows) - len(ok)} failed, {ooms} of them OOM though forecast to fit"
        line += f", {timeouts} stopped at --measure-timeout" if timeouts else ""
    if any(r.get("device") == "cpu" for r in ok):
        line += " (ran on CPU: the forecast is a GPU's, so these errors say nothing of it)"
    return line


def meta(m: ModelShape, w: Workload, hw: Hardware, st: Settings) -> dict[str, Any]:
    """What the runs were: when, how, on what, and what re-predicts them."""
    import torch  # torch-free path: `zerofit plan` imports this module; only --measure gets here

    cuda = torch.cuda.is_available()
    return {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "command": "zerofit " + shlex.join(sys.argv[1:]),
        "torch": torch.__version__,
        **library_versions(),
        "gpu": torch.cuda.get_device_name(0) if cuda else None,
        "gpu_count": torch.cuda.device_count() if cuda else 0,
        "warmup_steps": WARMUP,
        "timed_steps": st.steps,
        "config_summary": {
            "model": m.name,
            "params": m.num_params,
            "seq_len": w.seq_len,
            "micro_batch_size": w.micro_batch_size,
            "grad_accum_steps": w.grad_accum_steps,
            "world_size": w.world_size,
            "compute_dtype": w.compute_dtype,
            "master_dtype": w.master_dtype,
        },
        # to re-predict the rows with a later planner (tests/test_planner_measured.py); each
        # row has its own workload (with a global batch, its micro-batch x accumulation)
        "shape": dataclasses.asdict(m),
        "hardware": dataclasses.asdict(hw),
    }


def replay(
    meta: dict[str, Any], row: dict[str, Any]
) -> tuple[ModelShape, Workload, Hardware, Strategy]:
    """What a `--measure-out` row was forecast from, to forecast it again with today's planner."""
    shape = dict(meta["shape"])
    if shape.get("measured"):
        shape["measured"] = ParamCounts(**shape["measured"])
    work = dict(row["workload"])
    if work.get("lora"):
        work["lora"] = Adapters(**work["lora"])
    p = row["plan"]
    strategy = Strategy.of(
        p["backend"], p["activation_checkpointing"], p["compile"], **p["options"]
    )
    strategy = dataclasses.replace(strategy, ac_blocks=p.get("ac_blocks"))
    return ModelShape(**shape), Workload(**work), Hardware(**meta["hardware"]), strategy


def measure(
    st: Settings,
    to_stderr: bool,
    m: ModelShape,
    w: Workload,
    hw: Hardware,
    options: list[Option],
    config_of: Callable[[Option], Config],
) -> list[dict[str, Any]]:
    """Run the picked strategies here, print each row and the summary line (on stderr when
    `to_stderr`, so that --json stays parseable), and write them to `st.out`."""
    stream = sys.stderr if to_stderr else sys.stdout
    chosen = pick(options, st.count)
    if len(chosen) < st.count:
        print(f"--measure {st.count}: only {len(chosen)} strategies fit", file=stream)
    head = meta(m, w, hw, st)
    rows: list[dict[str, Any]] = []
    for o in chosen:
        rows.append(run_one(o, config_of(o), st, w))
        print(row_line(rows[-1]), file=stream, flush=True)
        if st.out is not None:  # after every run: a crash keeps what was measured
            st.out.parent.mkdir(parents=True, exist_ok=True)
            st.out.write_text(json.dumps({"meta": head, "rows": rows}, indent=1))
    print(summary_line(rows), file=stream, flush=True)
    if st.out is not None:
        print(f"wrote {st.out}", file=stream)
    return rows

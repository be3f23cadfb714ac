"""What people read from `zerofit bench` and the other printed tables: piped, every value whole (a
markdown table, no line cut); on a terminal, no line wider than 100 columns (or the terminal, if
wider); the charts carry their values, the model, the GPU or CPU and the date, and a CPU run's
memory is called host RSS."""

from __future__ import annotations

import io
import re

import pytest
from rich.console import Console

from zerofit.bench.charts import chart_figures
from zerofit.bench.report import environment, host_cpu, print_results
from zerofit.bench.run import Result
from zerofit.commands.bench import model_label
from zerofit.launch.run_config import load_config
from zerofit.report.progress import summary_table
from zerofit.report.tables import print_table

LONG = "fsdp bf16 compiled with full activation checkpointing: micro_batch_size=16 grad_accum=4"
KERNEL = "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>(int)"
GPU_META = {"date": "2026-12-03", "nproc": 8, "model": "llama3-8b", "env": {"gpu": "NVIDIA H200"}}
CPU_META = {"date": "2026-12-04", "nproc": 2, "model": "tiny", "env": {"gpu": None}}


def _profile() -> dict:
    breakdown = {"compute": 0.61, "communication": 0.2, "optimizer": 0.1, "host": 0.05}
    top = [{"name": KERNEL, "calls": 12, "total_ms": 1234.5, "share": 0.42}]
    return {
        "breakdown": breakdown | {"idle": 0.04},
        "comm_overlap": 0.33,
        "trace": "rank0.pt.trace.json",
        "top": top,
        "device": "cuda",
        "top_by": "device time",
    }


def _results() -> list[Result]:
    ok = Result(LONG, [], "fsdp", "ok", tokens_per_s=1234567.0, tokens_per_s_per_gpu=154320.9)
    ok.tflops_per_gpu, ok.mfu, ok.step_time_s = 432.1, 0.535, 12.3456
    ok.mem_alloc_gib, ok.mem_reserved_gib, ok.alloc_retries, ok.final_loss = 71.2, 75.5, 3, 9.8765
    ok.profile_dir, ok.profile = "runs/bench/00-x/profile", _profile()
    oom = Result(LONG.replace("fsdp", "ddp") + " and more", [], "ddp", "oom")
    oom.error = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 GiB. " * 2
    return [ok, oom]


def _print(console: Console, meta: dict) -> list[str]:
    print_results(_results(), meta, console)
    return console.file.getvalue().splitlines()  # type: ignore[attr-defined]


def _terminal(width: int) -> Console:
    return Console(file=io.StringIO(), force_terminal=True, width=width, color_system=None)


def test_piped_bench_output_holds_every_value_whole() -> None:
    lines = _print(Console(file=io.StringIO()), GPU_META)  # a StringIO: not a terminal
    text = "\n".join(lines)
    for value in ["1,234,567", "154,321", "432.1", "53.5%", "12.346", "71.2", "75.5", "9.8765"]:
        assert re.search(rf"\| {re.escape(value)} \|", text), value  # a whole markdown cell
    r = _results()
    assert f"| {LONG} | ok |" in text and f"| {r[1].name} | oom |" in text
    assert f"{r[1].name}: oom: {r[1].error}" in lines  # the error on one line, whole
    assert f"| {KERNEL} | 12 | 1,234.50 | 42.0% |" in text  # the top kernels, names whole
    assert "| 61.0% | 20.0% | 10.0% | 5.0% | 4.0% | 33.0% |" in text
    assert "…" not in text and max(map(len, lines)) > 100  # nothing cut to fit


@pytest.mark.parametrize("width", [60, 80, 100, 120])
def test_a_terminal_gets_lines_no_wider_than_100_columns_or_itself(width: int) -> None:
    lines = _print(_terminal(width), GPU_META)
    assert max(map(len, lines)) <= max(100, width), "\n".join(lines)
    text = "\n".join(lines)
    for value in ["1,234,567", "432.1", "53.5%", "12.346", "71.2", "9.8765"]:
        assert value in text  # numbers are kept whole: the long names wrap instead
    assert "zerofit bench" in text and "…" not in text


def test_a_cpu_runs_memory_column_is_host_rss() -> None:
    text = "\n".join(_print(Console(file=io.StringIO()), CPU_META))
    assert "peak host RSS GiB" in text and "peak alloc GiB" not in text
    terminal = "\n".join(_print(_terminal(100), CPU_META))
    assert "RSS" in terminal and not re.search(r"\balloc\b", terminal)


def test_the_run_summary_keeps_its_paths_whole() -> None:
    run_dir = "/very/long/path/" + "to/a/run/directory/" * 8
    summary = {"step": 40, "final_step_loss": 1.25, "run_dir": run_dir, "checkpoint": run_dir}
    piped = Console(file=io.StringIO())
    print_table(summary_table(summary), piped)
    assert f"| run dir | {run_dir} |" in piped.file.getvalue()  # type: ignore[attr-defined]
    terminal = _terminal(80)
    print_table(summary_table(summary), terminal)
    lines = terminal.file.getvalue().splitlines()  # type: ignore[attr-defined]
    assert max(map(len, lines)) <= 100 and "1.2500" in "\n".join(lines)


def _data(meta: dict) -> dict:
    results = [
        {"name": "fsdp", "status": "ok", "tokens_per_s": 12345.6, "mem_alloc_gib": 40.25}
        | {"mem_reserved_gib": 44.5},
        {"name": "zero3", "status": "ok", "tokens_per_s": 11000.0, "mem_alloc_gib": 38.0}
        | {"mem_reserved_gib": 41.0},
        {"name": "too big", "status": "oom", "tokens_per_s": None, "mem_alloc_gib": None},
    ]
    return {"meta": meta, "best": "fsdp", "results": results}


def _texts(ax) -> list[str]:  # noqa: ANN001 - a matplotlib Axes
    return [t.get_text() for t in ax.texts]


def test_gpu_charts_show_values_model_gpu_and_date() -> None:
    figures = chart_figures(_data(GPU_META))
    assert set(figures) == {"throughput.png", "memory.png"}
    for fig in figures.values():
        title = fig.axes[0].get_title()
        assert "llama3-8b" in title and "NVIDIA H200 x 8" in title and "2026-12-03" in title
    throughput = figures["throughput.png"].axes[0]
    assert {"12,346", "11,000", "oom"} <= set(_texts(throughput))
    memory = figures["memory.png"].axes[0]
    assert {"40.2", "44.5", "38.0", "41.0"} <= set(_texts(memory))  # allocated and reserved
    legend = [t.get_text() for t in memory.get_legend().get_texts()]
    assert legend == ["peak allocated", "peak reserved"]


def test_cpu_charts_call_the_memory_host_rss() -> None:
    figures = chart_figures(_data(CPU_META))
    for fig in figures.values():
        title = fig.axes[0].get_title()
        assert "tiny" in title and "CPU" in title and "2026-12-04" in title
    memory = figures["memory.png"].axes[0]
    legend = memory.get_legend()
    labels = [memory.get_ylabel(), memory.get_title()]
    labels += [t.get_text() for t in legend.get_texts()] if legend else []
    assert all("allocated" not in label for label in labels), labels
    assert "host RSS" in memory.get_ylabel() and "resident set size" in memory.get_ylabel()
    assert {"40.25", "38.00"} <= set(_texts(memory))


def test_the_model_is_named_as_the_config_gives_it() -> None:
    assert model_label(load_config(None, ["model.preset=llama3-1b"])) == "llama3-1b"
    cfg = load_config(None, ["model.preset=tiny", "model.overrides={n_layers: 2}"])
    assert model_label(cfg) == "tiny (n_layers=2)"


def test_every_result_records_the_host_cpu(tmp_path) -> None:  # noqa: ANN001 - pytest's path
    """The planner's host terms differ between hosts (issue 27: the H100 machine's host ran FSDP2's
    hooks over twice as fast as the H200 machine's): a result names its CPU and core count."""
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nvendor_id\t: GenuineIntel\nmodel name\t: Xeon Test 8480\n")
    assert host_cpu(info) == "Xeon Test 8480"
    assert host_cpu(tmp_path / "absent")  # off Linux: what the platform says, never empty
    env = environment()
    assert env["cpu"] and env["cpu_count"] >= 1

"""What `zerofit bench` leaves behind: results.json, results.md, throughput.png, memory.png and the
table it prints; with --profile, each variant's step-time breakdown and top kernels too."""

from __future__ import annotations

import json
import os
import platform
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
from rich.console import Console

from zerofit.backends import library_versions
from zerofit.bench.charts import on_cpu, write_charts
from zerofit.bench.run import Result, best, best_lines
from zerofit.report.memory_history import MEMORY_HISTORY_STEPS
from zerofit.report.profiling import PARTS
from zerofit.report.tables import Align, TextTable, print_lines, print_table

COLUMNS: list[tuple[str, str, str, str]] = [  # (Result attribute, header, short header, format)
    ("tokens_per_s", "tokens/s", "tok/s", "{:,.0f}"),
    ("real_tokens_per_s", "real tokens/s", "real tok/s", "{:,.0f}"),
    ("tokens_per_s_per_gpu", "tokens/s/GPU", "tok/s /GPU", "{:,.0f}"),
    ("tflops_per_gpu", "TFLOP/s/GPU", "TFLOP/s /GPU", "{:.1f}"),
    ("mfu", "MFU", "MFU", "{:.1%}"),
    ("step_time_s", "step s (median)", "step s", "{:.3f}"),
    ("mem_alloc_gib", "peak alloc GiB", "alloc GiB", "{:.1f}"),
    ("mem_reserved_gib", "peak reserved GiB", "resv GiB", "{:.1f}"),
    ("alloc_retries", "alloc retries", "retries", "{:,}"),
    ("final_loss", "final loss", "loss", "{:.4f}"),
]
# a CPU run's mem_alloc_gib: rank 0's peak resident set size (header, short header)
CPU_MEMORY = ("peak host RSS GiB", "RSS GiB")


def cells(r: Result) -> list[str]:
    row = [r.name, r.status]
    for attr, _, _, fmt in COLUMNS:
        value = getattr(r, attr)
        row.append(fmt.format(value) if value is not None else "-")
    return row


def headers(cpu: bool = False, short: bool = False) -> list[str]:
    """The columns' names (``short``: for a narrow terminal); on CPU the memory is host RSS."""
    names = [
        CPU_MEMORY[1 if short else 0]
        if cpu and attr == "mem_alloc_gib"
        else (brief if short else head)
        for attr, head, brief, _ in COLUMNS
    ]
    return ["variant", "status", *names]


def results_table(results: list[Result], meta: dict[str, Any]) -> TextTable:
    """The variants side by side."""
    align: list[Align] = ["left", "left", *(["right"] * len(COLUMNS))]
    cpu = on_cpu(meta)
    table = TextTable("zerofit bench", headers(cpu), align, short=headers(cpu, short=True))
    for r in results:
        table.add_row(cells(r), None if r.status == "ok" else "red")
    return table


def environment() -> dict[str, Any]:
    env: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "host": platform.node(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "gpus": torch.cuda.device_count() if torch.cuda.is_available() else 0,
        "cpu": host_cpu(),
        "cpu_count": os.cpu_count(),
    }
    env.update(library_versions())
    return env


def host_cpu(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """The host CPU's model name: the planner's host terms (kernel launches, engine hooks, CPU
    Adam) depend on it, so every result records which host it ran on."""
    try:
        for line in cpuinfo.read_text(errors="replace").splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and value.strip():
                return value.strip()
    except OSError:  # not Linux: what the platform says
        pass
    return platform.processor() or platform.machine() or "unknown"


def markdown(results: list[Result], meta: dict[str, Any]) -> str:
    lines = [
        f"# zerofit bench: {meta['date']}",
        "",
        f"- GPU: {meta['env']['gpu'] or 'none (CPU)'} x {meta['nproc']}; torch {meta['env']['torch']}"
        + "".join(f", {lib} {meta['env'].get(lib)}" for lib in library_versions()),
        *([f"- model: {meta['model']}"] if meta.get("model") else []),
        f"- command: `{meta['command']}`",
        f"- median step time over {meta['steps']} steps after {meta['warmup']} warm-up steps",
        "",
        *results_table(results, meta).markdown(),
    ]
    if on_cpu(meta):
        lines += ["", f"{CPU_MEMORY[0]}: the peak resident set size of rank 0's process (CPU)."]
    failed = [r for r in results if r.status != "ok"]
    if failed:
        lines += ["", *(f"- {r.name}: {r.status}: {r.error}" for r in failed)]
    picks = best_lines(results)
    if picks:
        lines += ["", *(f"- {line}" for line in picks)]
    if meta["steps"] < 10:
        lines += [
            "",
            f"Note: only {meta['steps']} timed steps per variant (10 or more is the norm).",
        ]
    gpu = (meta.get("env") or {}).get("gpu")
    if gpu and meta.get("warmup", MEMORY_HISTORY_STEPS) < MEMORY_HISTORY_STEPS:
        lines += [
            "",
            f"Note: --warmup {meta['warmup']} times steps during which the run still records its "
            f"CUDA allocations (the first {MEMORY_HISTORY_STEPS}), which slows them: use "
            f"--warmup {MEMORY_HISTORY_STEPS} or more.",
        ]
    lines += profile_markdown(results, meta.get("profile_steps", 0))
    return "\n".join(lines) + "\n"


def profile_cells(r: Result) -> list[str]:
    """variant, the five shares, comm overlapped with compute, the trace file."""
    p = r.profile or {}
    shares = [f"{p['breakdown'][part]:.1%}" for part in PARTS]
    trace = str(Path(r.profile_dir) / p["trace"])
    return [r.name, *shares, f"{p['comm_overlap']:.1%}", trace]


def profile_table(profiled: list[Result], trace: bool) -> TextTable:
    """Each profiled variant's shares of step time (and its trace file, if ``trace``)."""
    heads = ["variant", *PARTS, "comm overlapped", "trace"]
    align: list[Align] = ["left", *(["right"] * (len(PARTS) + 1)), "left"]
    keep = len(heads) if trace else len(heads) - 1
    table = TextTable("where the step time went (profiled steps, rank 0)", heads[:keep], align)
    for r in profiled:
        table.add_row(profile_cells(r)[:keep])
    return table


def top_rows(profile: dict[str, Any], top: int) -> tuple[str, list[list[str]]]:
    """('kernel' or 'op', rows of name, calls, total ms, share)."""
    what = "kernel" if profile["device"] == "cuda" else "op"
    rows = [
        [t["name"], str(t["calls"]), f"{t['total_ms']:,.2f}", f"{t['share']:.1%}"]
        for t in profile["top"][:top]
    ]
    return what, rows


def profile_markdown(results: list[Result], steps: int) -> list[str]:
    profiled = [r for r in results if r.profile]
    if not profiled:
        return []
    lines = [
        "",
        f"## Where the step time went ({steps} profiled steps after the timed ones, rank 0)",
        "",
        *profile_table(profiled, trace=True).markdown(),
        "",
        "Shares of the profiled steps' wall time (definitions: `zerofit.report.profiling`); "
        "'comm overlapped' is the time communication ran alongside compute.",
    ]
    for r in profiled:
        what, rows = top_rows(r.profile or {}, 10)
        lines += ["", f"### {r.name}: top {what}s by {(r.profile or {})['top_by']}", ""]
        lines += [f"| {what} | calls | total ms | share |", "|---|---:|---:|---:|"]
        for name, *figures in rows:  # kernel names hold <templates> and the odd '|'
            cell = "`" + name.replace("`", "'").replace("|", "\\|") + "`"
            lines.append("| " + " | ".join([cell, *figures]) + " |")
    return lines


def write_report(results: list[Result], out: Path, meta: dict[str, Any]) -> None:
    top = best(results)
    data = {
        "meta": meta,
        "best": top.name if top else None,
        "results": [asdict(r) for r in results],
    }
    (out / "results.json").write_text(json.dumps(data, indent=1))
    (out / "results.md").write_text(markdown(results, meta))
    write_charts(data, out)


def print_results(
    results: list[Result], meta: dict[str, Any], console: Console | None = None
) -> None:
    """The table, the failures, the best variants and any profiles on ``console`` (default:
    stdout's): markdown where it is not a terminal, else fitted to it (`zerofit.report.tables`)."""
    console = console or Console()
    print_table(results_table(results, meta), console)
    for r in results:
        if r.status != "ok":
            print_lines(console, [f"{r.name}: {r.status}: {r.error}"], style="red")
    print_lines(console, best_lines(results))
    print_profiles(results, console)


def print_profiles(results: list[Result], console: Console) -> None:
    """Each profiled variant's breakdown and top kernels (the trace paths were printed as each
    variant finished)."""
    profiled = [r for r in results if r.profile]
    if not profiled:
        return
    print_table(profile_table(profiled, trace=False), console)
    for r in profiled:
        what, rows = top_rows(r.profile or {}, 5)
        title = f"{r.name}: top {what}s by {(r.profile or {})['top_by']}"
        top = TextTable(title, [what, "calls", "total ms", "share"], ["left", *["right"] * 3])
        for row in rows:
            top.add_row(row)
        print_table(top, console)

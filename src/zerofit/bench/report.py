"""What `zerofit bench` leaves behind: results.json, results.md, throughput.png, memory.png and the
table it prints; with --profile, each variant's step-time breakdown and top kernels too."""

from __future__ import annotations

import json
import platform
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from rich.console import Console
from rich.table import Table
from rich.text import Text

from zerofit.backends import library_versions
from zerofit.bench.run import Result, best, best_lines
from zerofit.report.memory_history import MEMORY_HISTORY_STEPS
from zerofit.report.profiling import PARTS

COLUMNS: list[tuple[str, str, str]] = [  # (Result attribute, header, format)
    ("tokens_per_s", "tokens/s", "{:,.0f}"),
    ("real_tokens_per_s", "real tokens/s", "{:,.0f}"),
    ("tokens_per_s_per_gpu", "tokens/s/GPU", "{:,.0f}"),
    ("tflops_per_gpu", "TFLOP/s/GPU", "{:.1f}"),
    ("mfu", "MFU", "{:.1%}"),
    ("step_time_s", "step s (median)", "{:.3f}"),
    ("mem_alloc_gib", "peak alloc GiB", "{:.1f}"),
    ("mem_reserved_gib", "peak reserved GiB", "{:.1f}"),
    ("alloc_retries", "alloc retries", "{:,}"),
    ("final_loss", "final loss", "{:.4f}"),
]


def cells(r: Result) -> list[str]:
    row = [r.name, r.status]
    for attr, _, fmt in COLUMNS:
        value = getattr(r, attr)
        row.append(fmt.format(value) if value is not None else "-")
    return row


def headers() -> list[str]:
    return ["variant", "status", *(h for _, h, _ in COLUMNS)]


def environment() -> dict[str, Any]:
    env: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "host": platform.node(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "gpus": torch.cuda.device_count() if torch.cuda.is_available() else 0,
    }
    env.update(library_versions())
    return env


def markdown(results: list[Result], meta: dict[str, Any]) -> str:
    lines = [
        f"# zerofit bench: {meta['date']}",
        "",
        f"- GPU: {meta['env']['gpu'] or 'none (CPU)'} x {meta['nproc']}; torch {meta['env']['torch']}"
        + "".join(f", {lib} {meta['env'].get(lib)}" for lib in library_versions()),
        f"- command: `{meta['command']}`",
        f"- median step time over {meta['steps']} steps after {meta['warmup']} warm-up steps",
        "",
        "| " + " | ".join(headers()) + " |",
        "|" + "---|" * 2 + "---:|" * len(COLUMNS),
    ]
    lines += ["| " + " | ".join(cells(r)) + " |" for r in results]
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


def profile_headers() -> list[str]:
    return ["variant", *PARTS, "comm overlapped", "trace"]


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
        "| " + " | ".join(profile_headers()) + " |",
        "|---|" + "---:|" * (len(PARTS) + 1) + "---|",
        *("| " + " | ".join(profile_cells(r)) + " |" for r in profiled),
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


def charts(results: list[Result], out: Path) -> list[Path]:
    names = [r.name for r in results]
    written = []
    specs = [
        ("throughput.png", "tokens/s", [[r.tokens_per_s or 0.0 for r in results]], ["tokens/s"]),
        (
            "memory.png",
            "GiB",
            [
                [r.mem_alloc_gib or 0.0 for r in results],
                [r.mem_reserved_gib or 0.0 for r in results],
            ],
            ["peak allocated", "peak reserved"],
        ),
    ]
    for filename, unit, series, labels in specs:
        fig = Figure(figsize=(max(6.0, 0.9 * len(names) + 2), 4.5))
        FigureCanvasAgg(fig)
        ax = fig.add_subplot()
        width = 0.8 / len(series)
        for j, (values, label) in enumerate(zip(series, labels, strict=True)):
            xs = [i + (j - (len(series) - 1) / 2) * width for i in range(len(names))]
            ax.bar(xs, values, width, label=label)
        for i, r in enumerate(results):
            if r.status != "ok":
                ax.annotate(r.status, (i, 0), ha="center", va="bottom", color="red")
        ax.set_xticks(range(len(names)), names, rotation=30, ha="right", fontsize=8)
        ax.set_ylabel(unit)
        ax.set_title(f"zerofit bench: {unit} by variant")
        if len(series) > 1:
            ax.legend()
        fig.tight_layout()
        fig.savefig(out / filename, dpi=120)
        written.append(out / filename)
    return written


def write_report(results: list[Result], out: Path, meta: dict[str, Any]) -> None:
    top = best(results)
    data = {
        "meta": meta,
        "best": top.name if top else None,
        "results": [asdict(r) for r in results],
    }
    (out / "results.json").write_text(json.dumps(data, indent=1))
    (out / "results.md").write_text(markdown(results, meta))
    charts(results, out)


def print_table(results: list[Result]) -> None:
    table = Table(title="zerofit bench")
    for i, h in enumerate(headers()):
        table.add_column(h, justify="left" if i < 2 else "right")
    for r in results:
        style = None if r.status == "ok" else "red"
        table.add_row(*cells(r), style=style)
    console = Console()
    console.print(table)
    for r in results:
        if r.status != "ok":
            console.print(f"[red]{r.name}: {r.status}: {r.error}[/red]")
    for line in best_lines(results):
        console.print(line)
    print_profiles(results, console)


def print_profiles(results: list[Result], console: Console) -> None:
    """Each profiled variant's breakdown and top kernels (cells are `Text`: kernel names are not
    markup)."""
    profiled = [r for r in results if r.profile]
    if not profiled:
        return
    table = Table(title="where the step time went (profiled steps, rank 0)")
    for i, h in enumerate(profile_headers()[:-1]):  # the trace paths are printed per variant
        table.add_column(h, justify="right" if i else "left")
    for r in profiled:
        table.add_row(*map(Text, profile_cells(r)[:-1]))
    console.print(table)
    for r in profiled:
        what, rows = top_rows(r.profile or {}, 5)
        top = Table(title=f"{r.name}: top {what}s by {(r.profile or {})['top_by']}")
        for i, h in enumerate([what, "calls", "total ms", "share"]):
            top.add_column(h, justify="left" if i == 0 else "right", overflow="fold")
        for row in rows:
            top.add_row(*map(Text, row))
        console.print(top)

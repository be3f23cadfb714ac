"""The charts `zerofit bench` writes, throughput.png and memory.png: a bar per variant with its value
on it, titled with the model, the GPU (or CPU) and the date. A GPU run's memory is the caching
allocator's peak allocated and reserved; a CPU run has no allocator to ask, so its memory is the
peak host RSS (resident set size) of rank 0's process, and the chart says so.

Built from results.json's data (``{"meta": ..., "results": [...]}``), so a test, or anyone with a
results.json, gets the same figures."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

HOST_RSS = "peak host RSS"
HOST_RSS_AXIS = "GiB: peak host RSS\n(resident set size of rank 0's process)"


@dataclass
class Chart:
    filename: str
    what: str  # the title's first words
    unit: str  # the y axis
    value_format: str  # each bar's label
    series: list[tuple[str, list[float | None]]]  # (legend label, a value per variant)


def on_cpu(meta: dict[str, Any]) -> bool:
    return not (meta.get("env") or {}).get("gpu")


def subject(meta: dict[str, Any]) -> str:
    """'<model> on <GPU> x <n>, <date>' ('on CPU, <n> processes' without a GPU)."""
    env = meta.get("env") or {}
    nproc = meta.get("nproc", "?")
    processes = f"{nproc} process" + ("" if nproc == 1 else "es")
    where = f"CPU, {processes}" if on_cpu(meta) else f"{env['gpu']} x {nproc}"
    model = meta.get("model") or "model not recorded"
    return f"{model} on {where}, {meta.get('date', 'undated')}"


def chart_specs(data: dict[str, Any]) -> list[Chart]:
    results = data["results"]

    def values(key: str) -> list[float | None]:
        return [r.get(key) if r.get("status") == "ok" else None for r in results]

    throughput = Chart(
        "throughput.png", "tokens/s", "tokens/s", "{:,.0f}", [("tokens/s", values("tokens_per_s"))]
    )
    if on_cpu(data.get("meta") or {}):  # measure() keeps a CPU run's host RSS as mem_alloc_gib
        memory = Chart("memory.png", HOST_RSS, HOST_RSS_AXIS, "{:.2f}", [])
        memory.series.append((HOST_RSS, values("mem_alloc_gib")))
    else:
        memory = Chart("memory.png", "peak GPU memory", "GiB", "{:.1f}", [])
        memory.series.append(("peak allocated", values("mem_alloc_gib")))
        memory.series.append(("peak reserved", values("mem_reserved_gib")))
    return [throughput, memory]


def chart_figure(chart: Chart, data: dict[str, Any]) -> Figure:
    """One chart: grouped bars, each labelled with its value; failed variants marked."""
    results = data["results"]
    names = [r["name"] for r in results]
    fig = Figure(figsize=(max(6.0, 0.9 * len(names) + 2), 4.8))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    width = 0.8 / len(chart.series)
    for j, (label, values) in enumerate(chart.series):
        xs = [i + (j - (len(chart.series) - 1) / 2) * width for i in range(len(names))]
        bars = ax.bar(xs, [v or 0.0 for v in values], width, label=label)
        texts = [chart.value_format.format(v) if v is not None else "" for v in values]
        ax.bar_label(bars, texts, padding=2, fontsize=7)
    for i, r in enumerate(results):
        if r.get("status") != "ok":
            ax.annotate(r.get("status", "?"), (i, 0), ha="center", va="bottom", color="red")
    ax.set_xticks(range(len(names)), names, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel(chart.unit)
    ax.margins(y=0.3 if len(chart.series) > 1 else 0.15)  # room for the labels and legend
    ax.set_title(f"zerofit bench: {chart.what} by variant\n{subject(data.get('meta') or {})}")
    if len(chart.series) > 1:
        ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    return fig


def chart_figures(data: dict[str, Any]) -> dict[str, Figure]:
    """{file name: figure} for results.json's data."""
    return {chart.filename: chart_figure(chart, data) for chart in chart_specs(data)}


def write_charts(data: dict[str, Any], out: Path) -> list[Path]:
    written = []
    for filename, fig in chart_figures(data).items():
        fig.savefig(out / filename, dpi=120)
        written.append(out / filename)
    return written

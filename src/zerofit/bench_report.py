"""What `zerofit bench` leaves behind: results.json, results.md, throughput.png, memory.png and the
table it prints."""

from __future__ import annotations

import json
import platform
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from zerofit.bench import Result, best, best_lines

COLUMNS: list[tuple[str, str, str]] = [  # (Result attribute, header, format)
    ("tokens_per_s", "tokens/s", "{:,.0f}"),
    ("real_tokens_per_s", "real tokens/s", "{:,.0f}"),
    ("tokens_per_s_per_gpu", "tokens/s/GPU", "{:,.0f}"),
    ("tflops_per_gpu", "TFLOP/s/GPU", "{:.1f}"),
    ("mfu", "MFU", "{:.1%}"),
    ("step_time_s", "step s (median)", "{:.3f}"),
    ("mem_alloc_gib", "peak alloc GiB", "{:.1f}"),
    ("mem_reserved_gib", "peak reserved GiB", "{:.1f}"),
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
    import torch

    env: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "host": platform.node(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "gpus": torch.cuda.device_count() if torch.cuda.is_available() else 0,
    }
    try:
        import deepspeed

        env["deepspeed"] = deepspeed.__version__
    except ImportError:
        env["deepspeed"] = None
    return env


def markdown(results: list[Result], meta: dict[str, Any]) -> str:
    lines = [
        f"# zerofit bench: {meta['date']}",
        "",
        f"- GPU: {meta['env']['gpu'] or 'none (CPU)'} x {meta['nproc']}; torch {meta['env']['torch']}, "
        f"DeepSpeed {meta['env']['deepspeed']}",
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
    return "\n".join(lines) + "\n"


def charts(results: list[Result], out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

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
        fig, ax = plt.subplots(figsize=(max(6.0, 0.9 * len(names) + 2), 4.5))
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
        plt.close(fig)
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
    from rich.console import Console
    from rich.table import Table

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

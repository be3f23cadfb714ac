"""Rank-0 progress display: a rich progress bar on a terminal, plain log lines otherwise."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeRemainingColumn
from rich.progress import Progress as RichProgress

from zerofit.report.tables import TextTable


def format_record(r: dict[str, Any]) -> str:
    parts = []
    if "loss" in r:
        parts.append(f"loss {r['loss']:.4f}")
    if "eval_loss" in r:
        parts.append(f"eval {r['eval_loss']:.4f}")
    if "eval_dpo_accuracy" in r:  # the held-out pairs
        parts.append(f"eval acc {r['eval_dpo_accuracy']:.2f}")
    if "dpo_accuracy" in r:  # train.objective dpo: over the logging window's pairs
        parts.append(f"acc {r['dpo_accuracy']:.2f}  margin {r['dpo_margin']:.3f}")
    if "tokens_per_s" in r:
        parts.append(f"{r['tokens_per_s']:,.0f} tok/s")
    if "mfu" in r:
        parts.append(f"MFU {100 * r['mfu']:.1f}%")
    if "mem_alloc_gib" in r:
        parts.append(f"mem {r['mem_alloc_gib']:.1f}/{r['mem_reserved_gib']:.1f} GiB")
    elif "mem_rss_gib" in r:
        parts.append(f"rss {r['mem_rss_gib']:.2f} GiB")
    return "  ".join(parts)


class Progress:
    def __init__(self, total: int, start: int, enabled: bool):
        self.enabled = enabled
        self.console = Console(stderr=False)
        self.live = enabled and self.console.is_terminal
        self.bar: RichProgress | None = None
        if self.live:
            self.bar = RichProgress(
                TextColumn("[bold]train"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeRemainingColumn(),
                TextColumn("{task.fields[stats]}"),
                console=self.console,
            )
            self.task = self.bar.add_task("train", total=total, completed=start, stats="")

    def __enter__(self) -> Progress:
        if self.bar:
            self.bar.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.bar:
            self.bar.__exit__(*exc)

    def update(self, step: int, record: dict[str, Any]) -> None:
        if not self.enabled:
            return
        text = format_record(record)
        if self.bar:
            self.bar.update(self.task, stats=text)
        else:
            self.console.print(f"step {step:>6}  {text}", highlight=False)

    def advance(self, step: int) -> None:
        if self.bar:
            self.bar.update(self.task, completed=step)


def _final_loss(summary: dict[str, Any]) -> tuple[str, str]:
    """The last step's own loss (summary.json's final_step_loss)."""
    loss = summary.get("final_step_loss")
    step = summary.get("step", "?")
    return (f"final loss (step {step})", f"{loss:.4f}" if isinstance(loss, float) else "-")


def _window_loss(summary: dict[str, Any]) -> tuple[str, str]:
    """The last logged record's loss: a mean over the steps since the log before it."""
    n = summary.get("loss_steps", 1)
    label = f"mean loss, last {n} steps" if n > 1 else "logged loss, last step"
    return (label, f"{summary['loss']:.4f}" if "loss" in summary else "-")


def summary_table(summary: dict[str, Any]) -> TextTable:
    table = TextTable("zerofit run summary", ["what", "value"], show_header=False)
    rows = [
        ("steps", f"{summary.get('start_step', 0)} -> {summary.get('step', '?')}"),
        _final_loss(summary),
        _window_loss(summary),
        ("eval loss", f"{summary['eval_loss']:.4f}" if "eval_loss" in summary else "-"),
        ("tokens/s", f"{summary['tokens_per_s']:,.0f}" if "tokens_per_s" in summary else "-"),
        (
            "tokens/s per GPU" if summary.get("device") == "cuda" else "tokens/s per rank",
            f"{summary['tokens_per_s_per_gpu']:,.0f}" if "tokens_per_s_per_gpu" in summary else "-",
        ),
        ("MFU", f"{100 * summary['mfu']:.1f}%" if "mfu" in summary else "- (no GPU peak known)"),
    ]
    if "dpo_accuracy" in summary:  # the last logging window's pairs
        rows.append(
            (
                "DPO (last window)",
                f"accuracy {summary['dpo_accuracy']:.2f}, reward margin {summary['dpo_margin']:.3f}",
            )
        )
    if "eval_dpo_accuracy" in summary:  # the last eval's held-out pairs
        rows.append(
            (
                "DPO (held out)",
                f"accuracy {summary['eval_dpo_accuracy']:.2f}, "
                f"reward margin {summary['eval_dpo_margin']:.3f}",
            )
        )
    if "mem_alloc_gib" in summary:
        rows.append(
            (
                "peak memory",
                f"{summary['mem_alloc_gib']:.2f} GiB allocated, {summary['mem_reserved_gib']:.2f} reserved",
            )
        )
    rss = summary.get("mem_rss_gib", summary.get("host_rss_gib"))
    if rss is not None:
        rows.append(("peak host RSS (rank 0)", f"{rss:.2f} GiB"))
    rows += [
        ("ranks", str(summary.get("world_size", "?"))),
        ("wall time", f"{summary.get('wall_time_s', 0):.1f} s"),
        ("checkpoint", str(summary.get("checkpoint", "-"))),
        ("run dir", str(summary.get("run_dir", "-"))),
    ]
    for k, v in rows:
        table.add_row([k, v])
    return table

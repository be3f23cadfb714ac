"""`zerofit plan`'s table: one row per strategy (micro-batch x accumulation, GPU total, fits, speed,
memory by component), the workload and the machine above it, then the "fits" rule, the engines
left out (those that refuse the config), the run as configured and the verdict.

The table fits the terminal's width (100 columns when stdout is not a terminal) and is never cut:
the columns that do not fit beside the strategy go to a second table of the same rows, keyed by
the rank in the `#` column, and a cell too wide for any table wraps onto a second line.
"""

from __future__ import annotations

import re
import textwrap
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING

from zerofit.backends.terms import GIB, Workload
from zerofit.models.shape import ModelShape
from zerofit.planner.configured import Configured, Suggestion, rank_key
from zerofit.planner.plan import Option, closest, headroom_rule, left_out_line, recommend
from zerofit.planner.shape import Hardware

if TYPE_CHECKING:
    from rich.console import Console

FLAG = re.compile(r"(--[\w.-]+) ([^\s)]+)")  # `--section.key VALUE`
PIPED_WIDTH = 100  # columns when stdout is not a terminal
SHOWN = 12  # rows without --all
COMPONENTS = {"params": "parameters", "grads": "gradients", "optim": "optimizer_states"}
COMPONENTS |= {"activ": "activations", "logits": "logits", "buffers": "buffers"}
COMPONENTS |= {"overhead": "overhead"}


def _cells(o: Option, w: Workload) -> dict[str, str]:
    c, at = o.memory.components(), o.workload or w
    return {
        "strategy": o.strategy.label,
        "micro x acc": f"{at.micro_batch_size} x {at.grad_accum_steps}",
        "GPU total": f"{o.memory.peak_reserved / GIB:.1f}",
        "fits": "yes" if o.fits else "no",
        "tok/s": f"{o.speed.tokens_per_s:,.0f}",
        "step s": f"{o.speed.step_time:.2f}",
        "MFU": f"{100 * o.speed.mfu:.0f}%",
        "host/GPU": f"{o.memory.host / GIB:.1f}",
        **{short: f"{c[key] / GIB:.1f}" for short, key in COMPONENTS.items()},
    }


COLUMNS = ("#", "strategy", "micro x acc", "GPU total", "fits", "tok/s", "step s", "MFU")
COLUMNS += ("host/GPU", *COMPONENTS)


def rows(
    options: list[Option], w: Workload, show_all: bool, configured: Configured | None
) -> list[dict[str, str]]:
    """The rows shown: the 12 best (every one with `show_all`), each with its rank in `#`, and
    the run as configured marked `*` (added at its place when the plan does not list it or it
    falls beyond the rows shown)."""
    shown = options if show_all else options[:SHOWN]
    out = [{"#": str(i + 1), **_cells(o, w)} for i, o in enumerate(shown)]
    if configured is None:
        return out
    if configured.listed is not None and configured.listed < len(shown):
        out[configured.listed]["#"] += "*"
        return out
    row = {"#": f"{configured.rank}*" if configured.listed is not None else "*"}
    row |= _cells(configured.option, w)
    later = [i for i, o in enumerate(shown) if rank_key(o) > rank_key(configured.option)]
    out.insert(later[0] if later and configured.listed is None else len(out), row)
    return out


def groups(widths: dict[str, int], width: int) -> list[list[str]]:
    """The columns of each table, in COLUMNS order: as many beside `#` and the strategy as fit in
    `width` (a cell takes its text and 3 columns of padding and rule, a table 1 more), the rest
    in further tables keyed by `#`."""

    def size(cols: list[str]) -> int:
        return sum(widths[c] + 3 for c in cols) + 1

    out = [["#", "strategy"]]
    for col in COLUMNS[2:]:
        if size([*out[-1], col]) > width and len(out[-1]) > 1:
            out.append(["#"])
        out[-1].append(col)
    return out


def verdict(options: list[Option], fixed: bool = False, micro_batch: int = 1) -> str:
    best = recommend(options)
    if best is None:
        near = closest(options)
        if fixed:
            smaller = "Lower seq_len or the global batch"
        elif micro_batch > 1:
            smaller = "Lower the micro-batch or seq_len"
        else:
            smaller = "Shorten seq_len, train LoRA/QLoRA adapters"
        return (
            f"[bold red]nothing fits[/]: the closest is {near.strategy.label} "
            f"({near.why_not}). {smaller}, add GPUs, or add host RAM / NVMe for offload."
        )
    batch = ""
    if fixed and best.workload is not None:
        batch = (
            f" at micro-batch {best.workload.micro_batch_size} x accumulation "
            f"{best.workload.grad_accum_steps}"
        )
    return (
        f"[bold green]recommended:[/] {best.strategy.label}{batch}: "
        f"{best.memory.peak_reserved / GIB:.1f} GiB per GPU, ~{best.speed.tokens_per_s:,.0f} tokens/s"
    )


def gpu_words(hw: Hardware) -> str:
    figures = f"{hw.peak_flops / 1e12:,.0f} TFLOP/s bf16, {hw.mem_bw / 1e9:,.0f} GB/s memory"
    if hw.gpu_from == "assumed":
        return (
            f"GPU not named: speed assumes an H200's {figures} (give --gpu NAME or --peak-tflops)"
        )
    return f"{hw.name} ({hw.gpu_from}): {figures}"


def host_words(hw: Hardware) -> str:
    if hw.cpu_mem is None:
        return "host RAM unknown (give --cpu-mem): offload cannot fit"
    where = {"given": "given", "detected": "detected here"}.get(hw.cpu_mem_from, hw.cpu_mem_from)
    words = f"host RAM {hw.cpu_mem / GIB:,.0f} GiB per node ({where})"
    if hw.host_launch_s is not None:
        compiled = hw.host_compiled_launch_s
        words += f"; host {hw.host_launch_s * 1e6:.1f} us a kernel launch" + (
            f" ({compiled * 1e6:.1f} compiled)" if compiled is not None else ""
        )
        hooks = [f"{rate * 1e6:.1f} us {name}" for name, rate in hw.host_hooks]
        if hw.host_hook_s is not None:
            hooks.append(f"{hw.host_hook_s * 1e6:.1f} us")
        words += f", a hook call {', '.join(hooks) or 'as fitted'}"
        adam = [f"{name} {rate / 1e9:.0f} GB/s" for name, rate in hw.host_adam]
        words += (f", {', '.join(adam)}" if adam else "") + f" ({hw.host_from})"
    return words


def title(m: ModelShape, w: Workload, hw: Hardware, global_batch: int | None) -> str:
    batch = (
        f"global batch {global_batch} x seq {w.seq_len} (micro-batch x accumulation per strategy)"
        if global_batch is not None
        else f"micro-batch {w.micro_batch_size} x seq {w.seq_len}"
    )
    memory = f"{hw.gpu_mem / GIB:.1f} GiB"
    if hw.gpu_mem_from != "card":
        memory += f" ({hw.gpu_mem_from})"
    text = (
        f"{m.name}: {m.num_params / 1e9:.2f}B params, {batch}, {hw.world_size} x {memory}, "
        f"{w.compute_dtype} compute / {w.master_dtype} master"
    )
    if w.fp8 != "none":
        text += f", fp8 {w.fp8} (block Linear layers; output layer {w.compute_dtype})"
    if w.lora and w.lora.quantized:
        text += (
            f"; QLoRA r={w.lora.rank}: {w.lora.params / 1e6:.3g}M adapter params train, the base "
            f"is frozen, {w.lora.quantized / 1e9:.3g}B of its weights in NF4 (4-bit), the rest in "
            f"{w.compute_dtype}"
        )
    elif w.lora:
        text += (
            f"; LoRA r={w.lora.rank}: {w.lora.params / 1e6:.3g}M adapter params train, the base is "
            f"frozen in {w.compute_dtype}"
        )
    return text + f"\n{gpu_words(hw)}; {host_words(hw)}"


def table_width(is_terminal: bool, terminal: int) -> int:
    """The terminal's width, or PIPED_WIDTH when stdout is not a terminal."""
    return terminal if is_terminal else PIPED_WIDTH


def print_rows(say: Callable[..., None], table_rows: list[dict[str, str]], width: int) -> None:
    """The rows as one table, or as several of the same rows (see `groups`), within `width`."""
    from rich.table import Table  # light CLI start: rich loads only to print a table

    widths = {c: max(len(c), *(len(r[c]) for r in table_rows)) for c in COLUMNS}
    for n, cols in enumerate(groups(widths, width)):
        table = Table(title="the same rows, continued (GiB per GPU)" if n else None)
        for col in cols:
            justify = "left" if col == "strategy" else "right"
            table.add_column(col, justify=justify, overflow="fold")
        for r in table_rows:
            table.add_row(*(r[c] for c in cols))
        say(table)


def print_tables(
    m: ModelShape,
    w: Workload,
    hw: Hardware,
    options: list[Option],
    show_all: bool,
    global_batch: int | None = None,
    refused: dict[str, str] | None = None,
    configured: Configured | None = None,
) -> Callable[[list[str]], None]:
    """The title, the table(s) and the lines under them; returns what prints the lines that
    follow (`print_lines`: the run as configured, the adapters)."""
    from rich.console import Console  # light CLI start: rich loads only to print a table

    probe = Console()
    console = Console(width=table_width(probe.is_terminal, probe.width))
    console.print(title(m, w, hw, global_batch), markup=False, highlight=False)
    print_rows(console.print, rows(options, w, show_all, configured), console.width)
    console.print(
        "GiB per GPU; GPU total = peak allocated + CUDA context + fragmentation. Speed: roofline "
        "(see zerofit/planner/speed.py)."
        + (" * = as configured." if configured is not None else "")
    )
    console.print(headroom_rule(hw))
    if refused:
        console.print(left_out_line(refused), markup=False)
    console.print(verdict(options, global_batch is not None, w.micro_batch_size))
    return partial(print_lines, console)


def print_lines(console: Console, lines: list[str]) -> None:
    """Plain lines within the console's width, each continued under its own indent + 4; a flag
    stays on one line with its value."""
    for line in lines:
        indent = " " * (len(line) - len(line.lstrip()) + 4)
        kept = FLAG.sub("\\1\xa0\\2", line)  # textwrap breaks at spaces, not at U+00A0
        wrapped = textwrap.fill(
            kept, console.width, subsequent_indent=indent, break_on_hyphens=False
        )
        console.print(wrapped.replace("\xa0", " "), markup=False, highlight=False, soft_wrap=True)


def _forecast_words(o: Option) -> str:
    fits = "fits" if o.fits else f"does not fit ({o.why_not})"
    return (
        f"{o.strategy.label}, {o.memory.peak_reserved / GIB:.1f} GiB per GPU, {fits}, "
        f"~{o.speed.tokens_per_s:,.0f} tokens/s"
    )


def flags(fields: dict[str, object]) -> str:
    """Config fields as the `--section.key VALUE` flags that set them."""

    def value(v: object) -> str:
        return "null" if v is None else str(v).lower() if isinstance(v, bool) else str(v)

    return " ".join(f"--{k} {value(v)}" for k, v in fields.items())


def configured_lines(
    configured: Configured, suggested: list[Suggestion], w: Workload, total: int
) -> list[str]:
    """The run as configured (the row marked `*`), and when it does not fit, each change that
    the planner forecast (`zerofit.planner.configured.suggestions`)."""
    o, at = configured.option, configured.option.workload or w
    how = " (parallel.backend auto: the planner's pick at launch)" if configured.auto else ""
    lines = [
        f"* as configured{how}: micro-batch {at.micro_batch_size} x accumulation "
        f"{at.grad_accum_steps}, {_forecast_words(o)}; rank {configured.rank} of {total}"
    ]
    if suggested:
        fitting = sum(s.option.fits for s in suggested)
        lines.append(
            "  it does not fit; the same run with one change"
            + (":" if fitting else " (none of them fits either):")
        )
    for s in suggested:
        given = flags(s.overrides)
        lines.append(
            f"  - {s.change}" + (f" ({given})" if given else "") + f": {_forecast_words(s.option)}"
        )
    return lines

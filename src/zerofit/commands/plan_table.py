"""`zerofit plan`'s table: one row per strategy (memory by component, micro-batch x accumulation,
speed), the workload and the machine in its title, then the "fits" rule, the engines left out (those
that refuse the config) and the verdict."""

from __future__ import annotations

from zerofit.backends.terms import GIB, Workload
from zerofit.models.shape import ModelShape
from zerofit.planner.plan import Option, closest, headroom_rule, left_out_line, recommend
from zerofit.planner.shape import Hardware

COLUMNS = ("strategy", "micro x acc", "params", "grads", "optim", "activ", "logits", "buffers")
COLUMNS += ("overhead", "GPU total", "host/GPU", "fits", "step s", "tok/s", "MFU")
COMPONENTS = ("parameters", "gradients", "optimizer_states", "activations", "logits", "buffers")
COMPONENTS += ("overhead",)


def row(o: Option, w: Workload) -> list[str]:
    c, at = o.memory.components(), o.workload or w
    return [
        o.strategy.label,
        f"{at.micro_batch_size} x {at.grad_accum_steps}",
        *(f"{c[k] / GIB:.1f}" for k in COMPONENTS),
        f"{o.memory.peak_reserved / GIB:.1f}",
        f"{o.memory.host / GIB:.1f}",
        "yes" if o.fits else "no",
        f"{o.speed.step_time:.2f}",
        f"{o.speed.tokens_per_s:,.0f}",
        f"{100 * o.speed.mfu:.0f}%",
    ]


def verdict(options: list[Option], fixed: bool = False) -> str:
    best = recommend(options)
    if best is None:
        near = closest(options)
        smaller = (
            "Lower seq_len or the global batch" if fixed else "Lower the micro-batch or seq_len"
        )
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
    return f"host RAM {hw.cpu_mem / GIB:,.0f} GiB per node ({where})"


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


def print_tables(
    m: ModelShape,
    w: Workload,
    hw: Hardware,
    options: list[Option],
    show_all: bool,
    global_batch: int | None = None,
    refused: dict[str, str] | None = None,
) -> None:
    from rich.console import Console  # light CLI start: rich loads only to print a table
    from rich.table import Table  # light CLI start: rich loads only to print a table

    console = Console()
    console = Console(width=max(console.width, 170))  # a wide table reads better wrapped
    table = Table(title=title(m, w, hw, global_batch))
    for col in COLUMNS:
        table.add_column(col, justify="left" if col == "strategy" else "right")
    for o in options if show_all else options[:12]:
        table.add_row(*row(o, w))
    console.print(table)
    console.print(
        "GiB per GPU; GPU total = peak allocated + CUDA context + fragmentation. Speed: roofline "
        "(see zerofit/planner/speed.py)."
    )
    console.print(headroom_rule(hw), soft_wrap=True)
    if refused:
        console.print(left_out_line(refused), soft_wrap=True, markup=False)
    console.print(verdict(options, global_batch is not None))

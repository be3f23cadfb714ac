"""`zerofit plan --json`: the forecast's model, workload, hardware, headroom and every option, in
GiB and tokens/s (the layout docs/benchmarks' plan files and `plan --measure` read)."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from zerofit.backends.terms import GIB, Workload
from zerofit.models.shape import ModelShape
from zerofit.planner.configured import Configured, Suggestion
from zerofit.planner.plan import Option, headroom, recommend
from zerofit.planner.shape import Hardware


def to_json(
    m: ModelShape,
    w: Workload,
    hw: Hardware,
    options: list[Option],
    global_batch: int | None = None,
    refused: dict[str, str] | None = None,
    configured: Configured | None = None,
    suggested: list[Suggestion] | None = None,
) -> dict[str, Any]:
    best = recommend(options)
    return {
        "model": {
            "name": m.name,
            "params": m.num_params,
            "layers": m.n_layers,
            "dim": m.dim,
            "vocab": m.vocab_size,
        },
        "workload": {
            "micro_batch_size": w.micro_batch_size,
            "seq_len": w.seq_len,
            "world_size": w.world_size,
            "grad_accum_steps": w.grad_accum_steps,
            "global_batch_size": global_batch,
            "compute_dtype": w.compute_dtype,
            "master_dtype": w.master_dtype,
            "fp8": w.fp8,
            "lora": asdict(w.lora) if w.lora else None,
        },
        "hardware": hardware_json(hw),
        "headroom": headroom(hw),
        "options": [
            {
                **option_json(o, w),
                "as_configured": configured is not None and configured.listed == i,
            }
            for i, o in enumerate(options)
        ],
        "as_configured": None if configured is None else configured_json(configured, suggested, w),
        "left_out": dict(refused or {}),
        "recommendation": best.strategy.label if best else None,
    }


def configured_json(
    c: Configured, suggested: list[Suggestion] | None, w: Workload
) -> dict[str, Any]:
    """The run as configured: its option, where it ranks (`listed`: its index in `options`, or
    null when the plan does not list it), whether it is `auto`'s pick, and when it does not fit
    the same run with one change each (`suggestions`)."""
    return {
        **option_json(c.option, w),
        "rank": c.rank,
        "listed": c.listed,
        "auto": c.auto,
        "suggestions": [
            {"change": x.change, "overrides": x.overrides, **option_json(x.option, w)}
            for x in suggested or []
        ],
    }


def option_json(o: Option, w: Workload) -> dict[str, Any]:
    """One option in `zerofit plan --json` (GiB; its own micro-batch x accumulation, else `w`'s)."""
    return {
        "strategy": o.strategy.label,
        "config": o.strategy.overrides(),
        "micro_batch_size": (o.workload or w).micro_batch_size,
        "grad_accum_steps": (o.workload or w).grad_accum_steps,
        "fits": o.fits,
        "why_not": o.why_not,
        "gpu_gib": {k: v / GIB for k, v in o.memory.components().items()},
        "peak_allocated_gib": o.memory.peak_allocated / GIB,
        "peak_reserved_gib": o.memory.peak_reserved / GIB,
        "host_gib_per_gpu": o.memory.host / GIB,
        "nvme_gib_per_gpu": o.memory.nvme / GIB,
        "host_gib_per_gpu_while_loading": o.memory.loading_host / GIB,
        "step_time_s": o.speed.step_time,
        "tokens_per_s": o.speed.tokens_per_s,
        "mfu": o.speed.mfu,
    }


def hardware_json(hw: Hardware) -> dict[str, object]:
    """The machine planned for: its GPUs, host RAM, disk and host speed, and where each came
    from."""

    def us(seconds: float | None) -> float | None:
        return None if seconds is None else seconds * 1e6

    return {
        "gpus_per_node": hw.gpus_per_node,
        "nodes": hw.nodes,
        "gpu": hw.name,
        "gpu_from": hw.gpu_from,
        "gpu_mem_gib": hw.gpu_mem / GIB,
        "gpu_mem_from": hw.gpu_mem_from,
        "peak_tflops": hw.peak_flops / 1e12,
        "mem_bw_gbs": hw.mem_bw / 1e9,
        "intra_bw_gbs": hw.intra_bw / 1e9,
        "pcie_bw_gbs": hw.pcie_bw / 1e9,
        "cpu_mem_gib": None if hw.cpu_mem is None else hw.cpu_mem / GIB,
        "cpu_mem_from": hw.cpu_mem_from,
        "nvme_tb": hw.nvme / 1e12,
        "host_launch_us": us(hw.host_launch_s),
        "host_hook_us": us(hw.host_hook_s),
        "host_hooks_us": {name: rate * 1e6 for name, rate in hw.host_hooks},
        "host_compiled_launch_us": us(hw.host_compiled_launch_s),
        "host_from": hw.host_from,
        "host_adam_gb_per_s": {name: rate / 1e9 for name, rate in hw.host_adam},
    }

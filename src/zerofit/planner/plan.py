"""Every strategy's memory and speed on given hardware, and the recommendation.

The recommendation is the fastest strategy that fits with HEADROOM to spare on the GPU (and within
the host RAM / NVMe it needs). Nothing is special-cased: the seed's decision guide (under 24 GB:
ZeRO-3 + CPU offload; 40 GB and up: FSDP + bf16) has to come out of the numbers.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from zerofit.backends import engines
from zerofit.models.shape import ModelShape
from zerofit.planner.memory import Memory, Strategy, estimate
from zerofit.planner.shape import Hardware
from zerofit.planner.speed import Speed, predict
from zerofit.planner.terms import Workload
from zerofit.schema import Config

HEADROOM = 0.10  # keep 10% of GPU memory free
HOST_SHARE = 0.85  # of host RAM usable for offload


@dataclass
class Option:
    strategy: Strategy
    memory: Memory
    speed: Speed
    fits: bool
    why_not: str = ""


def candidates(hw: Hardware, base: Config | None = None) -> list[Strategy]:
    """Every engine's option sets (on top of `base`'s sections), without and with full activation
    checkpointing."""
    cfg = base or Config()
    out: list[Strategy] = []
    for ac in ("none", "full"):
        for name, eng in engines().items():
            for opts in eng.candidates(eng.opts(cfg), hw.nodes, bool(hw.nvme)):
                out.append(Strategy(name, opts, activation_checkpointing=ac))
    return out


def evaluate(m: ModelShape, w: Workload, hw: Hardware, s: Strategy) -> Option:
    mem = estimate(m, w, s)
    speed = predict(m, w, s, hw)
    reasons = []
    if mem.peak_reserved > hw.gpu_mem * (1 - HEADROOM):
        reasons.append(
            f"needs {mem.peak_reserved / 2**30:.1f} GiB of {hw.gpu_mem / 2**30:.1f} GiB per GPU"
        )
    host_need = mem.host * hw.gpus_per_node
    if hw.cpu_mem and host_need > hw.cpu_mem * HOST_SHARE:
        reasons.append(f"needs {host_need / 2**30:.0f} GiB host RAM of {hw.cpu_mem / 2**30:.0f}")
    if mem.nvme and mem.nvme * hw.gpus_per_node > hw.nvme:
        reasons.append(f"needs {mem.nvme * hw.gpus_per_node / 1e12:.2f} TB NVMe")
    return Option(s, mem, speed, not reasons, "; ".join(reasons))


def plan(m: ModelShape, w: Workload, hw: Hardware, base: Config | None = None) -> list[Option]:
    """All options, fitting ones first, fastest first."""
    opts = [evaluate(m, w, hw, s) for s in candidates(hw, base)]
    return sorted(opts, key=lambda o: (not o.fits, o.speed.step_time, o.memory.peak_reserved))


def recommend(options: list[Option]) -> Option | None:
    return options[0] if options and options[0].fits else None


def to_json(m: ModelShape, w: Workload, hw: Hardware, options: list[Option]) -> dict[str, Any]:
    gib = 2**30
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
            "compute_dtype": w.compute_dtype,
            "master_dtype": w.master_dtype,
            "lora": asdict(w.lora) if w.lora else None,
        },
        "hardware": {
            "gpus_per_node": hw.gpus_per_node,
            "nodes": hw.nodes,
            "gpu_mem_gib": hw.gpu_mem / gib,
            "cpu_mem_gib": hw.cpu_mem / gib,
            "nvme_tb": hw.nvme / 1e12,
        },
        "options": [
            {
                "strategy": o.strategy.label,
                "config": o.strategy.overrides(),
                "fits": o.fits,
                "why_not": o.why_not,
                "gpu_gib": {k: v / gib for k, v in o.memory.components().items()},
                "peak_allocated_gib": o.memory.peak_allocated / gib,
                "peak_reserved_gib": o.memory.peak_reserved / gib,
                "host_gib_per_gpu": o.memory.host / gib,
                "nvme_gib_per_gpu": o.memory.nvme / gib,
                "host_gib_per_gpu_while_loading": o.memory.loading_host / gib,
                "step_time_s": o.speed.step_time,
                "tokens_per_s": o.speed.tokens_per_s,
                "mfu": o.speed.mfu,
            }
            for o in options
        ],
        "recommendation": best.strategy.label if best else None,
    }

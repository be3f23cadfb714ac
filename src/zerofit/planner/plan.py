"""Every strategy's memory and speed on given hardware, and the recommendation.

The recommendation is the fastest strategy that fits. Nothing is special-cased: the seed's decision
guide (under 24 GB: ZeRO-3 + CPU offload; 40 GB and up: FSDP + bf16) has to come out of the numbers.

The strategies (`candidates`): every engine's option sets, each without, with selective, with the
fewest first blocks that fit (`first_k`, `fewest_blocks`) and with full activation checkpointing,
all with the config's own `parallel.compile`. An engine whose
`validate` refuses the config (DeepSpeed with `precision.fp8`) is left out (`left_out`), and the
plan says so in one line.

What "fits" means (`headroom_rule` says it in words, with the numbers):
- GPU: the predicted total per GPU (peak allocated + the CUDA context + the allocator's
  fragmentation, `Memory.peak_reserved`) within 1 - HEADROOM of the GPU's memory. The HEADROOM
  share is kept for what the forecast leaves out: NCCL's communication buffers, the allocator's
  transient spikes, other processes on the card, and the forecast's own error (measured within 5%
  for most strategies, over by up to 17% for some: docs/benchmarks).
- Host: what offloading keeps in host RAM per node within HOST_SHARE of the node's RAM (the OS, the
  data loader and the pinned-memory limits need the rest). The host RAM is always checked: with
  none known (`Hardware.cpu_mem` None) an offloading strategy does not fit.
- NVMe: what NVMe offload writes, within the given space.

With a fixed global batch (`train.global_batch_size`, `zerofit plan --global-batch`), each strategy
comes with its own micro-batch x accumulation (x the world size = the global batch, the micro-batch
a divisor of the per-rank share) and its engine's tunings (`Engine.tunings`: DeepSpeed's
offload_ratio): of those that fit, the fastest forecast, and of equally fast ones the largest
micro-batch. Memory only grows with the micro-batch, so the largest that fits is found by bisection.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

from zerofit.backends import engines
from zerofit.backends.catalog import RunConfig
from zerofit.backends.terms import GIB, Workload
from zerofit.config.schema import Config
from zerofit.errors import UserError
from zerofit.models.shape import ModelShape
from zerofit.planner.memory import CUDA_CONTEXT, FRAGMENTATION, Memory, Strategy, estimate
from zerofit.planner.shape import Hardware
from zerofit.planner.speed import Speed, predict

HEADROOM = 0.10  # share of GPU memory kept free (see the module docstring)
# `near_limit`: only the forecast's own error is kept free. Held-out peak-memory forecasts land
# within 5% (the fp32-master 8B runs of 2026-12-04 1.5% to 3.9% high).
FORECAST_ERROR = 0.04
HOST_SHARE = 0.85  # share of host RAM usable for offload
MAX_MICRO_BATCH = 2**20  # train.micro_batch_size and grad_accum_steps: the schema's bound
OFFLOAD_TIE = 0.05  # see without_offload_first
MAX_SPLITS = 32  # fitting micro-batch sizes compared per strategy variant (the largest ones)


@dataclass
class Option:
    strategy: Strategy
    memory: Memory
    speed: Speed
    fits: bool
    why_not: str = ""
    workload: Workload | None = None  # what it was evaluated at (its micro-batch x accumulation)


# activation checkpointing, least recompute first
AC_MODES = ("none", "selective", "first_k", "full")


def left_out(base: Config | None = None) -> dict[str, str]:
    """The engines that refuse `base` (their `validate` raises), each with its reason."""
    cfg = base or RunConfig()
    out: dict[str, str] = {}
    for name, eng in engines().items():
        try:
            eng.validate(cfg)
        except UserError as e:
            out[name] = str(e)
    return out


def candidates(hw: Hardware, base: Config | None = None, keep_ac: bool = False) -> list[Strategy]:
    """Every engine's option sets (on top of `base`'s sections), with each activation
    checkpointing mode (`keep_ac`: only `base`'s, with its ac_blocks and ac_every) and `base`'s
    parallel.compile; engines that refuse `base` (`left_out`) have none."""
    cfg = base or RunConfig()
    refused = left_out(cfg)
    p = cfg.parallel
    mode = p.activation_checkpointing  # its k only where the mode reads it, as the run does
    blocks = p.ac_blocks if mode == "first_k" else None
    pinned = (blocks, p.ac_every if mode == "every_k" else Strategy.ac_every) if keep_ac else ()
    out: list[Strategy] = []
    for ac in [mode] if keep_ac else AC_MODES:
        for name, eng in engines().items():
            if name in refused:
                continue
            for opts in eng.candidates(eng.opts(cfg), hw.nodes, bool(hw.nvme)):
                out.append(Strategy(name, opts, ac, eng.compiles(opts, p.compile, "cuda"), *pinned))
    return out


def left_out_line(refused: dict[str, str]) -> str:
    """One line naming the engines left out and why ("" when none)."""
    if not refused:
        return ""
    return "left out: " + "; ".join(f"{name} ({why})" for name, why in refused.items())


def headroom(hw: Hardware) -> dict[str, float | None]:
    """The numbers of the "fits" rule on this hardware (GiB, shares)."""
    ram = hw.cpu_mem
    return {
        "gpu_mem_gib": hw.gpu_mem / GIB,
        "gpu_kept_share": HEADROOM,
        "gpu_kept_gib": hw.gpu_mem * HEADROOM / GIB,
        "gpu_usable_gib": hw.gpu_mem * (1 - HEADROOM) / GIB,
        "cuda_context_gib": CUDA_CONTEXT / GIB,
        "fragmentation_share": FRAGMENTATION,
        "host_mem_gib": None if ram is None else ram / GIB,
        "host_usable_share": HOST_SHARE,
        "host_usable_gib": None if ram is None else ram * HOST_SHARE / GIB,
    }


def headroom_rule(hw: Hardware) -> str:
    """One line: what "fits" keeps back, and why."""
    h = headroom(hw)
    host = (
        f"host: offloaded states within {HOST_SHARE:.0%} of {h['host_mem_gib']:,.0f} GiB RAM per "
        f"node = {h['host_usable_gib']:,.0f} GiB (the OS, data loader and pinned buffers need the rest)"
        if h["host_mem_gib"] is not None
        else "host RAM unknown: nothing that offloads fits (give --cpu-mem)"
    )
    return (
        f"fits: GPU total (peak allocated + {h['cuda_context_gib']:.2f} GiB CUDA context + "
        f"{FRAGMENTATION:.0%} allocator fragmentation) within {1 - HEADROOM:.0%} of "
        f"{h['gpu_mem_gib']:.1f} GiB = {h['gpu_usable_gib']:.1f} GiB; the other "
        f"{h['gpu_kept_gib']:.1f} GiB stay free for NCCL buffers, allocator spikes, other "
        f"processes and the forecast's error; {host}."
    )


def _host_reason(mem: Memory, hw: Hardware) -> str | None:
    need = mem.host * hw.gpus_per_node
    if need <= 0:
        return None
    if hw.cpu_mem is None:
        return f"needs {need / GIB:,.0f} GiB host RAM per node, and the host RAM is unknown"
    if need > hw.cpu_mem * HOST_SHARE:
        return (
            f"needs {need / GIB:,.0f} GiB host RAM per node, over the "
            f"{hw.cpu_mem * HOST_SHARE / GIB:,.0f} GiB usable of {hw.cpu_mem / GIB:,.0f}"
        )
    return None


def evaluate(m: ModelShape, w: Workload, hw: Hardware, s: Strategy) -> Option:
    """Strategy `s` at workload `w`: its memory, speed and whether it fits. A `first_k` strategy
    without its count recomputes the fewest blocks that fit (`fewest_blocks`)."""
    if s.activation_checkpointing == "first_k" and s.ac_blocks is None:
        return fewest_blocks(m, w, hw, s)
    mem = estimate(m, w, s)
    speed = predict(m, w, s, hw)
    reasons = []
    usable = hw.gpu_mem * (1 - HEADROOM)
    if mem.peak_reserved > usable:
        inside = mem.peak_reserved <= hw.gpu_mem
        reasons.append(
            f"needs {mem.peak_reserved / GIB:.1f} GiB per GPU, over the {usable / GIB:.1f} GiB "
            f"usable of {hw.gpu_mem / GIB:.1f}"
            + (" (within the card: it may run where nothing else uses it)" if inside else "")
        )
    host = _host_reason(mem, hw)
    if host:
        reasons.append(host)
    if mem.nvme and mem.nvme * hw.gpus_per_node > hw.nvme:
        reasons.append(f"needs {mem.nvme * hw.gpus_per_node / 1e12:.2f} TB NVMe")
    return Option(s, mem, speed, not reasons, "; ".join(reasons), w)


def fewest_blocks(m: ModelShape, w: Workload, hw: Hardware, s: Strategy) -> Option:
    """`first_k` with the fewest recomputed blocks that fit, from 1 to all but one (none and all
    are the `none` and `full` strategies), by bisection: each block recomputed saves memory and
    costs speed. When even all but one do not fit, that option (not fitting)."""
    last = max(1, m.n_layers - 1)
    tried: dict[int, Option] = {}

    def at(i: int) -> Option:  # i = 0 .. last - 1: first_k with i + 1 blocks
        if i not in tried:
            tried[i] = evaluate(m, w, hw, replace(s, ac_blocks=i + 1))
        return tried[i]

    found = _first_fitting(last, at)
    return at(last - 1 if found is None else found)


def batch_splits(
    global_batch: int, world_size: int, micro: int | None = None, accum: int | None = None
) -> list[tuple[int, int]]:
    """Every (micro-batch, accumulation) with micro x accum x world_size = global_batch (only
    those with the `micro` or `accum` given), the largest micro-batch first; UserError when the
    global batch does not split so over the ranks."""
    if global_batch % world_size:
        raise UserError(
            f"a global batch of {global_batch:,} sequences does not split over {world_size} GPUs: "
            f"give a multiple of {world_size}"
        )
    per_rank = global_batch // world_size
    small = [d for d in range(1, math.isqrt(per_rank) + 1) if per_rank % d == 0]
    divisors = sorted({*small, *(per_rank // d for d in small)}, reverse=True)
    splits = [(d, per_rank // d) for d in divisors]
    splits = [(mb, acc) for mb, acc in splits if mb <= MAX_MICRO_BATCH >= acc]
    if not splits:
        raise UserError(
            f"a global batch of {global_batch:,} sequences over {world_size} GPUs needs more than "
            f"{MAX_MICRO_BATCH:,} micro-batches of at most {MAX_MICRO_BATCH:,} sequences"
        )
    kept = [(mb, acc) for mb, acc in splits if micro in (None, mb) and accum in (None, acc)]
    if not kept:
        given = " and ".join(
            f"{what} {n}" for what, n in (("micro-batch", micro), ("accumulation", accum)) if n
        )
        raise UserError(
            f"a global batch of {global_batch:,} sequences over {world_size} GPUs is "
            f"{per_rank:,} per GPU: {given} does not make it (micro-batch x accumulation = "
            f"{per_rank:,})"
        )
    return kept


def _first_fitting(count: int, at: Callable[[int], Option]) -> int | None:
    """The first index whose option fits, by bisection over options that need no more memory
    as the index grows (smaller micro-batches, more recomputed blocks). None when none fits."""
    lo, hi = 0, count
    while lo < hi:
        mid = (lo + hi) // 2
        if at(mid).fits:
            hi = mid
        else:
            lo = mid + 1
    return lo if lo < count else None


def _variant(
    m: ModelShape, w: Workload, hw: Hardware, s: Strategy, splits: list[tuple[int, int]]
) -> tuple[list[Option], Option]:
    """One strategy variant: its options at the (up to MAX_SPLITS) largest micro-batches that fit,
    and its option at the smallest micro-batch (the nearest it comes when none fits)."""
    seen: dict[int, Option] = {}

    def at(i: int) -> Option:
        if i not in seen:
            mb, acc = splits[i]
            seen[i] = evaluate(m, replace(w, micro_batch_size=mb, grad_accum_steps=acc), hw, s)
        return seen[i]

    first = _first_fitting(len(splits), at)
    if first is None:
        return [], at(len(splits) - 1)
    last = min(first + MAX_SPLITS, len(splits))
    return [o for i in range(first, last) if (o := at(i)).fits], at(len(splits) - 1)


def fastest_split(
    m: ModelShape, w: Workload, hw: Hardware, s: Strategy, splits: list[tuple[int, int]]
) -> Option:
    """Strategy `s` at the fastest fitting micro-batch x accumulation of `splits` and engine
    tuning; when none fits, the variant needing the least GPU memory at the smallest micro-batch."""
    fitting: list[Option] = []
    nearest: list[Option] = []
    for opts in s.engine.tunings(s.options):
        fits, near = _variant(m, w, hw, replace(s, options=opts), splits)
        fitting += fits
        nearest.append(near)
    if not fitting:
        return min(nearest, key=lambda o: o.memory.peak_reserved)
    quickest = min(o.speed.step_time for o in fitting)
    tied = [o for o in fitting if o.speed.step_time <= quickest * (1 + 1e-9)]
    return max(tied, key=lambda o: o.workload.micro_batch_size if o.workload else 0)


def plan(
    m: ModelShape,
    w: Workload,
    hw: Hardware,
    base: Config | None = None,
    splits: list[tuple[int, int]] | None = None,
    keep_ac: bool = False,
) -> list[Option]:
    """All options, fitting ones first, fastest first. With `splits` (a fixed global batch's
    `batch_splits`) each strategy at its own micro-batch x accumulation and tuning
    (`fastest_split`); without, at `w`'s. `keep_ac`: at `base`'s activation checkpointing only."""
    found = candidates(hw, base, keep_ac)
    if splits is None:
        opts = [evaluate(m, w, hw, s) for s in found]
    else:
        opts = [fastest_split(m, w, hw, s, splits) for s in found]
    ranked = sorted(opts, key=lambda o: (not o.fits, o.speed.step_time, o.memory.peak_reserved))
    return without_offload_first(ranked)


def without_offload_first(ranked: list[Option]) -> list[Option]:
    """The fastest option offloads to host RAM, and one that does not is forecast within
    OFFLOAD_TIE of it: that one leads. The roofline's speed error is larger than such a gap
    (14-51% held out, docs/benchmarks/), and offload costs host RAM and PCIe copies whose overlap
    is its least certain term; on 2026-12-05 an 8B QLoRA at 23 GiB ranked CPU offload 1% ahead."""
    if not ranked or not ranked[0].fits or ranked[0].memory.host <= 0:
        return ranked
    limit = ranked[0].speed.step_time * (1 + OFFLOAD_TIE)
    for i, o in enumerate(ranked):
        if o.fits and o.memory.host <= 0 and o.memory.nvme <= 0 and o.speed.step_time <= limit:
            return [o, *ranked[:i], *ranked[i + 1 :]]
    return ranked


def option_fields(o: Option) -> dict[str, object]:
    """The config fields that select an option: its strategy's, and its micro-batch x
    accumulation."""
    fields = o.strategy.overrides()
    if o.workload is not None:
        fields["train.micro_batch_size"] = o.workload.micro_batch_size
        fields["train.grad_accum_steps"] = o.workload.grad_accum_steps
    return fields


def recommend(options: list[Option]) -> Option | None:
    return options[0] if options and options[0].fits else None


def near_limit(options: list[Option], hw: Hardware) -> Option | None:
    """When nothing fits with the headroom: the fastest option whose forecast peak allocated
    memory, plus the forecast's error (FORECAST_ERROR) and the CUDA context, is within the card,
    with everything else it needs (host RAM, NVMe) there; None if there is none. Measured near the
    card's limit (2026-12-04, 8B fp32-master full AC on an H200) the allocator still ran without
    retries at 95% of the card reserved; an option forecast at 98% ran out of memory."""
    near = [
        o
        for o in options
        if not o.fits
        and o.memory.peak_allocated * (1 + FORECAST_ERROR) + CUDA_CONTEXT <= hw.gpu_mem
        and _host_reason(o.memory, hw) is None
        and not (o.memory.nvme and o.memory.nvme * hw.gpus_per_node > hw.nvme)
    ]
    return min(near, key=lambda o: o.speed.step_time) if near else None


def closest(options: list[Option]) -> Option:
    """When nothing fits: the option needing the least GPU memory (its `why_not` says what else
    it lacks, such as host RAM for offload)."""
    return min(options, key=lambda o: o.memory.peak_reserved)

"""A stated roofline for step time.

step = max(GPU work, host work) + CPU optimizer time (+ NVMe traffic) + the step's host hooks, where
the GPU work is compute + exposed communication + exposed offload copies, and
- compute = FLOPs per step / (GPUs x peak x efficiency), FLOPs x 4/3 with full activation
  checkpointing (the forward runs twice), and the forward's share again for DPO's adapters-off
  reference (`Workload.reference_forward`);
- communication moves, per rank and step, (S-1)/S of: FSDP / ZeRO-3 all-gather of the parameters in
  forward and again in backward (2 x P x e_c) plus the gradient reduce-scatter (P x e_r); ZeRO-1/2 a
  reduce-scatter of gradients and an all-gather of updated parameters; DDP an all-reduce (2 x P x
  e_m). Across nodes the inter-node bandwidth applies. Engines overlap it with compute, so only what
  exceeds OVERLAP x compute is exposed;
- offload (`Engine.offload_seconds`, an `OffloadTime`) comes in two parts. Once per optimizer step,
  after backward, where nothing hides it: the offloaded AdamW on the CPU at the engine's rate
  (DeepSpeed's vectorised CPU Adam, or torch's AdamW for FSDP CPU offload) and the copies around
  it. And every micro-batch, so grad_accum_steps times a step: the PCIe copies that ride along
  with forward and backward (DeepSpeed ZeRO-3 offload round-trips each rank's gradient partition
  through its pinned host buffer; offloaded parameters are fetched in forward and in backward).
  Those run on a side stream (DeepSpeed's overlap_comm stream, FSDP2's all-gather copy-in), so
  like communication only what exceeds OVERLAP x compute is exposed; a larger micro-batch means
  fewer of them per step. Checked on the 2026-12-03 24 GB rehearsal (llama3-1b, ZeRO-3 optimizer
  offload, micro-batch 1 x 64: 15.67 s a step measured), in-sample: no constant was refitted on it.
- host (`host_seconds`): the host issues the GPU's work, so a step is no shorter than the host's
  part of it; the two overlap, so only the longer counts. Every micro-batch the host launches each
  block's kernels (`launches`; counted by benchmarks/block_launches.py on zerofit's Llama block:
  122 eager, 51 of them in forward; 36 compiled, 15 in forward, as matmuls plus one fused kernel
  per run of other ops; 10 more per LoRA-adapted layer), a recomputed block's forward again, and
  eager selective checkpointing's Python policy on every forward op, in forward and in the
  recomputation (2 x 82), each at LAUNCH_SECONDS; and it runs the engine's Python hooks
  (`Engine.host_calls`: FSDP2 4 per unit, 3 without resharding, each weighed as BLOCK_LAYERS
  calls; ZeRO-3 4 per module holding parameters plus each trained tensor's gradient hook; ZeRO-1/2
  the gradient hooks; DDP none, its reducer is C++), each at HOOK_SECONDS. After backward, where
  nothing hides them, ZeRO-1/2 walk the trained tensors ZERO12_STEP_PASSES times. The host term
  does not depend on tokens: it decides steps of few tokens a micro-batch, eager above all, and
  hides under the GPU's work at the 8K-16K tokens the efficiencies were fitted at.
  LAUNCH_SECONDS = 29 us, HOOK_SECONDS = 170 us and ZERO12_STEP_PASSES = 2 (in
  backends/deepspeed/costs.py) were fitted (least squared log error, `tools/planner_residuals.py
  --fit`) on the eight rows of docs/benchmarks/data/2026-12-04-planner-heldout/a-measured.json
  (llama3-1b eager at 4,096 tokens: DDP, FSDP + SAC, FSDP grad-op + AC, ZeRO-1, ZeRO-2 + SAC,
  ZeRO-3 + AC, both offloads; the H200 host): median |error| 21.9% -> 7.6%, 6 of 8 within 10%.
  Held out, the 2026-12-03 files b, c and d (fp32 masters, the 3.6B shape with 28 layers, 2,048
  tokens; their timed steps recorded allocations, a slower host): 55.8% -> 22.4%, still under;
  every compiled run is unchanged. Not modelled: the optimizer step's memory traffic (inside the
  fitted efficiencies, so under-counted at small micro-batches), autocast's casts (14 kernels a
  block), the output layer's launches; the host's speed is the H200 machine's.
Every engine-specific term (traffic, offload, efficiency, hooks) lives in the engine's `spec` module.

The efficiency constants come from zerofit's own H200 measurements (docs/benchmarks/): on llama3-1b
(hidden 2048) eager FSDP ran at 36% MFU, eager ZeRO-3 at 29%; compiled, FSDP at 48.5% and ZeRO-3 at
46.3%. Wider models run bigger GEMMs: at hidden 4096 (Llama-3-8B shape) compiled FSDP reached 61.3%
and ZeRO-3 55.9%, so efficiency scales by 1 + WIDTH_GAIN x log2(hidden / 2048), clipped. They are
leads, not laws: `zerofit plan --measure` checks a prediction against a real run.

FP8 (`precision.fp8`, `Workload.fp8`): the decoder blocks' Linear layers multiply in float8, whose
dense peak is FP8_PEAK x the bf16 peak on Hopper and Ada (datasheets); the output layer, attention's
score and value products and every other op stay in bf16. The float8 share of the FLOPs (`fp8_share`)
runs FP8_GAIN times faster compiled, FP8_EAGER_GAIN eager, where the dynamic-scaling casts (amax,
scale, cast of each input, weight and output gradient) run as separate kernels. Both gains are
leads, UNMEASURED by zerofit until a run on the H200: torchao reports 1.2-1.5x end-to-end at 8B
compiled, which FP8_GAIN = 1.4 on an ~87% float8 share reproduces (1.33x at llama3-8b, seq 2048).
Whether the card has float8 tensor cores is not checked here (a run refuses one without).
MFU stays relative to the bf16 peak.

The GPU is an input (`Hardware`, from `zerofit.planner.gpus` or detected): its dense bf16 peak sets
the compute time, its link the communication, its PCIe generation the offload copies. Its memory
bandwidth scales the MEMORY_BOUND share of compute time spent in bandwidth-bound kernels (norms,
RoPE, SiLU, casts, the optimizer step) by the card's FLOP-per-byte ratio against the H200's, the
card the efficiencies were measured on: on the H200 the factor is 1. MEMORY_BOUND is a lead: compile,
which fuses those kernels, removed about a quarter of eager step time on the H200 (1 - 1/1.35);
compiled runs keep less of it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from zerofit.backends.terms import NF4_BYTES, Workload
from zerofit.models.shape import ModelShape
from zerofit.planner.memory import Strategy
from zerofit.planner.shape import Hardware

WIDTH_GAIN = 0.24  # per doubling of the hidden size
OVERLAP = 0.8
MEMORY_BOUND = 0.2  # share of the H200's compute time in bandwidth-bound kernels
REFERENCE_FLOPS_PER_BYTE = 989.4e12 / 4.8e12  # the H200: dense bf16 peak / memory bandwidth
FP8_PEAK = 2.0  # dense float8 / dense bf16 peak, Hopper and Ada (the ceiling of any fp8 gain)
FP8_GAIN = 1.4  # float8 Linear time / bf16 Linear time, compiled: a lead, unmeasured by zerofit
FP8_EAGER_GAIN = 1.1  # the same eager (unfused casts): a lead, unmeasured by zerofit
# QLoRA: share of the memory bandwidth rebuilding an NF4 weight reaches, counted as NF4_BYTES read
# and e_c written a weight. Compiled: fitted on an H100's 8B trace, the 3,072 rebuilds of
# 4096 x 14336 weights in a step (two Inductor kernels each: 0.208 of 3.35 TB/s;
# docs/benchmarks/data/2026-12-07-qlora-rebuild-h100/call1, tests/test_nf4.py recomputes it).
# Eager, about six elementwise passes: a lead, unmeasured.
DEQUANT_EFFICIENCY = 0.21
DEQUANT_EAGER_EFFICIENCY = 0.1
# The host (see the module docstring): seconds of host time per kernel launch (an eager op, a
# compiled kernel, or selective checkpointing's Python policy call on an op), and per Python
# hook call of an engine (`Engine.host_calls`). Fitted on the 2026-12-04 held-out file.
LAUNCH_SECONDS = 29e-6
HOOK_SECONDS = 170e-6
# What one decoder block issues in a forward + backward (benchmarks/block_launches.py, torch
# 2.13): eager kernels, of which in forward; compiled kernels (matmuls + one fused kernel per run
# of other ops), of which in forward; forward ops (views too); forward matmuls and attention
BLOCK_KERNELS, BLOCK_FORWARD_KERNELS = 122, 51
BLOCK_FUSED, BLOCK_FORWARD_FUSED = 36, 15
BLOCK_FORWARD_OPS, BLOCK_FORWARD_MATMULS = 82, 8
# per LoRA-adapted layer (A and B, dropout, scale and add; QLoRA's rebuild fuses in): fused
# kernels, of which in forward (zerofit's lean LoRA runs compiled kernels on CUDA, even eager)
ADAPTER_KERNELS, ADAPTER_FORWARD_KERNELS = 10, 4


@dataclass
class Speed:
    step_time: float
    compute: float
    comm_exposed: float
    offload: float
    tokens_per_s: float
    mfu: float
    host: float = 0.0  # host seconds a step: its launches and hooks (`host_seconds`)
    disk_read: float = 0.0  # NVMe bytes a rank reads a step (`OffloadTime.disk_read`)
    disk_write: float = 0.0  # and writes


def efficiency(s: Strategy, dim: int) -> float:
    """Share of the peak the model FLOPs reach (before recompute and communication): the engine's
    eager efficiency at hidden 2048, its compile gain, and the width scaling."""
    width = min(1.35, max(0.6, 1.0 + WIDTH_GAIN * math.log2(dim / 2048)))
    eng = s.engine
    return eng.efficiency * (eng.compile_gain if s.compile else 1.0) * width


def bandwidth_factor(hw: Hardware) -> float:
    """Compute time on this card relative to a card of the same peak with the H200's FLOP-per-byte
    ratio: the bandwidth-bound share scales with peak / memory bandwidth."""
    ratio = hw.peak_flops / hw.mem_bw / REFERENCE_FLOPS_PER_BYTE
    return 1.0 - MEMORY_BOUND + MEMORY_BOUND * ratio


def flops_per_token(m: ModelShape, w: Workload) -> float:
    """Training FLOPs per token. LoRA: the frozen base does no weight-gradient matmuls (4 FLOPs
    per weight and token, not 6); the adapters do all 6."""
    flops = m.flops_per_token(w.seq_len)
    if w.lora:
        flops += 6.0 * w.lora.params - 2.0 * m.flops_params
    return flops


def forward_share(m: ModelShape, w: Workload) -> float:
    """The forward pass's share of the training FLOPs: a third of the full model's (forward 2,
    backward 4 per weight and token, attention alike), and with LoRA the adapters' forward over
    the base's 4 FLOPs a weight."""
    forward = m.flops_per_token(w.seq_len) / 3
    if w.lora:
        forward += 2.0 * w.lora.params
    return forward / flops_per_token(m, w)


def fp8_share(m: ModelShape, w: Workload) -> float:
    """Share of the training FLOPs in Linear layers that compute in float8: every decoder block's
    weights but its two norms (none without `precision.fp8`)."""
    if w.fp8 == "none":
        return 0.0
    linear = 6.0 * m.n_layers * max(0, m.block_params - 2 * m.dim)
    return min(1.0, linear / flops_per_token(m, w))


def fp8_time_factor(m: ModelShape, w: Workload, compiled: bool) -> float:
    """Compute time with float8 Linear layers relative to bf16 (1.0 without fp8)."""
    gain = FP8_GAIN if compiled else FP8_EAGER_GAIN
    share = fp8_share(m, w)
    return 1.0 - share + share / gain


def dequant_seconds(m: ModelShape, w: Workload, s: Strategy, hw: Hardware) -> float:
    """QLoRA: a rank's time rebuilding its NF4 weights in one step: each forward and backward
    (and each recomputed forward) rebuilds every one, for each micro-batch."""
    if w.lora is None or not w.lora.quantized:
        return 0.0
    passes = 2.0 + len(s.recomputed(m.n_layers)) / max(1, m.n_layers) + float(w.reference_forward)
    moved = w.lora.quantized * (NF4_BYTES + w.e_c) * passes * w.grad_accum_steps
    return moved / (hw.mem_bw * (DEQUANT_EFFICIENCY if s.compile else DEQUANT_EAGER_EFFICIENCY))


def launches(m: ModelShape, w: Workload, s: Strategy) -> float:
    """Kernel launches (and per-op Python calls) the host makes for one micro-batch: each block's
    forward and backward, eager or compiled, with its adapters; a recomputed block's forward
    again (and DPO's reference forward); selective checkpointing's recomputed ops and, eager, its
    policy called on every forward op, in forward and again in the recomputation."""
    L, lora = m.n_layers, (w.lora.per_block if w.lora else 0)
    if s.compile:
        block, forward = BLOCK_FUSED, BLOCK_FORWARD_FUSED
        sac = BLOCK_FORWARD_FUSED
    else:
        block, forward = BLOCK_KERNELS, BLOCK_FORWARD_KERNELS
        sac = BLOCK_FORWARD_KERNELS - BLOCK_FORWARD_MATMULS + 2 * BLOCK_FORWARD_OPS
    block += lora * ADAPTER_KERNELS
    forward += lora * ADAPTER_FORWARD_KERNELS
    forwards = len(s.recomputed(L)) + L * float(w.reference_forward)
    selective = L * sac if s.activation_checkpointing == "selective" else 0
    return L * block + forwards * forward + selective


def hook_key(engine: str, world: int, variant: str = "") -> str:
    """`Hardware.host_hooks`'s key for `engine`'s hooks at `world` ranks in a run of `variant`
    (`Engine.hook_variants`): "<engine>[/<variant>]" where ranks shard, and "@1" after it for a
    rank alone (a probe's other path)."""
    name = f"{engine}/{variant}" if variant else engine
    return f"{name}@1" if world == 1 else name


def host_rates(
    hw: Hardware | None,
    compiled: bool = False,
    engine: str | None = None,
    world: int = 2,
    variant: str = "",
    fallback: str = "",
) -> tuple[float, float]:
    """(seconds per kernel launch, seconds per hook call of `engine` at `world` ranks in a run
    of `variant`) on the host: the machine's probed or given figures (`Hardware.host_launch_s`,
    or `host_compiled_launch_s` for a compiled kernel where known; the engine's probed
    `host_hooks`: the variant's at that world size, else where ranks shard, else the same of
    the `fallback` variant, then of the plain run, as an older probe file has them; else
    `host_hook_s`), else the fitted constants."""
    if hw is None:
        return LAUNCH_SECONDS, HOOK_SECONDS
    launch = LAUNCH_SECONDS if hw.host_launch_s is None else hw.host_launch_s
    if compiled and hw.host_compiled_launch_s is not None:
        launch = hw.host_compiled_launch_s
    probed = dict(hw.host_hooks)
    tried = [(v, n) for v in (variant, fallback, "") for n in (world, 2)]
    found = [probed[k] for v, n in tried if (k := hook_key(engine or "", n, v)) in probed]
    hook = found[0] if found else HOOK_SECONDS if hw.host_hook_s is None else hw.host_hook_s
    return launch, hook


def host_seconds(
    m: ModelShape, w: Workload, s: Strategy, hw: Hardware | None = None
) -> tuple[float, float]:
    """(host seconds a step that the GPU's work can hide, host seconds after backward that
    nothing hides): every micro-batch's launches and engine hooks (those before the step's last
    at the engine's accumulating rate, where it has one: `HostCalls.accumulating`); the step's
    engine hooks."""
    engine, name = s.engine, s.engine.name
    variant = engine.hook_variant(s.options, s.compile)
    launch, hook = host_rates(hw, s.compile, name, w.world_size, variant)
    calls = engine.host_calls(m, w, s.options)
    issue = launches(m, w, s) * launch
    last = issue + calls.micro_batch * hook
    before = last
    if calls.accumulating is not None:
        quiet = engine.hook_variant(s.options, s.compile, accumulating=True)
        _, off = host_rates(hw, s.compile, name, w.world_size, quiet, variant)
        before = issue + calls.accumulating * off
    return last + before * (w.grad_accum_steps - 1), calls.step * hook


def predict(m: ModelShape, w: Workload, s: Strategy, hw: Hardware) -> Speed:
    W = w.world_size
    tokens_step = w.tokens * w.grad_accum_steps * W
    flops = flops_per_token(m, w) * tokens_step
    # a recomputed block runs its forward twice (+ its forward's share of the training FLOPs:
    # 1/3, or ~1/2 with LoRA, whose frozen base skips the weight gradients); selective AC only
    # re-runs the cheap elementwise ops
    recompute = 1.03 if s.activation_checkpointing == "selective" else 1.0
    recompute += len(s.recomputed(m.n_layers)) / max(1, m.n_layers) * forward_share(m, w)
    if w.reference_forward:  # DPO's reference: the base's forward again, adapters off
        recompute += forward_share(m, w)
    compute = flops * recompute * bandwidth_factor(hw) / (W * hw.peak_flops * efficiency(s, m.dim))
    compute *= fp8_time_factor(m, w, s.compile)
    compute += dequant_seconds(m, w, s, hw)
    bw = hw.inter_bw if hw.nodes > 1 else hw.intra_bw
    comm = s.engine.traffic(m, w, s.options).per_rank / bw
    exposed = max(0.0, comm - OVERLAP * compute)
    host = s.engine.offload_seconds(m, w, s.options, hw)
    copies = host.micro_batch * w.grad_accum_steps  # hidden under compute as communication is
    offload = host.step + max(0.0, copies - OVERLAP * compute)
    hidden, unhidden = host_seconds(m, w, s, hw)  # the host issues the GPU's work as it runs
    step = max(compute + exposed + offload - host.step, hidden) + host.step + unhidden
    tps = tokens_step / step
    mfu = flops_per_token(m, w) * tps / (W * hw.peak_flops)
    disk = (host.disk_read, host.disk_write)
    return Speed(step, compute, exposed, offload, tps, mfu, hidden + unhidden, *disk)

"""A stated roofline for step time.

step = compute + exposed communication + CPU optimizer time (+ NVMe traffic), where
- compute = FLOPs per step / (GPUs x peak x efficiency), FLOPs x 4/3 with full activation
  checkpointing (the forward runs twice);
- communication moves, per rank and step, (S-1)/S of: FSDP / ZeRO-3 all-gather of the parameters in
  forward and again in backward (2 x P x e_c) plus the gradient reduce-scatter (P x e_r); ZeRO-1/2 a
  reduce-scatter of gradients and an all-gather of updated parameters; DDP an all-reduce (2 x P x
  e_m). Across nodes the inter-node bandwidth applies. Engines overlap it with compute, so only what
  exceeds OVERLAP x compute is exposed;
- offloaded AdamW runs on the CPU at CPU_ADAM_BW bytes/s (DeepSpeed's vectorised CPU Adam) or
  TORCH_CPU_ADAM (torch's AdamW for FSDP CPU offload), plus gradients down / parameters up over PCIe.

The efficiency constants come from zerofit's own H200 measurements (docs/benchmarks/): on llama3-1b
(hidden 2048) eager FSDP ran at 36% MFU, eager ZeRO-3 at 29%; compiled, FSDP at 48.5% and ZeRO-3 at
46.3%. Wider models run bigger GEMMs: at hidden 4096 (Llama-3-8B shape) compiled FSDP reached 61.3%
and ZeRO-3 55.9%, so efficiency scales by 1 + WIDTH_GAIN x log2(hidden / 2048), clipped. They are
leads, not laws: `zerofit plan --measure` checks a prediction against a real run.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from zerofit.planner.memory import BYTES, Strategy, Workload
from zerofit.planner.shape import Hardware, ModelShape

EFFICIENCY = {"ddp": 0.37, "fsdp": 0.36, "deepspeed": 0.30}  # eager, hidden 2048
COMPILE_GAIN = {"ddp": 1.3, "fsdp": 1.35, "deepspeed": 1.54}
WIDTH_GAIN = 0.24  # per doubling of the hidden size
OVERLAP = 0.8
# DeepSpeedCPUAdam streams ~7 x master-dtype bytes per parameter (param, grad, 2 moments read;
# param and moments written); 42 GB/s per node fits the 13B run (bf16 states, 16 cores).
CPU_ADAM_BW = 42e9
TORCH_CPU_ADAM = 0.25e9  # params/s per node (torch.optim.AdamW on CPU tensors)
NVME_BW = 3e9  # bytes/s per node


@dataclass
class Speed:
    step_time: float
    compute: float
    comm_exposed: float
    offload: float
    tokens_per_s: float
    mfu: float


def efficiency(backend: str, compiled: bool, dim: int) -> float:
    """Share of the peak the model FLOPs reach (before recompute and communication)."""
    width = min(1.35, max(0.6, 1.0 + WIDTH_GAIN * math.log2(dim / 2048)))
    return EFFICIENCY[backend] * (COMPILE_GAIN[backend] if compiled else 1.0) * width


def predict(m: ModelShape, w: Workload, s: Strategy, hw: Hardware) -> Speed:
    W = w.world_size
    tokens_step = w.tokens * w.grad_accum_steps * W
    flops = m.flops_per_token(w.seq_len) * tokens_step
    # full AC runs the forward twice; selective AC only re-runs the cheap elementwise ops
    recompute = {"full": 4 / 3, "selective": 1.03}.get(s.activation_checkpointing, 1.0)
    eff = efficiency(s.backend, s.compile, m.dim)
    compute = flops * recompute / (W * hw.peak_flops * eff)

    P = m.num_params
    e_c, e_m, e_r = BYTES[w.compute_dtype], BYTES[w.master_dtype], BYTES[w.reduce_dtype]
    if s.backend == "ddp":
        volume, group = 2 * P * e_m, W
    elif s.backend == "fsdp" or s.stage == 3:
        group = W // (s.replicate_degree if s.backend == "fsdp" else 1)
        volume = (2 * P * e_c * w.grad_accum_steps + P * e_r) if group > 1 else 0.0
        if s.backend == "fsdp" and s.replicate_degree > 1:
            volume += 2 * P * e_r / group  # all-reduce of the shards across replicas
    else:
        volume, group = P * (e_r + e_c), W
    frac = (group - 1) / group if group > 1 else 0.0
    bw = hw.inter_bw if hw.nodes > 1 else hw.intra_bw
    comm = volume * frac / bw
    exposed = max(0.0, comm - OVERLAP * compute)

    offload = 0.0
    local_params = P / W if (s.backend != "ddp") else P
    gpus = hw.gpus_per_node
    if s.backend == "fsdp" and s.cpu_offload:
        offload = local_params * gpus / TORCH_CPU_ADAM + local_params * (e_m * 2) / hw.pcie_bw
    elif s.backend == "deepspeed" and s.offload_optimizer != "none":
        moved = local_params * (s.offload_ratio if s.offload_optimizer == "cpu" else 1.0)
        offload = moved * gpus * 7 * e_m / CPU_ADAM_BW
        offload += moved * (w.deepspeed_grad_bytes + e_c) / hw.pcie_bw
        if s.offload_optimizer == "nvme":
            offload += 2 * local_params * gpus * 3 * e_m / NVME_BW
    if s.backend == "deepspeed" and s.offload_param != "none":
        offload += (
            3 * local_params * e_c * W / hw.pcie_bw
        )  # params streamed in fwd, bwd, out after step
    step = compute + exposed + offload
    tps = tokens_step / step
    return Speed(
        step,
        compute,
        exposed,
        offload,
        tps,
        m.flops_per_token(w.seq_len) * tps / (W * hw.peak_flops),
    )

"""DDP as the planner, the doctor and the launcher see it (no torch here)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from zerofit.backends.ddp.options import DDPOptions
from zerofit.backends.engine import Engine
from zerofit.backends.terms import EngineMemory, Traffic, Workload

if TYPE_CHECKING:
    from zerofit.models.shape import ModelShape


class DDP(Engine[DDPOptions]):
    name = "ddp"
    options = DDPOptions
    runtime_module = "zerofit.backends.ddp.runtime"
    efficiency = 0.37  # eager, hidden 2048 (llama3-1b on an H200)
    compile_gain = 1.3
    fp32_checkpoints = True  # autocast keeps an fp32 residual stream

    def label(self, opts: DDPOptions) -> str:
        return "DDP"

    def memory(self, m: ModelShape, w: Workload, opts: DDPOptions) -> EngineMemory:
        P = m.num_params
        T = w.trained(P)  # LoRA: adapters train, the base is frozen (w.frozen_bytes)
        mixed = w.e_c != w.e_m
        cached = T if w.lora else P - m.embedding_params
        if w.fp8 != "none":  # float8 Linear layers cast their own weights, outside autocast's cache
            cached -= m.n_layers * max(0, m.block_params - 2 * m.dim)
        mem = EngineMemory(
            parameters=T * w.e_m + w.frozen_bytes(P),
            optimizer_states=2 * T * w.e_m,
            gradients=T * w.e_m,
            # autocast's cached low-precision copies of the master-dtype weights
            buffers=(cached * w.e_c if mixed else 0.0) + w.dequantized_bytes,
            persistent_grads=w.grad_accum_steps > 1,
        )
        if w.reference_copy:  # DPO's frozen copy, whole on every rank, stored as autocast runs it
            kept = m.embedding_params + (2 * m.n_layers + 1) * m.dim  # embedding and norms
            mem.parameters += w.copy_bytes(P, autocast_kept=kept)
            mem.notes.append("DPO's reference copy is whole on every rank (DDP replicates)")
        if w.world_size > 1:
            mem.buffers += T * w.e_m  # reducer buckets (gradients are copied into them)
            mem.notes.append("DDP keeps a second copy of the gradients in its all-reduce buckets")
        return mem

    def traffic(self, m: ModelShape, w: Workload, opts: DDPOptions) -> Traffic:
        return Traffic(2 * w.trained(m.num_params) * w.e_m, w.world_size)  # one all-reduce


ENGINE = DDP()

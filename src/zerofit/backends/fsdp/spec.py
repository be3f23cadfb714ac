"""FSDP2 as the planner, the doctor and the launcher see it (no torch here).

CPU offload (`CPUOffloadPolicy`), from torch's `distributed/fsdp/_fully_shard` and zerofit's FSDP
runtime:
- Every micro-batch (`OffloadTime.micro_batch`): the sharded parameters live in host RAM in their
  stored dtype and are copied to the GPU before each all-gather, then cast (`FSDPParam.
  all_gather_inputs`): every block in forward and again in backward, but the last block (not
  resharded after forward, `sharding.apply_fsdp`) and the root (FSDP2 keeps the root unsharded
  after forward) once.
- Gradients: zerofit syncs them on the last micro-batch only (`set_requires_gradient_sync`), so
  between syncs each rank accumulates the unsharded gradients on the GPU in the reduce dtype
  (`to_accumulated_grad_if_needed`), offload or not, and the reduced shard goes to the host once
  per step (`foreach_reduce`), where torch's AdamW updates it.
The host AdamW streams ~7 x master-dtype bytes a parameter (as DeepSpeed's CPU Adam: parameter,
gradient and two moments read; parameter and moments written). Its rate per node was fitted on the
H200 host (16 cores, 2026-12-04, `speed2_h200.sh`: llama3-1b, FSDP2 offload at 16 x 4 with AC and
compile on a 24 GB cap, the rest of the step forecast as above): torch's fused CPU AdamW, zerofit's
default for host-resident states (`optim.fused` unset), 41 GB/s (30,762 tokens/s measured), about
DeepSpeed's CPU Adam (CPU_ADAM_BW); the foreach update (`optim.fused: false`) 17 GB/s (23,275).
`plan --host-probe` times both on the host where it runs (`host_optimizers_for_probe`), and a
forecast then charges the probed rates (`Hardware.adam_bw`).
In-sample: both runs are the fit. Checked on the held-out 2026-12-04 config a (bf16 states,
seq 1024): -7.2% in step time.
PCIe runs at `Hardware.pcie_bw` (planner.gpus.HOST_LINK_BW for the card's generation).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from zerofit.backends.engine import Engine
from zerofit.backends.fsdp.options import FSDPOptions
from zerofit.backends.terms import (
    BLOCK_LAYERS,
    EngineMemory,
    HostCalls,
    OffloadTime,
    Traffic,
    Workload,
)
from zerofit.errors import UserError

if TYPE_CHECKING:
    from zerofit.config import Config
    from zerofit.models.shape import ModelShape
    from zerofit.planner.shape import Hardware

FUSED_CPU_ADAM_BW = 41e9  # bytes/s per node, 7 x master-dtype bytes a parameter (see above)
FOREACH_CPU_ADAM_BW = 17e9
ADAM_FUSED = ("fsdp fused", FUSED_CPU_ADAM_BW)  # (Hardware.adam_bw's key, fitted rate)
ADAM_FOREACH = ("fsdp foreach", FOREACH_CPU_ADAM_BW)


class FSDP(Engine[FSDPOptions]):
    name = "fsdp"
    options = FSDPOptions
    runtime_module = "zerofit.backends.fsdp.runtime"
    plan_keys = ("reshard_after_forward", "replicate_degree", "cpu_offload")
    efficiency = 0.36  # eager, hidden 2048 (llama3-1b on an H200)
    compile_gain = 1.35

    def check_world(self, opts: FSDPOptions, world_size: int) -> None:
        if world_size % opts.replicate_degree:
            raise UserError(
                f"parallel.fsdp.replicate_degree={opts.replicate_degree} does not divide the "
                f"world size {world_size}"
            )

    def replicas(self, opts: FSDPOptions) -> int:
        return opts.replicate_degree

    def candidates(self, base: FSDPOptions, nodes: int, nvme: bool) -> list[FSDPOptions]:
        plain = replace(base, reshard_after_forward=True, replicate_degree=1, cpu_offload=False)
        out = [plain, replace(plain, reshard_after_forward=False)]
        if nodes > 1:
            out.append(replace(plain, replicate_degree=nodes))
        return [*out, replace(plain, cpu_offload=True)]

    def label(self, opts: FSDPOptions) -> str:
        name = "FSDP " + ("full-shard" if opts.reshard_after_forward else "grad-op")
        name += f" hybrid x{opts.replicate_degree}" if opts.replicate_degree > 1 else ""
        return name + (" + CPU offload" if opts.cpu_offload else "")

    def memory(self, m: ModelShape, w: Workload, opts: FSDPOptions) -> EngineMemory:
        P, S = m.num_params, w.world_size // opts.replicate_degree
        T = w.trained(P)  # LoRA: adapters train, the base is frozen (w.frozen_bytes)
        gathered = (2 * m.block_params + m.root_params) if opts.reshard_after_forward else P
        blocks = 2 if opts.reshard_after_forward else m.n_layers  # of which in decoder blocks
        head_grad = 0 if w.lora else m.vocab_size * m.dim  # a LoRA head is frozen
        mem = EngineMemory(
            gradients=T * w.e_m / S,
            # units gathered in flight (block weights in e_g) + the root's unsharded head gradient
            buffers=(gathered + head_grad) * w.e_c
            - blocks * (m.block_params * w.e_c - w.gathered_block_bytes(m.block_params))
            + w.dequantized_bytes,
            # the root's reduce-scatter: unsharded gradients + their reduce-dtype copy
            end_buffers=0 if w.lora else m.root_params * (w.e_c + w.e_r),
            buffers_at_end=False,
            persistent_grads=w.grad_accum_steps > 1,
        )
        # + DPO's frozen copy (train.dpo.reference: copy): sharded alike, in the compute dtype
        weights = (T * w.e_m + w.frozen_bytes(P)) / S + w.copy_bytes(P, S)
        if mem.persistent_grads:
            # Between syncs FSDP2 accumulates *unsharded* gradients (reduce dtype) on every rank,
            # on the GPU with CPU offload too (the module docstring).
            mem.held_grads = T * w.e_r
        if w.reference_copy:  # its units gathered one after another in its forward
            mem.reference_buffers = (2 * m.block_params + m.root_params) * w.e_c
        if opts.cpu_offload:
            mem.host = weights + 3 * T * w.e_m / S  # + gradients and AdamW's two moments
            mem.gradients = 0.0
            mem.notes.append("parameters, gradients and AdamW states live in host RAM")
        else:
            mem.parameters = weights
            mem.optimizer_states = 2 * T * w.e_m / S
        return mem

    def traffic(self, m: ModelShape, w: Workload, opts: FSDPOptions) -> Traffic:
        P, group = m.num_params, w.world_size // opts.replicate_degree
        T = w.trained(P)
        block = m.block_params * w.e_c - w.gathered_block_bytes(m.block_params)
        gathered = P * w.e_c - m.n_layers * block  # bytes per pass
        copy = P * w.e_c if w.reference_copy else 0.0  # DPO's frozen copy, in its forward
        volume = ((2 * gathered + copy) * w.grad_accum_steps + T * w.e_r) if group > 1 else 0.0
        if opts.replicate_degree > 1:
            volume += 2 * T * w.e_r / group  # all-reduce of the shards across replicas
        return Traffic(volume, group)

    def offload_seconds(
        self, m: ModelShape, w: Workload, opts: FSDPOptions, hw: Hardware
    ) -> OffloadTime:
        """See the module docstring: per micro-batch the sharded parameters up for each
        all-gather, per step the reduced gradient shard down and the CPU AdamW."""
        if not opts.cpu_offload:
            return OffloadTime()
        P, S = m.num_params, w.world_size // opts.replicate_degree
        local = w.trained(P) / w.world_size
        stored = (w.trained(P) * w.e_m + w.frozen_bytes(P)) / S  # bytes of a rank's shard
        copy = w.copy_bytes(P, S)  # DPO's frozen copy: its shard up once, in its forward
        blocks = 2 * m.n_layers - 1 if opts.reshard_after_forward else m.n_layers
        gathers = (blocks * m.block_params + m.root_params) / P  # full passes over the model
        key, fitted = ADAM_FUSED if w.fused_optim else ADAM_FOREACH
        rate = hw.adam_bw(key, fitted)  # probed here (`plan --host-probe`), else fitted
        step = local * hw.gpus_per_node * 7 * w.e_m / rate + local * w.e_m / hw.pcie_bw
        return OffloadTime((gathers * stored + copy) / hw.pcie_bw, step)

    def host_calls(self, m: ModelShape, w: Workload, opts: FSDPOptions) -> HostCalls:
        """FSDP2's hooks on each unit (the blocks and the root): before and after forward and
        backward (3 without resharding after forward), each walking its unit's parameters in
        Python: counted as BLOCK_LAYERS hook calls a unit (the 2026-12-04 fit, planner.speed)."""
        hooks = 4 if opts.reshard_after_forward else 3
        return HostCalls(hooks * (m.n_layers + 1) * BLOCK_LAYERS)

    def hook_for_probe(
        self, model: Any, blocks: Any, variant: str = ""
    ) -> tuple[Callable[[Any], None], int]:
        """zerofit's full-shard sharding in bf16 (`sharding.shard_for_probe`), over compiled
        blocks for the "compiled" variant: 4 hooks a unit."""
        from zerofit.backends.fsdp.sharding import shard_for_probe  # why: imports torch

        shard_for_probe(model, blocks, compiled=variant == "compiled")
        return lambda tokens: model(tokens).float().sum().backward(), 4 * BLOCK_LAYERS

    def hook_variants(self) -> dict[str, bool]:
        """Eager and compiled, probed apart: two H100 runs of one shape (2026-12-06) left
        compiled FSDP2 about 1.5x eager's host time a hook call, though the probe later read the
        compiled call slightly cheaper (84 us against 95); each kind is charged its own."""
        return {"": False, "compiled": True}

    def hook_variant(self, opts: FSDPOptions, compiled: bool, accumulating: bool = False) -> str:
        return "compiled" if compiled else ""

    def host_optimizers_for_probe(self) -> dict[str, Callable[..., Any]]:
        """torch's CPU AdamW as CPU offload steps it: fused (zerofit's default for host-resident
        states) and foreach (`optim.fused: false`)."""
        from zerofit.backends.torch_common import adamw_for_probe  # why: imports torch

        return {ADAM_FUSED[0]: adamw_for_probe(True), ADAM_FOREACH[0]: adamw_for_probe(False)}

    def shard_share(self, opts: FSDPOptions, world_size: int) -> float:
        return opts.replicate_degree / world_size

    def unsharded(self, opts: FSDPOptions, world_size: int) -> tuple[str, str]:
        why = ""
        if opts.replicate_degree == world_size:
            why = (
                f" (parallel.fsdp.replicate_degree={world_size} equals the world size: every "
                "rank is a replica)"
            )
        return "FAIL", why

    def remedies(self, cfg: Config) -> list[tuple[str, dict[str, Any]]]:
        return [
            (
                "shard parameters too (FSDP full-shard)",
                {
                    "parallel.backend": self.name,
                    "parallel.fsdp.reshard_after_forward": True,
                    "parallel.fsdp.replicate_degree": 1,
                },
            )
        ]


ENGINE = FSDP()

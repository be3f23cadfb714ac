"""DeepSpeed ZeRO as the planner, the doctor and the launcher see it (no torch or deepspeed here)."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

from zerofit.backends.deepspeed.options import DeepSpeedOptions
from zerofit.backends.engine import Engine
from zerofit.errors import UserError
from zerofit.planner.terms import BYTES, EngineMemory, Traffic, Workload

if TYPE_CHECKING:
    from zerofit.config import Config
    from zerofit.models.shape import ModelShape
    from zerofit.planner.shape import Hardware

# DeepSpeedCPUAdam streams ~7 x master-dtype bytes per parameter (param, grad, 2 moments read;
# param and moments written); 42 GB/s per node fits the 13B run (bf16 states, 16 cores).
CPU_ADAM_BW = 42e9
NVME_BW = 3e9  # bytes/s per node
RATIO_STEP = 0.05  # the planner's steps of offload_ratio


def fp16_supported() -> bool:
    """Whether DeepSpeed's accelerator here runs fp16 (CPUs differ). Without DeepSpeed installed,
    the runtime's own error says how to install it."""
    try:
        from deepspeed.accelerator import get_accelerator
    except ImportError:
        return True
    return bool(get_accelerator().is_fp16_supported())


def grad_bytes(w: Workload) -> int:
    """DeepSpeed's gradient partitions: bf16 with bf16 master weights
    (bf16_master_weights_and_grads), else the reduce dtype."""
    return BYTES[w.master_dtype] if w.master_dtype == "bf16" else w.e_r


class DeepSpeed(Engine):
    name = "deepspeed"
    options = DeepSpeedOptions
    runtime_module = "zerofit.backends.deepspeed.runtime"
    checkpoint_format = "deepspeed"
    checkpoint_reader = "zerofit.backends.deepspeed.checkpoint:ZeroCheckpointReader"
    commands = ("zerofit.backends.deepspeed.command",)
    plan_keys = ("stage", "offload_optimizer", "offload_param", "offload_ratio")
    efficiency = 0.30  # eager, hidden 2048 (llama3-1b on an H200)
    compile_gain = 1.54

    def validate(self, cfg: Config) -> None:
        if cfg.precision.fp8 != "none":
            raise UserError(
                f"precision.fp8={cfg.precision.fp8}: DeepSpeed has no float8 path in zerofit; use "
                "parallel.backend=fsdp (or precision.fp8: none)"
            )

    def prepare(self, cfg: Config, world_size: int, device_type: str) -> Config:
        from zerofit.backends.deepspeed.ds_json import merge_user_json
        from zerofit.config import with_fields

        cfg = merge_user_json(cfg, world_size)
        ds, prec = cfg.parallel.deepspeed, cfg.precision
        if ds.stage < 3 and ds.offload_param != "none":
            raise UserError(f"parallel.deepspeed.offload_param needs stage 3 (stage is {ds.stage})")
        if "nvme" in (ds.offload_optimizer, ds.offload_param) and not ds.nvme_path:
            raise UserError("nvme offload needs parallel.deepspeed.nvme_path")
        if ds.offload_ratio != 1.0 and (ds.stage != 3 or ds.offload_optimizer != "cpu"):
            raise UserError(
                "parallel.deepspeed.offload_ratio needs stage 3 with offload_optimizer: cpu"
            )
        bf16_masters = prec.master_dtype == prec.param_dtype == "bf16"
        if prec.master_dtype != "fp32" and not bf16_masters:
            raise UserError(
                f"deepspeed keeps master weights in fp32, or in bf16 with bf16 compute; got "
                f"precision.master_dtype={prec.master_dtype}, param_dtype={prec.param_dtype}"
            )
        if prec.param_dtype == "fp16" and not fp16_supported():
            raise UserError(
                f"fp16 compute (precision.param_dtype, or the DeepSpeed JSON's fp16 section) is not "
                f"supported by DeepSpeed on this {device_type.upper()}; use bf16 or fp32"
            )
        if ds.torch_adam is None:  # DeepSpeed's Adam kernels JIT-compile; on CPU use torch's AdamW
            cfg = with_fields(cfg, {"parallel.deepspeed.torch_adam": device_type != "cuda"})
        return cfg

    def candidates(self, base: DeepSpeedOptions, nodes: int, nvme: bool) -> list[DeepSpeedOptions]:
        plain = replace(
            base, stage=3, offload_optimizer="none", offload_param="none", offload_ratio=1.0
        )
        out = [replace(plain, stage=stage) for stage in (1, 2, 3)]
        out.append(replace(plain, offload_optimizer="cpu"))
        out.append(replace(plain, offload_optimizer="cpu", offload_param="cpu"))
        if nvme:
            out.append(replace(plain, offload_optimizer="nvme", offload_param="cpu"))
        return out

    def tunings(self, opts: DeepSpeedOptions) -> list[DeepSpeedOptions]:
        """Optimizer offload at stage 3, parameters on the GPU: every offload_ratio in steps of
        RATIO_STEP (the planner takes the fastest that fits: the smallest share on the CPU, since
        the GPU-resident part of the optimizer is faster)."""
        if opts.stage != 3 or opts.offload_optimizer != "cpu" or opts.offload_param != "none":
            return [opts]
        n = round(1 / RATIO_STEP)
        return [replace(opts, offload_ratio=round(i / n, 4)) for i in range(1, n + 1)]

    def label(self, opts: DeepSpeedOptions) -> str:
        name = f"ZeRO-{opts.stage}"
        if opts.offload_optimizer != "none":
            share = f" {opts.offload_ratio:.0%}" if opts.offload_ratio < 1 else ""
            name += f" + optim{share}->{opts.offload_optimizer}"
        if opts.offload_param != "none":
            name += f" + params->{opts.offload_param}"
        return name

    def memory(self, m: ModelShape, w: Workload, opts: DeepSpeedOptions) -> EngineMemory:
        P, W, stage = m.num_params, w.world_size, opts.stage
        T = w.trained(P)  # LoRA: the adapters; the frozen base is a module copy only
        part = W if stage >= 1 else 1
        opt = 3 * T * w.e_m / part  # master copy + two moments
        grads = T * (grad_bytes(w) if stage >= 2 else w.e_c) / (W if stage >= 2 else 1)
        bucket = min(opts.reduce_bucket_size, T) if w.lora else opts.reduce_bucket_size
        mem = EngineMemory(
            parameters=(P + (T if w.lora else 0)) * w.e_c / (W if stage == 3 else 1),
            persistent_grads=True,  # DeepSpeed allocates its gradient partitions up front
            buffers=bucket * w.e_c,
        )
        if stage == 3:
            mem.buffers += (2 * m.block_params + m.vocab_size * m.dim) * w.e_c  # gathered in flight
        elif stage in (1, 2) and W > 1:  # all-gather of the updated parameters
            gather = min(opts.allgather_bucket_size, T) if w.lora else opts.allgather_bucket_size
            mem.buffers += gather * w.e_c
        if opts.offload_optimizer == "cpu":  # offload_ratio < 1: the rest stays on the GPU
            r = opts.offload_ratio
            mem.host += r * (opt + grads)
            opt, grads = (1 - r) * opt, (1 - r) * grads
        elif opts.offload_optimizer == "nvme":
            mem.nvme += opt
            mem.host += grads + P * w.e_m / part  # staging buffers for the swapped states
            opt, grads = 0.0, 0.0
        if stage == 3 and opts.offload_param != "none":
            where = "host" if opts.offload_param == "cpu" else "nvme"
            setattr(mem, where, getattr(mem, where) + mem.parameters)
            mem.parameters = 0.0
        mem.optimizer_states, mem.gradients = opt, grads
        return mem

    def traffic(self, m: ModelShape, w: Workload, opts: DeepSpeedOptions) -> Traffic:
        P, W = m.num_params, w.world_size
        T = w.trained(P)
        if opts.stage == 3:  # parameters gathered in forward and backward, gradients scattered
            return Traffic((2 * P * w.e_c * w.grad_accum_steps + T * w.e_r) if W > 1 else 0.0, W)
        return Traffic(T * (w.e_r + w.e_c), W)  # reduce-scatter grads, all-gather new params

    def offload_seconds(
        self, m: ModelShape, w: Workload, opts: DeepSpeedOptions, hw: Hardware
    ) -> float:
        local, gpus, seconds = w.trained(m.num_params) / w.world_size, hw.gpus_per_node, 0.0
        if opts.offload_optimizer != "none":
            moved = local * (opts.offload_ratio if opts.offload_optimizer == "cpu" else 1.0)
            seconds += moved * gpus * 7 * w.e_m / CPU_ADAM_BW
            seconds += moved * (grad_bytes(w) + w.e_c) / hw.pcie_bw
            if opts.offload_optimizer == "nvme":
                seconds += 2 * local * gpus * 3 * w.e_m / NVME_BW
        if opts.stage == 3 and opts.offload_param != "none":
            # parameters streamed in for forward and backward, and out after the step (LoRA:
            # the frozen base only in)
            every = m.num_params / w.world_size
            seconds += (2 * every + local) * w.e_c * w.world_size / hw.pcie_bw
        return seconds

    def shard_share(self, opts: DeepSpeedOptions, world_size: int) -> float:
        return 1 / world_size if opts.stage == 3 else 1.0

    def unsharded(self, opts: DeepSpeedOptions, world_size: int) -> tuple[str, str]:
        if opts.stage == 3:
            return "FAIL", ""
        why = f" (ZeRO stage {opts.stage} shards optimizer states/gradients, not parameters)"
        return "warn", why

    def remedies(self, cfg: Config) -> list[tuple[str, dict[str, Any]]]:
        return [
            (
                "offload optimizer states to CPU (ZeRO-3)",
                {
                    "parallel.backend": self.name,
                    "parallel.deepspeed.stage": 3,
                    "parallel.deepspeed.offload_optimizer": "cpu",
                },
            )
        ]


ENGINE = DeepSpeed()

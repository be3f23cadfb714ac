"""DeepSpeed ZeRO as the planner, the doctor and the launcher see it (no torch or deepspeed here).

Offload terms, from DeepSpeed 0.19.8's `runtime/zero/stage3.py` (the version the H200 runs used):
- Where the optimizer lives (`cpu_share`). `offload_optimizer.ratio` does not split parameters: it
  places whole optimizer sub-groups (`_create_fp16_partitions`: `subgroup_to_device`), the first
  int((1 - ratio) x count) on the GPU, the rest on the CPU. Each param group (zerofit's two:
  matrices with weight decay, then norms and biases) is cut into sub-groups of
  `parallel.deepspeed.sub_group_size` elements per rank (`_create_fp16_sub_groups`; DeepSpeed's
  default SUB_GROUP_SIZE, 1e9). With it llama3-1b on one GPU has three (1.00B, 0.50B, the norms):
  a ratio over 2/3 offloads all of it, one from 1/3 to 2/3 the last two, a smaller one the norms
  alone. With a fixed global batch the planner also tries FINE_SUB_GROUP_SIZE (`tunings`), so
  that the ratio moves 1e8 elements at a time rather than 1e9.
- Every micro-batch (`OffloadTime.micro_batch`). With optimizer offload the gradient partitions
  live in a pinned host buffer (`grad_partitions_flat_buffer` on `self.device`, the CPU), in
  DeepSpeed's gradient-accumulation dtype, the compute dtype (zerofit sets no
  `data_types.grad_accum_dtype`); each micro-batch `partition_grads` copies the rank's partition
  to the GPU, adds the new gradient there and copies it back ("adding directly to cpu is very
  slow"): 2 x local parameters x e_c over PCIe in turn, for every parameter, whatever the ratio.
  With parameter offload, each rank's bf16 partition is fetched in forward and again in
  backward: 2 x P / W x e_c more, to the GPU only. PCIe is full duplex: the fetches share the
  host-to-GPU direction with the gradients' way up, not the way down (the 2026-12-04 24 GB runs,
  where parameter offload made a step faster, not slower, are still under-forecast: unexplained).
- Once per step (`OffloadTime.step`): CPU Adam over the CPU share (CPU_ADAM_BW), that share's
  gradient copied down in the master dtype (`_offload_grad_partition_at_boundary`) and its
  updated parameters up in e_c (not with parameter offload: the partition is on the host
  already). `plan --host-probe` times this whole step on the host (`host_optimizers_for_probe`),
  and its rate then stands for all of it (on several GPUs the copies, each on its own link, are
  charged as if in turn).
PCIe runs at `Hardware.pcie_bw` (planner.gpus.HOST_LINK_BW for the card's generation).

ZeRO-1/2 and ZeRO-3 memory by phase: `costs`'s module docstring.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from zerofit.backends.deepspeed.costs import (
    ADAM_KEY,
    CPU_ADAM_BW,
    FINE_SUB_GROUP_SIZE,
    HOOK_VARIANTS,
    RATIO_STEP,
    SUB_GROUP_SIZE,
    NvmeTerms,
    cpu_share,
    elements,
    hook_variant,
    host_calls,
    nvme_terms,
    offloaded,
    probed_stage,
    stage3_phases,
    stage12_phases,
)
from zerofit.backends.deepspeed.ds_json import to_ds_json
from zerofit.backends.deepspeed.merge import merge_user_json
from zerofit.backends.deepspeed.nvme import check_aio, check_nvme_path, uncompiled_on_disk
from zerofit.backends.deepspeed.options import DeepSpeedOptions
from zerofit.backends.deepspeed.pre_launch import launch_check, unsupported_dtype
from zerofit.backends.engine import Engine, LaunchCheck
from zerofit.backends.terms import EngineMemory, HostCalls, OffloadTime, Traffic, Workload
from zerofit.config import check_path, with_fields
from zerofit.config.sizes import human_bytes
from zerofit.errors import UserError

if TYPE_CHECKING:
    from zerofit.config import Config
    from zerofit.models.shape import ModelShape
    from zerofit.planner.shape import Hardware


def dtype_supported(dtype: str) -> bool:
    """Whether DeepSpeed's accelerator here computes in `dtype` (fp16 or bf16)."""
    return fp16_supported() if dtype == "fp16" else bf16_supported()


def bf16_supported() -> bool:
    """Whether DeepSpeed's accelerator here runs bf16 (HF checks it before filling "auto")."""
    try:
        from deepspeed.accelerator import get_accelerator  # optional: deepspeed
    except ImportError:
        return True
    return bool(get_accelerator().is_bf16_supported())


def fp16_supported() -> bool:
    """Whether DeepSpeed's accelerator here runs fp16 (CPUs differ). Without DeepSpeed installed,
    the runtime's own error says how to install it."""
    try:
        from deepspeed.accelerator import get_accelerator  # optional: deepspeed
    except ImportError:
        return True
    return bool(get_accelerator().is_fp16_supported())


class DeepSpeed(Engine[DeepSpeedOptions]):
    name = "deepspeed"
    options = DeepSpeedOptions
    runtime_module = "zerofit.backends.deepspeed.runtime"
    checkpoint_format = "deepspeed"
    checkpoint_reader = "zerofit.backends.deepspeed.checkpoint:ZeroCheckpointReader"
    library = "deepspeed"
    nvme_dir_key = "parallel.deepspeed.nvme_path"
    file_command = "ds-config"
    file_help = "print the DeepSpeed JSON a config turns into"
    plan_keys = (
        "stage",
        "offload_optimizer",
        "offload_param",
        "offload_ratio",
        "sub_group_size",
        "pin_memory",
    )
    efficiency = 0.30  # eager, hidden 2048 (llama3-1b on an H200)
    compile_gain = 1.54

    def checkpoint_files(self, saved: dict[str, Any]) -> Iterator[tuple[str, ...]]:
        """ZeRO-3: each rank's model-states and optimizer file; ZeRO-1/2: one model-states file,
        and each rank's optimizer file (named ``bf16_...`` when the run computed in bf16); stage 0:
        the model-states file alone (the optimizer's state is in it)."""
        layout = saved.get("layout")
        stage = layout.get("stage") if isinstance(layout, dict) else None
        if stage not in (0, 1, 2, 3) or isinstance(stage, bool):
            raise ValueError(f"no ZeRO stage in its layout ({stage!r})")
        if stage < 3:
            yield ("mp_rank_00_model_states.pt",)
        for rank in range(saved["world_size"] if stage else 0):
            if stage == 3:
                yield (f"zero_pp_rank_{rank}_mp_rank_00_model_states.pt",)
            optim = f"zero_pp_rank_{rank}_mp_rank_00_optim_states.pt"
            yield (optim, f"bf16_{optim}")

    def render_file(self, cfg: Config, world_size: int) -> str:
        return json.dumps(to_ds_json(cfg, world_size), indent=2)

    def launch_check(self, cfg: Config, world_size: int) -> LaunchCheck:
        """The resolved JSON (kept as the run folder's ds_config.json); a user's file checked by
        DeepSpeed's own config models, and what zerofit made of it, as notes (`pre_launch`)."""
        return launch_check(cfg, world_size)

    def check_options(self, opts: DeepSpeedOptions) -> None:
        check_path("parallel.deepspeed.config", opts.config)
        check_path("parallel.deepspeed.nvme_path", opts.nvme_path)

    def validate(self, cfg: Config) -> None:
        if cfg.precision.fp8 != "none":
            raise UserError(
                f"precision.fp8={cfg.precision.fp8}: DeepSpeed has no float8 path in zerofit; use "
                "parallel.backend=fsdp (or precision.fp8: none)"
            )
        if cfg.model.lora.quantize != "none":
            raise UserError(
                f"model.lora.quantize={cfg.model.lora.quantize}: DeepSpeed cannot hold a 4-bit "
                "base (ZeRO flattens parameters into floating-point buffers, and ZeRO-3 would "
                "all-gather the base unquantised); use parallel.backend=fsdp, which shards and "
                "all-gathers the 4-bit base as it is, or ddp"
            )

    def prepare(self, cfg: Config, world_size: int, device_type: str) -> Config:
        cfg = merge_user_json(cfg, world_size)
        ds, prec = cfg.parallel.deepspeed, cfg.precision
        if ds.stage < 3 and ds.offload_param != "none":
            raise UserError(f"parallel.deepspeed.offload_param needs stage 3 (stage is {ds.stage})")
        if "nvme" in (ds.offload_optimizer, ds.offload_param) and not ds.nvme_path:
            raise UserError("nvme offload needs parallel.deepspeed.nvme_path")
        if ds.stage < 3 and ds.offload_optimizer == "nvme":  # 0.19.8: stage_1_and_2.cpu_offload
            raise UserError(
                f"parallel.deepspeed.offload_optimizer: nvme needs stage 3 (stage is {ds.stage}): "
                f"DeepSpeed's ZeRO-{ds.stage} keeps such an optimizer in host RAM, as with cpu"
            )
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
        # bf16 is checked for a user's file only (whose validation imports DeepSpeed anyway):
        # zerofit's own bf16 default is for GPUs that run it, and `ds-config` imports no torch
        checked = prec.param_dtype == "fp16" or (prec.param_dtype == "bf16" and ds.config)
        if checked and not dtype_supported(prec.param_dtype):
            raise unsupported_dtype(cfg, device_type)
        # Partial offload (Twin-Flow) steps the CPU share with DeepSpeedCPUAdam only (DeepSpeed
        # 0.19.8 asserts it: "Hybrid Optimizer Only Supports DeepSpeedCPUAdam").
        hybrid = ds.offload_ratio < 1
        if ds.torch_adam and hybrid:
            raise UserError(
                "parallel.deepspeed.offload_ratio < 1 needs DeepSpeed's CPU Adam: set "
                "parallel.deepspeed.torch_adam: false (or null)"
            )
        if ds.torch_adam is None:  # DeepSpeed's Adam kernels JIT-compile; on CPU use torch's AdamW
            torch_adam = device_type != "cuda" and not hybrid
            cfg = with_fields(cfg, {"parallel.deepspeed.torch_adam": torch_adam})
        return cfg

    def uncompiled(self, opts: DeepSpeedOptions) -> str | None:
        return uncompiled_on_disk(opts)

    def check_machine(
        self, cfg: Config, planned: Callable[[], EngineMemory], local_ranks: int
    ) -> None:
        """NVMe offload: DeepSpeed's async_io op must build here, and nvme_path must take this
        node's swap files (`nvme`'s module docstring)."""
        ds = cfg.parallel.deepspeed
        keys = ("offload_optimizer", "offload_param")
        on_nvme = [f"parallel.deepspeed.{k}: nvme" for k in keys if getattr(ds, k) == "nvme"]
        if not on_nvme or not ds.nvme_path:
            return
        per_rank = planned().nvme
        what = f"{local_ranks} rank(s) x {human_bytes(per_rank)} of {' and '.join(on_nvme)}"
        check_nvme_path(ds.nvme_path, per_rank * local_ranks, what)  # the user's path first
        check_aio(" and ".join(on_nvme))

    def candidates(self, base: DeepSpeedOptions, nodes: int, nvme: bool) -> list[DeepSpeedOptions]:
        plain = replace(
            base, stage=3, offload_optimizer="none", offload_param="none", offload_ratio=1.0
        )
        out = [replace(plain, stage=stage) for stage in (1, 2, 3)]
        out.append(replace(plain, offload_optimizer="cpu"))
        out.append(replace(plain, offload_optimizer="cpu", offload_param="cpu"))
        if nvme:  # sub-groups of FINE_SUB_GROUP_SIZE: its pinned swap buffers hold 4 of them
            swap = replace(plain, offload_optimizer="nvme", sub_group_size=FINE_SUB_GROUP_SIZE)
            size = min(base.sub_group_size, FINE_SUB_GROUP_SIZE)
            disk = [replace(swap, offload_param=p, sub_group_size=size) for p in ("cpu", "nvme")]
            # unpinned, listed last (the same forecast speed: pageable copies are not costed, so
            # a tie keeps the pinned one): torch rounds each pinned buffer up to a power of two
            out += disk + [replace(o, pin_memory=False) for o in disk if o.pin_memory]
        return out

    def tunings(self, opts: DeepSpeedOptions) -> list[DeepSpeedOptions]:
        """Optimizer offload at stage 3, parameters on the GPU: every offload_ratio in steps of
        RATIO_STEP, the largest first, at the options' sub_group_size and then (when finer) at
        FINE_SUB_GROUP_SIZE. The planner takes the fastest that fits (the least on the CPU, since
        the GPU-resident part of the optimizer is faster); of variants that place the same share
        (`cpu_share`), so run alike, the first: the options' own sub-groups, the largest ratio,
        whose label is the closest to what DeepSpeed does.

        Why finer sub-groups: DeepSpeed moves whole sub-groups, so at 1e9 elements a small model
        has two or three, each too large to stay on a small card beside the rest. The cost is
        more of them per step: one CPU Adam call each (a vectorized loop over its elements) and
        its own gradient download and parameter upload. At 1e8 elements (400 MB in fp32) these
        calls are assumed to stream as fast as one large one (unmeasured); the forecast counts
        no per-sub-group cost."""
        if opts.stage != 3 or opts.offload_optimizer != "cpu" or opts.offload_param != "none":
            return [opts]
        n = round(1 / RATIO_STEP)
        ratios = [round(i / n, 4) for i in range(n, 0, -1)]
        sizes = [opts.sub_group_size]
        if opts.sub_group_size > FINE_SUB_GROUP_SIZE:
            sizes.append(FINE_SUB_GROUP_SIZE)
        return [replace(opts, sub_group_size=g, offload_ratio=r) for g in sizes for r in ratios]

    def label(self, opts: DeepSpeedOptions) -> str:
        name = f"ZeRO-{opts.stage}"
        if opts.offload_optimizer != "none":
            share = f" {opts.offload_ratio:.0%}" if opts.offload_ratio < 1 else ""
            name += f" + optim{share}->{opts.offload_optimizer}"
            fine = share or opts.offload_optimizer == "nvme"
            if fine and opts.sub_group_size != SUB_GROUP_SIZE:
                name += f" ({elements(opts.sub_group_size)} sub-groups)"
        if opts.offload_param != "none":
            name += f" + params->{opts.offload_param}"
        offloads = opts.offload_optimizer != "none" or opts.offload_param != "none"
        if offloads and not opts.pin_memory:
            name += " (unpinned)"
        return name

    def memory(self, m: ModelShape, w: Workload, opts: DeepSpeedOptions) -> EngineMemory:
        P, W, stage = m.num_params, w.world_size, opts.stage
        T = w.trained(P)  # LoRA: the adapters; the frozen base is a module copy only
        part = W if stage >= 1 else 1
        opt = 3 * T * w.e_m / part  # master copy + two moments
        bucket = min(opts.reduce_bucket_size, T) if w.lora else opts.reduce_bucket_size
        mem = EngineMemory(
            parameters=(P + (T if w.lora else 0)) * w.e_c / (W if stage == 3 else 1),
            persistent_grads=True,  # DeepSpeed allocates its gradient partitions up front
            buffers=bucket * w.e_c,
        )
        if stage == 3:
            opt, grads = stage3_phases(mem, m, w, opts, bucket)  # places CPU and NVMe offload
        else:
            grads = stage12_phases(mem, m, w, opts, bucket)
            opt, grads = offloaded(mem, m, w, opts, opt, grads)
        if w.reference_copy:  # DPO's frozen copy: partitioned at stage 3, else whole
            mem.parameters += w.copy_bytes(P, W if stage == 3 else 1)
            gathers = stage == 3 and (W > 1 or opts.offload_param != "none")
            mem.reference_buffers = (
                (2 * m.block_params + m.vocab_size * m.dim) * w.e_c if gathers else 0.0
            )
        if stage == 3 and opts.offload_param != "none":
            mem.host += mem.parameters if opts.offload_param == "cpu" else 0.0
            mem.parameters = 0.0
        if stage == 3:  # the swap files and their host buffers (`nvme_terms`)
            disk = nvme_terms(m, w, opts)
            mem.nvme, mem.host = mem.nvme + disk.disk, mem.host + disk.host
        mem.optimizer_states, mem.gradients = opt, grads
        return mem

    def traffic(self, m: ModelShape, w: Workload, opts: DeepSpeedOptions) -> Traffic:
        P, W = m.num_params, w.world_size
        T = w.trained(P)
        if opts.stage == 3:  # parameters gathered in forward and backward, gradients scattered
            passes = 3 if w.reference_copy else 2  # + DPO's frozen copy, in its forward
            return Traffic(
                (passes * P * w.e_c * w.grad_accum_steps + T * w.e_r) if W > 1 else 0.0, W
            )
        return Traffic(T * (w.e_r + w.e_c), W)  # reduce-scatter grads, all-gather new params

    def offload_seconds(
        self, m: ModelShape, w: Workload, opts: DeepSpeedOptions, hw: Hardware
    ) -> OffloadTime:
        """See the module docstring: per micro-batch the gradient partition's round trip (and the
        offloaded parameters' fetches), per step CPU Adam and the copies around it."""
        local, gpus = w.trained(m.num_params) / w.world_size, hw.gpus_per_node
        grads = fetches = step = 0.0
        params_on_host = opts.stage == 3 and opts.offload_param != "none"
        if opts.offload_optimizer != "none":
            moved = local * cpu_share(m, w, opts)
            grads = local * w.e_c / hw.pcie_bw  # each way: to the GPU, accumulated, back
            probed = hw.adam_bw(ADAM_KEY, 0.0)  # the whole step as timed here, copies included
            step += moved * gpus * 7 * w.e_m / (probed or CPU_ADAM_BW)
            if not probed:
                step += moved * (w.e_m + (0 if params_on_host else w.e_c)) / hw.pcie_bw
        if params_on_host:  # each rank fetches its partition in forward and again in backward
            passes = 3 if w.reference_copy else 2  # + DPO's frozen copy's, in its forward
            fetches = passes * m.num_params / w.world_size * w.e_c / hw.pcie_bw
        # NVMe (`nvme_terms`): the node's ranks share the disk; the step swaps each sub-group
        # in and out around its Adam (no pipelining by default), the parameters read from the
        # disk go up to the GPU as they arrive
        disk = nvme_terms(m, w, opts) if opts.stage == 3 else NvmeTerms()
        step += gpus * (disk.step_read / hw.nvme_read_bw + disk.step_write / hw.nvme_write_bw)
        reads = gpus * disk.micro_read / hw.nvme_read_bw
        # the round trip is serial (one stream); PCIe is full duplex, so the fetches share only
        # the host-to-GPU direction with the gradients' way up
        return OffloadTime(
            max(2 * grads, grads + fetches, reads),
            step,
            disk_read=disk.step_read + disk.micro_read * w.grad_accum_steps,
            disk_write=disk.step_write,
        )

    def host_calls(self, m: ModelShape, w: Workload, opts: DeepSpeedOptions) -> HostCalls:
        return host_calls(m, w, opts)  # costs.host_calls: ZeRO's Python hooks

    def hook_for_probe(
        self, model: Any, blocks: Any, variant: str = ""
    ) -> tuple[Callable[[Any], None], int] | None:
        try:
            from zerofit.backends.deepspeed.probe import zero_for_probe  # optional: deepspeed
        except ImportError:
            return None
        return zero_for_probe(model, *probed_stage(variant))

    def hook_variants(self) -> dict[str, bool]:
        """ZeRO-3's hooks; ZeRO-1/2's gradient hooks alone (at ZeRO-3's rate, ZeRO-2 came out
        +19.9% on the H100, 2026-12-06); ZeRO-1's off the accumulation boundary."""
        return dict(HOOK_VARIANTS)

    def hook_variant(
        self, opts: DeepSpeedOptions, compiled: bool, accumulating: bool = False
    ) -> str:
        return hook_variant(opts, accumulating)  # costs.hook_variant

    def host_optimizers_for_probe(self) -> dict[str, Callable[..., Any]]:
        try:
            from zerofit.backends.deepspeed.probe import offload_step_for_probe  # optional
        except ImportError:
            return {}
        return {ADAM_KEY: offload_step_for_probe}  # ZeRO-3's whole offloaded step

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

"""DDP, the baseline: every rank holds the whole model; gradients are all-reduced."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel

from zerofit.backends.base import materialize_from_spec
from zerofit.backends.torch_common import (
    TorchBackend,
    build_adamw,
    cast_frozen_,
    frozen_,
    trainable,
)
from zerofit.distributed import fp8 as fp8
from zerofit.distributed.parallelize import apply_ac, apply_compile, get_blocks
from zerofit.models import ModelSpec


class DDPBackend(TorchBackend):
    name = "ddp"

    def setup(self, spec: ModelSpec, init_seed: int) -> None:
        module = spec.module.to(self.master_dtype)
        cast_frozen_(module, self.param_dtype)  # a LoRA base: stored as it is computed
        fp8.convert(module, self.precision.fp8, self.ctx.device, fsdp_all_gather=False)
        blocks = get_blocks(module, spec.blocks_path)
        apply_ac(
            blocks,
            self.parallel.activation_checkpointing,
            self.parallel.ac_every,
            self.parallel.ac_blocks,
        )
        if self.parallel.compile:
            apply_compile(blocks)
        materialize_from_spec(module, self.ctx.device, spec, init_seed)
        self.scaler = self.make_scaler()
        if self.ctx.world_size > 1:
            ids = [self.ctx.device.index] if self.ctx.device.type == "cuda" else None
            ddp = DistributedDataParallel(module, device_ids=ids)
            if self.reduce_dtype != self.master_dtype:
                hook = {
                    torch.bfloat16: default_hooks.bf16_compress_hook,
                    torch.float16: default_hooks.fp16_compress_hook,
                }
                if self.reduce_dtype in hook:
                    ddp.register_comm_hook(None, hook[self.reduce_dtype])
            self.model = ddp
        else:
            self.model = module
        self.optimizer = build_adamw(self.model, self.optim_cfg, self.ctx.device)

    def wrap_frozen(self, spec: ModelSpec, init_seed: int) -> nn.Module:
        """Replicated like the policy: the whole copy on every rank, nothing to reduce. Stored as
        the policy computes under autocast: the Linear weights in the compute dtype, the rest in
        the master dtype (an fp32 residual stream, as the policy's), so that at step 0 it
        computes exactly what the policy does."""
        module = frozen_(spec.module.to(self.master_dtype), self.param_dtype, linears_only=True)
        if self.parallel.compile:
            apply_compile(get_blocks(module, spec.blocks_path))
        materialize_from_spec(module, self.ctx.device, spec, init_seed)
        return module.eval()

    def reduce_dtype_in_use(self) -> torch.dtype:
        """DDP all-reduces gradients in the parameters' dtype unless a compression hook is set."""
        grads_dtype = trainable(self.model)[0].dtype
        if not isinstance(self.model, DistributedDataParallel):
            return grads_dtype  # one process: nothing is reduced
        hook = self.model._get_ddp_logging_data().get("comm_hook", "")
        return {"bf16_compress_hook": torch.bfloat16, "fp16_compress_hook": torch.float16}.get(
            hook, grads_dtype
        )

    @contextlib.contextmanager
    def micro_step(self, is_last: bool) -> Iterator[None]:
        sync = (
            contextlib.nullcontext()
            if is_last or self.ctx.world_size == 1
            else self.model.no_sync()
        )
        autocast = (
            torch.autocast(self.ctx.device.type, dtype=self.param_dtype)
            if self.param_dtype != self.master_dtype
            else contextlib.nullcontext()
        )
        with sync, autocast:
            yield


BACKEND = DDPBackend

"""FSDP2 (`fully_shard`): parameters, gradients and optimizer states sharded over the mesh."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import torch
from torch import nn
from torch.distributed.fsdp import FSDPModule

from zerofit.backends.base import Gate, materialize_from_spec
from zerofit.backends.fsdp.sharding import apply_fsdp
from zerofit.backends.torch_common import TorchBackend, build_adamw, cast_frozen_, frozen_
from zerofit.distributed import fp8 as fp8
from zerofit.distributed.parallelize import apply_ac, apply_compile, get_blocks
from zerofit.faults.nonfinite import StepResult
from zerofit.models import ModelSpec


class FSDPBackend(TorchBackend):
    name = "fsdp"
    fp8_scales = False  # tensorwise float8: precompute the all-gather scales after each update

    def setup(self, spec: ModelSpec, init_seed: int) -> None:
        p, f = self.parallel, self.parallel.fsdp
        module = spec.module.to(self.master_dtype)  # on meta: a dtype change only
        cast_frozen_(module, self.param_dtype)  # a LoRA base: stored as it is computed
        # float8 matmuls first (torchtitan's order); tensorwise weights all-gather in float8
        self.fp8_scales = self.precision.fp8 == "tensorwise"
        fp8.convert(module, self.precision.fp8, self.ctx.device, self.fp8_scales)
        blocks = get_blocks(module, spec.blocks_path)
        apply_ac(blocks, p.activation_checkpointing, p.ac_every, p.ac_blocks)
        if p.compile:
            apply_compile(blocks)
        self._shard(module, blocks, f.reshard_after_forward)
        init_device = torch.device("cpu") if f.cpu_offload else self.ctx.device
        materialize_from_spec(module, init_device, spec, init_seed)
        self.model = module
        self.scaler = self.make_scaler()
        self.optimizer = build_adamw(module, self.optim_cfg, init_device, offloaded=f.cpu_offload)

    def _shard(
        self, module: nn.Module, blocks: list[nn.Module], reshard_after_forward: bool
    ) -> None:
        """`module` and its `blocks` under FSDP2, as `parallel.fsdp` says."""
        f = self.parallel.fsdp
        apply_fsdp(
            module,
            blocks,
            self.ctx.mesh,
            param_dtype=self.param_dtype,
            reduce_dtype=self.reduce_dtype,
            reshard_after_forward=reshard_after_forward,
            cpu_offload=f.cpu_offload,
            wrap=f.wrap,
            min_num_params=f.min_num_params,
            prefetch=f.prefetch,
        )

    def wrap_frozen(self, spec: ModelSpec, init_seed: int) -> nn.Module:
        """Sharded like the policy (the same mesh, units, prefetch and CPU offload), stored in
        the compute dtype the policy's all-gathers cast to; every unit resharded after its
        forward, the last block and the root too (no backward comes to reshard them)."""
        p, f = self.parallel, self.parallel.fsdp
        module = frozen_(spec.module, self.param_dtype)
        blocks = get_blocks(module, spec.blocks_path)
        if p.compile:
            apply_compile(blocks)
        self._shard(module, blocks, reshard_after_forward=True)
        assert isinstance(module, FSDPModule)
        module.set_reshard_after_forward(True)  # apply_fsdp keeps the last block gathered
        device = torch.device("cpu") if f.cpu_offload else self.ctx.device
        materialize_from_spec(module, device, spec, init_seed)
        return module.eval()

    def step(self, lr: float, loss: torch.Tensor, gate: Gate) -> StepResult:
        result = super().step(lr, loss, gate)
        if self.fp8_scales and result.applied:  # the next all-gathers cast the new weights
            fp8.precompute_scales(self.model)
        return result

    def restore(self, path: Path, saved: dict) -> None:
        super().restore(path, saved)
        if self.fp8_scales:  # scales of the loaded weights, as an uninterrupted run has them
            fp8.precompute_scales(self.model)

    def reduce_dtype_in_use(self) -> torch.dtype:
        """FSDP2 reduces in reduce_dtype, else in the dtype the gradients were computed in (read
        on the first parameter that has gradients: a LoRA base has none)."""
        groups = [
            m._get_fsdp_state()._fsdp_param_group  # type: ignore[operator]
            for m in self.model.modules()
            if isinstance(m, FSDPModule)
        ]
        fp = next(
            p
            for g in groups
            if g is not None
            for p in g.fsdp_params
            if p.sharded_param.requires_grad
        )
        return fp.reduce_dtype or fp.param_dtype or fp.orig_dtype

    @contextlib.contextmanager
    def micro_step(self, is_last: bool) -> Iterator[None]:
        assert isinstance(self.model, FSDPModule)
        # Accumulate unsharded-free: gradients are reduce-scattered only on the last micro-batch.
        self.model.set_requires_gradient_sync(is_last)
        yield


BACKEND = FSDPBackend

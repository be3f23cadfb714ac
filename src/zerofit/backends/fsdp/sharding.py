"""FSDP2's sharding: per transformer block (or by size, as FSDP1's size-based policy), then the
root; with explicit prefetch of the neighbouring blocks' all-gathers."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import (
    CPUOffloadPolicy,
    MixedPrecisionPolicy,
    OffloadPolicy,
    fully_shard,
)

from zerofit.distributed.parallelize import apply_compile


def apply_fsdp(
    model: nn.Module,
    blocks: nn.ModuleList,
    mesh: DeviceMesh,
    *,
    param_dtype: torch.dtype,
    reduce_dtype: torch.dtype,
    reshard_after_forward: bool,
    cpu_offload: bool,
    wrap: str = "block",
    min_num_params: int = 100_000_000,
    prefetch: int = 0,
) -> list[nn.Module]:
    """FSDP2: shard per transformer block (or by size), then the root. Returns the FSDP units.

    `prefetch` > 0 (block wrap): each block explicitly prefetches the all-gathers of the next
    `prefetch` blocks in forward and the previous ones in backward (torchtitan's knob)."""
    # fp32 compute: no cast at all (every float parameter is fp32 already but a QLoRA base's NF4
    # words, which a cast would change; a param_dtype of fp32 would convert them)
    cast_to = None if param_dtype == torch.float32 else param_dtype
    kwargs = {
        "mesh": mesh,
        "mp_policy": MixedPrecisionPolicy(param_dtype=cast_to, reduce_dtype=reduce_dtype),
        "offload_policy": CPUOffloadPolicy(pin_memory=torch.cuda.is_available())
        if cpu_offload
        else OffloadPolicy(),
    }
    units: list[nn.Module] = []
    if wrap == "block":
        for i, block in enumerate(blocks):
            # The last block's params are needed again at once by backward: keep them unsharded.
            last = i == len(blocks) - 1
            fully_shard(block, reshard_after_forward=reshard_after_forward and not last, **kwargs)
            units.append(block)
        if prefetch > 0:
            _explicit_prefetch(list(blocks), prefetch)
    else:
        units = _size_units(model, min_num_params)
        for unit in units:
            fully_shard(unit, reshard_after_forward=reshard_after_forward, **kwargs)
    fully_shard(model, reshard_after_forward=reshard_after_forward, **kwargs)
    units.append(model)
    return units


def shard_for_probe(model: nn.Module, blocks: nn.ModuleList, compiled: bool = False) -> None:
    """FSDP2 as a bf16 full-shard run applies it, over the process group in use (the host
    probe's fake one), on the device `model` is on; `compiled`: each block compiled first, as a
    compiled run does (`parallelize.apply_compile`, ahead of sharding)."""
    if compiled:
        apply_compile(blocks)
    device = next(model.parameters()).device.type
    mesh = init_device_mesh(device, (dist.get_world_size(),))
    kwargs = {"param_dtype": torch.bfloat16, "reduce_dtype": torch.float32}
    apply_fsdp(model, blocks, mesh, reshard_after_forward=True, cpu_offload=False, **kwargs)


def _explicit_prefetch(blocks: list[nn.Module], depth: int) -> None:
    for i, block in enumerate(blocks):
        ahead = blocks[i + 1 : i + 1 + depth]
        behind = blocks[max(0, i - depth) : i][::-1]
        if ahead:
            block.set_modules_to_forward_prefetch(ahead)  # type: ignore[operator]
        if behind:
            block.set_modules_to_backward_prefetch(behind)  # type: ignore[operator]


def _size_units(model: nn.Module, min_num_params: int) -> list[nn.Module]:
    """Size-based policy (as FSDP1's size_based_auto_wrap_policy): post-order, a module becomes a
    unit once the parameters not yet claimed by a unit below it reach `min_num_params`."""
    units: list[nn.Module] = []

    def visit(module: nn.Module) -> int:
        unclaimed = sum(p.numel() for p in module.parameters(recurse=False))
        for child in module.children():
            unclaimed += visit(child)
        is_container = isinstance(
            module, nn.ModuleList | nn.ModuleDict
        )  # no forward: cannot be a unit
        if module is not model and not is_container and unclaimed >= min_num_params:
            units.append(module)
            return 0
        return unclaimed

    visit(model)
    return units

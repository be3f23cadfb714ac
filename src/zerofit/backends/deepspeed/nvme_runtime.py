"""NVMe offload at run time (imports torch: the runtime's side): exact resumes, partitions on the
disk, and a DeepSpeed 0.19.8 fault worked around.

Resuming. DeepSpeed 0.19.8's `load_checkpoint` with the optimizer on NVMe (`engine.py`:
`zero_nvme_offload_optimizer`) copies the checkpoint's ``offloaded_tensors/rank*`` (each swapped
sub-group's fp32 master and Adam moments) back into the swap folder and rebuilds the parameters
from them (`reset_swap_buffers`), but skips the rank's ZeRO optimizer file altogether. What was
never swapped then stays as a fresh run has it: every sub-group under the swap threshold
(MIN_AIO_BYTES, 1 MiB: the norms and biases of a small model) with its master and moments, every
sub-group's Adam step count, and the loss scaler. Resumed so, the first step computes with fresh
norms and the next corrects Adam's bias as at step 1: on CPU the loss parted at once (3.531 vs
3.534 on the first step after the resume, 3.35 vs 5.61 on the second). `restore_unswapped_`
puts those back from the rank's optimizer file, which holds them (the swapped tensors in it are
empty).

Parameters on the disk (`offload_param: nvme`). zero.Init writes every partition of 1 MiB and
more to the disk and leaves an empty tensor: zerofit's own init writes through it
(`on_disk_partition`). From the second step on, DeepSpeed's NVMe prefetch
(`partitioned_param_coordinator.__prefetch_nvme_param_partitions`) walks the step's trace, in
which a parameter used in forward and again in backward appears twice, and asks the swapper to
read both at once: "param N already assigned swap buffer id M" (seen on CPU with 2 ranks; the
open Megatron-DeepSpeed issue 196 shows the same stack). The same prefetch takes every free swap
buffer, so a fetch off the trace (a block recomputed under activation checkpointing) finds too
few: "Not enough swap in buffers 5 for 6 params" (an H100, 2.0B parameters, 21 buffers).
`dedupe_swap_ins` makes the swapper read each parameter once, and keeps PREFETCH_RESERVE buffers
out of the prefetch's reach. Gathered parameters hold buffers too, as long as DeepSpeed keeps them
for reuse: `ds_json.own_json` bounds that to one block (`stage3_max_reuse_distance`).

Exact fp32 masters (bf16 or fp16 compute): DeepSpeed's `safe_set_full_fp32_param` reads and
writes back a parameter's whole optimizer sub-group when it is on the disk, for every parameter
(a 3B model: some 200 parameters, each moving GBs). `swapped_masters` keeps a sub-group read
while consecutive parameters fall in it: each sub-group is read and written once.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from zerofit.backends.deepspeed.costs import BLOCK_TENSORS

# Swap buffers the NVMe prefetch leaves free: one block's tensors, which a fetch off the
# prefetch's trace reads at once
PREFETCH_RESERVE = BLOCK_TENSORS
OPTIM_FILES = (
    "zero_pp_rank_{}_mp_rank_00_optim_states.pt",
    "bf16_zero_pp_rank_{}_mp_rank_00_optim_states.pt",
)


def optim_file(model_dir: Path, rank: int) -> Path:
    """The rank's ZeRO-3 optimizer file in a checkpoint's model folder."""
    for name in OPTIM_FILES:
        path = model_dir / name.format(rank)
        if path.exists():
            return path
    return model_dir / OPTIM_FILES[0].format(rank)  # missing: the loader names it


def _state(saved: dict, numel: int, swapped: bool) -> dict:
    """One sub-group's optimizer state from the saved one. A swapped sub-group's moments are
    empty in the file (they are in the swap files DeepSpeed copied back): placeholders of their
    size stand in, for the swapper to register and read back."""
    state = {}
    for key, value in saved.items():
        if not torch.is_tensor(value):
            state[key] = value
        elif value.numel() == 0 and swapped:
            state[key] = torch.empty(numel, dtype=value.dtype)
        else:
            state[key] = value.clone()
    return state


@torch.no_grad()
def restore_unswapped_(optimizer: Any, model_dir: Path, rank: int, load: Callable) -> None:
    """After DeepSpeed's own load of an NVMe checkpoint: the loss scaler, each sub-group's Adam
    state (the step, and the moments: of a swapped sub-group registered with the swapper, which
    reads them from its files at the next step, as after a step of its own) and the masters of
    the sub-groups never swapped, from the rank's optimizer file (`load`: weights only); then
    the persistent parameters gathered again from their restored partitions. Collective: every
    rank calls it."""
    saved = load(str(optim_file(model_dir, rank)), map_location="cpu")["optimizer_state_dict"]
    for key in ("loss_scaler", "dynamic_loss_scale", "overflow"):
        if key in saved:
            setattr(optimizer, key, saved[key])
    optimizer.checkpoint_event_prologue()  # every parameter partitioned, as DeepSpeed's load
    flats = optimizer.fp32_partitioned_groups_flat
    # torch's state_dict numbers the fp32 flats group by group, sub-groups in order within each
    # (stage3._set_fp32_optimizer_param_groups appends them so)
    order = sorted(range(len(flats)), key=lambda i: (optimizer.sub_group_to_group_id[i], i))
    states = saved["optimizer_state_dict"]["state"]
    inner = optimizer.optimizer.state
    for index, i in enumerate(order):
        swapped = optimizer._swappable_optimizer_subgroup(i)
        numel = int(optimizer.fp16_partitioned_groups_flat_numel[i])
        if index in states:
            inner[flats[i]] = _state(states[index], numel, swapped)
        if swapped:  # registered now (ds_id: the swap file's name), released until the step
            info = optimizer.optimizer_swapper._get_param_swap_info(flats[i])
            if info is not None:
                info.release_memory()
            continue
        flats[i].data.copy_(saved["fp32_flat_groups"][i].to(flats[i].dtype))
        optimizer._reassign_or_swap_out_partitioned_parameters(i)  # its module partition
    # the small parameters stay gathered between steps (stage3_param_persistence_threshold):
    # DeepSpeed's load gathered them before the partitions above were restored
    optimizer.checkpoint_event_epilogue()


@contextlib.contextmanager
def on_disk_partition(p: Any) -> Iterator[None]:
    """Around a write to a ZeRO-3 parameter's partition: with `offload_param: nvme` zero.Init
    wrote every partition of DeepSpeed's swap size to the disk and left an empty tensor in its
    place; it is read back into a swap buffer for the write, then written out and released."""
    swapper, part = getattr(p, "nvme_swapper", None), p.ds_tensor
    location = getattr(getattr(part, "final_location", None), "value", None)
    if swapper is not None and location == "nvme" and part.status.name == "NOT_AVAILABLE":
        swapper.swap_in([p], async_op=False)
        yield
        swapper.swap_out_and_release([p])
    else:
        yield


def dedupe_swap_ins() -> None:
    """DeepSpeed's parameter swapper reads each parameter of a swap-in once (see the module
    docstring); idempotent."""
    from deepspeed.runtime.swap_tensor.partitioned_param_swapper import (  # optional: deepspeed
        AsyncPartitionedParameterSwapper as Swapper,
    )

    if getattr(Swapper.swap_in, "zerofit_deduped", False):
        return
    original = Swapper.swap_in

    def swap_in(self: Any, params: list, async_op: bool = True, swap_in_buffers: Any = None) -> Any:
        if swap_in_buffers is None:
            params = list({id(p): p for p in params}.values())
            if async_op:  # the prefetch: leave a block's buffers to the fetch in use
                params = params[: max(0, len(self.available_buffer_ids) - PREFETCH_RESERVE)]
                if not params:
                    return None
        return original(self, params, async_op=async_op, swap_in_buffers=swap_in_buffers)

    swap_in.zerofit_deduped = True  # type: ignore[attr-defined]
    Swapper.swap_in = swap_in


class _Masters:
    """Sets fp32 masters in an optimizer whose sub-groups are swapped (`swapped_masters`)."""

    def __init__(self, optimizer: Any) -> None:
        self.opt, self.current = optimizer, None

    def __call__(self, p: Any, full: torch.Tensor, rank: int) -> None:
        opt = self.opt
        i, offset, n = opt.grad_position[opt.get_param_id(p)]
        if i != self.current:
            self.close()
            if opt._swappable_optimizer_subgroup(i):
                opt._optimizer_states_and_gradient_swap_in(i)
                self.current = i
        # the rank's slice as DeepSpeed's own set_full_hp_param takes it
        opt.fp32_partitioned_groups_flat[i].narrow(0, offset, n).copy_(
            full.flatten().narrow(0, n * rank, n)
        )

    def close(self) -> None:
        if self.current is not None:
            self.opt._optimizer_states_and_gradient_swap_out(self.current)
            self.current = None


@contextlib.contextmanager
def swapped_masters(optimizer: Any) -> Iterator[Callable[[Any, torch.Tensor, int], None] | None]:
    """A setter of fp32 masters that reads each swapped sub-group once (see the module
    docstring), written back on exit; None when the optimizer is not on NVMe."""
    if not getattr(optimizer, "swap_optimizer", False):
        yield None
        return
    masters = _Masters(optimizer)
    try:
        yield masters
    finally:
        masters.close()

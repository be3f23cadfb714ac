"""DeepSpeed's planner terms: what ZeRO keeps per GPU and on the host, and how long its offloaded
optimizer step takes (CPU Adam, NVMe), from the model's shape and the options (the offload
terms: `spec`'s module docstring).

ZeRO-1/2 memory by phase (`stage12_phases`), from DeepSpeed 0.19.8's `runtime/zero/
stage_1_and_2.py` (DeepSpeedZeroOptimizer with FusedAdam: zerofit sets no fp32 gradient
accumulation dtype, so not BF16_Optimizer). Resident: the flat bf16 parameters, the master
partition and Adam's two moments in the master dtype. The gradients (`grads_in_partition`) are in
the model dtype at both stages, whatever the reduce dtype; the step frees them, so a forward holds
none unless gradients accumulate (then see `_accumulating`: ZeRO-1 also keeps its reduce
buckets through the next forward, ZeRO-2 a second gradient partition in the boundary's
backward). Inside backward: two reduce buckets (`overlap_comm`) of
`reduce_bucket_size` in the model dtype, plus the bucket being reduced cast to the reduce dtype,
beside the activations not yet freed (the peak of a large model at a short sequence). The step
flattens each group's gradients (`torch.cat`) and casts the copy to the master dtype: with fp32
masters 22 bytes a parameter then, with bf16 12. Checked on the 2026-12-03/04 held-out runs (none
fitted): every ZeRO-1/2 row within 3.3%. World size > 1 is not derived from the source.

ZeRO-3 memory (`stage3_phases`), from `runtime/zero/stage3.py` and `partition_parameters.py`:
the flat gradient partitions are in the model dtype whatever the master (allocated at start-up;
with the optimizer offloaded, in pinned host memory, where the master, moments and fp32 gradients
of the offloaded sub-groups live too, while a GPU sub-group keeps its own master-dtype gradient
buffer); one reduce bucket in the reduce dtype from the start; at world size 1 a gathered
parameter is a view of its partition, so only W > 1 or parameter offload gather copies (two
blocks and the head in flight: not derived); the first bucket reduction adds the bucket's cast and
partitions, and under offload the head's copy and its fp64 norm chunk; the step flattens and casts
one sub-group's gradients at a time. Checked on the held-out runs (none fitted): every ZeRO-3 row
within 5%.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from zerofit.backends.deepspeed.options import DeepSpeedOptions
from zerofit.backends.terms import (
    BYTES,
    EngineMemory,
    HostCalls,
    Workload,
    block_tensors,
    trained_tensors,
)

if TYPE_CHECKING:
    from zerofit.models.shape import ModelShape

# DeepSpeedCPUAdam streams ~7 x master-dtype bytes per parameter (param, grad, 2 moments read;
# param and moments written); 42 GB/s per node fits the 13B run (bf16 states, 16 cores).
CPU_ADAM_BW = 42e9
ADAM_KEY = "deepspeed offload step"  # its probed rate (`Hardware.adam_bw`): `plan --host-probe`
# NVMe offload, DeepSpeed 0.19.8's defaults (`runtime/zero/offload_config.py`; zerofit sets none)
OPT_SWAP_BUFFERS = 4  # offload_optimizer.buffer_count: pinned buffers of the largest sub-group
OPT_SWAPPED = 4  # tensors a sub-group swaps: fp32 master, two moments, and its fp32 gradient
ADAM_MOMENTS = 2  # CPU Adam's exp_avg and exp_avg_sq
PARAM_SWAP_BUFFERS = 5  # offload_param.buffer_count
PARAM_MAX_IN_CPU = 10**9  # offload_param.max_in_cpu: elements a rank keeps in host RAM
RATIO_STEP = 0.05  # the planner's steps of offload_ratio
SUB_GROUP_SIZE = 10**9  # zero_optimization.sub_group_size: DeepSpeed's default, and zerofit's
# The finer sub-groups the planner tries with partial offload: 400 MB each in fp32. Cost assumed
# negligible, unmeasured: see `DeepSpeed.tunings`.
FINE_SUB_GROUP_SIZE = 10**8
# ZeRO-1/2's optimizer step walks the trained parameters in Python this many times (gradient
# norm, unscaling and the updated parameters' copy-back, beside the bucket bookkeeping), each
# walk a hook call a tensor (planner.speed): fitted on the 2026-12-04 held-out ZeRO-1 row
ZERO12_STEP_PASSES = 2
NORM_CHUNK = 250_000_000  # stage3._constant_buffered_norm2: elements per fp64 norm chunk


def grad_bytes(w: Workload) -> int:
    """DeepSpeed's gradient partitions: bf16 with bf16 master weights
    (bf16_master_weights_and_grads), else the reduce dtype."""
    return BYTES[w.master_dtype] if w.master_dtype == "bf16" else w.e_r


def offloaded(
    mem: EngineMemory, m: ModelShape, w: Workload, opts: DeepSpeedOptions, opt: float, grads: float
) -> tuple[float, float]:
    """ZeRO-1/2: the optimizer states and gradients that move to the host (DeepSpeed 0.19.8's
    stage_1_and_2 offloads an "nvme" optimizer as a "cpu" one; zerofit refuses it); returns
    what stays on the GPU."""
    if opts.offload_optimizer != "none":  # ZeRO-1/2 keep an "nvme" optimizer in host RAM too
        r = cpu_share(m, w, opts)
        mem.host += r * (opt + grads)
        return (1 - r) * opt, (1 - r) * grads
    return opt, grads


@dataclass(frozen=True)
class NvmeTerms:
    """One rank's NVMe offload, in bytes (`nvme_terms`)."""

    disk: float = 0.0  # swap files on the disk
    host: float = 0.0  # host RAM: pinned swap buffers, the parameters kept in host RAM
    step_read: float = 0.0  # read from the disk once per optimizer step
    step_write: float = 0.0  # written once per optimizer step
    micro_read: float = 0.0  # read every micro-batch: parameters fetched in forward and backward


def nvme_terms(m: ModelShape, w: Workload, opts: DeepSpeedOptions) -> NvmeTerms:
    """What NVMe offload puts on the disk and moves per step, from DeepSpeed 0.19.8's ZeRO-3
    (`runtime/swap_tensor/`). Checked on CPU, 2 ranks, a 8.9M-parameter model with optimizer and
    parameters on the disk (max_in_cpu 0): its swap files were these bytes less the tensors
    under 1 MiB (132.1 MB of optimizer files for 142.7 MB here; a 1.8M one, whose gradients all
    stay in RAM, read and wrote 24.5 MB a step for 29.4). Optimizer: each sub-group's fp32 master, two moments and, written at the step's
    boundary, its fp32 gradient, each a swap file (OPT_SWAPPED); the step reads all four and
    writes back three, one sub-group at a time through OPT_SWAP_BUFFERS pinned buffers of the
    largest. Parameters: every partition is written at zero.Init; the first PARAM_MAX_IN_CPU
    elements a rank holds are kept in host RAM too and fetched from there, the rest is read from
    the disk in forward and again in backward, and written back after each step when it trains.
    Tensors under DeepSpeed's 1 MiB swap threshold stay in host RAM (not counted)."""
    W, T = w.world_size, w.trained(m.num_params)
    local, disk, host = T / W, 0.0, 0.0
    read = write = micro = 0.0
    if opts.offload_optimizer == "nvme":
        largest = min(max(sub_groups(m, w, opts.sub_group_size)), local)
        disk += OPT_SWAPPED * local * w.e_m
        # the pinned swap buffers, and at the first step CPU Adam's two moments of a sub-group,
        # created in plain host RAM before they are swapped out (`cpu_adam.py`: no state yet)
        host += (OPT_SWAP_BUFFERS + ADAM_MOMENTS) * largest * w.e_m
        read += OPT_SWAPPED * local * w.e_m
        write += OPT_SWAPPED * local * w.e_m  # the gradient, then master and moments
    if opts.offload_param == "nvme":
        params = (m.num_params + (T if w.lora else 0)) / W
        swapped = max(0.0, params - PARAM_MAX_IN_CPU)  # fetched from the disk
        disk += params * w.e_c
        count, size = param_swap_buffers(m, W, opts.sub_group_size)
        host += (params - swapped + count * size) * w.e_c
        micro += 2 * swapped * w.e_c
        write += swapped * w.e_c * (local / params)  # the trained share, after the step
    return NvmeTerms(disk, host, read, write, micro)


BLOCK_TENSORS = 9  # a decoder block's parameters: q, k, v, o, three FFN matrices, two norms


def param_swap_buffers(m: ModelShape, world_size: int, sub_group_size: int) -> tuple[int, int]:
    """(buffer_count, buffer_size) of `offload_param` on NVMe, where DeepSpeed 0.19.8's defaults
    (PARAM_SWAP_BUFFERS buffers of 1e8 elements) fail. Each swapped partition takes a whole buffer
    (`partitioned_param_swapper.get_buffer` asserts it fits: a 3B model's embedding on one GPU is
    3.9x the default), and with the optimizer on NVMe too the buffers also stage each optimizer
    sub-group's parameters (`_initialize_from_swapped_fp16_params` asserts they hold the
    largest). A block is gathered whole (leaf modules) while the next one is fetched ahead:
    two blocks' tensors, the embedding, the head and one spare. A buffer is as large as the largest
    of those and no larger: DeepSpeed's default size would hold 21 x 1e8 elements in host RAM for
    any model (8.4 GB a rank in fp32 for a 10M-parameter one)."""
    q, kv = m.n_heads * m.head_dim, m.n_kv_heads * m.head_dim
    largest = max(m.embedding_params, m.dim * max(m.ffn_dim, q, kv))
    partition = -(-largest // world_size)
    groups = sub_groups(m, Workload(1, 1, world_size), sub_group_size)
    size = max(partition, math.ceil(max(groups)))
    return max(PARAM_SWAP_BUFFERS, 2 * BLOCK_TENSORS + 3), size


def _norm_copy(m: ModelShape) -> float:
    """The gradient norm's fp64 copy of one tensor at a time: the largest parameter's."""
    return 8 * max(m.vocab_size * m.dim, m.dim * m.ffn_dim)


def stage12_phases(
    mem: EngineMemory, m: ModelShape, w: Workload, opts: DeepSpeedOptions, bucket: float
) -> float:
    """ZeRO-1/2 (`DeepSpeedZeroOptimizer`, see the module docstring): sets `mem`'s phases and
    returns the gradient storage. Derived from the source for one rank; W > 1 keeps the
    partitioning of the gradients as ZeRO describes it, unchecked on a GPU."""
    T, W = w.trained(m.num_params), w.world_size
    local = T / W
    grads = T * w.e_c / (W if opts.stage == 2 else 1)  # in the model dtype at either stage
    mem.persistent_grads = w.grad_accum_steps > 1  # else the step frees them before forward
    mem.buffers = 0.0  # the buckets live in backward only
    buckets = (2 if opts.overlap_comm else 1) * bucket * w.e_c
    cast = bucket * w.e_r if w.e_r != w.e_c else 0.0  # a bucket in the reduce dtype, in flight
    mem.backward = ((bucket, buckets), (2 * bucket, buckets + cast))
    if opts.offload_optimizer == "none":  # the step flattens the gradients, then casts them
        flat = local * w.e_c + (local * w.e_m if w.e_m != w.e_c else 0.0)
        mem.step_buffers = max(flat, _norm_copy(m))
    if W > 1:  # the all-gather of the updated parameters, after the step's temporaries
        gather = min(opts.allgather_bucket_size, T) if w.lora else opts.allgather_bucket_size
        mem.step_buffers = max(mem.step_buffers, gather * w.e_c)
    if w.grad_accum_steps > 1 and opts.offload_optimizer == "none":
        _accumulating(mem, w, opts, T, grads, buckets)
    return grads


def _accumulating(
    mem: EngineMemory, w: Workload, opts: DeepSpeedOptions, T: float, grads: float, buckets: float
) -> None:
    """ZeRO-1/2 with gradients accumulating over micro-batches (`stage_1_and_2.py`). Stage 2: the
    epilogue of a micro-batch short of the boundary keeps views of `grads_in_partition` and
    drops the buffer, so the boundary's backward allocates a second one beside them until its
    epilogue adds the two. Stage 1: short of the boundary nothing is reduced and no epilogue
    releases the reduce buckets, which live on through the next forward; in the boundary's
    backward each accumulated `param.grad` is freed only as its hook copies it into a bucket."""
    if opts.stage == 2:
        mem.backward = tuple((at, b + grads) for at, b in mem.backward)
    else:
        mem.held_grads = grads + buckets
        mem.backward = tuple((at, b + max(0.0, T - at) * w.e_c) for at, b in mem.backward)


def stage3_phases(
    mem: EngineMemory, m: ModelShape, w: Workload, opts: DeepSpeedOptions, bucket: float
) -> tuple[float, float]:
    """ZeRO-3 (`DeepSpeedZeroOptimizer_Stage3`, see the module docstring): sets `mem`'s buffers,
    host share and phases; returns the optimizer states and gradients left on the GPU."""
    T, W = w.trained(m.num_params), w.world_size
    local, head = T / W, m.vocab_size * m.dim
    mem.buffers = bucket * w.e_r  # one reduce bucket in the reduce dtype, from the start
    if W > 1 or opts.offload_param != "none":  # a rank's gathered copies (at W = 1 a view)
        mem.buffers += (2 * m.block_params + head) * w.e_c
    grads, opt = local * w.e_c, 3 * local * w.e_m  # flat gradient partitions in the model dtype
    reduce = (w.e_r + w.e_c) * bucket + 2 * m.block_params * w.e_c  # 1st reduction's copies
    groups = sub_groups(m, w, opts.sub_group_size)
    if opts.offload_optimizer != "none":  # NVMe: the same on the GPU, the states on the disk
        r = cpu_share(m, w, opts)
        on_gpu = int((1 - opts.offload_ratio) * len(groups))  # as cpu_share counts them
        pin = pinned if opts.pin_memory else float
        cpu = opts.offload_optimizer == "cpu"  # NVMe: every sub-group swaps through the host
        mem.host += pin(grads) + _host_optimizer(w, groups[on_gpu:] if cpu else groups, cpu, pin)
        mem.step_buffers = 4 * max(groups[:on_gpu], default=0.0)
        norm = max(8 * min(head, NORM_CHUNK), 4 * head)  # the head's fp64 norm or fp32 cast
        reduce = max(reduce, w.e_c * (bucket + head) + norm)
        mem.backward = ((bucket, reduce),)
        return (1 - r) * opt, (1 - r) * local * w.e_m  # GPU sub-groups keep a gradient buffer
    largest = max(groups)
    cast = largest * w.e_m if w.e_m != w.e_c else 0.0
    mem.step_buffers = max(largest * w.e_c + cast, _norm_copy(m))
    mem.backward = ((bucket, reduce),)
    return opt, grads


def pinned(nbytes: float) -> float:
    """The host bytes a pinned tensor of `nbytes` takes: torch's CachingHostAllocator (DeepSpeed's
    `pin_memory()`) rounds each block up to a power of two."""
    return float(2 ** math.ceil(math.log2(nbytes))) if nbytes > 1 else float(nbytes)


def _host_optimizer(w: Workload, host: list[float], cpu: bool, pin: Callable) -> float:
    """ZeRO-3's offloaded optimizer in host RAM beside the pinned gradient partitions, for its
    sub-groups off the GPU (`host`): with "cpu" (`cpu`), each one's fp32 master and two moments
    and its pinned fp32 gradient buffer (`stage3.py`: one a sub-group); with either, the step's
    copy of the largest one's updated master to the GPU, converted to the compute dtype on the
    host first (a blocking copy with a dtype change: none when the master is in the compute
    dtype)."""
    temp = max(host, default=0.0) * w.e_c if w.e_m != w.e_c else 0.0
    if not cpu:
        return temp
    return 3 * sum(host) * w.e_m + sum(pin(g * w.e_m) for g in host) + temp


def decayed_matrices(m: ModelShape) -> list[int]:
    """The parameters zerofit's AdamW decays (`torch_common.param_groups`: two dimensions and up),
    in the model's order: the embedding, each block's q, k, v, o and three FFN matrices, the
    output layer unless tied."""
    q, kv = m.n_heads * m.head_dim, m.n_kv_heads * m.head_dim
    block = [m.dim * q, m.dim * kv, m.dim * kv, q * m.dim, *[m.dim * m.ffn_dim] * 3]
    head = [] if m.tied_embeddings else [m.embedding_params]
    return [m.embedding_params, *block * m.n_layers, *head]


def sub_groups(m: ModelShape, w: Workload, size: int = SUB_GROUP_SIZE) -> list[float]:
    """Elements per rank of ZeRO-3's optimizer sub-groups, in order: each param group cut after
    the parameter that brings a sub-group to `size` (sub_group_size; LoRA: the adapters, one
    group)."""
    if w.lora:
        groups = [[w.lora.params / w.world_size]]
    else:
        matrices = [n / w.world_size for n in decayed_matrices(m)]
        rest = max(0.0, m.num_params / w.world_size - sum(matrices))
        groups = [matrices, [rest]] if rest else [matrices]
    out: list[float] = []
    for group in groups:
        filled = 0.0
        for i, n in enumerate(group):
            filled += n
            if filled >= size or i == len(group) - 1:
                out.append(filled)
                filled = 0.0
    return out


def cpu_share(m: ModelShape, w: Workload, opts: DeepSpeedOptions) -> float:
    """The share of the optimizer (master weights, moments, fp32 gradients) DeepSpeed keeps off
    the GPU (in host RAM, or on NVMe): whole sub-groups from int((1 - offload_ratio) x their
    count) on; 0 without offload."""
    if opts.offload_optimizer == "none":
        return 0.0
    if opts.offload_optimizer != "cpu" or opts.stage != 3:
        return 1.0
    groups = sub_groups(m, w, opts.sub_group_size)
    on_gpu = int((1 - opts.offload_ratio) * len(groups))  # as stage3._create_fp16_partitions
    return sum(groups[on_gpu:]) / sum(groups)


def elements(n: int) -> str:
    """A count of elements, short: 100M, 1B, 12,345."""
    for unit, scale in (("B", 10**9), ("M", 10**6)):
        if n >= scale and n % scale == 0:
            return f"{n // scale}{unit}"
    return f"{n:,}"


ZERO12 = "zero12"  # `hook_variants`: ZeRO-1/2 runs, whose gradient hooks alone are probed
ZERO1_ACCUMULATING = "zero1-accumulating"  # ZeRO-1's gradient hooks off the boundary
HOOK_VARIANTS = {"": False, ZERO12: False, ZERO1_ACCUMULATING: False}  # none compiled


def hook_variant(opts: DeepSpeedOptions, accumulating: bool = False) -> str:
    """The kind of run whose probed hook rate a run with `opts` is charged (`accumulating`: on
    a micro-batch before the step's last): ZeRO-3's, ZeRO-1/2's, or ZeRO-1's off the boundary."""
    if opts.stage == 3:
        return ""
    return ZERO1_ACCUMULATING if accumulating and opts.stage == 1 else ZERO12


def probed_stage(variant: str) -> tuple[int, bool]:
    """(ZeRO stage, whether each backward is the accumulation boundary) that the probe runs to
    time `variant`'s hooks."""
    return {ZERO12: (2, True), ZERO1_ACCUMULATING: (1, False)}.get(variant, (3, True))


def host_calls(m: ModelShape, w: Workload, opts: DeepSpeedOptions) -> HostCalls:
    """DeepSpeed's Python hooks (`zerofit.planner.speed.host_seconds`). ZeRO-3: every module
    holding parameters fetches them before forward and backward and releases them after (4
    calls), and every trained tensor's gradient hook reduces it; ZeRO-1/2: every trained
    tensor's gradient hook each micro-batch, and ZERO12_STEP_PASSES walks over the trained
    tensors each step. ZeRO-1's hooks reduce only at the accumulation boundary
    (`reduce_ready_partitions_and_remove_grads` in DeepSpeed's stage_1_and_2.py); before it
    they still run (bucket setup, the gradient's accumulation into its own buffer, the hook
    count's epilogue), at the rate the probe times off the boundary (`accumulating`).
    Charging them nothing there left a held-out ZeRO-1 run at 4 micro-batches -18.9%
    (2026-12-07, H100)."""
    root = 2 if m.tied_embeddings else 3
    trained = trained_tensors(m.n_layers, root, w)
    if opts.stage == 3:
        modules = m.n_layers * block_tensors(w) + root
        return HostCalls(4 * modules + trained)
    accumulating = trained if opts.stage == 1 else None
    return HostCalls(trained, ZERO12_STEP_PASSES * trained, accumulating)

"""DeepSpeed's planner terms: what ZeRO keeps per GPU and on the host, and how long its offloaded
optimizer step takes (CPU Adam, NVMe), from the model's shape and the options."""

from __future__ import annotations

from typing import TYPE_CHECKING

from zerofit.backends.deepspeed.options import DeepSpeedOptions
from zerofit.backends.terms import BYTES, EngineMemory, Workload

if TYPE_CHECKING:
    from zerofit.models.shape import ModelShape

# DeepSpeedCPUAdam streams ~7 x master-dtype bytes per parameter (param, grad, 2 moments read;
# param and moments written); 42 GB/s per node fits the 13B run (bf16 states, 16 cores).
CPU_ADAM_BW = 42e9
NVME_BW = 3e9  # bytes/s per node
RATIO_STEP = 0.05  # the planner's steps of offload_ratio
SUB_GROUP_SIZE = 10**9  # zero_optimization.sub_group_size: DeepSpeed's default, and zerofit's
# The finer sub-groups the planner tries with partial offload: 400 MB each in fp32. Cost assumed
# negligible, unmeasured: see `DeepSpeed.tunings`.
FINE_SUB_GROUP_SIZE = 10**8
NORM_CHUNK = 250_000_000  # stage3._constant_buffered_norm2: elements per fp64 norm chunk


def grad_bytes(w: Workload) -> int:
    """DeepSpeed's gradient partitions: bf16 with bf16 master weights
    (bf16_master_weights_and_grads), else the reduce dtype."""
    return BYTES[w.master_dtype] if w.master_dtype == "bf16" else w.e_r


def offloaded(
    mem: EngineMemory, m: ModelShape, w: Workload, opts: DeepSpeedOptions, opt: float, grads: float
) -> tuple[float, float]:
    """ZeRO-1/2 (and ZeRO-3 to NVMe): the optimizer states and gradients that move to the host or
    to NVMe; returns what stays on the GPU."""
    if opts.offload_optimizer == "cpu":
        r = cpu_share(m, w, opts)
        mem.host += r * (opt + grads)
        return (1 - r) * opt, (1 - r) * grads
    if opts.offload_optimizer == "nvme":
        mem.nvme += opt
        part = w.world_size if opts.stage >= 1 else 1
        mem.host += grads + m.num_params * w.e_m / part  # staging buffers for the swapped states
        return 0.0, 0.0
    return opt, grads


def _norm_copy(m: ModelShape) -> float:
    """The gradient norm's fp64 copy of one tensor at a time: the largest parameter's."""
    return 8 * max(m.vocab_size * m.dim, m.dim * m.ffn_dim)


def stage12_phases(
    mem: EngineMemory, m: ModelShape, w: Workload, opts: DeepSpeedOptions, bucket: float
) -> float:
    """ZeRO-1/2 (`DeepSpeedZeroOptimizer`, see `spec`'s module docstring): sets `mem`'s phases and
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
    return grads


def stage3_phases(
    mem: EngineMemory, m: ModelShape, w: Workload, opts: DeepSpeedOptions, bucket: float
) -> tuple[float, float]:
    """ZeRO-3 (`DeepSpeedZeroOptimizer_Stage3`, see `spec`'s module docstring): sets `mem`'s buffers,
    host share and phases; returns the optimizer states and gradients left on the GPU."""
    T, W = w.trained(m.num_params), w.world_size
    local, head = T / W, m.vocab_size * m.dim
    mem.buffers = bucket * w.e_r  # one reduce bucket in the reduce dtype, from the start
    if W > 1 or opts.offload_param != "none":  # a rank's gathered copies (at W = 1 a view)
        mem.buffers += (2 * m.block_params + head) * w.e_c
    grads, opt = local * w.e_c, 3 * local * w.e_m  # flat gradient partitions in the model dtype
    reduce = (w.e_r + w.e_c) * bucket + 2 * m.block_params * w.e_c  # 1st reduction's copies
    groups = sub_groups(m, w, opts.sub_group_size)
    if opts.offload_optimizer == "cpu":
        r = cpu_share(m, w, opts)
        mem.host += grads + r * local * 4 * w.e_m  # partitions pinned; master, moments, grads
        gpu = groups[: int((1 - opts.offload_ratio) * len(groups))]
        mem.step_buffers = 4 * max(gpu, default=0.0)
        norm = max(8 * min(head, NORM_CHUNK), 4 * head)  # the head's fp64 norm or fp32 cast
        reduce = max(reduce, w.e_c * (bucket + head) + norm)
        mem.backward = ((bucket, reduce),)
        return (1 - r) * opt, (1 - r) * local * w.e_m  # GPU sub-groups keep a gradient buffer
    largest = max(groups)
    cast = largest * w.e_m if w.e_m != w.e_c else 0.0
    mem.step_buffers = max(largest * w.e_c + cast, _norm_copy(m))
    mem.backward = ((bucket, reduce),)
    return opt, grads


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
    the GPU: whole sub-groups from int((1 - offload_ratio) x their count) on; 0 without offload."""
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

"""`parallel.deepspeed.*`: DeepSpeed ZeRO's options (no torch or deepspeed imports here).

Each field maps to one DeepSpeed JSON path: `zerofit.backends.deepspeed.ds_json.TABLE` (torch_adam:
in zerofit's own optimizer block only; config and leaf_blocks: none).
"""

from __future__ import annotations

from typing import Annotated as A
from typing import Literal

from pydantic.dataclasses import dataclass

from zerofit.config.fields import SECTION, Bool, Int, NoBool, Positive, Share, Str, doc

_ELEMENTS = {"ge": 1, "le": 2**40}  # bucket sizes, in elements
_COUNT = {"ge": 0, "le": 2**40}
Offload = Literal["none", "cpu", "nvme"]


@dataclass(config=SECTION)
class DeepSpeedOptions:
    """DeepSpeed ZeRO: stages 1-3, CPU/NVMe offload, buckets and the fp16 loss scaler."""

    config: A[
        Str | None, doc("a ds_config.json merged with this config (conflicts are errors)")
    ] = None
    stage: A[
        Literal[0, 1, 2, 3],
        NoBool,
        doc("ZeRO stage: 1 optimizer states, 2 + gradients, 3 + parameters"),
    ] = 3
    offload_optimizer: A[Offload, doc("where optimizer states live")] = "none"
    offload_ratio: A[
        Share, doc("stage 3: share of optimizer states offloaded; the rest are updated on the GPU")
    ] = 1.0
    sub_group_size: A[
        Int,
        doc(
            "stage 3: elements per rank of each optimizer sub-group, the unit offload_ratio "
            "places on the GPU or the CPU (DeepSpeed's default, 1e9; 0: one per parameter)",
            **_COUNT,
        ),
    ] = 1_000_000_000
    offload_param: A[Offload, doc("stage 3: where parameters live")] = "none"
    nvme_path: A[Str | None, doc("directory on a fast SSD for nvme offload")] = None
    pin_memory: A[Bool, doc("page-locked host buffers for offload")] = True
    overlap_comm: A[Bool, doc("overlap gradient reduction with backward")] = True
    contiguous_gradients: A[Bool, doc("copy gradients into one buffer as they are produced")] = True
    reduce_scatter: A[Bool, doc("reduce gradients with reduce-scatter instead of all-reduce")] = (
        True
    )
    allgather_bucket_size: A[
        Int, doc("elements per all-gather bucket (stages 1-2)", **_ELEMENTS)
    ] = 500_000_000
    reduce_bucket_size: A[Int, doc("elements per gradient-reduction bucket", **_ELEMENTS)] = (
        500_000_000
    )
    prefetch_bucket_size: A[Int, doc("stage 3: elements prefetched ahead of use", **_COUNT)] = (
        50_000_000
    )
    param_persistence_threshold: A[
        Int, doc("stage 3: params smaller than this stay unpartitioned", **_COUNT)
    ] = 100_000
    max_live_parameters: A[Int, doc("stage 3: max gathered elements alive at once", **_COUNT)] = (
        1_000_000_000
    )
    leaf_blocks: A[
        Bool, doc("stage 3: gather each decoder block's params in one go (ZeRO-3 leaf)")
    ] = True
    torch_adam: A[
        Bool | None,
        doc(
            "torch AdamW instead of DeepSpeed's fused/CPU Adam (null: on CPU, unless "
            "offload_ratio < 1, which needs DeepSpeed's CPU Adam)"
        ),
    ] = None
    loss_scale_window: A[
        Int, doc("fp16: steps without overflow before the loss scale grows", ge=1, le=2**31 - 1)
    ] = 1000
    initial_scale_power: A[Int, doc("fp16: initial loss scale is 2**this", ge=0, le=64)] = 16
    hysteresis: A[
        Int, doc("fp16: overflows tolerated before the scale shrinks", ge=1, le=2**31 - 1)
    ] = 2
    min_loss_scale: A[Positive, doc("fp16: floor of the dynamic loss scale")] = 1.0

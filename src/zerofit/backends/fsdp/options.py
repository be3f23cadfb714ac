"""`parallel.fsdp.*`: FSDP2's options (no torch here: the schema and the planner read them)."""

from __future__ import annotations

from typing import Annotated as A
from typing import ClassVar, Literal

from pydantic.dataclasses import dataclass

from zerofit.config.fields import SECTION, Bool, Int, doc


@dataclass(config=SECTION)
class FSDPOptions:
    """FSDP2 (`fully_shard`): how parameters, gradients and AdamW states are sharded."""

    # Before 0.2 these options were flat under `parallel.*`; such configs load until this version.
    flat_until: ClassVar[str] = "0.3"

    reshard_after_forward: A[Bool, doc("true = FULL_SHARD, false = SHARD_GRAD_OP")] = True
    replicate_degree: A[
        Int, doc("hybrid sharding: replicas on the outer mesh dim (HSDP if > 1)", ge=1, le=2**20)
    ] = 1
    prefetch: A[
        Int,
        doc(
            "blocks whose all-gather is issued ahead (0: FSDP2's implicit one-block prefetch)",
            ge=0,
            le=1024,
        ),
    ] = 0
    wrap: A[Literal["block", "size"], doc("FSDP unit: each transformer block, or size-based")] = (
        "block"
    )
    min_num_params: A[
        Int, doc("size policy: a module becomes a unit at this many params", ge=1, le=2**50)
    ] = 100_000_000
    cpu_offload: A[Bool, doc("sharded params, grads and AdamW states live in host RAM")] = False

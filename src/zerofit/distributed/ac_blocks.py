"""Which blocks recompute in backward under each activation-checkpointing mode: pure arithmetic,
shared by the model transforms (`zerofit.distributed.parallelize.apply_ac`) and the planner."""

from __future__ import annotations

from zerofit.errors import UserError


def checkpointed_blocks(
    mode: str, n_blocks: int, every: int = 2, first: int | None = None
) -> list[int]:
    """The indices of the blocks that recompute in backward under `mode` (see `apply_ac`)."""
    if mode == "none":
        return []
    if mode == "every_k":
        return list(range(0, n_blocks, every))
    if mode == "first_k":
        k = first or 0
        if k > n_blocks:
            raise UserError(
                f"parallel.ac_blocks={k}: the model has {n_blocks} blocks (first_k recomputes "
                f"the first ac_blocks of them; {n_blocks} is full checkpointing)"
            )
        return list(range(k))
    return list(range(n_blocks))

"""DeepSpeed ZeRO-3's hooks for the host probe (`zerofit.planner.host_probe`): a model handed to
`deepspeed.initialize` over the process group in use (the probe's fake one), so that a forward +
backward runs ZeRO-3's Python fetch, release and gradient hooks as a bf16 run does."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator

import deepspeed
import torch
from torch import nn

from zerofit.backends.terms import BLOCK_LAYERS
from zerofit.report import quiet


@contextlib.contextmanager
def _as_rank_zero() -> Iterator[None]:
    """The environment a launcher gives rank 0 of the process group in use, restored after."""
    world = str(torch.distributed.get_world_size())
    given = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": world, "LOCAL_WORLD_SIZE": world}
    saved = {k: os.environ.get(k) for k in given}
    os.environ.update(given)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def zero3_for_probe(model: nn.Module) -> tuple[Callable[[torch.Tensor], None], int]:
    """`model` under ZeRO-3 in bf16 (torch's AdamW: no op to build): a forward + backward, and
    the hook calls of a block as `costs.host_calls` counts them (4 per module holding
    parameters, and a gradient hook per trained tensor)."""
    config = {
        "train_micro_batch_size_per_gpu": 1,
        "zero_optimization": {"stage": 3},
        "bf16": {"enabled": True},
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "torch_adam": True}},
    }
    with _as_rank_zero(), quiet.deepspeed_setup():
        engine, *_ = deepspeed.initialize(model=model, config=config)

    def step(tokens: torch.Tensor) -> None:
        with _as_rank_zero():  # ZeRO-3 reads LOCAL_RANK in its hooks (the same in every step)
            engine.backward(engine(tokens).float().sum())

    return step, 5 * BLOCK_LAYERS

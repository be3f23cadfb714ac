"""What a forward keeps for backward: the bytes of the tensors autograd saves, the model's own
parameters not counted. Device-independent (on CPU there is no allocator to read), so the tests
and `benchmarks/ac_saved_bytes.py` use it to check that recomputation frees a block's
activations."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn


def saved_bytes(model: nn.Module, loss: Callable[[], torch.Tensor]) -> int:
    """Bytes saved for backward while ``loss()`` runs `model`'s forward (each storage once), then
    the backward of the scalar it returns."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    kept: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in params:
            kept[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        value = loss()
    value.backward()
    return sum(kept.values())

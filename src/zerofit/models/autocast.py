"""What autocast would cast a Linear's tensors to, done before a custom autograd function runs.

A function that computes a Linear itself (``lora_delta``'s updates, ``nf4_linear``'s 4-bit base)
sees its inputs as autocast left them: an fp32 residual stream under DDP's bf16 autocast, say.
``F.linear`` would cast them to autocast's dtype first; ``linear_inputs`` does the same, so that
such a function computes, and allocates, in that dtype.
"""

from __future__ import annotations

import torch


def linear_inputs(*tensors: torch.Tensor | None) -> tuple[torch.Tensor | None, ...]:
    """`tensors` (the first one a tensor) cast to autocast's dtype where autocast is on for the
    first one's device (None stays None), as ``F.linear`` casts its input, weight and bias; as
    given where it is off."""
    device = tensors[0].device.type  # type: ignore[union-attr]
    if not torch.is_autocast_enabled(device):
        return tensors
    dtype = torch.get_autocast_dtype(device)
    return tuple(None if t is None else t.to(dtype) for t in tensors)

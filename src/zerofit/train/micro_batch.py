"""One micro-batch through the model, as every objective and the DPO reference run it."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from zerofit.data import Batch
from zerofit.models.doc_attention import BOUNDS_MULTIPLE, document_bounds


def forward(model: nn.Module, batch: Batch, device: torch.device, **kwargs: Any) -> torch.Tensor:
    """The model on a micro-batch: its mean loss over the valid targets (``per_token=True``: each
    place's negative log-likelihood). Positions and the documents' bounds when the rows have them,
    the bounds from the host's copy (no device sync in forward), padded as `BOUNDS_MULTIPLE`
    says."""
    inputs, targets = (t.to(device, non_blocking=True) for t in batch[:2])
    if len(batch) < 3:
        return model(inputs, targets, **kwargs)
    positions = batch[2].to(device, non_blocking=True)
    docs = document_bounds(batch[2], BOUNDS_MULTIPLE).to(device, non_blocking=True)
    return model(inputs, targets, positions=positions, documents=docs, **kwargs)

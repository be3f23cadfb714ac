"""Learning-rate schedule: linear warmup, then cosine decay to lr x min_lr_ratio.

A pure function of the step, so resuming needs no scheduler state beyond the step itself.
"""

from __future__ import annotations

import math


def lr_at(
    step: int, *, lr: float, warmup_steps: int, total_steps: int, min_lr_ratio: float
) -> float:
    """Learning rate for optimizer step `step` (0-based)."""
    if warmup_steps and step < warmup_steps:
        return lr * (step + 1) / warmup_steps
    decay_steps = max(total_steps - warmup_steps, 1)
    progress = min(max(step - warmup_steps, 0) / decay_steps, 1.0)
    cosine = 0.5 * (1 + math.cos(math.pi * progress))
    return lr * (min_lr_ratio + (1 - min_lr_ratio) * cosine)

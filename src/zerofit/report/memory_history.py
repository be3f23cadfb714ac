"""How long a CUDA run records its allocations (its OOM report's snapshot), for the commands that
time runs without importing the training loop: `zerofit bench --warmup` and `zerofit plan
--measure` start timing after it (`zerofit.train.periodic.FirstSteps` stops the recording)."""

from __future__ import annotations

# On CUDA a run records its allocations from start-up through this step. Recording slows every
# allocation, so no timed step should fall inside it.
MEMORY_HISTORY_STEPS = 3

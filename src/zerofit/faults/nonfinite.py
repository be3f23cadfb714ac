"""`train.on_nonfinite`: what a step whose loss or gradient norm is NaN or inf does.

`stop` (the default) ends the run at the first such step; `skip` drops that step's update and
goes on, up to `train.max_skipped_steps` in a row. Either way the update is never applied, so the
weights stay those of the last good step and no checkpoint ever holds non-finite weights.

An fp16 loss-scale overflow is not this: the loss was finite, only the scaled gradients
overflowed, and the loss scaler skipping the step and lowering the scale is normal. Those are
counted apart (`loss_scale_skips` in the summary).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from zerofit.errors import EXIT_NONFINITE, RunStopped


@dataclass
class StepResult:
    """What an engine's `step` did: the global gradient norm (pre-clip, on the device), whether
    the update was applied, and whether it was skipped by the fp16 loss scaler."""

    grad_norm: object  # torch.Tensor; typed loosely to keep this module free of torch
    applied: bool = True
    scale_skip: bool = False
    detail: str = ""  # the engine's own word on a skipped update, if any

    @property
    def nonfinite(self) -> bool:
        return not self.applied and not self.scale_skip


@dataclass
class NonFinitePolicy:
    policy: str  # "stop" | "skip"
    max_in_a_row: int
    in_a_row: int = 0
    skipped: int = 0  # non-finite steps skipped in this run
    scale_skips: int = 0  # fp16 loss-scale overflows (normal)
    skipped_steps: list[int] = field(default_factory=list)

    def record(self, step: int, result: StepResult, what: str, next_move: str) -> None:
        """Account for optimizer step ``step`` (1-based); raise RunStopped when the run must end.
        ``next_move`` says where the last good checkpoint is and how to continue from it."""
        if result.scale_skip:
            self.scale_skips += 1
        if not result.nonfinite:
            self.in_a_row = 0
            return
        self.in_a_row += 1
        self.skipped += 1
        self.skipped_steps = (self.skipped_steps + [step])[-100:]
        if self.policy == "skip" and self.in_a_row <= self.max_in_a_row:
            return
        why = (
            "train.on_nonfinite: stop"
            if self.policy == "stop"
            else f"{self.in_a_row} non-finite steps in a row, above train.max_skipped_steps="
            f"{self.max_in_a_row}"
        )
        fix = "set train.on_nonfinite: skip" if self.policy == "stop" else "raise the limit"
        raise RunStopped(
            f"stopped at step {step}: {what}; the update was not applied ({why}). Nothing was "
            f"saved. Lower optim.lr (or {fix}); {next_move}",
            EXIT_NONFINITE,
            "nonfinite",
        )

    def state_dict(self) -> dict:
        return {"in_a_row": self.in_a_row, "skipped": self.skipped, "scale_skips": self.scale_skips}

    def load_state_dict(self, state: dict) -> None:
        self.in_a_row = int(state.get("in_a_row", 0))
        self.skipped = int(state.get("skipped", 0))
        self.scale_skips = int(state.get("scale_skips", 0))

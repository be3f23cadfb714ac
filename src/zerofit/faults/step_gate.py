"""The one agreement per optimizer step: are this step's loss and gradient norm finite on every
rank, and has any rank been asked to stop?

An engine calls the gate between backward and its optimizer update with a small device tensor of
evidence (the loss, and the global gradient norm where the engine has it before the update). The
finiteness test runs on the device; reading its one boolean is the step's only host
synchronisation (none per micro-batch). The boolean and the stop signal then travel in one tiny
CPU all-reduce (gloo), so every rank applies or skips the same update and stops after the same
step.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist

from zerofit.faults.signals import StopSignals


class StepGate:
    def __init__(self, signals: StopSignals, world_size: int) -> None:
        self.signals = signals
        self.world_size = world_size
        self.signum = 0  # agreed: the stop signal any rank received (0: none)
        self.evidence: list[float] = []  # this rank's values, read only when a step is refused

    def __call__(self, evidence: torch.Tensor) -> bool:
        """True when the update may be applied (every rank's evidence is finite)."""
        local_ok = bool(torch.isfinite(evidence).all())
        self.evidence = [] if local_ok else [float(v) for v in evidence.detach().float().cpu()]
        flags = self._agree(int(not local_ok))
        return flags[1] == 0

    def poll(self) -> int:
        """Agree on a stop signal outside a step (before the first one). Returns it (0: none)."""
        return self._agree(0)[0]

    def _agree(self, bad: int) -> list[int]:
        flags = torch.tensor([self.signals.signum, bad], dtype=torch.int64)
        if self.world_size > 1 and dist.is_initialized():
            dist.all_reduce(flags, op=dist.ReduceOp.MAX)  # a CPU tensor: gloo
        out = [int(v) for v in flags]
        self.signum = max(self.signum, out[0])
        return out


def describe(evidence: list[float], names: tuple[str, ...] = ("loss", "gradient norm")) -> str:
    """'the loss is nan, the gradient norm is inf' for the values that are not finite."""
    bad = [f"the {n} is {v}" for n, v in zip(names, evidence, strict=False) if not math.isfinite(v)]
    return ", ".join(bad) or "another rank's loss or gradient norm is not finite"

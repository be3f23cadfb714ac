"""The host's speed at an offloaded optimizer step, measured where it runs (part of `zerofit plan
--host-probe`, `planner.host_probe`).

An offloading run steps its optimizer on the CPU once per step, where nothing hides it, so the
host decides that part of the step (the engines' `offload_seconds`). Each engine says what it
steps (`Engine.host_optimizers_for_probe`): FSDP2's CPU offload torch's fused and foreach AdamW,
timed alone over fp32 parameters; DeepSpeed a ZeRO-3 step with the optimizer offloaded, timed
whole as `engine.step()` runs it (DeepSpeedCPUAdam, the gradients' unscaling and clipping, the
copies between the pinned buffers and the GPU). Each runs over about NUMEL parameters (512 MiB
with gradients and moments: far past any cache, as a rank's partition is) and over GROWTH times
as many, on every core (a run's ranks share them all: `launch.spawn`), in a fake process group
of one rank. The rate is the difference: ADAM_BYTES a parameter (the unit `offload_seconds`
charges, `Hardware.adam_bw`) over the extra seconds the extra parameters took, each time the
median of STEPS steps after one. A step's fixed cost (DeepSpeed's Python around its
sub-groups) does not grow with the parameters: timed whole at one size, the step read as 24.8
GB/s on an H100 machine where a run's step, less the rest of its forecast, streamed about 41
(docs/benchmarks/2026-12-06-host-probe-h100-2.md). The two-size rate read 27.2 GB/s on another
H100 machine, and its held-out ZeRO-3 offload run was forecast +2.7% (same write-up).
"""

from __future__ import annotations

import os
import statistics

import torch

from zerofit.backends import engines
from zerofit.planner.fake_group import fake_group

NUMEL, GROWTH, STEPS = 1 << 25, 3, 5  # 32 Mi parameters, then 96 Mi
ADAM_BYTES = 7 * 4  # a parameter's fp32 bytes an Adam step streams (`offload_seconds`)


def why(e: Exception) -> str:
    """An exception in one line of at most 200 characters."""
    return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:200]


def _seconds(make: object, numel: int, device: torch.device) -> tuple[float, int]:
    """(median seconds of a step, the parameters it stepped) for one host optimizer."""
    step, stepped = make(numel, device)  # type: ignore[operator]
    step()  # the moments are allocated in the first step
    return statistics.median(step() for _ in range(STEPS)), stepped


def _marginal_rate(make: object, numel: int, device: torch.device) -> float:
    """Bytes/s of the parameters GROWTH x `numel` adds over `numel` (see the module docstring)."""
    small, few = _seconds(make, numel, device)
    big, many = _seconds(make, GROWTH * numel, device)
    if big <= small or many <= few:
        raise RuntimeError(
            f"{many} parameters took no longer than {few} ({big:.4f} s, {small:.4f} s)"
        )
    return ADAM_BYTES * (many - few) / (big - small)


def optimizer_rates(
    device: torch.device, numel: int | None = None
) -> tuple[dict[str, float], dict[str, str]]:
    """(host optimizer -> bytes/s, "<host optimizer>'s step" -> why it could not be timed), over
    `numel` parameters and GROWTH times as many (None: NUMEL, read when called)."""
    numel = numel or NUMEL
    rates, failed = {}, {}
    threads = torch.get_num_threads()
    torch.set_num_threads(os.cpu_count() or threads)
    try:
        with fake_group(1):
            for engine in engines().values():
                for key, make in engine.host_optimizers_for_probe().items():
                    try:
                        rates[key] = _marginal_rate(make, numel, device)
                    except Exception as e:  # noqa: BLE001 - an op that cannot build: fitted rate
                        failed[f"{key}'s step"] = why(e)
    finally:
        torch.set_num_threads(threads)
    return rates, failed

"""The host's speed at issuing a GPU's work, measured where it runs (`zerofit plan --host-probe`).

The planner's host term (`zerofit.planner.speed.host_seconds`) charges every kernel launch and
every engine hook call some host time. Both rates belong to the host CPU and the torch build, not
the GPU: on the H100 machine FSDP2's hooks ran at least twice as fast as on the H200 machine the
constants were fitted on (docs/benchmarks/2026-12-06-planner-heldout-h100.md). This probe times
both here, on the first GPU (else on the CPU, where an op's dispatch stands in for its launch):
- **launch**: forward + backward of zerofit's Llama at a size where the GPU's kernels take less
  time than the host takes to issue them (hidden 256, 64 tokens, bf16). One block's host time is
  the time of a 6-block model less a 2-block one, over 4; a launch is that over the kernels a
  block issues (`speed.BLOCK_KERNELS`, counted by benchmarks/block_launches.py). On a GPU the
  same with the blocks compiled as a run compiles them gives a compiled kernel's launch, over
  `speed.BLOCK_FUSED` (Triton's launcher is Python: its cost is not an eager op's).
- **hook**: the same models with the hooks of the engine that `probes_host_hooks` (FSDP2, as a
  bf16 full-shard run shards: every block and the root a unit) over torch's fake process group
  of PROBE_WORLD ranks (its collectives return at once: the hooks' Python and copies are timed,
  not communication). A unit's extra host time, over the hook calls the engine's `host_calls`
  counts a unit as (`Engine.hook_for_probe`), is a hook call.
Each time is the median of REPEATS timings of STEPS steps, after WARMUP steps.
Not probed: compiled launches on a CPU (charged at the eager rate), the other engines' hooks
(charged at the probed engine's rate per call), the CPU optimizer's speed.
"""

from __future__ import annotations

import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist

from zerofit.backends import engines
from zerofit.distributed.parallelize import apply_compile
from zerofit.errors import UserError
from zerofit.models import build_model
from zerofit.planner.speed import BLOCK_FUSED, BLOCK_KERNELS

PROBE_WORLD = 2
LAYERS = (2, 6)
WARMUP, STEPS, REPEATS = 3, 10, 5
SHAPE = {"dim": 256, "n_heads": 4, "n_kv_heads": 2, "ffn_dim": 512, "vocab_size": 512}
TOKENS = 64


@dataclass(frozen=True)
class HostSpeed:
    launch_s: float  # host seconds per kernel launch
    hook_s: float  # host seconds per engine hook call
    block_s: float  # one eager block's forward + backward, host seconds
    compiled_launch_s: float | None  # host seconds per compiled kernel launch (CUDA only)
    unit_s: float  # FSDP2's hooks on one unit a micro-batch, host seconds
    where: str  # "<cpu model>, <device>"


def cpu_name() -> str:
    """The host CPU's model name (/proc/cpuinfo), else the platform's word for it."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _model(layers: int, device: torch.device) -> torch.nn.Module:
    spec = build_model("llama3-1b", overrides={"n_layers": layers, **SHAPE}, loss_chunk=0)
    torch.manual_seed(0)
    return spec.construct().to(device)


def _step_seconds(model: torch.nn.Module, device: torch.device) -> float:
    """Median host seconds of a forward + backward, the GPU never the one waited on."""
    tokens = torch.randint(0, SHAPE["vocab_size"], (1, TOKENS), device=device)

    def steps(n: int) -> None:
        for _ in range(n):
            model(tokens).float().sum().backward()
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    steps(WARMUP)
    times = []
    for _ in range(REPEATS):
        start = time.perf_counter()
        steps(STEPS)
        times.append((time.perf_counter() - start) / STEPS)
    return statistics.median(times)


def _per_block(make: Callable[[int], torch.nn.Module], device: torch.device) -> float:
    few, many = (_step_seconds(make(n), device) for n in LAYERS)
    return max(0.0, (many - few) / (LAYERS[1] - LAYERS[0]))


def _compiled(layers: int, device: torch.device) -> torch.nn.Module:
    """The model in bf16 with its blocks compiled as a run compiles them (`apply_compile`)."""
    model = _model(layers, device).to(torch.bfloat16)
    apply_compile(model.layers)  # type: ignore[arg-type]
    return model


def _hooked(layers: int, device: torch.device) -> tuple[torch.nn.Module, int]:
    """The model with the probed engine's hooks on every block and the root, and the hook calls
    a unit counts as (`Engine.hook_for_probe`)."""
    model = _model(layers, device)
    engine = next(e for e in engines().values() if e.probes_host_hooks)
    return model, engine.hook_for_probe(model, model.layers)


def probe() -> HostSpeed:
    """Times the host here (see the module docstring); UserError inside a distributed job."""
    if dist.is_initialized():
        raise UserError("--host-probe: run it outside a distributed job (a process group is up)")
    # torch's fake process group, registered as the "fake" backend when this module is imported
    from torch.testing._internal.distributed import fake_pg  # noqa: F401  # why: test backend

    device = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    block = _per_block(lambda n: _model(n, device).to(torch.bfloat16), device)
    compiled = None
    if device.type == "cuda":  # Inductor's kernels are Triton's there; on a CPU, C++ loops
        compiled = _per_block(lambda n: _compiled(n, device), device) / BLOCK_FUSED
    calls: list[int] = []

    def hooked(layers: int) -> torch.nn.Module:
        model, per_unit = _hooked(layers, device)
        calls.append(per_unit)
        return model

    dist.init_process_group("fake", store=dist.HashStore(), rank=0, world_size=PROBE_WORLD)
    try:
        unit = max(0.0, _per_block(hooked, device) - block)
    finally:
        dist.destroy_process_group()
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    return HostSpeed(
        launch_s=block / BLOCK_KERNELS,
        hook_s=unit / calls[0],
        block_s=block,
        compiled_launch_s=compiled,
        unit_s=unit,
        where=f"{cpu_name()}, {name}",
    )

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
- **hooks**: the same models under each engine that has Python hooks to time
  (`Engine.hook_for_probe`: FSDP2 as a bf16 full-shard run shards it, every block and the root a
  unit, eager and over compiled blocks; DeepSpeed ZeRO-3 in bf16, and ZeRO-2 for ZeRO-1/2's
  gradient hooks, when DeepSpeed is installed: each engine's `hook_variants`) over torch's fake
  process group (its collectives return at once: the hooks' Python and copies are timed, not
  communication), of each of PROBE_WORLDS ranks: a rank alone runs other paths (DeepSpeed
  gathers nothing, its parameters are views) and cost half as much on this project's CPU
  machine. A unit's extra host time, over the hook calls that engine's `host_calls` counts a
  unit as, is that engine's hook call. DeepSpeed's cost 1.7 times FSDP2's a unit on this
  project's CPU machine, so one rate for both misses one of them.
- **host optimizers** (`planner.optimizer_probe`): each engine's offloaded optimizer step.
- **PCIe** (on a GPU): pinned host memory to the GPU and back, PCIE_BYTES at a time, the slower
  direction: what offloading runs copy over (`Hardware.pcie_bw`; the card's table gives 25 GB/s
  for an H100, where a held-out FSDP2 offload run came out +25.1% on an H100 machine,
  2026-12-07).
Every model of a measurement (the 6-block and 2-block ones, plain and hooked) is timed in turn,
REPEATS times STEPS steps after WARMUP (on a CPU, CPU_REPEATS times CPU_STEPS); the hooks' cost
is each repeat's hooked block less its plain one, and the median over the repeats is taken: a
host that slows down for a while slows all of one repeat alike.
Not probed on a CPU: compiled launches and compiled runs' hooks (charged at the eager rates).
"""

from __future__ import annotations

import statistics
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from zerofit.backends import engines
from zerofit.bench.report import host_cpu
from zerofit.distributed.parallelize import apply_compile
from zerofit.errors import UserError
from zerofit.models import build_model
from zerofit.planner.fake_group import fake_group
from zerofit.planner.optimizer_probe import optimizer_rates, why
from zerofit.planner.speed import BLOCK_FUSED, BLOCK_KERNELS, hook_key

PROBE_WORLDS = (1, 2)  # a rank alone (DeepSpeed then gathers nothing) and ranks that shard
LAYERS = (2, 6)
WARMUP, STEPS, REPEATS = 3, 10, 7
CPU_STEPS, CPU_REPEATS = 3, 5  # on a CPU a step takes ~30x as long: fewer of them
SHAPE = {"dim": 256, "n_heads": 4, "n_kv_heads": 2, "ffn_dim": 512, "vocab_size": 512}
TOKENS = 64
PCIE_BYTES, PCIE_REPEATS = 256 << 20, 5


@dataclass(frozen=True)
class HostSpeed:
    launch_s: float  # host seconds per kernel launch
    compiled_launch_s: float | None  # host seconds per compiled kernel launch (CUDA only)
    hooks: dict[str, float]  # engine name -> host seconds per hook call of that engine
    block_s: float  # one eager block's forward + backward, host seconds
    units: dict[str, float]  # engine name -> its hooks on one unit a micro-batch, host seconds
    adam_bw: dict[str, float]  # host optimizer -> bytes/s (`Hardware.adam_bw`'s keys)
    failed: dict[str, str]  # what could not be timed -> why (its fitted rate kept)
    where: str  # "<cpu model>, <device>"
    pcie_bw: float | None = None  # bytes/s between pinned host memory and the GPU (CUDA only)


Step = Callable[[torch.Tensor], None]


class _NoHooks(Exception):
    """An engine without Python hooks to time (`Engine.hook_for_probe` gave None)."""


def _model(layers: int, device: torch.device) -> torch.nn.Module:
    spec = build_model("llama3-1b", overrides={"n_layers": layers, **SHAPE}, loss_chunk=0)
    torch.manual_seed(0)
    return spec.construct().to(device)


def _plain(model: torch.nn.Module) -> Step:
    return lambda tokens: model(tokens).float().sum().backward()


def _gaps(makes: list[Callable[[int], Step]], device: torch.device) -> list[list[float]]:
    """Per repeat, per maker: one block's host seconds in a forward + backward of its models
    (the model of LAYERS[1] blocks less the one of LAYERS[0], over their difference). Every
    model is timed in turn, REPEATS times STEPS steps after WARMUP (on a CPU CPU_REPEATS times
    CPU_STEPS), so that a host that slows down for a while slows all of one repeat alike."""
    tokens = torch.randint(0, SHAPE["vocab_size"], (1, TOKENS), device=device)
    pairs = [[make(n) for n in LAYERS] for make in makes]

    def seconds(step: Step, n: int) -> float:
        start = time.perf_counter()
        for _ in range(n):
            step(tokens)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return (time.perf_counter() - start) / max(1, n)

    for pair in pairs:
        for step in pair:
            seconds(step, WARMUP)
    blocks = LAYERS[1] - LAYERS[0]
    steps, repeats = (STEPS, REPEATS) if device.type == "cuda" else (CPU_STEPS, CPU_REPEATS)
    return [
        [(seconds(big, steps) - seconds(small, steps)) / blocks for small, big in pairs]
        for _ in range(repeats)
    ]


def _per_block(make: Callable[[int], Step], device: torch.device) -> float:
    """One block's host seconds in a forward + backward: the median over the repeats."""
    return max(0.0, statistics.median(gap for (gap,) in _gaps([make], device)))


def _compiled(layers: int, device: torch.device) -> Step:
    """The model in bf16 with its blocks compiled as a run compiles them (`apply_compile`)."""
    model = _model(layers, device).to(torch.bfloat16)
    apply_compile(model.layers)  # type: ignore[arg-type]
    return _plain(model)


def _hooks_at(engine: Any, world: int, device: torch.device, variant: str) -> tuple[float, int]:
    """(the host seconds `engine`'s hooks add to a unit a micro-batch in a run of `variant`,
    the hook calls a unit counts as) over a fake process group of `world` ranks: each
    repeat's hooked block less its plain one (compiled where the variant compiles), the median
    (_NoHooks where the engine has no Python hooks)."""
    calls: list[int] = []

    def hooked(layers: int) -> Step:
        model = _model(layers, device)
        found = engine.hook_for_probe(model, model.layers, variant)
        if found is None:
            raise _NoHooks
        calls.append(found[1])
        return found[0]

    if engine.hook_variants()[variant]:
        plain = lambda n: _compiled(n, device)  # noqa: E731
    else:
        plain = lambda n: _plain(_model(n, device).to(torch.bfloat16))  # noqa: E731
    with fake_group(world):
        gaps = _gaps([plain, hooked], device)
    return max(0.0, statistics.median(mine - alone for alone, mine in gaps)), calls[0]


def _engine_units(device: torch.device) -> tuple[dict, dict, dict]:
    """(key -> seconds per hook call, key -> seconds its hooks add a unit, what failed -> why)
    for every engine with hooks to time (`Engine.hook_for_probe`), for each of its kinds of run
    (`Engine.hook_variants`; compiled ones on a GPU only) at each of PROBE_WORLDS, under
    `hook_key`'s keys. An engine whose probe fails is left out (its calls keep the fitted
    rate)."""
    hooks, units, failed = {}, {}, {}
    for name, engine in engines().items():
        for variant, compiled in engine.hook_variants().items():
            if compiled and device.type != "cuda":
                continue  # Inductor's CPU code is not the Triton a GPU run launches
            for world in PROBE_WORLDS:
                key = hook_key(name, world, variant)
                try:
                    units[key], calls = _hooks_at(engine, world, device, variant)
                except _NoHooks:
                    break
                except Exception as e:  # noqa: BLE001 - a library's failure under a fake group
                    failed[f"{key}'s hooks"] = why(e)
                    continue
                hooks[key] = units[key] / calls
    return hooks, units, failed


def _pcie(device: torch.device) -> float:
    """Bytes/s of PCIE_BYTES copied between pinned host memory and `device`, each way the median
    of PCIE_REPEATS after one: the slower way."""
    host = torch.empty(PCIE_BYTES, dtype=torch.uint8, pin_memory=True)
    gpu = torch.empty(PCIE_BYTES, dtype=torch.uint8, device=device)
    rates = []
    for dst, src in ((gpu, host), (host, gpu)):
        times = []
        for _ in range(PCIE_REPEATS + 1):
            torch.cuda.synchronize(device)
            start = time.perf_counter()
            dst.copy_(src, non_blocking=True)
            torch.cuda.synchronize(device)
            times.append(time.perf_counter() - start)
        rates.append(PCIE_BYTES / statistics.median(times[1:]))
    return min(rates)


def _pcie_rate(device: torch.device) -> tuple[float | None, dict[str, str]]:
    """(`_pcie`'s bytes/s, else None; what failed -> why): on a CPU nothing to time; a copy that
    fails keeps the card table's rate."""
    if device.type != "cuda":
        return None, {}
    try:
        return _pcie(device), {}
    except Exception as e:  # noqa: BLE001 - pinned memory refused, a copy failed: table rate
        return None, {"PCIe copies": why(e)}


def probe() -> HostSpeed:
    """Times the host here (see the module docstring); UserError inside a distributed job."""
    if dist.is_initialized():
        raise UserError("--host-probe: run it outside a distributed job (a process group is up)")
    device = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    block = _per_block(lambda n: _plain(_model(n, device).to(torch.bfloat16)), device)
    compiled = None
    if device.type == "cuda":  # Inductor's kernels are Triton's there; on a CPU, C++ loops
        compiled = _per_block(lambda n: _compiled(n, device), device) / BLOCK_FUSED
    with warnings.catch_warnings():  # the engines' own, about collectives that do nothing here
        warnings.simplefilter("ignore")
        hooks, units, failed = _engine_units(device)
        adam, adam_failed = optimizer_rates(device)
    pcie, pcie_failed = _pcie_rate(device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    return HostSpeed(
        launch_s=block / BLOCK_KERNELS,
        compiled_launch_s=compiled,
        hooks=hooks,
        block_s=block,
        units=units,
        adam_bw=adam,
        failed={**failed, **adam_failed, **pcie_failed},
        where=f"{host_cpu()}, {name}",
        pcie_bw=pcie,
    )

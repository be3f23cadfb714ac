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
  unit; DeepSpeed ZeRO-3 in bf16, when DeepSpeed is installed) over torch's fake process group of
  PROBE_WORLD ranks (its collectives return at once: the hooks' Python and copies are timed, not
  communication). A unit's extra host time, over the hook calls that engine's `host_calls` counts
  a unit as, is that engine's hook call. DeepSpeed's cost 1.7 times FSDP2's a unit on this
  project's CPU machine, so one rate for both misses one of them.
Each pair of models (6 blocks and 2) is timed in turn, REPEATS times STEPS steps after WARMUP,
and the median of the paired differences taken: a host that slows down for a while slows both.
Not probed: compiled launches on a CPU (charged at the eager rate), ZeRO-1/2's hooks (charged at
ZeRO-3's rate per call), the CPU optimizer's speed.
"""

from __future__ import annotations

import statistics
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist

from zerofit.backends import engines
from zerofit.bench.report import host_cpu
from zerofit.distributed.parallelize import apply_compile
from zerofit.errors import UserError
from zerofit.models import build_model
from zerofit.planner.speed import BLOCK_FUSED, BLOCK_KERNELS

PROBE_WORLD = 2
LAYERS = (2, 6)
WARMUP, STEPS, REPEATS = 3, 10, 7
SHAPE = {"dim": 256, "n_heads": 4, "n_kv_heads": 2, "ffn_dim": 512, "vocab_size": 512}
TOKENS = 64


@dataclass(frozen=True)
class HostSpeed:
    launch_s: float  # host seconds per kernel launch
    compiled_launch_s: float | None  # host seconds per compiled kernel launch (CUDA only)
    hooks: dict[str, float]  # engine name -> host seconds per hook call of that engine
    block_s: float  # one eager block's forward + backward, host seconds
    units: dict[str, float]  # engine name -> its hooks on one unit a micro-batch, host seconds
    failed: dict[str, str]  # engine name -> why its hooks could not be timed (fitted rate kept)
    where: str  # "<cpu model>, <device>"


Step = Callable[[torch.Tensor], None]


class _NoHooks(Exception):
    """An engine without Python hooks to time (`Engine.hook_for_probe` gave None)."""


def _model(layers: int, device: torch.device) -> torch.nn.Module:
    spec = build_model("llama3-1b", overrides={"n_layers": layers, **SHAPE}, loss_chunk=0)
    torch.manual_seed(0)
    return spec.construct().to(device)


def _plain(model: torch.nn.Module) -> Step:
    return lambda tokens: model(tokens).float().sum().backward()


def _per_block(make: Callable[[int], Step], device: torch.device) -> float:
    """One block's host seconds in a forward + backward: the two models of LAYERS timed in
    turn, REPEATS times STEPS steps after WARMUP, the median of the paired differences (a host
    that slows down for a while slows both of a pair)."""
    tokens = torch.randint(0, SHAPE["vocab_size"], (1, TOKENS), device=device)
    steps = [make(n) for n in LAYERS]

    def seconds(step: Step, n: int) -> float:
        start = time.perf_counter()
        for _ in range(n):
            step(tokens)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return (time.perf_counter() - start) / max(1, n)

    for step in steps:
        seconds(step, WARMUP)
    gaps = [seconds(steps[1], STEPS) - seconds(steps[0], STEPS) for _ in range(REPEATS)]
    return max(0.0, statistics.median(gaps) / (LAYERS[1] - LAYERS[0]))


def _compiled(layers: int, device: torch.device) -> Step:
    """The model in bf16 with its blocks compiled as a run compiles them (`apply_compile`)."""
    model = _model(layers, device).to(torch.bfloat16)
    apply_compile(model.layers)  # type: ignore[arg-type]
    return _plain(model)


def _engine_units(device: torch.device, block: float) -> tuple[dict, dict, dict]:
    """(engine -> seconds per hook call, engine -> seconds its hooks add a unit, engine -> why
    its probe failed), for every engine with hooks to time (`Engine.hook_for_probe`), over a
    fake process group. An engine whose probe fails is left out (its calls keep the fitted
    rate)."""
    hooks, units, failed = {}, {}, {}
    for name, engine in engines().items():
        calls: list[int] = []

        def hooked(layers: int, engine=engine, calls=calls) -> Step:  # noqa: ANN001
            model = _model(layers, device)
            found = engine.hook_for_probe(model, model.layers)
            if found is None:
                raise _NoHooks
            calls.append(found[1])
            return found[0]

        dist.init_process_group("fake", store=dist.HashStore(), rank=0, world_size=PROBE_WORLD)
        try:
            units[name] = max(0.0, _per_block(hooked, device) - block)
        except _NoHooks:
            continue
        except Exception as e:  # noqa: BLE001 - a library's failure under a fake group: skip it
            failed[name] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:200]
            continue
        finally:
            dist.destroy_process_group()
        hooks[name] = units[name] / calls[0]
    return hooks, units, failed


def probe() -> HostSpeed:
    """Times the host here (see the module docstring); UserError inside a distributed job."""
    if dist.is_initialized():
        raise UserError("--host-probe: run it outside a distributed job (a process group is up)")
    # torch's fake process group, registered as the "fake" backend when this module is imported
    from torch.testing._internal.distributed import fake_pg  # noqa: F401  # why: test backend

    device = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    block = _per_block(lambda n: _plain(_model(n, device).to(torch.bfloat16)), device)
    compiled = None
    if device.type == "cuda":  # Inductor's kernels are Triton's there; on a CPU, C++ loops
        compiled = _per_block(lambda n: _compiled(n, device), device) / BLOCK_FUSED
    with warnings.catch_warnings():  # the engines' own, about collectives that do nothing here
        warnings.simplefilter("ignore")
        hooks, units, failed = _engine_units(device, block)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    return HostSpeed(
        launch_s=block / BLOCK_KERNELS,
        compiled_launch_s=compiled,
        hooks=hooks,
        block_s=block,
        units=units,
        failed=failed,
        where=f"{host_cpu()}, {name}",
    )

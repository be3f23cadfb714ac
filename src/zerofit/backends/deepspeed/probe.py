"""DeepSpeed for the host probe (`zerofit.planner.host_probe`): ZeRO's hooks (a model handed to
`deepspeed.initialize` over the process group in use, the probe's fake one, so that a forward +
backward runs ZeRO-3's Python fetch, release and gradient hooks, or ZeRO-2's gradient hooks, as
a bf16 run does), and the CPU Adam that optimizer offload steps."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator
from typing import Any

import deepspeed
import torch
from torch import nn

from zerofit.backends.deepspeed.lazy_muon import import_muon_lazily
from zerofit.backends.terms import BLOCK_LAYERS
from zerofit.models import build_model
from zerofit.models.shape import shape_from_preset
from zerofit.report import quiet


@contextlib.contextmanager
def _as_rank_zero() -> Iterator[None]:
    """The environment a launcher gives rank 0 of the process group in use, restored after."""
    world = str(torch.distributed.get_world_size())
    given = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": world, "LOCAL_WORLD_SIZE": world}
    saved = {k: os.environ.get(k) for k in given}
    os.environ.update(given)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


# ZeRO-3 keeps tensors below `stage3_param_persistence_threshold` elements (1e5 by default, which
# zerofit keeps) gathered for good: in a real model's block only the norms. The probe's blocks
# are small (hidden 256: its attention matrices have 32-65 Ki elements), so at the default its
# attention would persist and skip the fetch and release paths that a run's take. Below its
# smallest matrix and above its norms, the probe's block partitions what a real one does. On an
# H100 the probe read ZeRO-3's hook calls at 1.5-2x what runs showed before this, and still at
# ~1.3x after it (238 us against ~185: docs/benchmarks/2026-12-06-host-probe-h100-2.md).
PERSIST = 1000
ACCUMULATING = 1 << 20  # accumulation steps of a probe that stays off the boundary


def _initialize(model: nn.Module, config: dict) -> Any:
    """`deepspeed.initialize` as rank zero of the process group in use. The probe makes one
    fake group per measurement: the groups DeepSpeed cached from an earlier one are dropped
    first (its own teardown, `deepspeed.comm.destroy_process_group`, does the same)."""
    import_muon_lazily()  # every ZeRO optimizer imports it: no compile at import
    release = getattr(deepspeed.utils.groups, "_release_process_group_references", None)
    if release is not None:
        release(None)
    with _as_rank_zero(), quiet.deepspeed_setup():
        return deepspeed.initialize(model=model, config=config)[0]


def zero_for_probe(
    model: nn.Module, stage: int, boundary: bool = True
) -> tuple[Callable[[torch.Tensor], None], int]:
    """`model` under ZeRO `stage` (3, 2 for ZeRO-1/2's gradient hooks, or 1) in bf16 (torch's
    AdamW: no op to build) as zerofit's runs configure it, but for ZeRO-3's persistence
    threshold (PERSIST: see there): a forward + backward, and the hook calls of a block as
    `costs.host_calls` counts them (ZeRO-3: 4 per module holding parameters and a gradient
    hook per trained tensor; ZeRO-1/2: the gradient hooks). Each backward is the accumulation
    boundary, or with `boundary` False none is: DeepSpeed's boundary is micro-step + 1 a
    multiple of its accumulation steps, and the probe never steps, so ACCUMULATING steps keep
    it off."""
    zero = {"stage": stage, "overlap_comm": True, "contiguous_gradients": True}
    if stage == 3:
        zero["stage3_param_persistence_threshold"] = PERSIST
    config = {
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 1 if boundary else ACCUMULATING,
        "zero_optimization": zero,
        "communication_data_type": "fp32",
        "bf16": {"enabled": True},
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "torch_adam": True}},
    }
    engine = _initialize(model, config)

    if engine.is_gradient_accumulation_boundary() != boundary:
        raise RuntimeError(f"DeepSpeed's accumulation boundary is not {boundary} here")

    def step(tokens: torch.Tensor) -> None:
        with _as_rank_zero():  # ZeRO-3 reads LOCAL_RANK in its hooks (the same in every step)
            engine.backward(engine(tokens).float().sum())

    return step, (5 if stage == 3 else 1) * BLOCK_LAYERS


OFFLOAD_SHAPE = {"dim": 1024, "n_heads": 8, "n_kv_heads": 4, "ffn_dim": 2816, "vocab_size": 512}


def offload_step_for_probe(numel: int, device: torch.device) -> tuple[Callable[[], float], int]:
    """ZeRO-3 with its optimizer offloaded to pinned host memory (DeepSpeedCPUAdam, fp32 master,
    bf16, clipping at 1.0, as zerofit's offload runs are) over a Llama of about `numel`
    parameters, in the process group in use (the probe's fake one of one rank): (a step that
    runs a forward + backward, then times `engine.step()` alone and returns its seconds, the
    parameters it steps). Its C++ op builds here if it is not built."""
    shape = OFFLOAD_SHAPE
    layers = max(1, round(numel / shape_from_preset("llama3-1b", shape).block_params))
    spec = build_model("llama3-1b", overrides={"n_layers": layers, **shape}, loss_chunk=0)
    model = spec.construct()
    config = {
        "train_micro_batch_size_per_gpu": 1,
        "gradient_clipping": 1.0,
        "zero_optimization": {
            "stage": 3,
            "offload_optimizer": {"device": "cpu", "pin_memory": True},
        },
        "bf16": {"enabled": True},
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "torch_adam": False}},
    }
    engine = _initialize(model, config)
    tokens = torch.randint(0, shape["vocab_size"], (1, 16), device=engine.device)

    def step() -> float:
        with _as_rank_zero():
            engine.backward(engine(tokens).float().sum())
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            start = time.perf_counter()
            engine.step()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            return time.perf_counter() - start

    return step, sum(p.ds_numel for p in engine.module.parameters())

"""zerofit config <-> DeepSpeed JSON: one explicit table, and the JSON a run is initialised with.

`TABLE` is the only place that knows which zerofit field is which DeepSpeed JSON path. From it:
- `own_json(cfg, world_size)` writes zerofit's own JSON for a (resolved) config;
- `resolve_ds_json(cfg, world_size)` completes a user's file (`parallel.deepspeed.config`) from it
  (`fill.fill_json`: "auto" replaced, left-out keys added, each change recorded) and
  `to_ds_json` is its JSON, what DeepSpeed is initialised with;
- `merge.merge_user_json` adopts the file's values into the zerofit config beforehand, so the
  two agree (a value both set differently is refused, naming both).
JSON keys the table does not own (round_robin_gradients, ...) pass through unchanged.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from zerofit.backends.deepspeed.costs import param_swap_buffers
from zerofit.backends.deepspeed.fill import Resolved, fill_json
from zerofit.backends.deepspeed.json_paths import put
from zerofit.backends.deepspeed.nvme import uncompiled_on_disk
from zerofit.backends.engine import compiles_unless
from zerofit.config import Config, get_field
from zerofit.config.limits import shown
from zerofit.errors import UserError
from zerofit.models.shape import shape_from_config

SKIP = object()  # from_ds result: this JSON value says nothing about the zerofit field


def _same(x: Any) -> Any:
    return x


def _device(device: Any) -> Any:
    return "none" if device in (None, "none") else device


@dataclass(frozen=True)
class Row:
    field: str  # dotted zerofit path
    path: str  # dotted DeepSpeed JSON path
    to_ds: Callable[[Any], Any] = _same
    from_ds: Callable[[Any], Any] = _same  # may return SKIP
    when: Callable[[Config], bool] = lambda cfg: True  # write this path only if true


def _stage3(cfg: Config) -> bool:
    return cfg.parallel.deepspeed.stage == 3


def _offload_opt(cfg: Config) -> bool:
    return cfg.parallel.deepspeed.offload_optimizer != "none"


def _offload_param(cfg: Config) -> bool:
    return _stage3(cfg) and cfg.parallel.deepspeed.offload_param != "none"


def _fp16(cfg: Config) -> bool:
    return cfg.precision.param_dtype == "fp16"


def _dtype_flag(name: str) -> tuple[Callable[[Any], Any], Callable[[Any], Any]]:
    return (lambda d: d == name), (lambda enabled: name if enabled else SKIP)


_fp16_to, _fp16_from = _dtype_flag("fp16")
_bf16_to, _bf16_from = _dtype_flag("bf16")
_DS = "parallel.deepspeed."

TABLE: tuple[Row, ...] = (
    Row("train.micro_batch_size", "train_micro_batch_size_per_gpu"),
    Row("train.grad_accum_steps", "gradient_accumulation_steps"),
    Row("optim.grad_clip", "gradient_clipping", lambda c: c or 0.0, lambda c: c or None),
    Row("optim.lr", "optimizer.params.lr", from_ds=float),
    Row("optim.betas", "optimizer.params.betas", list, lambda b: tuple(float(x) for x in b)),
    Row("optim.eps", "optimizer.params.eps", from_ds=float),
    Row("optim.weight_decay", "optimizer.params.weight_decay", from_ds=float),
    Row("precision.param_dtype", "fp16.enabled", _fp16_to, _fp16_from),
    Row("precision.param_dtype", "bf16.enabled", _bf16_to, _bf16_from),
    Row("precision.reduce_dtype", "communication_data_type"),
    # bf16 master weights, gradients and AdamW states (DeepSpeed >= 0.18); fp32 is the default.
    Row("precision.master_dtype", "bf16.bf16_master_weights_and_grads", _bf16_to, _bf16_from),
    Row("precision.master_dtype", "bf16.bf16_optimizer_states", _bf16_to, _bf16_from),
    Row(_DS + "loss_scale_window", "fp16.loss_scale_window", when=_fp16),
    Row(_DS + "initial_scale_power", "fp16.initial_scale_power", when=_fp16),
    Row(_DS + "hysteresis", "fp16.hysteresis", when=_fp16),
    Row(_DS + "min_loss_scale", "fp16.min_loss_scale", when=_fp16),
    Row(_DS + "stage", "zero_optimization.stage", from_ds=int),
    Row(
        _DS + "offload_optimizer",
        "zero_optimization.offload_optimizer.device",
        from_ds=_device,
        when=_offload_opt,
    ),
    Row(_DS + "nvme_path", "zero_optimization.offload_optimizer.nvme_path", when=_offload_opt),
    Row(
        _DS + "offload_ratio",
        "zero_optimization.offload_optimizer.ratio",
        from_ds=float,
        when=_offload_opt,
    ),
    Row(_DS + "pin_memory", "zero_optimization.offload_optimizer.pin_memory", when=_offload_opt),
    Row(_DS + "sub_group_size", "zero_optimization.sub_group_size", from_ds=int, when=_stage3),
    Row(
        _DS + "offload_param",
        "zero_optimization.offload_param.device",
        from_ds=_device,
        when=_offload_param,
    ),
    Row(_DS + "nvme_path", "zero_optimization.offload_param.nvme_path", when=_offload_param),
    Row(_DS + "pin_memory", "zero_optimization.offload_param.pin_memory", when=_offload_param),
    Row(_DS + "overlap_comm", "zero_optimization.overlap_comm"),
    Row(_DS + "contiguous_gradients", "zero_optimization.contiguous_gradients"),
    Row(_DS + "reduce_scatter", "zero_optimization.reduce_scatter"),
    Row(_DS + "allgather_bucket_size", "zero_optimization.allgather_bucket_size", from_ds=int),
    Row(_DS + "reduce_bucket_size", "zero_optimization.reduce_bucket_size", from_ds=int),
    Row(
        _DS + "prefetch_bucket_size",
        "zero_optimization.stage3_prefetch_bucket_size",
        from_ds=int,
        when=_stage3,
    ),
    Row(
        _DS + "param_persistence_threshold",
        "zero_optimization.stage3_param_persistence_threshold",
        from_ds=int,
        when=_stage3,
    ),
    Row(
        _DS + "max_live_parameters",
        "zero_optimization.stage3_max_live_parameters",
        from_ds=int,
        when=_stage3,
    ),
)


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    keys = [k for k, _ in pairs]
    twice = next((k for k in keys if keys.count(k) > 1), None)
    if twice is not None:  # json.loads would keep the last silently; DeepSpeed refuses it
        raise ValueError(f"key {twice!r} appears twice in one object")
    return dict(pairs)


def read_user_json(path: str) -> dict[str, Any]:
    p = Path(path)
    if not p.is_file():
        raise UserError(f"parallel.deepspeed.config: file not found: {shown(p, quote=False)}")
    try:
        data = json.loads(p.read_bytes(), object_pairs_hook=_no_duplicates)
    except json.JSONDecodeError as e:
        raise UserError(
            f"bad JSON in {shown(p, quote=False)} at line {e.lineno}, column {e.colno}: {e.msg}"
        ) from None
    except (OSError, ValueError) as e:  # unreadable, not UTF-8, or a key given twice
        raise UserError(f"bad JSON in {shown(p, quote=False)}: {e}") from None
    if not isinstance(data, dict):
        raise UserError(f"{shown(p, quote=False)}: the top level must be a JSON object")
    return data


def own_json(cfg: Config, world_size: int) -> dict[str, Any]:
    """The DeepSpeed config zerofit writes for a (precision-resolved) zerofit config."""
    t, ds = cfg.train, cfg.parallel.deepspeed
    params: dict[str, Any] = {} if ds.torch_adam is None else {"torch_adam": ds.torch_adam}
    ours: dict[str, Any] = {
        "train_batch_size": t.micro_batch_size * t.grad_accum_steps * world_size,
        "optimizer": {"type": "AdamW", "params": params},  # torch_adam: in zerofit's block only
        "steps_per_print": 2**31 - 1,  # zerofit logs; keep DeepSpeed's own step log quiet
        "wall_clock_breakdown": False,
        # DeepSpeed's throughput timer (on by default) synchronises the device when each
        # micro-batch's forward starts and again in each `step()`, which zerofit calls every
        # micro-batch: the host then waits out the GPU's queue twice a micro-batch. zerofit
        # times its own steps, and steps_per_print above silences the timer's only output.
        "timers": {"throughput": {"enabled": False}},
    }
    for row in TABLE:
        value = row.to_ds(get_field(cfg, row.field)) if row.when(cfg) else None
        if value is not None:  # None: DeepSpeed's default (nvme_path without NVMe)
            put(ours, row.path, value)
    if _fp16(cfg):
        put(ours, "fp16.loss_scale", 0)  # 0 = dynamic
    if needs_plain_linear(cfg):
        # ZeRO-3's memory-efficient linear fails inside activation-checkpoint recomputation
        # (SystemError from LinearFunctionForZeroStage3.apply, seen on an H200 with DeepSpeed 0.19.8),
        # and under torch.compile Dynamo would trace its ZeRO parameter checks into every block.
        put(ours, "zero_optimization.memory_efficient_linear", False)
    if torch_adam_offloaded(cfg):
        ours["zero_force_ds_cpu_optimizer"] = False  # allow torch AdamW on offloaded states
    if _stage3(cfg) and ds.offload_param == "nvme":  # DeepSpeed's 5 x 1e8 hold no large partition
        shape = shape_from_config(cfg)
        count, size = param_swap_buffers(shape, world_size, ds.sub_group_size)
        put(ours, "zero_optimization.offload_param.buffer_count", count)
        put(ours, "zero_optimization.offload_param.buffer_size", size)
        # a gathered parameter holds its swap buffer until released, and DeepSpeed keeps every
        # parameter used again within max_reuse_distance elements gathered (1e9 by default: ten
        # 3B blocks, whose buffers the 2 x BLOCK_TENSORS + 3 above cannot hold: "Not enough
        # buffers 0 for swapping 7", an H100); one block keeps a recomputed block for its backward
        put(ours, "zero_optimization.stage3_max_reuse_distance", shape.block_params)
    return ours


def needs_plain_linear(cfg: Config) -> bool:
    """ZeRO-3 under activation checkpointing or compile: memory_efficient_linear must be off."""
    return _stage3(cfg) and (cfg.parallel.activation_checkpointing != "none" or _compiled(cfg))


def _compiled(cfg: Config) -> bool:
    """Whether the run compiles, `auto` as it resolves on a GPU (the engine's `compiles`)."""
    why_not = uncompiled_on_disk(cfg.parallel.deepspeed)
    return compiles_unless(cfg.parallel.compile, "cuda", why_not)


def torch_adam_offloaded(cfg: Config) -> bool:
    """torch's AdamW on offloaded states: DeepSpeed must not insist on its CPU Adam."""
    return bool(cfg.parallel.deepspeed.torch_adam) and (_offload_opt(cfg) or _offload_param(cfg))


def resolve_ds_json(cfg: Config, world_size: int) -> Resolved:
    """The user's JSON (if any) completed from zerofit's, with what was filled in."""
    path = cfg.parallel.deepspeed.config
    return fill_json(read_user_json(path) if path else {}, own_json(cfg, world_size))


def to_ds_json(cfg: Config, world_size: int) -> dict[str, Any]:
    """The JSON DeepSpeed is initialised with (the config already merged with the user's file,
    `merge.merge_user_json`, so every value zerofit fills agrees with the file)."""
    return resolve_ds_json(cfg, world_size).json

"""zerofit config <-> DeepSpeed JSON: one explicit table, the merge with a user's ds_config.json.

`TABLE` is the only place that knows which zerofit field is which DeepSpeed JSON path. From it:
- `to_ds_json(cfg, world_size)` writes the JSON DeepSpeed is initialised with;
- `merge_user_json(cfg, world_size)` adopts the values of a user's JSON into the zerofit config, and
  rejects a value the two disagree on, naming both.
JSON keys the table does not own (round_robin_gradients, ...) pass through unchanged.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from zerofit.config import Config, compiles, deep_merge, explicit_keys, get_field, with_fields
from zerofit.config.limits import shown
from zerofit.errors import UserError

_MISSING = object()
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
    Row(_DS + "torch_adam", "optimizer.params.torch_adam"),
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


def _get(tree: dict[str, Any], dotted: str) -> Any:
    node: Any = tree
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return _MISSING
        node = node[part]
    return node


def _set(tree: dict[str, Any], dotted: str, value: Any) -> None:
    *parents, leaf = dotted.split(".")
    for part in parents:
        tree = tree.setdefault(part, {})
    tree[leaf] = value


def read_user_json(path: str) -> dict[str, Any]:
    p = Path(path)
    if not p.is_file():
        raise UserError(f"parallel.deepspeed.config: file not found: {shown(p, quote=False)}")
    try:
        data = json.loads(p.read_text())
    except json.JSONDecodeError as e:
        raise UserError(
            f"bad JSON in {shown(p, quote=False)} at line {e.lineno}, column {e.colno}: {e.msg}"
        ) from None
    if not isinstance(data, dict):
        raise UserError(f"{p}: the top level must be a JSON object")
    return data


def to_ds_json(cfg: Config, world_size: int) -> dict[str, Any]:
    """The DeepSpeed config a (precision-resolved) zerofit config turns into."""
    user = read_user_json(cfg.parallel.deepspeed.config) if cfg.parallel.deepspeed.config else {}
    t = cfg.train
    ours: dict[str, Any] = {
        "train_batch_size": t.micro_batch_size * t.grad_accum_steps * world_size,
        "optimizer": {"type": "AdamW", "params": {}},
        "steps_per_print": 2**31 - 1,  # zerofit logs; keep DeepSpeed's own step log quiet
        "wall_clock_breakdown": False,
    }
    for row in TABLE:
        if row.when(cfg):
            _set(ours, row.path, row.to_ds(get_field(cfg, row.field)))
    if _fp16(cfg):
        _set(ours, "fp16.loss_scale", 0)  # 0 = dynamic
    if _stage3(cfg) and (cfg.parallel.activation_checkpointing != "none" or compiles(cfg.parallel)):
        # ZeRO-3's memory-efficient linear fails inside activation-checkpoint recomputation
        # (SystemError from LinearFunctionForZeroStage3.apply, seen on an H200 with DeepSpeed 0.19.8),
        # and under torch.compile Dynamo would trace its ZeRO parameter checks into every block.
        _set(ours, "zero_optimization.memory_efficient_linear", False)
    if cfg.parallel.deepspeed.torch_adam and (_offload_opt(cfg) or _offload_param(cfg)):
        ours["zero_force_ds_cpu_optimizer"] = False  # allow torch AdamW on offloaded states
    return deep_merge(user, ours)


def merge_user_json(cfg: Config, world_size: int) -> Config:
    """Adopt a user's ds_config.json into `cfg`; a value both set differently is an error."""
    path = cfg.parallel.deepspeed.config
    if not path:
        return cfg
    user = read_user_json(path)
    explicit = explicit_keys(cfg)
    updates: dict[str, Any] = {}
    for row in TABLE:
        raw = _get(user, row.path)
        if raw is _MISSING:
            continue
        try:
            value = row.from_ds(raw)
        except (TypeError, ValueError):
            raise UserError(f"{path}: {row.path}={raw!r} is not valid") from None
        if value is SKIP:
            continue
        current = updates.get(row.field, get_field(cfg, row.field))
        if value != current and (row.field in explicit or row.field in updates):
            raise UserError(
                f"{row.field}={current!r} in the config but {row.path}={raw!r} in {path}"
            )
        updates[row.field] = value
    if "precision.param_dtype" in updates and "precision.mode" not in explicit:
        updates["precision.mode"] = updates["precision.param_dtype"]
    opt_type = _get(user, "optimizer.type")
    if opt_type is not _MISSING and str(opt_type).lower() not in ("adam", "adamw"):
        raise UserError(
            f"{path}: optimizer.type={opt_type!r}; zerofit's optim section is AdamW (use Adam or AdamW)"
        )
    if "scheduler" in user:
        raise UserError(
            f"{path}: has a scheduler; zerofit's schedule comes from optim.warmup_steps and optim.min_lr_ratio, remove it"
        )
    cfg = with_fields(cfg, updates) if updates else cfg
    return _check_batch(cfg, user, path, world_size, explicit | set(updates))


def _check_batch(
    cfg: Config, user: dict[str, Any], path: str, world: int, known: set[str]
) -> Config:
    """train_batch_size must equal micro x accum x world; derive the micro-batch when only it is given."""
    total = _get(user, "train_batch_size")
    if total is _MISSING:
        return cfg
    t = cfg.train
    if "train.micro_batch_size" not in known:
        micro, rem = divmod(int(total), t.grad_accum_steps * world)
        if rem or micro < 1:
            raise UserError(
                f"{path}: train_batch_size={total} is not divisible by grad_accum_steps={t.grad_accum_steps} x world size={world}"
            )
        cfg = with_fields(cfg, {"train.micro_batch_size": micro})
        t = cfg.train
    expected = t.micro_batch_size * t.grad_accum_steps * world
    if int(total) != expected:
        raise UserError(
            f"train_batch_size={total} in {path} but micro_batch_size={t.micro_batch_size} x "
            f"grad_accum_steps={t.grad_accum_steps} x world size={world} = {expected}"
        )
    return cfg

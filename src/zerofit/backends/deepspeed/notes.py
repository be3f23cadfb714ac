"""What the launcher says about a user's DeepSpeed JSON: nothing it changed goes unsaid.

One line each, printed once a run has passed every check (`zerofit.launch.prepare`), and by
`zerofit ds-config` on stderr:
- what every "auto" became (and where it stays "auto": DeepSpeed's default);
- the keys the file leaves out that zerofit fills from its config;
- the optimizer params the file leaves out, and what sets them instead;
- the scheduler zerofit's own schedule stands in for;
- the file's activation_checkpointing block against `parallel.activation_checkpointing`.
"""

from __future__ import annotations

from typing import Any

from zerofit.backends.deepspeed.fill import Resolved
from zerofit.backends.deepspeed.json_paths import AUTO, shown
from zerofit.backends.deepspeed.user_blocks import DS_ADAM_DEFAULTS, SCHEDULES
from zerofit.backends.deepspeed.user_json import HIDDEN_AUTO
from zerofit.config import Config

HIDDEN_RULE = {  # how HF's rule reads, by path (user_json.HIDDEN_AUTO)
    "zero_optimization.reduce_bucket_size": "hidden²",
    "zero_optimization.stage3_prefetch_bucket_size": "0.9 x hidden²",
    "zero_optimization.stage3_param_persistence_threshold": "10 x hidden",
}
CANONICAL = {  # a ZeRO-3 key as the file may spell it -> as HIDDEN_AUTO does
    "zero_optimization.prefetch_bucket_size": "zero_optimization.stage3_prefetch_bucket_size",
    "zero_optimization.param_persistence_threshold": (
        "zero_optimization.stage3_param_persistence_threshold"
    ),
}
# deepspeed.checkpointing's options: any of them on asks for something of the model's own code
CHECKPOINTING = (
    "partition_activations",
    "contiguous_memory_optimization",
    "cpu_checkpointing",
    "number_checkpoints",
    "synchronize_checkpoint_boundary",
    "profile",
)


def launch_notes(cfg: Config, user: dict[str, Any], resolved: Resolved, file: str) -> list[str]:
    lines = (
        _auto_line(cfg, user, resolved, file),
        _filled_line(resolved, file),
        _optimizer_line(cfg, user, file),
        _scheduler_line(cfg, user, file),
        _checkpointing_line(cfg, user, file),
    )
    return [line for line in lines if line]


def _auto_line(cfg: Config, user: dict[str, Any], resolved: Resolved, file: str) -> str | None:
    hidden: list[int] = []
    items = [
        f"{path}={shown(value)}{_why(cfg, path, value, hidden)}" for path, value in resolved.autos
    ]
    block = user.get("scheduler")
    params = (block.get("params") or {}) if isinstance(block, dict) else {}
    schedule = {
        "warmup_min_lr": 0,
        "warmup_max_lr": cfg.optim.lr,
        "warmup_num_steps": cfg.optim.warmup_steps,
        "total_num_steps": cfg.train.steps,
    }
    items += [
        f"scheduler.params.{key}={shown(schedule[key])} (zerofit's schedule)"
        for key, value in params.items()
        if value == AUTO and key in schedule
    ]
    items += [f'{path} stays "auto" (DeepSpeed\'s default)' for path in resolved.left_auto]
    return f'{file}: "auto" became ' + ", ".join(items) if items else None


def _why(cfg: Config, path: str, value: Any, hidden: list[int]) -> str:
    """' (hidden², hidden 64)' where HF's hidden-size rule gave the value."""
    rule = CANONICAL.get(path, path)
    if rule not in HIDDEN_AUTO:
        return ""
    if not hidden:
        from zerofit.models.shape import shape_from_config  # a model-folder read: only if needed

        hidden.append(shape_from_config(cfg).dim)
    if HIDDEN_AUTO[rule](hidden[0]) != value:
        return " (the config's parallel.deepspeed setting)"
    return f" ({HIDDEN_RULE[rule]}, hidden {hidden[0]})"


def _filled_line(resolved: Resolved, file: str) -> str | None:
    if not resolved.filled:
        return None
    items = ", ".join(f"{path}={shown(value)}" for path, value in resolved.filled)
    n = len(resolved.filled)
    return f"{file} leaves out {n} key{'s' if n > 1 else ''} zerofit sets; filled from the config: {items}"


def _optimizer_line(cfg: Config, user: dict[str, Any], file: str) -> str | None:
    block = user.get("optimizer")
    if not isinstance(block, dict):
        return None
    params, o = block.get("params") or {}, cfg.optim
    said = []
    if "lr" not in params:
        said.append(f"lr follows zerofit's schedule (optim.lr={o.lr})")
    if "weight_decay" not in params:
        said.append(
            f"weight_decay zerofit's parameter groups (optim.weight_decay={o.weight_decay} on "
            "matrices, 0 on norms and biases)"
        )
    said += [
        f"{key} DeepSpeed's default ({shown(value)})"
        for key, _, value in DS_ADAM_DEFAULTS
        if key not in params
    ]
    if not said:
        return None
    missing = [
        k for k in ("lr", "weight_decay", *(k for k, _, _ in DS_ADAM_DEFAULTS)) if k not in params
    ]
    return (
        f"{file}: optimizer {block.get('type')} is built by DeepSpeed as written; its params leave "
        f"out {', '.join(missing)}: " + "; ".join(said)
    )


def _scheduler_line(cfg: Config, user: dict[str, Any], file: str) -> str | None:
    block = user.get("scheduler")
    if not isinstance(block, dict) or block.get("type") not in SCHEDULES:
        return None
    o, steps = cfg.optim, cfg.train.steps
    then = (
        "then constant"
        if o.min_lr_ratio == 1
        else f"then cosine decay to {o.min_lr_ratio:g} x lr at step {steps}"
    )
    line = (
        f"{file}: scheduler {block['type']} is left out of the JSON DeepSpeed gets; zerofit's "
        f"schedule stands in: linear warmup over {o.warmup_steps} steps to lr {o.lr:g}, {then}"
    )
    warmup_type = (block.get("params") or {}).get("warmup_type", "log")
    if o.warmup_steps and warmup_type != "linear":
        line += f" (DeepSpeed's {block['type']} would warm up along a log curve)"
    return line


def _checkpointing_line(cfg: Config, user: dict[str, Any], file: str) -> str | None:
    block = user.get("activation_checkpointing")
    if not isinstance(block, dict):
        return None
    asks = [f"{k}={shown(block[k])}" for k in CHECKPOINTING if block.get(k) not in (None, False)]
    if not asks:
        return None
    ac = cfg.parallel.activation_checkpointing
    wins = (
        "no block is recomputed (set it to full to recompute every block)"
        if ac == "none"
        else "blocks are recomputed with torch's checkpoint, without those options"
    )
    return (
        f"{file}: activation_checkpointing ({', '.join(asks)}) configures deepspeed.checkpointing, "
        f"which zerofit's models do not call: parallel.activation_checkpointing={ac} wins, so "
        f"{wins}"
    )

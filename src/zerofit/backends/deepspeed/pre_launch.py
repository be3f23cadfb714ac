"""Before any rank starts: the JSON DeepSpeed will get, checked, kept and explained.

`launch_check` (the engine's `Engine.launch_check`) resolves the JSON (`ds_json.resolve_ds_json`),
keeps it for the run folder (`ds_config.json`) and, for a user's file, refuses the settings that
cannot work with the zerofit config, has DeepSpeed validate the whole (`validate`), and returns
the notes that say what zerofit made of the file (`notes`).
"""

from __future__ import annotations

import json
from typing import Any

from zerofit.backends.deepspeed.ds_json import (
    needs_plain_linear,
    read_user_json,
    resolve_ds_json,
    torch_adam_offloaded,
)
from zerofit.backends.deepspeed.json_paths import get
from zerofit.backends.deepspeed.notes import launch_notes
from zerofit.backends.deepspeed.validate import validate
from zerofit.backends.engine import LaunchCheck
from zerofit.config import Config
from zerofit.config.limits import shown
from zerofit.errors import UserError

RESOLVED_FILE = "ds_config.json"  # in the run folder: the JSON DeepSpeed was initialised with


def launch_check(cfg: Config, world_size: int) -> LaunchCheck:
    resolved = resolve_ds_json(cfg, world_size)
    files = {RESOLVED_FILE: json.dumps(resolved.json, indent=2) + "\n"}
    path = cfg.parallel.deepspeed.config
    if not path:
        return LaunchCheck([], files)
    file = shown(path, quote=False)
    check_settings(cfg, resolved.json, file)
    said = validate(cfg, resolved.json, file)
    return LaunchCheck(launch_notes(cfg, read_user_json(path), resolved, file) + said, files)


def check_settings(cfg: Config, ds: dict[str, Any], file: str) -> None:
    """The file's settings that fail with the rest of the config, which zerofit would otherwise
    have written itself."""
    if needs_plain_linear(cfg) and get(ds, "zero_optimization.memory_efficient_linear") is True:
        p = cfg.parallel
        raise UserError(
            f"zero_optimization.memory_efficient_linear=true in {file}: ZeRO-3's memory-"
            "efficient linear fails under activation checkpointing and torch.compile "
            f"(parallel.activation_checkpointing={p.activation_checkpointing}, "
            f"parallel.compile={p.compile}); set it to false or remove it"
        )
    if torch_adam_offloaded(cfg) and ds.get("zero_force_ds_cpu_optimizer") is True:
        raise UserError(
            f"zero_force_ds_cpu_optimizer=true in {file}, but the optimizer is torch's Adam "
            "(torch_adam) on offloaded states, which DeepSpeed then refuses; set it to false"
        )


def unsupported_dtype(cfg: Config, device_type: str) -> UserError:
    """The line for a compute dtype DeepSpeed's accelerator here does not run, naming the file's
    key where the file asked for it."""
    dtype, path = cfg.precision.param_dtype, cfg.parallel.deepspeed.config
    use = "bf16 or fp32" if dtype == "fp16" else "fp32"
    if path and get(read_user_json(path), f"{dtype}.enabled") is True:
        said = f"{dtype}.enabled=true in {shown(path, quote=False)}"
        use += ' (set it to "auto" or false)'
    else:
        said = f"precision.param_dtype={dtype}"
    return UserError(
        f"{dtype} compute ({said}) is not supported by DeepSpeed on this {device_type.upper()}; "
        f"use {use}"
    )

"""The typed run configuration: schema, YAML loading, dotted overrides, validation.

Every section is a dataclass. Loading walks the YAML mapping against the dataclass fields, so an
unknown key is rejected by name (with the closest valid one), and a value of the wrong type is
rejected with its dotted path. Cross-field checks live in `validate`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import math
import types
import typing
from pathlib import Path
from typing import Any, Literal

import yaml

from zerofit.errors import UserError
from zerofit.schema import (  # noqa: F401  (re-exported: the schema is part of this module's API)
    CheckpointConfig,
    Config,
    DataConfig,
    DeepSpeedConfig,
    LogConfig,
    ModelConfig,
    OptimConfig,
    ParallelConfig,
    PrecisionConfig,
    TrainConfig,
)

# ----------------------------------------------------------------------------- conversion


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _convert(value: Any, tp: Any, path: str) -> Any:
    """Check/convert one YAML value against a (resolved) type annotation."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _convert(value, arg, path)
            except UserError as e:
                errors.append(str(e))
        raise UserError(
            errors[-1] if len(errors) == 1 else f"{path}: {value!r} is not a valid {_type_name(tp)}"
        )
    if origin is Literal:
        choices = typing.get_args(tp)
        if value not in choices:
            raise UserError(f"{path}: {value!r} is not one of {', '.join(map(str, choices))}")
        return value
    if origin in (list, tuple):
        if not isinstance(value, list | tuple):
            raise UserError(f"{path}: expected a list, got {value!r}")
        args = typing.get_args(tp)
        if origin is tuple and len(args) != len(value):
            raise UserError(f"{path}: expected {len(args)} values, got {len(value)}")
        items = args if origin is tuple else [args[0]] * len(value)
        out = [
            _convert(v, t, f"{path}[{i}]")
            for i, (v, t) in enumerate(zip(value, items, strict=True))
        ]
        return tuple(out) if origin is tuple else out
    if origin is dict:
        if not isinstance(value, dict):
            raise UserError(f"{path}: expected a mapping, got {value!r}")
        return dict(value)
    if dataclasses.is_dataclass(tp):
        return _from_dict(tp, value, path)
    if tp is Any:
        return value
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise UserError(f"{path}: expected true or false, got {value!r}")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, str):  # '5e7' (YAML 1.1 reads it as a string): bucket sizes
            with contextlib.suppress(ValueError):
                value = float(value)
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise UserError(f"{path}: expected an integer, got {value!r}")
    if tp is float:
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):  # YAML reads 3e-4 (no dot) as a string
            try:
                return float(value)
            except ValueError:
                pass
        raise UserError(f"{path}: expected a number, got {value!r}")
    if tp is str:
        if isinstance(value, str):
            return value
        raise UserError(f"{path}: expected a string, got {value!r}")
    raise TypeError(f"unsupported annotation {tp!r} at {path}")


def _from_dict(cls: type, data: Any, path: str) -> Any:
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise UserError(f"{path or 'config'}: expected a mapping, got {data!r}")
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    kwargs = {}
    for key, value in data.items():
        dotted = f"{path}.{key}" if path else str(key)
        if key not in names:
            raise UserError(f"unknown config key '{dotted}'{_suggest(str(key), names, path)}")
        kwargs[key] = _convert(value, hints[key], dotted)
    return cls(**kwargs)


def _suggest(key: str, names: list[str], path: str) -> str:
    close = difflib.get_close_matches(key, names, n=1, cutoff=0.5)
    if close:
        return f" (did you mean '{path + '.' if path else ''}{close[0]}'?)"
    return f"; valid keys: {', '.join(names)}"


def to_dict(cfg: Any) -> dict[str, Any]:
    """Plain, YAML-safe dict of a config (tuples become lists)."""

    def plain(v: Any) -> Any:
        if isinstance(v, tuple | list):
            return [plain(x) for x in v]
        if isinstance(v, dict):
            return {k: plain(x) for k, x in v.items()}
        return v

    return plain(dataclasses.asdict(cfg))


# ----------------------------------------------------------------------------- loading


def parse_overrides(items: list[str]) -> dict[str, Any]:
    """`["train.steps=100", "optim.lr=3e-4"]` -> nested dict; values are parsed as YAML scalars."""
    tree: dict[str, Any] = {}
    for item in items:
        if "=" not in item:
            raise UserError(f"override '{item}' must look like section.key=value")
        key, raw = item.split("=", 1)
        parts = key.strip().lstrip("-").split(".")
        if len(parts) < 2 or not all(parts):
            raise UserError(
                f"override '{item}' must name a section and a key, e.g. train.steps=100"
            )
        try:
            value = yaml.safe_load(raw) if raw.strip() else None
        except yaml.YAMLError:
            value = raw
        node = tree
        for p in parts[:-1]:
            node = node.setdefault(p, {})
            if not isinstance(node, dict):
                raise UserError(f"override '{item}' conflicts with another override")
        node[parts[-1]] = value
    return tree


def deep_merge(
    base: dict[str, Any], extra: dict[str, Any], atomic: frozenset[str] = frozenset()
) -> dict[str, Any]:
    """`extra` over `base`, recursively; keys in `atomic` are replaced whole, never merged."""
    out = dict(base)
    for k, v in extra.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict) and k not in atomic:
            out[k] = deep_merge(out[k], v, atomic)
        else:
            out[k] = v
    return out


def read_yaml(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    if not p.is_file():
        raise UserError(f"config file not found: {p}")
    try:
        data = yaml.safe_load(p.read_text())
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(e, "problem", None) or "invalid YAML"
        raise UserError(f"bad YAML in {p}{where}: {problem}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise UserError(f"{p}: the top level must be a mapping of sections")
    return data


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> Config:
    """Load a YAML config (or the embedded defaults when path is None), apply dotted overrides."""
    data = read_yaml(path) if path else {}
    data = deep_merge(data, parse_overrides(overrides or []), frozenset({"overrides"}))
    return config_from_dict(data)


def config_from_dict(data: dict[str, Any]) -> Config:
    cfg = _from_dict(Config, data, "")
    validate(cfg)
    object.__setattr__(cfg, "_explicit", frozenset(_leaf_keys(data)))
    return cfg


def _leaf_keys(data: dict[str, Any], prefix: str = "") -> list[str]:
    keys = []
    for k, v in data.items():
        path = f"{prefix}{k}"
        if isinstance(v, dict) and k != "overrides":
            keys += _leaf_keys(v, path + ".")
        else:
            keys.append(path)
    return keys


def explicit_keys(cfg: Config) -> frozenset[str]:
    """Dotted keys the user wrote (YAML or flags), as opposed to defaults. Lost by `replace`."""
    return getattr(cfg, "_explicit", frozenset())


def get_field(cfg: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        cfg = getattr(cfg, part)
    return cfg


def with_fields(cfg: Config, updates: dict[str, Any]) -> Config:
    """A copy of `cfg` with dotted fields replaced (and re-validated through the schema)."""
    data = to_dict(cfg)
    for dotted, value in updates.items():
        node = data
        *parents, leaf = dotted.split(".")
        for part in parents:
            node = node[part]
        node[leaf] = list(value) if isinstance(value, tuple) else value
    new = config_from_dict(data)
    object.__setattr__(new, "_explicit", explicit_keys(cfg))
    return new


# ----------------------------------------------------------------------------- validation


def _check_optim(o: Any) -> None:
    """Values AdamW cannot train with (NaN and inf fail every comparison, so each test is a
    positive one): refused before anything starts."""
    finite = math.isfinite
    if not (finite(o.lr) and o.lr > 0):
        raise UserError(f"optim.lr must be a finite number > 0, got {o.lr}")
    if not all(finite(b) and 0.0 <= b < 1.0 for b in o.betas):
        raise UserError(f"optim.betas must be in [0, 1), got {list(o.betas)}")
    if not (finite(o.eps) and o.eps > 0):
        raise UserError(f"optim.eps must be a finite number > 0, got {o.eps}")
    if not (finite(o.weight_decay) and 0 <= o.weight_decay < 1 / o.lr):
        raise UserError(
            f"optim.weight_decay must be finite, >= 0 and below 1/lr (AdamW multiplies weights by "
            f"1 - lr x weight_decay each step), got {o.weight_decay}"
        )
    if not (finite(o.min_lr_ratio) and 0 <= o.min_lr_ratio <= 1):
        raise UserError(f"optim.min_lr_ratio must be in [0, 1], got {o.min_lr_ratio}")
    if o.grad_clip is not None and not (finite(o.grad_clip) and o.grad_clip > 0):
        raise UserError(f"optim.grad_clip must be a finite number > 0, or null, got {o.grad_clip}")


def _check_paths(cfg: Config) -> None:
    """A NUL byte cannot be in a path (the OS would raise deep inside a worker)."""
    sources = cfg.data.source if isinstance(cfg.data.source, list) else [cfg.data.source]
    for name, value in [
        ("model.hf", cfg.model.hf),
        ("data.tokenizer", cfg.data.tokenizer),
        ("log.run_dir", cfg.log.run_dir),
        ("checkpoint.dir", cfg.checkpoint.dir),
        *(("data.source", v) for v in sources),
    ]:
        if not isinstance(value, str):
            continue
        if "\x00" in value:
            raise UserError(f"{name}: the path contains a NUL byte: {value[:200]!r}")
        longest = max((len(part.encode()) for part in value.split("/")), default=0)
        if len(value.encode()) > 4096 or longest > 255:
            raise UserError(
                f"{name}: the path is too long ({len(value)} characters; a name may have 255 "
                f"bytes, a path 4096): {value[:100]!r}..."
            )


def validate(cfg: Config) -> None:
    """Checks that need no hardware or world size (those live in `check_world`)."""
    m, t, o, p = cfg.model, cfg.train, cfg.optim, cfg.parallel
    if (m.preset is None) == (m.hf is None):
        raise UserError("model: give exactly one of model.preset and model.hf")
    for name, value in [
        ("model.seq_len", m.seq_len),
        ("train.steps", t.steps),
        ("train.micro_batch_size", t.micro_batch_size),
        ("train.grad_accum_steps", t.grad_accum_steps),
        ("parallel.replicate_degree", p.replicate_degree),
        ("parallel.ac_every", p.ac_every),
        ("log.every", cfg.log.every),
        ("train.max_skipped_steps", t.max_skipped_steps),
    ]:
        if value < 1:
            raise UserError(f"{name} must be >= 1, got {value}")
    for name, value in [
        ("train.eval_every", t.eval_every),
        ("checkpoint.every", cfg.checkpoint.every),
        ("optim.warmup_steps", o.warmup_steps),
        ("model.loss_chunk", m.loss_chunk),
        ("parallel.prefetch", p.prefetch),
        ("train.max_restarts", t.max_restarts),
    ]:
        if value < 0:
            raise UserError(f"{name} must be >= 0, got {value}")
    if cfg.checkpoint.keep_last < 1:
        raise UserError(f"checkpoint.keep_last must be >= 1, got {cfg.checkpoint.keep_last}")
    if cfg.checkpoint.export_final and not cfg.checkpoint.save_final:
        raise UserError("checkpoint.export_final exports the final checkpoint: it needs save_final")
    if not 0.0 <= cfg.data.val_fraction < 1.0:
        raise UserError(f"data.val_fraction must be in [0, 1), got {cfg.data.val_fraction}")
    _check_optim(o)
    _check_paths(cfg)
    from zerofit.backends import backend_names  # late: backends import torch

    if p.backend not in [*backend_names(), "auto"]:
        raise UserError(
            f"parallel.backend: unknown backend '{p.backend}'{_suggest(p.backend, backend_names(), 'parallel')}"
        )


def check_world(cfg: Config, world_size: int) -> int:
    """Batch arithmetic against the world size; returns the data-parallel size."""
    t, p = cfg.train, cfg.parallel
    if world_size % p.replicate_degree:
        raise UserError(
            f"parallel.replicate_degree={p.replicate_degree} does not divide the world size {world_size}"
        )
    dp = world_size
    expected = t.micro_batch_size * t.grad_accum_steps * dp
    if t.global_batch_size is not None and t.global_batch_size != expected:
        raise UserError(
            f"train.global_batch_size={t.global_batch_size} but micro_batch_size={t.micro_batch_size} "
            f"x grad_accum_steps={t.grad_accum_steps} x data-parallel size={dp} = {expected}"
        )
    return dp


def resolve_precision(cfg: PrecisionConfig, device_type: str) -> PrecisionConfig:
    """Fill `auto` and the unset dtypes, so the saved config states every dtype explicitly."""
    mode = cfg.mode if cfg.mode != "auto" else ("bf16" if device_type == "cuda" else "fp32")
    return PrecisionConfig(
        mode=mode,
        param_dtype=cfg.param_dtype or mode,
        reduce_dtype=cfg.reduce_dtype or "fp32",
        master_dtype=cfg.master_dtype or "fp32",
    )


def save_config(cfg: Config, path: str | Path) -> None:
    Path(path).write_text(yaml.safe_dump(to_dict(cfg), sort_keys=False))


def field_help(cls: type = Config, prefix: str = "") -> list[tuple[str, str, str]]:
    """(dotted key, default, help) for every option: feeds `zerofit train --help`."""
    rows = []
    hints = typing.get_type_hints(cls, include_extras=True)
    for f in dataclasses.fields(cls):
        tp = typing.get_type_hints(cls)[f.name]
        if dataclasses.is_dataclass(tp):
            rows += field_help(tp, f"{prefix}{f.name}.")
            continue
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
        if isinstance(default, tuple):
            default = list(default)
        meta = getattr(hints[f.name], "__metadata__", ("",))
        rows.append((f"{prefix}{f.name}", repr(default), str(meta[0])))
    return rows

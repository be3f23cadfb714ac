"""The typed run configuration: schema, YAML loading, dotted overrides, validation.

Every section is a dataclass. Loading walks the YAML mapping against the dataclass fields, so an
unknown key is rejected by name (with the closest valid one), and a value of the wrong type is
rejected with its dotted path. Cross-field checks live in `validate`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import functools
import types
import typing
from pathlib import Path
from typing import Any, Literal

import yaml

from zerofit.errors import UserError
from zerofit.limits import (
    MAX_PATH_LEVELS,
    MAX_STRING,
    check_deepspeed,
    check_optim,
    check_ranges,
    shown,
)
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
from zerofit.yaml_safe import load_yaml_file, load_yaml_text

# ----------------------------------------------------------------------------- conversion


@functools.cache
def _type_hints(cls: type, extras: bool = False) -> dict[str, Any]:
    """A dataclass's resolved annotations (evaluating them is slow; the schema never changes)."""
    return typing.get_type_hints(cls, include_extras=extras)


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
            errors[-1]
            if len(errors) == 1
            else f"{path}: {shown(value)} is not a valid {_type_name(tp)}"
        )
    if origin is Literal:
        choices = typing.get_args(tp)
        if value not in choices:
            raise UserError(f"{path}: {shown(value)} is not one of {', '.join(map(str, choices))}")
        return value
    if origin in (list, tuple):
        if not isinstance(value, list | tuple):
            raise UserError(f"{path}: expected a list, got {shown(value)}")
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
            raise UserError(f"{path}: expected a mapping, got {shown(value)}")
        return dict(value)
    if dataclasses.is_dataclass(tp):
        return _from_dict(tp, value, path)
    if tp is Any:
        return value
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise UserError(f"{path}: expected true or false, got {shown(value)}")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        number = value
        if isinstance(value, str):  # '5e7' (YAML 1.1 reads it as a string): bucket sizes
            with contextlib.suppress(ValueError):
                number = float(value)
        if isinstance(number, float) and number.is_integer():
            return int(number)
        raise UserError(f"{path}: expected an integer, got {shown(value)}")
    if tp is float:
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):  # YAML reads 3e-4 (no dot) as a string
            try:
                return float(value)
            except ValueError:
                pass
        raise UserError(f"{path}: expected a number, got {shown(value)}")
    if tp is str:
        if isinstance(value, str):
            return _check_text(value, path)
        raise UserError(f"{path}: expected a string, got {shown(value)}")
    raise TypeError(f"unsupported annotation {tp!r} at {path}")


def _check_text(value: str, path: str) -> str:
    """A config string: at most MAX_STRING characters, all printable (a path or a name never
    needs a control, format or line-break character, and each would break an error line)."""
    if len(value) > MAX_STRING:
        raise UserError(
            f"{path}: too long ({len(value)} characters; at most {MAX_STRING}): {shown(value)}"
        )
    if not value.isprintable():
        i, ch = next((i, c) for i, c in enumerate(value) if not c.isprintable())
        what = "a NUL byte" if ch == "\x00" else f"the non-printable character {ch!r}"
        raise UserError(f"{path}: contains {what} at position {i}: {shown(value)}")
    return value


def _from_dict(cls: type, data: Any, path: str) -> Any:
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise UserError(f"{path or 'config'}: expected a mapping, got {shown(data)}")
    hints = _type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    kwargs = {}
    for key, value in data.items():
        dotted = f"{path}.{key}" if path else str(key)
        if key not in names:
            raise UserError(f"unknown config key {shown(dotted)}{_suggest(str(key), names, path)}")
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
            raise UserError(f"override {shown(item)} must look like section.key=value")
        key, raw = item.split("=", 1)
        parts = key.strip().lstrip("-").split(".")
        if len(parts) < 2 or not all(parts):
            raise UserError(
                f"override {shown(item)} must name a section and a key, e.g. train.steps=100"
            )
        try:
            value = load_yaml_text(raw, "an override") if raw.strip() else None
        except UserError:  # not YAML (or past a limit): the text itself, checked as a string
            value = raw
        node = tree
        for p in parts[:-1]:
            node = node.setdefault(p, {})
            if not isinstance(node, dict):
                raise UserError(f"override {shown(item)} conflicts with another override")
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


def _check_mergeable(base: dict[str, Any], extra: dict[str, Any], path: str = "") -> None:
    """Overrides below a key need a mapping (or nothing) there: `train: [1, 2]` in the file and
    `--train.steps 5` is an error, not a silent replacement of the file's value."""
    for k, v in extra.items():
        dotted = f"{path}{k}"
        old = base.get(k)
        if not isinstance(v, dict) or k == "overrides" or old is None:
            continue
        if not isinstance(old, dict):
            raise UserError(
                f"{dotted}: expected a mapping, got {shown(old)} (so --{dotted}.* cannot apply)"
            )
        _check_mergeable(old, v, dotted + ".")


def read_yaml(path: str | Path) -> dict[str, Any]:
    """The config file's mapping of sections, read under the limits of `zerofit.yaml_safe`."""
    data = load_yaml_file(path)
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise UserError(
            f"{shown(str(path), quote=False)}: the top level must be a mapping of sections"
        )
    return data


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> Config:
    """Load a YAML config (or the embedded defaults when path is None), apply dotted overrides."""
    data = read_yaml(path) if path else {}
    extra = parse_overrides(overrides or [])
    _check_mergeable(data, extra)
    data = deep_merge(data, extra, frozenset({"overrides"}))
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


def _check_paths(cfg: Config) -> None:
    """Paths the OS (or pathlib) would refuse deep inside a worker: a NUL byte, a name over 255
    bytes or a path over 4096, hundreds of levels, a `~user` that names no user."""
    sources = cfg.data.source if isinstance(cfg.data.source, list) else [cfg.data.source]
    ds = cfg.parallel.deepspeed
    for name, value in [
        ("model.hf", cfg.model.hf),
        ("data.tokenizer", cfg.data.tokenizer),
        ("log.run_dir", cfg.log.run_dir),
        ("checkpoint.dir", cfg.checkpoint.dir),
        ("parallel.deepspeed.config", ds.config),
        ("parallel.deepspeed.nvme_path", ds.nvme_path),
        *(("data.source", v) for v in sources),
    ]:
        if not isinstance(value, str):
            continue
        if "\x00" in value:
            raise UserError(f"{name}: the path contains a NUL byte: {shown(value)}")
        parts = value.split("/")
        if len(value.encode()) > 4096 or max(len(part.encode()) for part in parts) > 255:
            raise UserError(
                f"{name}: the path is too long ({len(value)} characters; a name may have 255 "
                f"bytes, a path 4096): {shown(value)}"
            )
        if len(parts) > MAX_PATH_LEVELS:  # Path.mkdir(parents=True) recurses once per level
            raise UserError(
                f"{name}: the path has {len(parts)} levels (at most {MAX_PATH_LEVELS}): "
                f"{shown(value)}"
            )
        try:
            Path(value).expanduser()
        except RuntimeError:
            raise UserError(f"{name}: no home directory for {shown(value)}") from None


def validate(cfg: Config) -> None:
    """Checks that need no hardware or world size (those live in `check_world`)."""
    m, p = cfg.model, cfg.parallel
    if (m.preset is None) == (m.hf is None):
        raise UserError("model: give exactly one of model.preset and model.hf")
    check_ranges(cfg)
    if cfg.checkpoint.export_final and not cfg.checkpoint.save_final:
        raise UserError("checkpoint.export_final exports the final checkpoint: it needs save_final")
    if not 0.0 <= cfg.data.val_fraction < 1.0:
        raise UserError(f"data.val_fraction must be in [0, 1), got {cfg.data.val_fraction}")
    check_optim(cfg.optim)
    check_deepspeed(p.deepspeed)
    _check_paths(cfg)
    from zerofit.backends import backend_names  # late: backends import torch

    if p.backend not in [*backend_names(), "auto"]:
        raise UserError(
            f"parallel.backend: unknown backend {shown(p.backend)}{_suggest(p.backend, backend_names(), 'parallel')}"
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
    hints = _type_hints(cls, extras=True)
    for f in dataclasses.fields(cls):
        tp = _type_hints(cls)[f.name]
        if dataclasses.is_dataclass(tp):
            rows += field_help(tp, f"{prefix}{f.name}.")
            continue
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
        if isinstance(default, tuple):
            default = list(default)
        meta = getattr(hints[f.name], "__metadata__", ("",))
        rows.append((f"{prefix}{f.name}", repr(default), str(meta[0])))
    return rows

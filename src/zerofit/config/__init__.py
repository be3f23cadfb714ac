"""Loading the run configuration: YAML plus dotted overrides, validated once by pydantic.

The schema (`zerofit.config.schema`) is pydantic dataclasses; a run's full schema (with the
engines' sections, `zerofit.backends.catalog.RunConfig`) is handed to the loaders here, which know
no engine; pydantic does the typing and bounds, and
`zerofit.config.error_lines` turns its first error into one line that names the dotted key and, for an
unknown key or value, the closest valid one. Cross-field checks live in `validate`; what needs the
world size or the device lives in `zerofit.launch.resolve`.
"""

from __future__ import annotations

import dataclasses
import functools
import sys
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml
from pydantic import TypeAdapter, ValidationError
from pydantic.fields import FieldInfo

from zerofit.config.error_lines import pick
from zerofit.config.limits import MAX_PATH_LEVELS, check_optim, shown
from zerofit.config.schema import Config, ParallelCommon, PrecisionConfig
from zerofit.config.yaml_safe import load_yaml_file, load_yaml_text
from zerofit.errors import UserError

# ----------------------------------------------------------------------------- conversion


@functools.cache
def _adapter(schema: type[Config]) -> TypeAdapter[Config]:
    return TypeAdapter(schema)


def _from_dict(data: Any, schema: type[Config]) -> Config:
    """Validate a mapping of sections against the schema; any problem becomes one UserError line."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise UserError(f"config: expected a mapping, got {shown(data)}")
    try:
        return _adapter(schema).validate_python(data)
    except ValidationError as e:
        raise UserError(pick(e.errors(include_url=False), data, schema)) from None


def to_dict(cfg: Config) -> dict[str, Any]:
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
    """The config file's mapping of sections, read under the limits of `zerofit.config.yaml_safe`."""
    data = load_yaml_file(path)
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise UserError(
            f"{shown(str(path), quote=False)}: the top level must be a mapping of sections"
        )
    return data


def load_config(
    path: str | Path | None, overrides: list[str] | None, schema: type[Config]
) -> Config:
    """Load a YAML config (or the embedded defaults when path is None), apply dotted overrides."""
    sections = schema.engine_sections
    data = migrate(read_yaml(path) if path else {}, str(path) if path else "the config", sections)
    extra = migrate(parse_overrides(overrides or []), "the command line", sections)
    _check_mergeable(data, extra)
    data = deep_merge(data, extra, frozenset({"overrides"}))
    return config_from_dict(data, schema)


def config_from_dict(data: dict[str, Any], schema: type[Config]) -> Config:
    cfg = _from_dict(data, schema)
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
    """Dotted keys the user wrote (YAML or flags); `config.replacing.replace_config` keeps them."""
    return getattr(cfg, "_explicit", frozenset())


def get_field(cfg: Config, dotted: str) -> Any:
    """The value at a dotted key (`"parallel.deepspeed.stage"`)."""
    value: Any = cfg
    for part in dotted.split("."):
        value = getattr(value, part)
    return value


def with_fields(cfg: Config, updates: dict[str, Any]) -> Config:
    """A copy of `cfg` with dotted fields replaced (and re-validated through the schema)."""
    data = to_dict(cfg)
    for dotted, value in updates.items():
        node = data
        *parents, leaf = dotted.split(".")
        for part in parents:
            node = node[part]
        node[leaf] = list(value) if isinstance(value, tuple) else value
    new = config_from_dict(data, type(cfg))
    object.__setattr__(new, "_explicit", explicit_keys(cfg))
    return new


# ----------------------------------------------------------------------------- validation


def _check_paths(cfg: Config) -> None:
    sources = cfg.data.source if isinstance(cfg.data.source, list) else [cfg.data.source]
    for name, value in [
        ("model.hf", cfg.model.hf),
        ("data.tokenizer", cfg.data.tokenizer),
        ("log.run_dir", cfg.log.run_dir),
        ("checkpoint.dir", cfg.checkpoint.dir),
        *(("data.source", v) for v in sources),
    ]:
        check_path(name, value)


def check_path(name: str, value: Any) -> None:
    """Refuse a path the OS (or pathlib) would refuse deep inside a worker: a NUL byte, a name over
    255 bytes or a path over 4096, hundreds of levels, a `~user` that names no user."""
    if not isinstance(value, str):
        return
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
            f"{name}: the path has {len(parts)} levels (at most {MAX_PATH_LEVELS}): {shown(value)}"
        )
    try:
        Path(value).expanduser()
    except RuntimeError:
        raise UserError(f"{name}: no home directory for {shown(value)}") from None


def validate(cfg: Config) -> None:
    """Checks across fields that need no hardware or world size (those live in `zerofit.launch.resolve`)."""
    m = cfg.model
    if (m.preset is None) == (m.hf is None):
        raise UserError("model: give exactly one of model.preset and model.hf")
    if cfg.checkpoint.export_final and not cfg.checkpoint.save_final:
        raise UserError("checkpoint.export_final exports the final checkpoint: it needs save_final")
    if not 0.0 <= cfg.data.val_fraction < 1.0:
        raise UserError(f"data.val_fraction must be in [0, 1), got {cfg.data.val_fraction}")
    if cfg.train.steps is None and cfg.train.epochs is None:
        raise UserError("train.steps is null: give a number of steps, or train.epochs")
    check_optim(cfg.optim)
    _check_paths(cfg)
    if cfg.precision.fp8 != "none" and cfg.model.lora.rank > 0:
        raise UserError(
            f"precision.fp8={cfg.precision.fp8} with LoRA (model.lora.rank > 0) is not supported: "
            "train the adapters in bf16 (precision.fp8: none)"
        )
    if m.lora.quantize != "none" and m.lora.rank == 0:
        raise UserError(
            f"model.lora.quantize={m.lora.quantize} stores the frozen base of LoRA's adapted "
            "layers: give model.lora.rank > 0 too (QLoRA), or model.lora.quantize: none"
        )
    if m.lora.quantize != "none" and cfg.precision.mode == "fp16":
        raise UserError(
            f"model.lora.quantize={m.lora.quantize} computes in bf16 or fp32: its 4-bit base is "
            "stored in bf16 words that fp16 compute would convert; use precision.mode: bf16 "
            "(or auto)"
        )
    _check_objective(cfg)
    p = cfg.parallel
    if (p.activation_checkpointing == "first_k") != (p.ac_blocks is not None):
        raise UserError(
            "parallel.ac_blocks goes with parallel.activation_checkpointing: first_k (how many "
            "blocks, from the input side, recompute): give both or neither"
        )
    check = type(cfg).engine_check
    if check is not None:
        check(cfg)


def _check_objective(cfg: Config) -> None:
    """Preference pairs and the DPO objective go together; the reference without extra weights
    needs adapters to switch off, and a frozen copy of the model is for full fine-tuning."""
    dpo, pairs = cfg.train.objective == "dpo", cfg.data.format == "preference"
    if dpo and not pairs:
        raise UserError(
            f"train.objective=dpo trains on preference pairs: set data.format: preference (its "
            f"records hold prompt, chosen and rejected), not {cfg.data.format}"
        )
    if pairs and not dpo:
        raise UserError(
            "data.format=preference holds pairs for train.objective: dpo; set it, or use a "
            "fine-tuning format (chat, prompt_completion, ...) for next-token training"
        )
    if cfg.train.dpo.reference == "adapters_off" and cfg.model.lora.rank == 0:
        raise UserError(
            "train.dpo.reference=adapters_off takes the base without LoRA's adapters as the "
            "reference: give model.lora.rank > 0, or train.dpo.reference: precomputed"
        )
    if cfg.train.dpo.reference == "copy" and cfg.model.lora.rank > 0:
        raise UserError(
            "train.dpo.reference=copy keeps a second, frozen copy of the whole model, for full "
            "fine-tuning; with model.lora the reference is the base with the adapters off, at no "
            "extra memory: train.dpo.reference: adapters_off (or auto)"
        )


def check_world(cfg: Config, world_size: int) -> int:
    """Batch arithmetic against the world size; returns the data-parallel size."""
    t = cfg.train
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
        fp8=cfg.fp8,
    )


def compiles(parallel: ParallelCommon, device_type: str = "cuda") -> bool:
    """Whether `parallel.compile` compiles on `device_type` (`auto`: on CUDA only). The planner
    and `ds-config` ask for the GPU a plan is for; a run is resolved for its own device."""
    return parallel.compile is True or (parallel.compile == "auto" and device_type == "cuda")


def save_config(cfg: Config, path: str | Path) -> None:
    Path(path).write_text(yaml.safe_dump(to_dict(cfg), sort_keys=False))


def leaf_fields(cls: type, prefix: str = "") -> Iterator[tuple[str, FieldInfo]]:
    """(dotted key, pydantic FieldInfo) of every option, sections walked in schema order."""
    for name, info in cls.__pydantic_fields__.items():  # type: ignore[attr-defined]
        if dataclasses.is_dataclass(info.annotation):
            yield from leaf_fields(info.annotation, f"{prefix}{name}.")  # type: ignore[arg-type]
        else:
            yield f"{prefix}{name}", info


def field_help(schema: type[Config]) -> list[tuple[str, str, str]]:
    """(dotted key, default, help) for every option: feeds `zerofit train --help`."""
    rows = []
    for key, info in leaf_fields(schema):
        default = info.get_default(call_default_factory=True)
        if isinstance(default, tuple):
            default = list(default)
        rows.append((key, repr(default), info.description or ""))
    return rows


def _is_int(tp: Any) -> bool:
    """int, or int | None, through any Annotated layers."""
    if typing.get_origin(tp) is typing.Annotated:
        return _is_int(typing.get_args(tp)[0])
    members = [a for a in typing.get_args(tp) if a is not type(None)] or [tp]
    return len(members) == 1 and (
        members[0] is int or (members[0] is not tp and _is_int(members[0]))
    )


def int_bounds(schema: type[Config]) -> dict[str, tuple[Any, Any]]:
    """(ge, le) of every integer field, by dotted key (None where a bound is missing)."""
    return {
        key: (
            next((m.ge for m in info.metadata if hasattr(m, "ge")), None),
            next((m.le for m in info.metadata if hasattr(m, "le")), None),
        )
        for key, info in leaf_fields(schema)
        if _is_int(info.annotation)
    }


_WARNED: set[tuple[str, str]] = set()


def migrate(data: dict[str, Any], where: str, sections: dict[str, type]) -> dict[str, Any]:
    """Old configs: an engine whose options were once flat under `parallel.*` (FSDP's, before
    0.2) declares `flat_until`; its flat keys move into `parallel.<engine>` with one line each."""
    parallel = data.get("parallel")
    if not isinstance(parallel, dict):
        return data
    parallel = dict(parallel)
    for engine, options in sections.items():
        until = getattr(options, "flat_until", None)
        if until is None:
            continue
        names = [f.name for f in dataclasses.fields(options)]
        moved = {k: parallel.pop(k) for k in list(parallel) if k in names}
        if not moved:
            continue
        section = parallel.get(engine)
        parallel[engine] = {**(section if isinstance(section, dict) else {}), **moved}
        for key in moved:
            if (where, key) not in _WARNED:
                _WARNED.add((where, key))
                print(
                    f"zerofit: parallel.{key} in {where} is now parallel.{engine}.{key}; the old "
                    f"name loads until zerofit {until}",
                    file=sys.stderr,
                )
    return {**data, "parallel": parallel}

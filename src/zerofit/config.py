"""The typed run configuration: schema, YAML loading, dotted overrides, validation.

Every section is a dataclass. Loading walks the YAML mapping against the dataclass fields, so an
unknown key is rejected by name (with the closest valid one), and a value of the wrong type is
rejected with its dotted path. Cross-field checks live in `validate`.
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated as A
from typing import Any, Literal

import yaml

from zerofit.errors import UserError

Dtype = Literal["bf16", "fp16", "fp32"]


@dataclass
class ModelConfig:
    """Which network to train."""

    preset: A[str | None, "a built-in preset: tiny, small, llama3-1b, llama3-8b, 13b, 70b"] = "tiny"
    hf: A[str | None, "or a local Hugging Face model directory (config.json, *.safetensors)"] = None
    seq_len: A[int, "tokens per training sequence"] = 256
    init_seed: A[int, "seed of the parameter initialisation"] = 0
    overrides: A[dict[str, Any], "change preset/HF config fields, e.g. {n_layers: 2}"] = field(
        default_factory=dict
    )


@dataclass
class DataConfig:
    """What to read and how to tokenize it."""

    source: A[
        str | list[str], "'stdlib' (this Python's own sources), or .txt/.jsonl files or dirs"
    ] = "stdlib"
    field: A[str, "JSONL field holding the document text"] = "text"
    tokenizer: A[str, "'byte', or a path to a local tokenizer.json"] = "byte"
    val_fraction: A[float, "share of packed sequences held out for eval loss"] = 0.02
    max_tokens: A[int | None, "read at most this many tokens (null: everything)"] = 4_000_000
    seed: A[int, "shuffling and split seed"] = 0


@dataclass
class TrainConfig:
    """Steps and batch arithmetic."""

    steps: A[int, "optimizer steps"] = 100
    micro_batch_size: A[int, "sequences per rank per forward pass"] = 8
    grad_accum_steps: A[int, "micro-batches per optimizer step"] = 1
    global_batch_size: A[int | None, "if given, must equal micro x accum x data-parallel size"] = (
        None
    )
    eval_every: A[int, "eval loss every N steps (0: never)"] = 50
    eval_batches: A[int, "micro-batches per rank in one eval"] = 4
    seed: A[int, "seed of the per-rank torch RNG"] = 0


@dataclass
class OptimConfig:
    """AdamW with linear warmup and cosine decay."""

    lr: A[float, "peak learning rate"] = 1e-3
    weight_decay: A[float, "AdamW decoupled weight decay (matrices only)"] = 0.1
    betas: A[tuple[float, float], "AdamW betas"] = (0.9, 0.95)
    eps: A[float, "AdamW epsilon"] = 1e-8
    fused: A[bool | None, "fused AdamW (null: on GPU, foreach on CPU)"] = None
    warmup_steps: A[int, "linear warmup steps"] = 20
    min_lr_ratio: A[float, "cosine decays to lr x this"] = 0.1
    grad_clip: A[float | None, "max global grad norm (null: no clipping)"] = 1.0


@dataclass
class PrecisionConfig:
    """Mixed precision. `mode` sets defaults for the three dtypes; each may be given explicitly."""

    mode: A[Literal["auto", "bf16", "fp16", "fp32"], "auto: bf16 on GPU, fp32 on CPU"] = "auto"
    param_dtype: A[Dtype | None, "compute dtype of forward/backward (default: mode)"] = None
    reduce_dtype: A[Dtype | None, "gradient reduction dtype (default: fp32)"] = None
    master_dtype: A[Dtype | None, "stored weights and AdamW states (default: fp32)"] = None


@dataclass
class DeepSpeedConfig:
    """DeepSpeed ZeRO. Each field maps to one DeepSpeed JSON path (zerofit.ds_config.TABLE)."""

    config: A[str | None, "a ds_config.json merged with this config (conflicts are errors)"] = None
    stage: A[
        Literal[0, 1, 2, 3], "ZeRO stage: 1 optimizer states, 2 + gradients, 3 + parameters"
    ] = 3
    offload_optimizer: A[Literal["none", "cpu", "nvme"], "where optimizer states live"] = "none"
    offload_param: A[Literal["none", "cpu", "nvme"], "stage 3: where parameters live"] = "none"
    nvme_path: A[str | None, "directory on a fast SSD for nvme offload"] = None
    pin_memory: A[bool, "page-locked host buffers for offload"] = True
    overlap_comm: A[bool, "overlap gradient reduction with backward"] = True
    contiguous_gradients: A[bool, "copy gradients into one buffer as they are produced"] = True
    reduce_scatter: A[bool, "reduce gradients with reduce-scatter instead of all-reduce"] = True
    allgather_bucket_size: A[int, "elements per all-gather bucket (stages 1-2)"] = 500_000_000
    reduce_bucket_size: A[int, "elements per gradient-reduction bucket"] = 500_000_000
    prefetch_bucket_size: A[int, "stage 3: elements prefetched ahead of use"] = 50_000_000
    param_persistence_threshold: A[int, "stage 3: params smaller than this stay unpartitioned"] = (
        100_000
    )
    max_live_parameters: A[int, "stage 3: max gathered elements alive at once"] = 1_000_000_000
    leaf_blocks: A[bool, "stage 3: gather each decoder block's params in one go (ZeRO-3 leaf)"] = (
        True
    )
    torch_adam: A[
        bool | None, "torch AdamW instead of DeepSpeed's fused/CPU Adam (null: on CPU)"
    ] = None
    loss_scale_window: A[int, "fp16: steps without overflow before the loss scale grows"] = 1000
    initial_scale_power: A[int, "fp16: initial loss scale is 2**this"] = 16
    hysteresis: A[int, "fp16: overflows tolerated before the scale shrinks"] = 2
    min_loss_scale: A[float, "fp16: floor of the dynamic loss scale"] = 1.0


@dataclass
class ParallelConfig:
    """How the model is spread over the ranks."""

    backend: A[str, "ddp | fsdp | deepspeed | auto (the planner's pick for this machine)"] = "fsdp"
    reshard_after_forward: A[bool, "FSDP: true = FULL_SHARD, false = SHARD_GRAD_OP"] = True
    replicate_degree: A[
        int, "FSDP hybrid sharding: replicas on the outer mesh dim (HSDP if > 1)"
    ] = 1
    wrap: A[Literal["block", "size"], "FSDP unit: each transformer block, or size-based"] = "block"
    min_num_params: A[int, "size policy: a module becomes a unit at this many params"] = 100_000_000
    cpu_offload: A[bool, "FSDP: sharded params, grads and AdamW states live in host RAM"] = False
    activation_checkpointing: A[
        Literal["none", "full", "every_k"], "recompute blocks in backward"
    ] = "none"
    ac_every: A[int, "every_k: checkpoint every k-th block"] = 2
    compile: A[bool, "torch.compile each transformer block"] = False
    deepspeed: DeepSpeedConfig = field(default_factory=DeepSpeedConfig)


@dataclass
class CheckpointConfig:
    dir: A[str | None, "default: <run_dir>/checkpoints"] = None
    every: A[int, "save every N steps (0: only at the end)"] = 0
    keep_last: A[int, "complete checkpoints kept; older ones are deleted"] = 2
    save_final: A[bool, "save when the run ends (benchmarks turn it off)"] = True


@dataclass
class LogConfig:
    run_dir: A[str | None, "default: runs/<timestamp>"] = None
    every: A[int, "log metrics every N steps"] = 10
    jsonl: A[bool, "write <run_dir>/metrics.jsonl"] = True
    tensorboard: A[bool, "write <run_dir>/tb (needs the tensorboard package)"] = False
    progress: A[bool, "progress bar (or log lines) on rank 0"] = True


@dataclass
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    precision: PrecisionConfig = field(default_factory=PrecisionConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    log: LogConfig = field(default_factory=LogConfig)


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
    ]:
        if value < 1:
            raise UserError(f"{name} must be >= 1, got {value}")
    for name, value in [
        ("train.eval_every", t.eval_every),
        ("checkpoint.every", cfg.checkpoint.every),
        ("optim.warmup_steps", o.warmup_steps),
    ]:
        if value < 0:
            raise UserError(f"{name} must be >= 0, got {value}")
    if cfg.checkpoint.keep_last < 1:
        raise UserError(f"checkpoint.keep_last must be >= 1, got {cfg.checkpoint.keep_last}")
    if not 0.0 <= cfg.data.val_fraction < 1.0:
        raise UserError(f"data.val_fraction must be in [0, 1), got {cfg.data.val_fraction}")
    if o.lr <= 0:
        raise UserError(f"optim.lr must be > 0, got {o.lr}")
    if not all(0.0 <= b < 1.0 for b in o.betas):
        raise UserError(f"optim.betas must be in [0, 1), got {list(o.betas)}")
    if o.grad_clip is not None and o.grad_clip <= 0:
        raise UserError(f"optim.grad_clip must be > 0 or null, got {o.grad_clip}")
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

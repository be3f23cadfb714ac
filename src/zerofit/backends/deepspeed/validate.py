"""The resolved DeepSpeed JSON checked by DeepSpeed itself, in the launcher, before any rank starts.

`DeepSpeedConfig` parses the whole JSON through DeepSpeed's pydantic models (ZeRO, offload, fp16,
bf16, monitors, comms logging, ...), which refuse a key they do not know, such as a misspelled
`stage3_param_persitence_threshold`; its own sanity checks follow. The optimizer's params are not
among them (DeepSpeed passes them to the optimizer's constructor only when the ranks build it):
they are checked here against the constructor DeepSpeed will call, chosen as
`DeepSpeedEngine.get_optimizer_configuration` chooses it. A failure is one line naming the key and
the file. DeepSpeed's own warnings (a deprecated key) become notes.

In the launcher DeepSpeed sees one process, so its batch check gets train_batch_size for one
(the world size's product is zerofit's check, `user_json.check_batch`).
"""

from __future__ import annotations

import contextlib
import copy
import difflib
import inspect
import logging
import re
import sys
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from zerofit.backends.deepspeed.json_paths import AUTO, MISSING, get, leaves, shown
from zerofit.config import Config
from zerofit.errors import UserError

SECTIONS = {  # DeepSpeed's model (a validation error's title) -> its object in the JSON
    "DeepSpeedZeroConfig": "zero_optimization",
    "DeepSpeedFP16Config": "fp16",
    "DeepSpeedBF16Config": "bf16",
    "DeepSpeedMonitorConfig": "",
    "CommsLoggerConfig": "comms_logger",
    "CompileConfig": "compile",
    "DeepSpeedThroughputTimerConfig": "timers.throughput",
    "TPTrainingConfig": "tensor_parallel",
    "HybridEngineConfig": "hybrid_engine",
}
MODEL_MODULES = (  # where DeepSpeed's config models live (for a misspelled key's closest name)
    "deepspeed.runtime.config",
    "deepspeed.runtime.zero.config",
    "deepspeed.runtime.precision_config",
    "deepspeed.monitor.config",
    "deepspeed.comm.config",
)
POPPED = {"torch_adam", "adam_w_mode", "fp32_optimizer_states"}  # DeepSpeed takes these out
PASSED = {"self", "params", "model_params", "adamw_mode"}  # DeepSpeed gives these itself


def validate(cfg: Config, ds: dict[str, Any], file: str) -> list[str]:
    """UserError (one line) where DeepSpeed would refuse `ds`; else its warnings, as notes."""
    try:
        import deepspeed  # optional: deepspeed (check_installed names it when missing)
        from deepspeed.runtime.config import DeepSpeedConfig  # optional: deepspeed
    except ImportError:
        return []
    probe = copy.deepcopy(ds)
    probe["train_batch_size"] = cfg.train.micro_batch_size * cfg.train.grad_accum_steps
    with _deepspeed_log() as said:
        try:
            DeepSpeedConfig(probe)
        except ValidationError as e:
            raise UserError(_pydantic_line(e, ds, file, deepspeed.__version__)) from None
        except (AssertionError, ValueError, TypeError, KeyError, AttributeError) as e:
            why = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise UserError(
                f"{file}: DeepSpeed {deepspeed.__version__} refuses it: {why}"
            ) from None
    check_auto_keys(ds, file, deepspeed.__version__)
    check_optimizer_params(ds, file)
    unread = unread_top_keys(ds, file, deepspeed.__version__, _source_names(deepspeed.__file__))
    return [f"{file}: DeepSpeed says: {line}" for line in dict.fromkeys(said)] + unread


def _source_names(init_file: str) -> set[str]:
    """Every snake_case string literal in DeepSpeed's source: a superset of the top-level keys
    its config reads (it has no model of the top level), in which a misspelled key is absent."""
    names: set[str] = set()
    for path in Path(init_file).parent.rglob("*.py"):
        names.update(re.findall(r"[\"']([a-z][a-z0-9_]*)[\"']", path.read_text(errors="ignore")))
    return names


def unread_top_keys(ds: dict[str, Any], file: str, version: str, known: set[str]) -> list[str]:
    """A top-level key DeepSpeed never reads: refused where it is close to one it does (a
    misspelling would be ignored in silence), else a note that DeepSpeed ignores it."""
    notes = []
    for key in ds:
        if key in known:
            continue
        close = difflib.get_close_matches(key, known, n=1, cutoff=0.85)
        if close:
            raise UserError(
                f"{key} in {file}: DeepSpeed {version} reads no such key and would ignore it "
                f"(did you mean {close[0]}?)"
            )
        notes.append(f"{file}: {key} is no key DeepSpeed {version} reads; it is ignored")
    return notes


def check_auto_keys(ds: dict[str, Any], file: str, version: str) -> None:
    """A key left "auto" must still be one DeepSpeed knows: its models drop every "auto" value
    before they check names, so a misspelled key set to "auto" would pass unread."""
    titles = {section: title for title, section in SECTIONS.items() if section}
    for path, value in leaves(ds):
        if value != AUTO:
            continue
        parts = path.split(".")
        for n in range(len(parts) - 1, 0, -1):  # the longest section holding this key
            title = titles.get(".".join(parts[:n]))
            if title is None:
                continue
            names = _names_at(title, parts[n:-1])
            if names and parts[-1] not in names:
                close = difflib.get_close_matches(parts[-1], names, n=1, cutoff=0.6)
                hint = f" (did you mean {close[0]}?)" if close else ""
                raise UserError(
                    f'{path}="auto" in {file}: DeepSpeed {version} has no such key{hint}'
                )
            break


@contextlib.contextmanager
def _deepspeed_log() -> Iterator[list[str]]:
    """DeepSpeed's warnings while it parses, kept (not printed on the launcher's stdout)."""
    said: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.levelno >= logging.WARNING:
                said.append(" ".join(record.getMessage().split()))

    logger = logging.getLogger("DeepSpeed")
    handlers, logger.handlers = logger.handlers, [Keep()]
    try:
        yield said
    finally:
        logger.handlers = handlers


def _pydantic_line(e: Any, ds: dict[str, Any], file: str, version: str) -> str:
    err = e.errors(include_url=False)[0]
    loc = [str(part) for part in err["loc"]]
    section = SECTIONS.get(e.title, e.title)
    key = ".".join([section, *loc] if section else loc)
    value = get(ds, key)
    said = "" if value is MISSING else f"={shown(value)}"
    if err["type"] == "extra_forbidden":
        close = difflib.get_close_matches(loc[-1], _names_at(e.title, loc[:-1]), n=1, cutoff=0.6)
        hint = f" (did you mean {close[0]}?)" if close else ""
        return f"{key}{said} in {file}: DeepSpeed {version} has no such key{hint}"
    return f"{key}{said} in {file}: {err['msg']} (DeepSpeed {version})"


def _names_at(title: str, loc: list[str]) -> list[str]:
    """The keys DeepSpeed's model `title` takes at `loc` inside it (names and aliases)."""
    cls = _model(title)
    for part in loc:
        found = cls.model_fields.get(part) if cls is not None else None
        models = [t for t in _types(found.annotation) if _is_model(t)] if found else []
        cls = models[0] if models else None
    if cls is None:
        return []
    fields = cls.model_fields
    return [*fields, *(f.alias for f in fields.values() if f.alias)]


def _model(title: str) -> type[BaseModel] | None:
    for module in MODEL_MODULES:  # imported already, by DeepSpeedConfig
        cls = getattr(sys.modules.get(module), title, None)
        if _is_model(cls):
            return cls
    return None


def _types(annotation: Any) -> list[Any]:
    args = typing.get_args(annotation)
    return [annotation] if not args else [t for a in args for t in _types(a)]


def _is_model(t: Any) -> bool:
    return inspect.isclass(t) and issubclass(t, BaseModel)


def check_optimizer_params(ds: dict[str, Any], file: str) -> None:
    """Each key of optimizer.params must be an argument of the Adam DeepSpeed will build."""
    block = ds.get("optimizer")
    params = block.get("params") if isinstance(block, dict) else None
    if not isinstance(params, dict):
        return
    if "max_grad_norm" in params:
        raise UserError(
            f"optimizer.params.max_grad_norm in {file}: DeepSpeed clips gradients with "
            "gradient_clipping (a top-level key); move it there"
        )
    name, cls = _adam_class(ds, params)
    takes = (set(inspect.signature(cls.__init__).parameters) - PASSED) | POPPED
    unknown = [key for key in params if key not in takes]
    if unknown:
        raise UserError(
            f"optimizer.params.{unknown[0]} in {file}: DeepSpeed's {name} takes no such "
            f"argument (it takes {', '.join(sorted(takes))})"
        )


def _adam_class(ds: dict[str, Any], params: dict[str, Any]) -> tuple[str, type]:
    """The Adam class DeepSpeed builds for this JSON (its name, the class)."""
    if params.get("torch_adam"):
        import torch  # optional path: only a JSON that asks for torch's Adam gets here

        adamw = str(ds["optimizer"].get("type", "")).lower() == "adamw"
        adamw = adamw or params.get("adam_w_mode", True)
        return (
            ("torch.optim.AdamW", torch.optim.AdamW)
            if adamw
            else ("torch.optim.Adam", torch.optim.Adam)
        )
    device = get(ds, "zero_optimization.offload_optimizer.device")
    from deepspeed.ops.adam import DeepSpeedCPUAdam, FusedAdam  # optional: deepspeed

    if device in ("cpu", "nvme"):
        return "DeepSpeedCPUAdam", DeepSpeedCPUAdam
    return "FusedAdam", FusedAdam

"""The optional packages a config asks for, checked before any worker starts.

A run that needs a package it does not have must stop at once with one line that says which
setting needs it and how to install it, not in a worker's traceback minutes later. `needs` lists
each package the resolved config asks for, with the setting and the pip extra; `check_installed`
looks each up (`importlib.util.find_spec`: nothing is imported) and raises a UserError for the
first one missing. A new optional dependency belongs in `needs`.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass

from zerofit.backends import get_engine
from zerofit.config import Config
from zerofit.errors import UserError


@dataclass(frozen=True)
class Need:
    module: str  # the importable name
    setting: str  # what in the config asks for it
    install: str  # what to run to get it


def _extra(name: str) -> str:
    return f"pip install 'zerofit[{name}]'"


def needs(cfg: Config) -> list[Need]:
    """The optional packages `cfg` (resolved: its engine chosen) needs, in the order checked."""
    out = []
    if cfg.model.hf:
        out.append(Need("transformers", "model.hf", _extra("hf")))
    library = get_engine(cfg.parallel.backend).library
    if library:
        out.append(Need(library, f"parallel.backend: {cfg.parallel.backend}", _extra(library)))
    if cfg.precision.fp8 != "none":
        out.append(Need("torchao", f"precision.fp8: {cfg.precision.fp8}", _extra("fp8")))
    if cfg.model.lora.quantize != "none":
        setting = f"model.lora.quantize: {cfg.model.lora.quantize}"
        out.append(Need("torchao", setting, _extra("qlora")))
    if cfg.log.tensorboard:
        out.append(Need("tensorboard", "log.tensorboard: true", _extra("tensorboard")))
    sources = cfg.data.source if isinstance(cfg.data.source, list) else [cfg.data.source]
    if any(str(s).endswith(".parquet") for s in sources if s):
        out.append(Need("pyarrow", "data.source (a .parquet file)", "pip install pyarrow"))
    return out


def installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package missing, or a broken module entry
        return False


def check_installed(cfg: Config) -> None:
    """UserError naming the setting and the install command of the first package `cfg` needs
    that is not installed here."""
    for need in needs(cfg):
        if not installed(need.module):
            raise UserError(
                f"{need.setting} needs the {need.module} package, which is not installed here: "
                f"{need.install}"
            )

"""One entry point for models: ``build_model(preset=... | hf=...) -> ModelSpec``.

The module in a ``ModelSpec`` has its parameters on the meta device (buffers real); the trainer
shards it, materialises it (``meta.allocate_`` keeps buffers) and fills each parameter with
``init_param_`` (``zerofit.models.init``) or ``weights``. Parameter counts and FLOPs per token come
from ``shape``, a ``zerofit.models.shape.ModelShape``.

Importing this package does not import torch: the planner, `zerofit plan` and the launcher read
shapes and presets only; ``build_model`` and ``ModelSpec`` load ``zerofit.models.build`` (and
torch) on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from zerofit.models.presets import PRESETS, LlamaArgs
from zerofit.models.shape import ModelShape

if TYPE_CHECKING:
    from zerofit.models.build import ModelSpec, build_model

__all__ = ["PRESETS", "LlamaArgs", "ModelShape", "ModelSpec", "build_model", "preset_names"]
_BUILD = ("ModelSpec", "build_model")


def preset_names() -> list[str]:
    return list(PRESETS)


def __getattr__(name: str) -> Any:
    if name in _BUILD:
        from zerofit.models import build  # torch-free path: `zerofit plan` imports this package

        return getattr(build, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

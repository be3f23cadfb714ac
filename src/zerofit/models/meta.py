"""Build modules with parameters on the meta device while buffers stay real.

``meta_params()`` lets us build a 70B model's structure in milliseconds without memory; buffers
(e.g. Hugging Face rotary ``inv_freq``) are small and often computed in ``__init__`` and never saved,
so they are kept on CPU with their real values.

Beware: ``nn.Module.to_empty()`` replaces buffers too (with uninitialised memory). Use
``allocate_()`` below, or copy the buffers back yourself, after ``to_empty``.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn


@contextmanager
def meta_params() -> Iterator[None]:
    """While active, every parameter registered on any module is moved to the meta device.

    The Parameter class, its ``requires_grad`` and any attributes in its ``__dict__`` are kept.
    Buffers are untouched (they stay where they were created, normally CPU).
    """
    original = nn.Module.register_parameter

    def register_on_meta(self: nn.Module, name: str, param: nn.Parameter | None) -> None:
        original(self, name, param)
        if param is None or param.device.type == "meta":
            return
        cls = type(param)
        moved = cls(param.detach().to("meta"), requires_grad=param.requires_grad)
        moved.__dict__.update(param.__dict__)
        self._parameters[name] = moved

    nn.Module.register_parameter = register_on_meta  # type: ignore[method-assign]
    try:
        yield
    finally:
        nn.Module.register_parameter = original  # type: ignore[method-assign]


def snapshot_buffers(module: nn.Module) -> dict[str, torch.Tensor]:
    """Copies of all buffers (by name) that are not on the meta device."""
    return {
        name: buf.detach().clone()
        for name, buf in module.named_buffers()
        if buf is not None and buf.device.type != "meta"
    }


@torch.no_grad()
def restore_buffers_(module: nn.Module, saved: dict[str, torch.Tensor]) -> None:
    """Copy ``saved`` (from ``snapshot_buffers``) back into the module's buffers, in place."""
    buffers = dict(module.named_buffers())
    for name, value in saved.items():
        if name in buffers:
            buffers[name].copy_(value.to(buffers[name].device))


def allocate_(module: nn.Module, device: torch.device | str) -> nn.Module:
    """``to_empty(device)`` that keeps buffer values. Parameters are left uninitialised."""
    saved = snapshot_buffers(module)
    module.to_empty(device=device)
    restore_buffers_(module, saved)
    return module

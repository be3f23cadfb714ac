"""Build modules with parameters on the meta device while buffers stay real.

``meta_params()`` lets us build a 70B model's structure in milliseconds without memory; buffers
(e.g. Hugging Face rotary ``inv_freq``) are small and often computed in ``__init__`` and never saved,
so they are kept on CPU with their real values. Initialisers that a module's ``__init__`` runs on
its parameters do nothing there (a meta tensor holds no values; the real ones come from
``ModelSpec.init_param_`` when the parameters are allocated).

Beware: ``nn.Module.to_empty()`` replaces buffers too (with uninitialised memory). Use
``allocate_()`` below, or copy the buffers back yourself, after ``to_empty``.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn
from torch.overrides import TorchFunctionMode


class _SkipMetaInit(TorchFunctionMode):
    """``nn.init.*_`` and ``Tensor.normal_`` on a meta tensor return it as it is: there is nothing
    to fill. Run, the meta kernel of ``normal_`` is a Python reference whose first call imports
    torch._dynamo (~0.5 s of every process that builds a model: the launcher and each worker)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        kwargs = kwargs or {}
        target = args[0] if args else kwargs.get("tensor")
        if isinstance(target, torch.Tensor) and target.is_meta and _is_init(func):
            return target
        return func(*args, **kwargs)


def _is_init(func: object) -> bool:
    """An in-place initialiser: ``Tensor.normal_``, or one of ``torch.nn.init``'s (``normal_``,
    ``kaiming_uniform_``, ...), which hand themselves to a torch function mode whole."""
    if func is torch.Tensor.normal_:
        return True
    name = getattr(func, "__name__", "")
    return getattr(func, "__module__", None) == nn.init.__name__ and name.endswith("_")


@contextmanager
def meta_params() -> Iterator[None]:
    """While active, every parameter registered on any module is moved to the meta device.

    The Parameter class, its ``requires_grad`` and any attributes in its ``__dict__`` are kept.
    Buffers are untouched (they stay where they were created, normally CPU). Initialisers run on
    a meta parameter do nothing (``_SkipMetaInit``).
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
        with _SkipMetaInit():
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


def _shared_params(module: nn.Module) -> list[list[tuple[nn.Module, str]]]:
    """The (module, attribute) places of each parameter held in more than one place (a tied head)."""
    places: dict[int, list[tuple[nn.Module, str]]] = {}
    for sub in module.modules():
        for name, param in sub._parameters.items():
            if param is not None:
                places.setdefault(id(param), []).append((sub, name))
    return [group for group in places.values() if len(group) > 1]


def allocate_(module: nn.Module, device: torch.device | str) -> nn.Module:
    """``to_empty(device)`` that keeps buffer values and tied parameters tied (``to_empty``
    replaces each module's parameters on its own). Parameters are left uninitialised."""
    saved = snapshot_buffers(module)
    shared = _shared_params(module)
    module.to_empty(device=device)
    for (owner, name), *others in shared:
        for sub, attr in others:
            sub._parameters[attr] = owner._parameters[name]
    restore_buffers_(module, saved)
    return module

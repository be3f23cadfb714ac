"""Engines behind one interface. Importing this package registers every built-in backend."""

from zerofit.backends import ddp, deepspeed, fsdp  # noqa: F401  (registration side effect)
from zerofit.backends.base import Backend, get_backend, register, registry


def backend_names() -> list[str]:
    return sorted(registry())


__all__ = ["Backend", "backend_names", "get_backend", "register", "registry"]

"""Warnings torchao logs about itself on import, dropped wherever it is imported from.

torchao (the `fp8` extra, `precision.fp8`) is imported by zerofit's fp8 path and also by
transformers whenever it is installed. On import it logs a warning for each optional compiled
kernel library that does not load against this torch (a CPU build loads none: they are CUDA
kernels, and float8 training does not use them), and newer torch logs a deprecation notice for
each Enum torchao registers with pytree. Neither says anything about the run, and a one-line error
must stay one line, so `install` filters exactly those records (installed when zerofit is
imported; no torch here). Every other record of those loggers passes.
"""

from __future__ import annotations

import logging

LOGGERS = ("torchao", "torch.utils._pytree")
_PYTREE_NOTICE = "is now natively supported by torch.compile as an opaque value type"


class _TorchaoImportNoise(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        msg = str(record.msg)  # the format string: the file or Enum is in the arguments
        if record.name == "torchao" and msg.startswith("Failed to load "):
            return False
        return _PYTREE_NOTICE not in msg


_FILTER = _TorchaoImportNoise()


def install() -> None:
    """Attach the filter to torchao's and torch's pytree loggers (idempotent)."""
    for name in LOGGERS:
        logger = logging.getLogger(name)
        if _FILTER not in logger.filters:
            logger.addFilter(_FILTER)

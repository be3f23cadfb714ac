"""DeepSpeed's Muon optimizer module, imported without compiling at import time.

DeepSpeed 0.19 imports `deepspeed.runtime.zero.muon.muon_optimizer` in the constructor of every
ZeRO optimizer (stages 1-3, and its bf16 optimizer), Muon or not. That module's `original_muon`
wraps a function in `torch.compile` when it is imported (`@compiler.compile()`), and
`torch.compile` imports Inductor to read its configuration: about 2.2 s of CPU time a rank before
the first step, on every DeepSpeed run (measured with py-spy on this project's CPU machine, a
two-rank ZeRO-3 run). zerofit trains with Adam or AdamW only (`user_blocks` refuses any other
optimizer), so Muon never runs here.

`import_muon_lazily` imports the two modules once, before `deepspeed.initialize`, with DeepSpeed's
`compiler.compile` swapped for a decorator that compiles on the function's first call. Muon
keeps working if it is ever called; a DeepSpeed without those names is left alone.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any

MUON = "deepspeed.runtime.zero.muon.muon_optimizer"


def _compile_on_first_call(func: Callable) -> Callable:
    """`torch.compile(func)`, built when the function is first called, not when it is defined."""
    compiled: list[Callable] = []

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if not compiled:
            import torch  # here: the wrapper runs only inside a torch process

            compiled.append(torch.compile(func))
        return compiled[0](*args, **kwargs)

    return wrapper


def import_muon_lazily() -> bool:
    """Import DeepSpeed's Muon modules with compilation deferred to their first call. Returns
    whether this call imported them (False: imported already, or this DeepSpeed has none)."""
    if MUON in sys.modules:
        return False
    try:
        from deepspeed.runtime import compiler  # optional: the deepspeed extra
    except ImportError:
        return False
    saved = getattr(compiler, "compile", None)
    if saved is None:
        return False
    compiler.compile = lambda: _compile_on_first_call
    try:
        import deepspeed.runtime.zero.muon.muon_optimizer  # noqa: F401 - optional: imported, not used
    except ImportError:
        return False
    finally:
        compiler.compile = saved
    return True

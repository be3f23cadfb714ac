"""Third-party noise kept out of a run's output, each filter narrowed to one message of one library.

A one-line error must stay one line, and a run's first lines say what the run is; neither has room
for what a library says about itself. Each filter here names the library (its logger, the call
zerofit makes) and the message; everything else those libraries say still passes.

- torchao (the `fp8` extra, imported by zerofit's fp8 path and by transformers whenever it is
  installed) logs "Failed to load ..." for each optional compiled kernel library that does not load
  against this torch (a CPU build loads none: they are CUDA kernels that float8 training does not
  use), and newer torch logs a deprecation notice for each Enum torchao registers with pytree.
  Where torchao was installed without bytecode (`pip install --no-compile`), Python 3.12 compiles
  its sources on import and warns about an invalid escape sequence in one of its docstrings.
- DeepSpeed logs, on every rank, that it fell back to its CPU accelerator, and prints, on every
  rank, that it built its shared-memory collective op. zerofit says which accelerator DeepSpeed
  runs on once, on rank 0 (`engine_line`).
- torch's weights-only unpickler warns that a file's pickle protocol (4, Python's default, which
  `torch.save` of older torch and of transformers writes) is not the one it writes itself (2),
  before it reads it with the allowlist anyway (`weights_only_load`).
- torch's DCP warns, on every single-process read (the launcher checking a checkpoint, `zerofit
  export`), that it is reading in a single process: that is what zerofit asked for (`no_dist=True`).

`install` runs when zerofit is imported (no torch here), before anything imports those libraries.
"""

from __future__ import annotations

import contextlib
import io
import logging
import re
import sys
import warnings
from collections.abc import Iterator
from typing import TextIO

_PYTREE_NOTICE = "is now natively supported by torch.compile as an opaque value type"
_DS_CPU_FALLBACK = "Setting accelerator to CPU"
_DS_BUILT = re.compile(r"^DeepSpeed \S+ built successfully$")
_DCP_SINGLE = "torch.distributed is disabled, unavailable or uninitialized"
_PICKLE_PROTOCOL = "Detected pickle protocol"


class _LibraryNoise(logging.Filter):
    """Drops exactly the records described in the module docstring."""

    def filter(self, record: logging.LogRecord) -> bool:
        msg = str(record.msg)  # the format string: the file or Enum is in the arguments
        if record.name == "torchao" and msg.startswith("Failed to load "):
            return False
        if record.name == "DeepSpeed" and record.module == "real_accelerator":
            return not msg.startswith(_DS_CPU_FALLBACK)
        return _PYTREE_NOTICE not in msg


_FILTER = _LibraryNoise()
TORCHAO_SOURCES = r".*[/\\]torchao[/\\]"
LOGGERS = ("torchao", "torch.utils._pytree", "DeepSpeed")


def install() -> None:
    """Attach the filter to the loggers above (idempotent). DeepSpeed's logger keeps it: DeepSpeed
    configures the same `logging.getLogger("DeepSpeed")` object when it is imported."""
    for name in LOGGERS:
        logger = logging.getLogger(name)
        if _FILTER not in logger.filters:
            logger.addFilter(_FILTER)
    # a compile-time warning names the source file as its module
    warnings.filterwarnings("ignore", category=SyntaxWarning, module=TORCHAO_SOURCES)


class _DropLines(io.TextIOBase):
    """A stdout that drops whole lines matching `pattern` and passes everything else."""

    def __init__(self, out: io.TextIOBase, pattern: re.Pattern[str]) -> None:
        self.out, self.pattern, self.pending = out, pattern, ""

    def write(self, text: str) -> int:
        self.pending += text
        *lines, self.pending = self.pending.split("\n")
        for line in lines:
            if not self.pattern.match(line):
                self.out.write(line + "\n")
        return len(text)

    def flush(self) -> None:
        self.out.flush()

    def close_pending(self) -> None:
        if self.pending and not self.pattern.match(self.pending):
            self.out.write(self.pending)
        self.pending = ""


@contextlib.contextmanager
def deepspeed_setup() -> Iterator[None]:
    """Around `deepspeed.initialize`: its per-rank "built successfully" print is dropped."""
    out = _DropLines(sys.stdout, _DS_BUILT)  # type: ignore[arg-type]
    with contextlib.redirect_stdout(out):  # type: ignore[type-var]
        try:
            yield
        finally:
            out.close_pending()


@contextlib.contextmanager
def data_output() -> Iterator[TextIO]:
    """Around a command whose stdout is data (`ds-config`, `config show`/`schema`, `plan --json`):
    whatever runs inside and prints to stdout goes to stderr instead (a library's log handler made
    while it is imported binds to the stdout of that moment, as DeepSpeed's does; a stray print).
    The command writes its data to the stream this yields: the real stdout."""
    real = sys.stdout
    with contextlib.redirect_stdout(sys.stderr):
        yield real


@contextlib.contextmanager
def single_process_dcp() -> Iterator[None]:
    """Around a DCP read zerofit makes in one process on purpose (`no_dist=True`)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_DCP_SINGLE, category=UserWarning)
        yield


@contextlib.contextmanager
def weights_only_load() -> Iterator[None]:
    """Around a `torch.load(weights_only=True)` zerofit makes: the protocol notice is dropped."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_PICKLE_PROTOCOL, category=UserWarning)
        yield

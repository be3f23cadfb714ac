"""Fault injection for tests/test_faults.py, loaded into every zerofit process of a test run by
putting this directory first on PYTHONPATH. Nothing here is part of zerofit.

ZEROFIT_TEST_NAN_AT=K: the K-th training forward pass (1-based, per process) returns a NaN loss.
ZEROFIT_TEST_ENOSPC=NAME: opening any file for writing under a directory called NAME fails with
ENOSPC, as a full disk would.
"""

import errno
import os

_nan_at = int(os.environ.get("ZEROFIT_TEST_NAN_AT", "0") or 0)
_enospc = os.environ.get("ZEROFIT_TEST_ENOSPC", "")

if _nan_at:
    from zerofit.models import llama

    _forward = llama.Llama.forward
    _calls = [0]

    def forward(self, tokens, targets=None):  # noqa: ANN001, ANN202
        out = _forward(self, tokens, targets)
        if targets is not None and self.training:
            _calls[0] += 1
            if _calls[0] == _nan_at:
                out = out * float("nan")
        return out

    llama.Llama.forward = forward

if _enospc:
    import builtins
    import io

    _open = io.open

    def failing_open(file, mode="r", *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        named = not isinstance(file, int)  # open(fd) as well: multiprocessing's pipes
        if named and any(m in mode for m in "wax+") and f"/{_enospc}/" in os.fspath(file):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), os.fspath(file))
        return _open(file, mode, *args, **kwargs)

    io.open = failing_open
    builtins.open = failing_open

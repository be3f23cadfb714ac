"""The exceptions that end a run with one line instead of a traceback.

`UserError`: bad input (file, config, flags); exit 2. `RunStopped`: the run stopped on purpose
(a signal, non-finite values, a failed save) after doing what it could to keep the work; its
`code` is the exit status, its message the one line the user sees.
"""


class UserError(Exception):
    """A problem with what the user gave us (file, config, flags). Never a bug in zerofit."""


class UnsafeCheckpointError(UserError):
    """A checkpoint file that is damaged or asks to run code: refused before anything ran
    (``zerofit.checkpoint.safe_load``)."""


class RunStopped(Exception):
    """The run stopped deliberately; ``str(e)`` is the line to print, ``code`` the exit status.

    ``kind`` says why: "signal" (preemption), "nonfinite" (NaN/inf loss or gradients) or "io"
    (a file could not be written)."""

    def __init__(self, message: str, code: int, kind: str) -> None:
        super().__init__(message)
        self.code = code
        self.kind = kind


# Exit statuses beyond 0 (done), 1 (a crash) and 2 (bad input): 128 + signal number for a
# preemption, as a shell reports a process killed by it (143 SIGTERM, 130 SIGINT).
EXIT_NONFINITE = 3
EXIT_IO = 4

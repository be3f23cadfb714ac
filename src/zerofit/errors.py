"""The exceptions that end a run with one line instead of a traceback.

`UserError`: bad input (file, config, flags); exit 2. `RunStopped`: the run stopped on purpose
(a signal, non-finite values, a failed save) after doing what it could to keep the work; its
`code` is the exit status, its message the one line the user sees. `DamagedFile`: one checkpoint
file that could not be read or was refused, named relative to its checkpoint in one short line.
"""

from pathlib import Path

LINE_CHARS = 200  # a damage line's length, its paths allowing


class UserError(Exception):
    """A problem with what the user gave us (file, config, flags). Never a bug in zerofit."""


class UnsafeCheckpointError(UserError):
    """A checkpoint file that is damaged or asks to run code: refused before anything ran
    (``zerofit.checkpoint.safe_load``)."""


class DamagedFile(UnsafeCheckpointError):
    """One checkpoint file that is damaged or refused: ``path``, and ``reason``, what is wrong with
    it ("could not be read: ...", "refused: ..."); a loader's own message is cut to its first
    sentence. ``line(ckpt)`` is the line naming it relative to its checkpoint."""

    def __init__(self, path: str | Path, reason: str) -> None:
        super().__init__(str(path), reason)  # both in args: it pickles (DCP gathers errors)
        self.path, self.reason = Path(path), reason

    def __str__(self) -> str:
        return one_line(f"{self.path} ", self.reason)

    def line(self, ckpt: Path) -> str:
        try:
            rel = self.path.relative_to(ckpt).as_posix()
        except ValueError:
            rel = str(self.path)
        return one_line(f"checkpoint {ckpt}: {rel} ", self.reason)


def one_line(head: str, reason: str) -> str:
    """``head`` + the first line and sentence of ``reason``, cut to about LINE_CHARS in all (the
    reason keeps 80 characters whatever the length of ``head``)."""
    text = " ".join(reason.split()).split(". ")[0]
    room = max(LINE_CHARS - len(head), 80)
    return head + (text if len(text) <= room else text[: room - 3] + "...")


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

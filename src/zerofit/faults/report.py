"""How a run's end reaches the user as one line.

Each worker that stops or fails leaves a small JSON record (`rank{r}.json`) in the launcher's
error directory: its kind, exit code and line. When the workers are gone, the launcher picks the
root cause among the records and the exit statuses and prints that one line:
bad input, then non-finite values and failed writes, then a rank killed by a signal (host OOM
for SIGKILL, with the host's RAM figures), then a crash; a rank that only lost its peers is the
last resort, since it is a consequence of another rank's failure.
"""

from __future__ import annotations

import errno
import json
import signal
from dataclasses import dataclass
from pathlib import Path

from zerofit.faults.signals import signal_name

# Root causes first; "peer" (a collective failed because another rank went away) and "signal"
# (a worker asked to stop by the agent tearing the group down) are consequences.
PRIORITY = ("user", "nonfinite", "io", "crash", "signal", "peer")

# Messages of errors a rank gets when another rank died under it.
PEER_MARKERS = (
    "connection closed by peer",
    "connection reset by peer",
    "broken pipe",
    "socket closed",
    "read error",
    "communicator was aborted",
    "process group shut down",
)


@dataclass
class Record:
    rank: int
    kind: str
    code: int
    line: str


def write_record(error_dir: str | Path, rank: int, kind: str, code: int, line: str) -> None:
    path = Path(error_dir, f"rank{rank}.json")
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"kind": kind, "code": code, "line": line}))
    tmp.replace(path)


def read_records(error_dir: Path) -> dict[int, Record]:
    out = {}
    for f in error_dir.glob("rank*.json"):
        try:
            rank = int(f.stem[4:])
            d = json.loads(f.read_text(errors="replace"))
            out[rank] = Record(rank, str(d["kind"]), int(d["code"]), str(d["line"]))
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return out


def clear_records(error_dir: str | Path, rank: int) -> None:
    Path(error_dir, f"rank{rank}.json").unlink(missing_ok=True)


def is_peer_failure(exc: BaseException) -> bool:
    """An error a rank sees because a peer went away (not its own fault)."""
    try:
        # torch-free path: `zerofit plan` imports this module (commands.train -> train.worker)
        from torch.distributed import DistError
    except ImportError:  # pragma: no cover - torch always has it here
        DistError = ()  # type: ignore[assignment,misc] # noqa: N806
    text = str(exc).lower()
    return isinstance(exc, DistError) or any(m in text for m in PEER_MARKERS)


def host_memory() -> str:
    """'this host has 23.4 GiB of RAM, 1.2 GiB available now' (plus a cgroup limit if set)."""
    info = {}
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            key, value = line.split(":", 1)
            info[key] = int(value.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        return "host memory unknown"
    gib = 2**30
    text = f"this host has {info.get('MemTotal', 0) / gib:.1f} GiB of RAM"
    if "MemAvailable" in info:
        text += f", {info['MemAvailable'] / gib:.1f} GiB available now"
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if limit.isdigit() and int(limit) < info.get("MemTotal", 0):
            text += f"; this container may use {int(limit) / gib:.1f} GiB"
    except OSError:
        pass
    return text


def death_line(rank: int, code: int) -> str:
    """A rank that ended without a record: killed by a signal, or an exit status."""
    if code < 0:
        name = signal_name(-code)
        why = ""
        if -code == signal.SIGKILL:
            why = (
                f": likely the host's out-of-memory killer, or a kill -9 ({host_memory()}; "
                f"`dmesg` lists OOM kills); a rank killed this way prints nothing"
            )
        elif -code in (signal.SIGSEGV, signal.SIGBUS, signal.SIGABRT):
            why = " (a crash in native code: a driver, NCCL or a compiled kernel)"
        return f"rank {rank} was killed by {name}{why}"
    return f"rank {rank} exited with status {code} without reporting an error"


def launcher_line(
    records: dict[int, Record], codes: dict[int, int], resume_hint: str
) -> tuple[str, int]:
    """The one line (without 'error: ') and exit status for workers that failed. ``codes``: the
    exit status of each failed rank (negative: killed by that signal)."""
    by_kind = {
        k: [r for r in sorted(records.values(), key=lambda r: r.rank) if r.kind == k]
        for k in PRIORITY
    }
    for kind in PRIORITY[:3]:
        if by_kind[kind]:
            return _one(by_kind[kind]), by_kind[kind][0].code
    killed = sorted(
        (r, c) for r, c in codes.items() if c < 0 and -c != signal.SIGTERM and r not in records
    )
    if killed:
        return f"{death_line(*killed[0])}. {resume_hint}", 1
    for kind in PRIORITY[3:]:
        if by_kind[kind]:
            rec = by_kind[kind][0]
            return f"{_one(by_kind[kind])}. {resume_hint}", 1 if kind != "signal" else rec.code
    silent = sorted((r, c) for r, c in codes.items() if r not in records)
    if silent:
        return f"{death_line(*silent[0])}. {resume_hint}", 1
    return f"training failed. {resume_hint}", 1


def _one(recs: list[Record]) -> str:
    """The message once when every rank agrees, else the lowest rank's, naming it."""
    if len({r.line for r in recs}) == 1:
        return recs[0].line
    return f"(rank {recs[0].rank}) {recs[0].line}"


def find_os_error(exc: BaseException) -> OSError | None:
    """The OSError behind ``exc``: itself, its cause or context, or (DCP's CheckpointException)
    one of the per-rank failures it carries."""
    seen: set[int] = set()
    todo: list[object] = [exc]
    while todo:
        e = todo.pop(0)
        if isinstance(e, tuple):
            todo.extend(e)
            continue
        if not isinstance(e, BaseException) or id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, OSError) and (e.errno or e.strerror):
            return e
        failures = getattr(e, "failures", None)
        if isinstance(failures, dict):
            todo.extend(failures.values())
        todo.extend([e.__cause__, e.__context__])
    return None


def describe_os_error(exc: BaseException) -> str:
    """'No space left on device (ENOSPC) writing /path/file' for any wrapped OSError."""
    e = find_os_error(exc)
    if e is None:
        return f"{type(exc).__name__}: {str(exc)[:200]}"
    name = errno.errorcode.get(e.errno or 0, f"errno {e.errno}")
    what = e.strerror or str(e)
    where = f" writing {e.filename}" if e.filename else ""
    return f"{what} ({name}){where}"

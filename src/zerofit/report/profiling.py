"""log.profile_steps: a torch profiler trace of the run's last N steps, and where their time went.

`StepProfiler` starts a torch.profiler.profile (CPU, plus CUDA on a GPU) one warm-up step before
the last N steps, so the steps before it (those `zerofit bench` times) run without it; with
log.profile_steps 0 it never imports the profiler and its ranges are no-ops. The trainer marks
each step `zerofit/step` and its phases `zerofit/data`, `zerofit/forward_backward` and
`zerofit/optimizer` (record_function ranges). On CUDA each profiled step ends with a device
synchronize, so that a step's kernels lie within its range. Rank 0 writes
`<run_dir>/profile/rank0.pt.trace.json` (Chrome / Perfetto JSON; `tensorboard --logdir
<run_dir>/profile` opens it in the profiler plugin) and `<run_dir>/profile/summary.json`.

The summary is `analyze` over `events_from_trace(trace)`: plain `Event` records, so the rules are
unit-tested without a profiler. T is the wall time of the profiled steps (the union of their
`zerofit/step` ranges); each share below is a part of T, the five sum to 1.

With device kernels (CUDA), on this rank's device timeline:
- communication: time in which an NCCL kernel (name containing 'nccl') runs;
- optimizer: time in which a kernel launched inside `zerofit/optimizer` runs (its launch, the
  CUDA runtime call of the same correlation id, lies in that range) and no NCCL kernel does, or
  no kernel runs while the host is inside `zerofit/optimizer` (such as a CPU-offloaded Adam);
- compute: time in which any other kernel (memcpy and memset included) runs, and none of the above;
- idle: time in which no kernel runs while the host is inside `zerofit/forward_backward` (launch
  gaps, synchronizations, waits);
- host: time in which no kernel runs while the host is outside both phases (loading batches, the
  loop's own Python): the GPU waits on host-only work.
Top kernels: by total device time within the steps.

Without device kernels (CPU), on the host timeline of every thread together:
- communication: time in which a collective runs (ops named 'c10d::', 'record_param_comms',
  'gloo' or 'nccl', such as the gloo worker threads' 'gloo:all_reduce' ranges);
- optimizer: the rest of the time inside `zerofit/optimizer`;
- compute: the rest of the time in which an op runs inside `zerofit/forward_backward`;
- host: the remainder (loading batches, Python between ops); idle: 0 (there is no device).
Top ops: by self CPU time (an op's time less that of the ops nested in it on its thread).

Both report `comm_overlap`: the share of T in which communication and compute (any other kernel,
or op inside `zerofit/forward_backward`) run at the same time; it is not part of the five.
"""

from __future__ import annotations

import contextlib
import json
import warnings
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

import torch

STEP, PHASE, OP, KERNEL = "step", "phase", "op", "kernel"
STEP_RANGE, DATA, FORWARD_BACKWARD, OPTIMIZER = (
    "zerofit/step",
    "zerofit/data",
    "zerofit/forward_backward",
    "zerofit/optimizer",
)
PARTS_OF = (FORWARD_BACKWARD, OPTIMIZER)  # the phases in which the device is meant to be busy
PARTS = ("compute", "communication", "optimizer", "host", "idle")
COMM_MARKS = ("c10d::", "record_param_comms", "gloo", "nccl")
TRACE_FILE = "rank0.pt.trace.json"


class Event(NamedTuple):
    """One trace event: a step or phase range, a host op, or a device kernel (microseconds)."""

    name: str
    kind: str  # step | phase | op | kernel
    start_us: float
    dur_us: float
    thread: int = 0  # ops: their thread (self time nests within one thread)
    launched_us: float | None = None  # kernels: when the host launched it, if known


Spans = list[tuple[float, float]]


def union(spans: Iterable[tuple[float, float]]) -> Spans:
    """Sorted, disjoint intervals covering the given ones."""
    out: Spans = []
    for s, e in sorted(spans):
        if e <= s:
            continue
        if out and s <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], e))
        else:
            out.append((s, e))
    return out


def intersect(a: Spans, b: Spans) -> Spans:
    """The intersection of two unions."""
    out: Spans = []
    i = j = 0
    while i < len(a) and j < len(b):
        s, e = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if s < e:
            out.append((s, e))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


def subtract(a: Spans, b: Spans) -> Spans:
    """The parts of union `a` outside union `b`."""
    out: Spans = []
    j = 0
    for s, e in a:
        while j < len(b) and b[j][1] <= s:
            j += 1
        k, cur = j, s
        while k < len(b) and b[k][0] < e:
            if b[k][0] > cur:
                out.append((cur, b[k][0]))
            cur = max(cur, b[k][1])
            k += 1
        if cur < e:
            out.append((cur, e))
    return out


def length(spans: Spans) -> float:
    return sum(e - s for s, e in spans)


def is_comm(name: str) -> bool:
    low = name.lower()
    return any(mark in low for mark in COMM_MARKS)


def _spans(events: Iterable[Event]) -> Spans:
    return union((ev.start_us, ev.start_us + ev.dur_us) for ev in events)


def _inside(t: float, spans: Spans) -> bool:
    return any(s <= t <= e for s, e in spans)


def _device_parts(events: list[Event], steps: Spans) -> tuple[dict[str, Spans], float]:
    kernels = [ev for ev in events if ev.kind == KERNEL]
    phase = {p: _spans(ev for ev in events if ev.kind == PHASE and ev.name == p) for p in PARTS_OF}
    comm_k = [ev for ev in kernels if is_comm(ev.name)]
    other = [ev for ev in kernels if not is_comm(ev.name)]
    opt_k = [ev for ev in other if ev.launched_us is not None]
    opt_k = [ev for ev in opt_k if _inside(ev.launched_us or 0.0, phase[OPTIMIZER])]
    comm = intersect(_spans(comm_k), steps)
    opt_busy = subtract(intersect(_spans(opt_k), steps), comm)
    busy = intersect(_spans(kernels), steps)
    compute = subtract(subtract(busy, comm), opt_busy)
    gaps = subtract(steps, busy)
    opt = union([*opt_busy, *intersect(gaps, phase[OPTIMIZER])])
    idle = subtract(intersect(gaps, phase[FORWARD_BACKWARD]), phase[OPTIMIZER])
    host = subtract(subtract(gaps, phase[FORWARD_BACKWARD]), phase[OPTIMIZER])
    overlap = length(intersect(comm, _spans(other)))
    parts = {"compute": compute, "communication": comm, "optimizer": opt}
    return {**parts, "host": host, "idle": idle}, overlap


def _host_parts(events: list[Event], steps: Spans) -> tuple[dict[str, Spans], float]:
    ops = [ev for ev in events if ev.kind == OP]
    phase = {p: _spans(ev for ev in events if ev.kind == PHASE and ev.name == p) for p in PARTS_OF}
    comm = intersect(_spans(ev for ev in ops if is_comm(ev.name)), steps)
    opt = subtract(intersect(phase[OPTIMIZER], steps), comm)
    running = intersect(_spans(ev for ev in ops if not is_comm(ev.name)), phase[FORWARD_BACKWARD])
    running = intersect(running, steps)
    compute = subtract(subtract(running, comm), opt)
    host = subtract(subtract(subtract(steps, comm), opt), compute)
    overlap = length(intersect(comm, running))
    parts = {"compute": compute, "communication": comm, "optimizer": opt}
    return {**parts, "host": host, "idle": []}, overlap


def self_times(ops: list[Event]) -> list[tuple[str, float]]:
    """(name, self time) of each op: its duration less that of the ops directly nested in it on
    its thread."""
    out: list[tuple[str, float]] = []
    by_thread: dict[int, list[Event]] = {}
    for ev in ops:
        by_thread.setdefault(ev.thread, []).append(ev)
    for evs in by_thread.values():
        stack: list[tuple[Event, list[float]]] = []  # (op, [self time so far])
        for ev in sorted(evs, key=lambda e: (e.start_us, -e.dur_us)):
            end = ev.start_us + ev.dur_us
            while stack and stack[-1][0].start_us + stack[-1][0].dur_us < end - 1e-3:
                top, own = stack.pop()
                out.append((top.name, own[0]))
            if stack:
                stack[-1][1][0] -= ev.dur_us
            stack.append((ev, [ev.dur_us]))
        out += [(top.name, own[0]) for top, own in stack]
    return out


def top_table(items: list[tuple[str, float]], top: int) -> list[dict[str, Any]]:
    """Names by total time: calls, total ms and share of all the time listed."""
    totals: dict[str, list[float]] = {}
    for name, us in items:
        entry = totals.setdefault(name, [0, 0.0])
        entry[0] += 1
        entry[1] += max(us, 0.0)
    everything = sum(t for _, t in totals.values()) or 1.0
    ranked = sorted(totals.items(), key=lambda kv: (-kv[1][1], kv[0]))[:top]
    return [
        {"name": name, "calls": int(n), "total_ms": round(us / 1e3, 4), "share": us / everything}
        for name, (n, us) in ranked
    ]


def analyze(events: list[Event], top: int = 10) -> dict[str, Any]:
    """The step-time breakdown and the top kernels (or ops) of the profiled steps. On a GPU also
    the share of the steps in which the host ran an op (``host_busy``: near 1 with an idle device
    means the host is what the step waits on) and the host ops by self time (``top_host``)."""
    steps = _spans(ev for ev in events if ev.kind == STEP)
    wall = length(steps)
    if wall <= 0:
        raise ValueError("the trace holds no zerofit/step range")
    device = any(ev.kind == KERNEL for ev in events)
    parts, overlap = (_device_parts if device else _host_parts)(events, steps)
    kind = KERNEL if device else OP
    mine = [ev for ev in events if ev.kind == kind and _inside(ev.start_us, steps)]
    items = [(ev.name, ev.dur_us) for ev in mine] if device else self_times(mine)
    ms = {p: length(parts[p]) / 1e3 for p in PARTS}
    host = {}
    if device:  # where the host's time went while the device waited or ran: its ops' self time
        ops = [ev for ev in events if ev.kind == OP and _inside(ev.start_us, steps)]
        busy = length(intersect(_spans(ops), steps))
        host = {"host_busy": round(busy / wall, 4), "top_host": top_table(self_times(ops), top)}
    return {
        "device": "cuda" if device else "cpu",
        "steps": sum(ev.kind == STEP for ev in events),
        "wall_ms": wall / 1e3,
        "breakdown": {p: round(ms[p] * 1e3 / wall, 4) for p in PARTS},
        "breakdown_ms": {p: round(v, 3) for p, v in ms.items()},
        "comm_overlap": round(overlap / wall, 4),
        "top_by": "device time" if device else "self CPU time",
        "top": top_table(items, top),
        **host,
    }


def events_from_trace(trace: dict[str, Any]) -> list[Event]:
    """The `Event`s of a Chrome trace written by torch.profiler (export_chrome_trace)."""
    raw = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X" and "dur" in e]
    launches = {
        e["args"]["correlation"]: float(e["ts"])
        for e in raw
        if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})
    }
    out: list[Event] = []
    for e in raw:
        cat, name = e.get("cat", ""), str(e.get("name", ""))
        ts, dur, tid = float(e["ts"]), float(e["dur"]), e.get("tid", 0)
        thread = tid if isinstance(tid, int) else hash(tid)
        if cat in ("kernel", "gpu_memcpy", "gpu_memset"):
            launched = launches.get(e.get("args", {}).get("correlation"))
            out.append(Event(name, KERNEL, ts, dur, thread, launched))
        elif cat == "cpu_op" or (cat == "user_annotation" and is_comm(name)):
            out.append(Event(name, OP, ts, dur, thread))
        elif cat == "user_annotation" and name.startswith("zerofit/"):
            out.append(Event(name, STEP if name == STEP_RANGE else PHASE, ts, dur, thread))
    return out


def summary_line(summary: dict[str, Any]) -> str:
    """'compute 61%, communication 20%, ...'"""
    return ", ".join(f"{p} {summary['breakdown'][p]:.0%}" for p in PARTS)


class StepProfiler:
    """Profiles the last `steps` of the `remaining` steps of this run (after one warm-up step of
    the profiler, when there is room for it); rank 0 writes the trace and summary to `out`.
    `StepProfiler.off()`: no profiler, no ranges."""

    def __init__(self, steps: int, remaining: int, out: Path | None, cuda: bool) -> None:
        self.active = max(0, min(steps, remaining))
        self.warmup = min(1, remaining - self.active)
        self.wait = remaining - self.active - self.warmup
        self.out, self.cuda = out, cuda
        self.count = 0
        self.prof: Any = None
        self.summary: dict[str, Any] | None = None

    @classmethod
    def off(cls) -> StepProfiler:
        return cls(0, 0, None, False)

    def phase(self, name: str) -> contextlib.AbstractContextManager[Any]:
        """A named range in the trace while the profiler runs; otherwise nothing."""
        if self.prof is None:
            return contextlib.nullcontext()
        return torch.profiler.record_function(name)

    @contextlib.contextmanager
    def step(self) -> Iterator[None]:
        """Around one train step: starts the profiler when its turn comes, steps it after."""
        if self.active and self.count == self.wait:
            self._start()
        if self.prof is None:
            yield
            self.count += 1
            return
        try:
            with torch.profiler.record_function(STEP_RANGE):
                yield
                if self.cuda:
                    torch.cuda.synchronize()
        except BaseException:
            self.prof.stop()  # the run ends here: no trace of a partial window
            self.prof = None
            raise
        self.count += 1
        self.prof.step()
        if self.count == self.wait + self.warmup + self.active:
            self.prof.stop()
            self.prof = None

    def _start(self) -> None:
        profiler = torch.profiler
        activities = [profiler.ProfilerActivity.CPU]
        if self.cuda:
            activities.append(profiler.ProfilerActivity.CUDA)
        with warnings.catch_warnings():  # a run too short for the warm-up step is warned of here
            warnings.simplefilter("ignore")
            plan = profiler.schedule(wait=0, warmup=self.warmup, active=self.active, repeat=1)
        self.prof = profiler.profile(
            activities=activities, schedule=plan, on_trace_ready=self._ready
        )
        self.prof.start()

    def _ready(self, prof: Any) -> None:
        if self.out is None:  # not rank 0
            return
        self.out.mkdir(parents=True, exist_ok=True)
        trace = self.out / TRACE_FILE
        prof.export_chrome_trace(str(trace))
        try:
            summary = analyze(events_from_trace(json.loads(trace.read_text())))
        except (ValueError, KeyError, TypeError) as e:
            print(f"warning: profile: no breakdown of {trace}: {e}", flush=True)
            return
        self.summary = {**summary, "trace": TRACE_FILE}
        (self.out / "summary.json").write_text(json.dumps(self.summary, indent=1))
        print(f"profile: {trace} ({summary_line(summary)})", flush=True)

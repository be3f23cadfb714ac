"""Throughput, MFU, memory, and where metrics go (JSONL, TensorBoard, rich progress on rank 0)."""

from __future__ import annotations

import json
import math
import resource
import sys
import time
from pathlib import Path
from typing import Any

import torch

from zerofit.report.rates import PEAK_BF16_FLOPS as PEAK_BF16_FLOPS
from zerofit.report.rates import peak_flops_named, rates


def peak_flops(device: torch.device) -> float | None:
    """Peak dense bf16 FLOP/s of one device, or None (CPU or unknown GPU: MFU is omitted)."""
    if device.type != "cuda":
        return None
    return peak_flops_named(torch.cuda.get_device_name(device))


def host_rss_gib() -> float:
    """This process's peak resident host memory so far, GiB."""
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
    return rss * (1 if sys.platform != "darwin" else 1 / 1024) / 2**20


def memory_stats(device: torch.device) -> dict[str, float]:
    """Peak GPU allocated/reserved GiB, the caching allocator's retries so far (each a cudaMalloc
    that failed, freed the cache and synchronized: a run that slows near the card's limit) and
    peak host RSS (loading is where it peaks); on CPU, peak host RSS GiB as the run's memory."""
    if device.type == "cuda":
        return {
            "mem_alloc_gib": torch.cuda.max_memory_allocated(device) / 2**30,
            "mem_reserved_gib": torch.cuda.max_memory_reserved(device) / 2**30,
            "alloc_retries": torch.cuda.memory_stats(device).get("num_alloc_retries", 0),
            "host_rss_gib": host_rss_gib(),
        }
    return {"mem_rss_gib": host_rss_gib()}


class Throughput:
    """Tokens/s and MFU over a window of steps (wall clock; the caller syncs before reading)."""

    def __init__(
        self, tokens_per_step: int, flops_per_token: float, world_size: int, peak: float | None
    ):
        self.tokens_per_step = tokens_per_step
        self.flops_per_token = flops_per_token
        self.world_size = world_size
        self.peak = peak
        self.reset()

    def reset(self) -> None:
        self.t0 = time.perf_counter()
        self.steps = 0
        self.real: torch.Tensor | None = None
        self.repeated: torch.Tensor | None = None

    def tick(
        self, real_tokens: torch.Tensor | None = None, repeated: torch.Tensor | None = None
    ) -> None:
        """One step; ``real_tokens`` its non-padding tokens where batches are padded;
        ``repeated`` its places that compute what another place does (DPO: each pair's second
        copy of its prompt), counted once: left out of every figure, FLOPs and MFU included."""
        self.steps += 1
        if real_tokens is not None:
            self.real = real_tokens if self.real is None else self.real + real_tokens
        if repeated is not None:
            self.repeated = repeated if self.repeated is None else self.repeated + repeated

    def read(self) -> dict[str, float]:
        dt = max(time.perf_counter() - self.t0, 1e-9)
        repeated = float(self.repeated) if self.repeated is not None else 0.0
        tps = (self.tokens_per_step * self.steps - repeated) / dt
        out = rates(tps, self.flops_per_token, self.world_size, self.peak)
        out["step_time_s"] = dt / max(self.steps, 1)
        if self.real is not None:
            out["real_tokens_per_s"] = float(self.real) / dt
        if self.repeated is not None:
            out["repeated_tokens_per_s"] = repeated / dt
        return out


class StepTimer:
    """Per-step durations with no host sync in the step: CUDA events on GPU, wall clock on CPU.

    `mark()` after each step; `durations()` (which syncs once) gives the time between marks.
    """

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.marks: list[Any] = []

    def mark(self) -> None:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self.marks.append(event)
        else:
            self.marks.append(time.perf_counter())

    def durations(self) -> list[float]:
        pairs = list(zip(self.marks, self.marks[1:], strict=False))
        if self.cuda:
            torch.cuda.synchronize()
            return [a.elapsed_time(b) / 1e3 for a, b in pairs]
        return [b - a for a, b in pairs]


def strict_json(record: dict[str, Any]) -> dict[str, Any]:
    """NaN and inf are not JSON: write them as null, and name them under ``nonfinite``."""
    bad = [k for k, v in record.items() if isinstance(v, float) and not math.isfinite(v)]
    if not bad:
        return record
    return {**{k: (None if k in bad else v) for k, v in record.items()}, "nonfinite": bad}


class MetricsSink:
    """Rank 0 writes metrics.jsonl and (optionally) TensorBoard events into the run directory."""

    def __init__(self, run_dir: Path, jsonl: bool, tensorboard: bool, enabled: bool):
        self.enabled = enabled
        self.file = open(run_dir / "metrics.jsonl", "a") if (enabled and jsonl) else None  # noqa: SIM115
        self.tb = None
        if enabled and tensorboard:
            from torch.utils.tensorboard import SummaryWriter  # optional: tensorboard

            self.tb = SummaryWriter(str(run_dir / "tb"))

    def write(self, record: dict[str, Any]) -> None:
        if self.file:
            self.file.write(json.dumps(strict_json(record), allow_nan=False) + "\n")
            self.file.flush()
        if self.tb:
            step = record["step"]
            for k, v in record.items():
                if k != "step" and isinstance(v, int | float):
                    self.tb.add_scalar(k, v, step)

    def close(self) -> None:
        if self.file:
            self.file.close()
        if self.tb:
            self.tb.close()


def truncate_metrics(run_dir: Path, step: int) -> int:
    """Before resuming at ``step``: keep one record per step in metrics.jsonl by moving records of
    later steps (the abandoned continuation) and unreadable lines to metrics.abandoned.jsonl.
    Returns how many lines moved."""
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return 0
    keep, moved = [], []
    for line in path.read_text(errors="replace").splitlines():
        try:
            later = int(json.loads(line)["step"]) > step
        except (ValueError, KeyError, TypeError):
            later = True
        (moved if later else keep).append(line)
    if moved:
        with open(run_dir / "metrics.abandoned.jsonl", "a") as f:
            f.write("".join(m + "\n" for m in moved))
        tmp = path.with_suffix(".jsonl.tmp")
        tmp.write_text("".join(k + "\n" for k in keep))
        tmp.replace(path)
    return len(moved)

"""NVMe offload in `zerofit plan`: the disk's bandwidth, what a step moves through it, and NVMe
proposed when the GPUs and the host RAM cannot hold the run.

The bytes come from the engine (`Engine.memory`: `Memory.nvme`, the swap files per rank;
`Engine.offload_seconds`: `OffloadTime.disk_read/disk_write`, what a rank moves through the disk
per optimizer step). The node's ranks share one disk, so a step's disk time is the node's bytes
over the node's bandwidth: `--nvme-bw READ[,WRITE]` (GB/s), or `--nvme-probe [DIR]`, which times
PROBE_BYTES written and read back with O_DIRECT, QUEUE_DEPTH requests in flight (as DeepSpeed's
async_io moves them) in DIR, else Hardware's assumed 3 GB/s each way.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import shutil
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

from zerofit.backends import engines
from zerofit.backends.terms import GIB, Workload
from zerofit.config import Config, get_field
from zerofit.config.limits import shown
from zerofit.config.sizes import human_bytes
from zerofit.errors import UserError
from zerofit.models.shape import ModelShape
from zerofit.planner.plan import Option, option_fields, plan
from zerofit.planner.plan_json import option_json
from zerofit.planner.shape import Hardware

PROBE_BYTES = 256 * 2**20  # written, then read back: a few seconds on a slow disk
# DeepSpeed's async_io as zerofit runs it (`aio` defaults, DeepSpeed 0.19.8): 1 MiB requests,
# 8 in flight. One request at a time (8 MiB each) read 1.48 GB/s and wrote 1.56 GB/s on the
# H100 machine's disk, where DeepSpeed's own swapping moved 2.2 GB/s (2026-12-06 NVMe run).
PROBE_BLOCK = 2**20
QUEUE_DEPTH = 8
UNBOUNDED = 2**62  # NVMe bytes per node when proposing NVMe: room assumed


def _in_flight(fd: int, blocks: int, write: bool) -> None:
    """Moves `blocks` PROBE_BLOCKs at their offsets in `fd`, QUEUE_DEPTH requests at a time
    (threads: os.pwrite and os.preadv release the GIL), each through its own aligned buffer."""

    def lane(first: int) -> None:
        buf = mmap.mmap(-1, PROBE_BLOCK)  # page-aligned, as O_DIRECT requires
        try:
            if write:
                buf.write(os.urandom(PROBE_BLOCK))  # incompressible
            for i in range(first, blocks, QUEUE_DEPTH):
                if write:
                    os.pwrite(fd, buf, i * PROBE_BLOCK)
                else:
                    os.preadv(fd, [buf], i * PROBE_BLOCK)
        finally:
            buf.close()

    with ThreadPoolExecutor(QUEUE_DEPTH) as pool:
        list(pool.map(lane, range(min(QUEUE_DEPTH, blocks))))


def _timed_passes(name: str, size: int) -> tuple[float, float]:
    """Seconds to write `size` bytes to `name` with O_DIRECT (synced), then to read them back."""
    blocks = max(1, size // PROBE_BLOCK)
    fd = os.open(name, os.O_WRONLY | os.O_DIRECT)
    start = time.perf_counter()
    try:
        _in_flight(fd, blocks, write=True)
        os.fsync(fd)
    finally:
        os.close(fd)
    wrote = time.perf_counter() - start
    fd = os.open(name, os.O_RDONLY | os.O_DIRECT)
    start = time.perf_counter()
    try:
        _in_flight(fd, blocks, write=False)
    finally:
        os.close(fd)
    return wrote, time.perf_counter() - start


def probe(folder: str, size: int = PROBE_BYTES) -> tuple[float, float]:
    """(read, write) bytes/s of the disk under `folder`: `size` bytes written with O_DIRECT and
    read back, through a temporary file removed again. UserError (one line) where it cannot."""
    where = Path(folder).expanduser()
    name = ""
    try:
        fd, name = tempfile.mkstemp(dir=where, prefix=".zerofit-nvme-probe-")
        os.close(fd)
        wrote, read = _timed_passes(name, size)
    except OSError as e:
        why = e.strerror or type(e).__name__
        raise UserError(f"--nvme-probe: cannot time {shown(str(where))} ({why})") from None
    finally:
        if name:
            with contextlib.suppress(OSError):
                os.unlink(name)
    moved = max(1, size // PROBE_BLOCK) * PROBE_BLOCK
    return moved / max(read, 1e-9), moved / max(wrote, 1e-9)


def with_disk(hw: Hardware, bw: tuple[float, float] | None, probe_dir: str | None) -> Hardware:
    """`hw` with the disk's bandwidth: `--nvme-bw`'s (GB/s read, write), else `probe_dir`'s
    timed (its free space too, when no --nvme was given), else as assumed."""
    if bw is not None:
        return replace(
            hw, nvme_read_bw=bw[0] * 1e9, nvme_write_bw=bw[1] * 1e9, nvme_bw_from="--nvme-bw"
        )
    if probe_dir is None:
        return hw
    read, write = probe(probe_dir)
    free = hw.nvme or shutil.disk_usage(Path(probe_dir).expanduser()).free
    source = f"probed in {shown(probe_dir, quote=False)}"
    return replace(hw, nvme=free, nvme_read_bw=read, nvme_write_bw=write, nvme_bw_from=source)


def disk_seconds(o: Option, hw: Hardware) -> float:
    """Seconds a step spends on the disk: the node's ranks' bytes over the node's bandwidth."""
    ranks = hw.gpus_per_node
    return ranks * (o.speed.disk_read / hw.nvme_read_bw + o.speed.disk_write / hw.nvme_write_bw)


def bandwidth_words(hw: Hardware) -> str:
    return (
        f"{hw.nvme_read_bw / 1e9:,.1f} GB/s read, {hw.nvme_write_bw / 1e9:,.1f} GB/s write "
        f"({hw.nvme_bw_from}{'; --nvme-bw or --nvme-probe' if hw.nvme_bw_from == 'assumed' else ''})"
    )


def disk_words(o: Option, hw: Hardware) -> str:
    """What an option puts on NVMe and moves through it, per node ("" when it puts nothing)."""
    if o.memory.nvme <= 0:
        return ""
    ranks = hw.gpus_per_node
    node = o.memory.nvme * ranks
    return (
        f"NVMe: {human_bytes(node)} per node ({human_bytes(o.memory.nvme)} a GPU); a step reads "
        f"{human_bytes(o.speed.disk_read * ranks)} and writes {human_bytes(o.speed.disk_write * ranks)}"
        f", {disk_seconds(o, hw):,.1f} s of its {o.speed.step_time:,.1f} s at {bandwidth_words(hw)}"
    )


def nvme_proposal(
    m: ModelShape,
    w: Workload,
    hw: Hardware,
    base: Config | None,
    splits: list[tuple[int, int]] | None,
) -> Option | None:
    """When nothing fits the GPUs and host RAM within the NVMe space given (none, unless
    `--nvme`): the fastest option that fits with room on NVMe assumed and offloads to it."""
    roomy = replace(hw, nvme=UNBOUNDED)
    found = [o for o in plan(m, w, roomy, base, splits) if o.fits and o.memory.nvme > 0]
    return found[0] if found else None


def _changed(base: Config, fields: dict[str, Any]) -> dict[str, Any]:
    """The fields whose value differs from `base`'s."""
    out = {}
    for key, value in fields.items():
        try:
            same = get_field(base, key) == value
        except AttributeError:
            same = False
        if not same:
            out[key] = value
    return out


def proposal_lines(o: Option, hw: Hardware, base: Config) -> list[str]:
    """`nvme_proposal`'s option in words: how it fits, its disk and the flags that select it
    (those that differ from `base`)."""
    dir_key = o.strategy.engine.nvme_dir_key
    at = o.workload
    batch = (
        f"micro-batch {at.micro_batch_size} x accumulation {at.grad_accum_steps}, " if at else ""
    )
    fields = {**_changed(base, option_fields(o)), **({dir_key: "DIR"} if dir_key else {})}
    given = " ".join(f"--{k} {v}" for k, v in fields.items())
    return [
        f"with NVMe offload it fits: {o.strategy.label}, {batch}"
        f"{o.memory.peak_reserved / GIB:.1f} GiB per GPU, "
        f"{o.memory.host * hw.gpus_per_node / GIB:,.0f} GiB host RAM per node, "
        f"~{o.speed.tokens_per_s:,.0f} tokens/s",
        f"  {disk_words(o, hw)}",
        f"  plan it with your disk: --nvme SIZE (free per node); run it with {given}",
    ]


def nvme_dir(base: Config) -> str | None:
    """The NVMe directory a config names (an engine's `nvme_dir_key`), or None."""
    for eng in engines().values():
        value = get_field(base, eng.nvme_dir_key) if eng.nvme_dir_key else None
        if value:
            return str(value)
    return None


def disk_json(o: Option, hw: Hardware) -> dict[str, float]:
    ranks = hw.gpus_per_node
    return {
        "nvme_bytes_per_gpu": o.memory.nvme,
        "nvme_bytes_per_node": o.memory.nvme * ranks,
        "disk_read_bytes_per_step_per_node": o.speed.disk_read * ranks,
        "disk_write_bytes_per_step_per_node": o.speed.disk_write * ranks,
        "disk_seconds_per_step": disk_seconds(o, hw),
    }


def report(
    m: ModelShape,
    w: Workload,
    hw: Hardware,
    base: Config,
    splits: list[tuple[int, int]] | None,
    shown_options: list[Option],
) -> tuple[list[str], dict[str, Any]]:
    """`zerofit plan`'s NVMe lines and JSON: the disk of each option shown that offloads to it
    (the recommendation, the run as configured), or, when nothing fits, NVMe proposed."""
    data: dict[str, Any] = {
        "nvme_read_gbs": hw.nvme_read_bw / 1e9,
        "nvme_write_gbs": hw.nvme_write_bw / 1e9,
        "nvme_bw_from": hw.nvme_bw_from,
    }
    lines, data["shown"] = [], []
    for o in shown_options:
        if o.memory.nvme > 0:
            lines.append(f"{o.strategy.label}: {disk_words(o, hw)}")
            data["shown"].append({"strategy": o.strategy.label, **disk_json(o, hw)})
    if any(o.fits for o in shown_options):
        return lines, data
    proposed = nvme_proposal(m, w, hw, base, splits)
    if proposed is not None:
        lines += proposal_lines(proposed, hw, base)
        data["proposal"] = {**option_json(proposed, w), **disk_json(proposed, hw)}
    return lines, data

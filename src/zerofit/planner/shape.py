"""What the planner needs to know about a machine, from whatever the user has.

The model side (``ModelShape`` and its constructors) lives in ``zerofit.models.shape``. The known
cards (memory, peak, bandwidths) live in ``zerofit.planner.gpus``.
"""

from __future__ import annotations

import math
import os
import re
import shutil
from dataclasses import dataclass, replace
from pathlib import Path

from zerofit.config.limits import shown
from zerofit.config.sizes import parse_size  # noqa: F401  re-exported: the plan command reads sizes
from zerofit.errors import UserError
from zerofit.models.shape import (  # noqa: F401  re-exported until the planner imports models.shape
    ModelShape,
    shape_from_config,
    shape_from_hf_config,
    shape_from_preset,
)
from zerofit.planner.gpus import GPU, gpu_named
from zerofit.report.rates import peak_flops_named

MAX_COUNT = 10**9  # the largest count a flag takes (GPUs, layers, tokens, ...)


def parse_count(flag: str, text: str | None, minimum: int = 1) -> int | None:
    """A whole-number flag (None when not given): UserError unless an integer in
    [minimum, MAX_COUNT]."""
    if text is None:
        return None
    value = int(text.strip()) if re.fullmatch(r"\s*[+-]?\d{1,30}\s*", text) else None
    if value is None or not minimum <= value <= MAX_COUNT:
        raise UserError(
            f"{flag} must be a whole number from {minimum} to {MAX_COUNT:,}, got {shown(text)}"
        )
    return value


def parse_positive(flag: str, text: str | None) -> float | None:
    """A finite number > 0 (None when not given), else UserError."""
    if text is None:
        return None
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise UserError(f"{flag} must be a finite number > 0, got {shown(text)}")
    return value


@dataclass(frozen=True)
class Hardware:
    gpus_per_node: int
    gpu_mem: int  # bytes per GPU
    nodes: int = 1
    cpu_mem: int | None = None  # bytes of host RAM per node (None: unknown, offload cannot fit)
    nvme: int = 0  # bytes of NVMe per node
    # NVMe bytes/s per node, as DeepSpeed's aio reaches them: `plan --nvme-bw` or `--nvme-probe`,
    # else assumed (one PCIe Gen4 drive; the ZeRO-Infinity paper's DGX-2 had ~25 GB/s of 16)
    nvme_read_bw: float = 3e9
    nvme_write_bw: float = 3e9
    nvme_bw_from: str = "assumed"  # assumed | --nvme-bw | probed <dir>
    peak_flops: float = 989.4e12  # dense bf16 per GPU (Hopper, when nothing says otherwise)
    intra_bw: float = 300e9  # bytes/s per GPU for collectives inside a node (NVLink class)
    inter_bw: float = 25e9  # bytes/s per GPU across nodes (200 Gb/s class)
    pcie_bw: float = 25e9  # bytes/s host<->GPU
    mem_bw: float = 4.8e12  # bytes/s of GPU memory (the H200 the speed constants were fitted on)
    name: str = "GPU"
    gpu_from: str = "assumed"  # where the card's figures come from: detected | --gpu | assumed
    cpu_mem_from: str = "given"  # where cpu_mem comes from: given | detected | unknown
    # where gpu_mem comes from: card | --gpu-mem | train.gpu_memory_limit
    gpu_mem_from: str = "card"
    # The host's speed at issuing the GPU's work (`planner.speed.host_seconds`): seconds per
    # kernel launch and per engine hook call, from `plan --host-probe` (`planner.host_probe`) or
    # `--host-us`; None: speed's constants, fitted on the H200 machine's host
    host_launch_s: float | None = None
    host_hook_s: float | None = None
    host_compiled_launch_s: float | None = None  # a compiled kernel's (None: host_launch_s)
    host_hooks: tuple[tuple[str, float], ...] = ()  # (engine, seconds a hook call) probed
    host_from: str = "assumed"  # assumed | --host-us | probed (<cpu>, <device>)
    # (host optimizer, bytes/s per node it streams) probed: `Engine.host_optimizers_for_probe`
    host_adam: tuple[tuple[str, float], ...] = ()

    @property
    def world_size(self) -> int:
        return self.gpus_per_node * self.nodes

    def adam_bw(self, key: str, fitted: float) -> float:
        """The host optimizer `key`'s bytes/s per node: probed on this host, else `fitted`."""
        return dict(self.host_adam).get(key, fitted)


def host_ram() -> int | None:
    """This machine's physical RAM in bytes, or None where the OS does not say."""
    try:
        ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None
    return ram if ram > 0 else None


def visible_gpus() -> int:
    """How many NVIDIA GPUs this process may use, without importing torch: the driver's list
    (/proc/driver/nvidia/gpus), narrowed by CUDA_VISIBLE_DEVICES where it is set."""
    proc = Path("/proc/driver/nvidia/gpus")
    present = len(list(proc.iterdir())) if proc.is_dir() else 0
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None or not present:
        return present
    ids = [v for v in visible.split(",") if v.strip()]
    if any(v.strip().startswith("-") for v in ids):  # "-1": none; ids after a bad one are hidden
        ids = ids[: next(i for i, v in enumerate(ids) if v.strip().startswith("-"))]
    return min(len(ids), present)


def detect_hardware() -> Hardware | None:
    """This machine's GPUs, host RAM and disk, or None without a GPU. A card in the table of
    ``zerofit.planner.gpus`` brings its peak and bandwidths; another one its peak as the trainer's
    MFU knows it, else Hopper's (``gpu_from`` says so)."""
    if not visible_gpus():  # asked of the driver: no torch import on a machine without a GPU
        return None
    import torch  # torch-free path: `zerofit plan` imports this module; only a GPU needs torch

    if not torch.cuda.is_available():
        return None
    props, name = torch.cuda.get_device_properties(0), torch.cuda.get_device_name(0)
    ram = host_ram()
    hw = Hardware(
        gpus_per_node=torch.cuda.device_count(),
        gpu_mem=props.total_memory,
        cpu_mem=ram,
        cpu_mem_from="detected" if ram else "unknown",
        nvme=shutil.disk_usage("/").free,
        name=name,
        gpu_from="detected",
    )
    gpu = gpu_named(name)
    if gpu is not None:
        return with_gpu(hw, gpu, memory=False)
    peak = peak_flops_named(name)
    if peak is None:
        return replace(hw, gpu_from="detected, peak assumed")
    return replace(hw, peak_flops=peak)


def with_host(
    hw: Hardware,
    launch: float | None,
    hook: float | None,
    compiled: float | None = None,
    hooks: tuple[tuple[str, float], ...] = (),
    source: str = "assumed",
    adam: tuple[tuple[str, float], ...] = (),
) -> Hardware:
    """`hw` with the host's rates, in seconds (`Hardware.host_launch_s` and the rest) and its
    host optimizers' bytes/s (`adam`); None (and no `hooks`, no `adam`) leaves the fitted
    constants in charge."""
    return replace(
        hw,
        host_launch_s=launch,
        host_hook_s=hook,
        host_compiled_launch_s=compiled,
        host_hooks=hooks,
        host_from=source,
        host_adam=adam,
    )


def with_gpu(hw: Hardware, gpu: GPU, memory: bool = True) -> Hardware:
    """`hw` with a known card's peak and bandwidths (and its memory, unless `memory` is False)."""
    return replace(
        hw,
        gpu_mem=gpu.memory if memory else hw.gpu_mem,
        peak_flops=gpu.peak_flops,
        intra_bw=gpu.intra_bw,
        pcie_bw=gpu.pcie_bw,
        mem_bw=gpu.mem_bw,
        name=gpu.name,
    )

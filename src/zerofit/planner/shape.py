"""What the planner needs to know about a machine, from whatever the user has.

The model side (``ModelShape`` and its constructors) lives in ``zerofit.models.shape``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch

from zerofit.errors import UserError
from zerofit.models.shape import (  # noqa: F401  re-exported until the planner imports models.shape
    ModelShape,
    shape_from_config,
    shape_from_hf_config,
    shape_from_preset,
)

_SIZE = re.compile(r"^\s*([0-9.]+)\s*([KMGTP]?)(i?)B?\s*$", re.IGNORECASE)


def parse_size(text: str) -> int:
    """'40GiB' -> bytes (binary), '2TB' -> bytes (decimal), '512G' -> GiB."""
    m = _SIZE.match(text)
    if not m:
        raise UserError(f"cannot read a size from '{text}' (examples: 40GiB, 80GB, 2TB)")
    value, unit, binary = float(m.group(1)), m.group(2).upper(), m.group(3)
    power = " KMGTP".index(unit) if unit else 0
    base = 1024 if (binary or (unit and not text.strip().upper().endswith("B"))) else 1000
    return int(value * base**power)


@dataclass(frozen=True)
class Hardware:
    gpus_per_node: int
    gpu_mem: int  # bytes per GPU
    nodes: int = 1
    cpu_mem: int = 0  # bytes of host RAM per node
    nvme: int = 0  # bytes of NVMe per node
    peak_flops: float = 989e12  # dense bf16 per GPU
    intra_bw: float = 300e9  # bytes/s per GPU for collectives inside a node (NVLink class)
    inter_bw: float = 25e9  # bytes/s per GPU across nodes (200 Gb/s class)
    pcie_bw: float = 25e9  # bytes/s host<->GPU
    name: str = "GPU"

    @property
    def world_size(self) -> int:
        return self.gpus_per_node * self.nodes


def detect_hardware() -> Hardware | None:
    """This machine's GPUs, host RAM and disk, or None without a GPU."""
    if not torch.cuda.is_available():
        return None
    import os
    import shutil

    from zerofit.metrics import peak_flops

    props = torch.cuda.get_device_properties(0)
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return Hardware(
        gpus_per_node=torch.cuda.device_count(),
        gpu_mem=props.total_memory,
        cpu_mem=ram,
        nvme=shutil.disk_usage("/").free,
        peak_flops=peak_flops(torch.device("cuda", 0)) or 989e12,
        name=props.name,
    )

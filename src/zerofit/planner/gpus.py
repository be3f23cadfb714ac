"""Known GPUs: memory, dense bf16 peak, memory and link bandwidth, for `zerofit plan --gpu NAME`
and for naming the local card (``torch.cuda.get_device_name()``).

Sources, per column:
- peak: the vendor's datasheet (NVIDIA H100, H200, A100, L40S, L4, A10, RTX A6000 datasheets; the
  Ada and Ampere GA102 architecture whitepapers for the RTX 4090 and 3090), dense bf16 tensor-core
  FLOP/s with fp32 accumulation, i.e. half the "with sparsity" figure;
- memory bandwidth and links: the same datasheets. ``link_bw`` is one direction of the fastest link
  every GPU of a many-GPU node shares: NVLink on SXM boards, else PCIe x16 (the NVLink bridges of
  the H100 PCIe, RTX 3090 and RTX A6000 join two cards only, so they are not assumed);
- memory: the total nvidia-smi shows for that card with its default ECC setting (MiB, rounded as
  reported); the datasheet's nominal GB is the physical size, part of it reserved.

The planner turns links into its bandwidths with stated factors (`Hardware` in planner.shape):
collectives reach LINK_EFFICIENCY of a link's one-direction peak (NCCL bus bandwidth; the planner's
300 GB/s for Hopper's 450 GB/s NVLink 4), and host<->GPU copies run at HOST_LINK_BW, fitted on the
H200's PCIe 5 and halved for PCIe 4 cards, as the link's peak is half.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass

from zerofit.config.limits import shown
from zerofit.errors import UserError

MIB = 2**20
LINK_EFFICIENCY = 2 / 3  # NCCL bus bandwidth / one-direction link peak
HOST_LINK_BW = {5: 25e9, 4: 12.5e9}  # effective host<->GPU bytes/s by PCIe generation
NVLINK4, NVLINK3 = 450e9, 300e9  # one direction (900 and 600 GB/s both ways)
PCIE = {5: 64e9, 4: 32e9}  # x16, one direction (128 and 64 GB/s both ways)


@dataclass(frozen=True)
class GPU:
    name: str
    memory: int  # bytes CUDA sees
    bf16_tflops: float  # dense, per the datasheet
    mem_bw: float  # bytes/s
    link: str  # what collectives travel over in a node of several cards
    link_bw: float  # bytes/s, one direction
    pcie_gen: int
    detect: str  # regex on torch.cuda.get_device_name()
    aliases: tuple[str, ...] = ()

    @property
    def peak_flops(self) -> float:
        return self.bf16_tflops * 1e12

    @property
    def intra_bw(self) -> float:
        """Bytes/s per GPU the planner assumes for collectives inside a node."""
        return LINK_EFFICIENCY * self.link_bw

    @property
    def pcie_bw(self) -> float:
        return HOST_LINK_BW[self.pcie_gen]


GPUS: tuple[GPU, ...] = (
    GPU("H100 SXM", 81559 * MIB, 989.4, 3.35e12, "NVLink 4", NVLINK4, 5, r"H100(?! PCIe| NVL)", ("h100", "h100 sxm5")),
    GPU("H100 PCIe", 81559 * MIB, 756.5, 2.0e12, "PCIe 5", PCIE[5], 5, r"H100 PCIe"),
    GPU("H200", 143771 * MIB, 989.4, 4.8e12, "NVLink 4", NVLINK4, 5, r"(?<!G)H200(?! NVL)", ("h200 sxm",)),
    GPU("A100 40GB", 40536 * MIB, 312.0, 1.555e12, "NVLink 3", NVLINK3, 4, r"A100.*40GB", ("a100-40",)),
    GPU("A100 80GB", 81920 * MIB, 312.0, 2.039e12, "NVLink 3", NVLINK3, 4, r"A100.*80GB", ("a100-80",)),
    GPU("L40S", 46068 * MIB, 362.05, 0.864e12, "PCIe 4", PCIE[4], 4, r"L40S"),
    GPU("L4", 23034 * MIB, 121.0, 0.3e12, "PCIe 4", PCIE[4], 4, r"\bL4\b"),
    GPU("A10", 23028 * MIB, 125.0, 0.6e12, "PCIe 4", PCIE[4], 4, r"\bA10\b"),
    GPU("RTX 4090", 24564 * MIB, 165.2, 1.008e12, "PCIe 4", PCIE[4], 4, r"RTX 4090(?! D)", ("4090",)),
    GPU("RTX 3090", 24576 * MIB, 71.0, 0.936e12, "PCIe 4", PCIE[4], 4, r"RTX 3090(?! Ti)", ("3090",)),
    GPU("RTX A6000", 49140 * MIB, 154.8, 0.768e12, "PCIe 4", PCIE[4], 4, r"RTX A6000", ("a6000",)),
)  # fmt: skip


def _key(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower())


def _names() -> dict[str, GPU]:
    out: dict[str, GPU] = {}
    for gpu in GPUS:
        for name in (gpu.name, *gpu.aliases):
            out[_key(name)] = gpu
    return out


def find_gpu(name: str) -> GPU:
    """The card `--gpu NAME` names (case, spaces and dashes ignored); UserError with the closest
    known name, or the cards a prefix could mean, otherwise."""
    names, key = _names(), _key(name)
    if key in names:
        return names[key]
    known = ", ".join(g.name for g in GPUS)
    starting = sorted({g.name for k, g in names.items() if key and k.startswith(key)})
    if len(starting) > 1:
        raise UserError(f"--gpu {shown(name)} could be {' or '.join(starting)}; say which")
    close = difflib.get_close_matches(key, list(names), n=1, cutoff=0.6) if key else []
    hint = f" (did you mean '{names[close[0]].name}'?)" if close else ""
    raise UserError(
        f"unknown GPU {shown(name)}{hint}; known: {known} (or give --gpu-mem and --peak-tflops)"
    )


def gpu_named(device_name: str) -> GPU | None:
    """The table's card for a CUDA device name ("NVIDIA GeForce RTX 4090"), or None."""
    for gpu in GPUS:
        if re.search(gpu.detect, device_name):
            return gpu
    return None

"""Throughput arithmetic, without torch: GPUs' dense bf16 peaks and what a step rate makes of them.
`zerofit.report.metrics` uses it during a run; `zerofit bench` and the planner, whose modules the
CLI imports without torch, use it directly."""

from __future__ import annotations

# Dense bf16 tensor-core peak per GPU, FLOP/s, from the vendors' datasheets (no sparsity).
# Matched against torch.cuda.get_device_name() by substring, most specific first.
PEAK_BF16_FLOPS: list[tuple[str, float]] = [
    ("GH200", 989e12),
    ("H200", 989e12),
    ("H100 PCIe", 756e12),
    ("H100 NVL", 835e12),
    ("H100", 989e12),
    ("H800", 989e12),
    ("B200", 2250e12),
    ("B100", 1750e12),
    ("A100", 312e12),
    ("A800", 312e12),
    ("L40S", 362e12),
    ("L40", 181e12),
    ("L4", 121e12),
    ("A10G", 70e12),
    ("A10", 125e12),
    ("RTX 4090", 165e12),
    ("RTX 3090", 71e12),
    ("V100", 125e12),
    ("MI300X", 1307e12),
    ("MI250X", 383e12),
]


def peak_flops_named(name: str) -> float | None:
    """Peak dense bf16 FLOP/s of the card that `torch.cuda.get_device_name` calls `name`, or None
    (an unknown card: MFU is omitted)."""
    for key, flops in PEAK_BF16_FLOPS:
        if key in name:
            return flops
    return None


def rates(
    tokens_per_s: float, flops_per_token: float, world_size: int, peak: float | None
) -> dict[str, float]:
    """tokens/s (all and per GPU), model TFLOP/s per GPU, and MFU when the peak is known."""
    flops = flops_per_token * tokens_per_s / world_size
    out = {
        "tokens_per_s": tokens_per_s,
        "tokens_per_s_per_gpu": tokens_per_s / world_size,
        "tflops_per_gpu": flops / 1e12,
    }
    if peak:
        out["mfu"] = flops / peak
    return out

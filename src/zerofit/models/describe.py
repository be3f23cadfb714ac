"""The one line a run prints at start about how its model computes: compile, attention, head."""

from __future__ import annotations

import torch
from torch import nn

from zerofit.models.hf_attention import runs_varlen


def _attention(module: nn.Module, device: torch.device, packed: bool) -> str:
    if getattr(module, "varlen", None) is None:  # the built-in Llama
        if not packed:
            return "SDPA, causal"
        kind = "FlexAttention" if device.type == "cuda" else "SDPA with a block-diagonal mask"
        return f"{kind} per packed sample"
    if module.varlen and runs_varlen(device):
        return "FlashAttention varlen per packed sample (zerofit_varlen)"
    implementation = getattr(module.hf.config, "_attn_implementation", "?")
    return f"transformers' {implementation}"


def _head(module: nn.Module, loss_chunk: int) -> str:
    fused = getattr(module, "fused", loss_chunk > 0)
    if not fused:
        return "full logits, then the loss"
    return f"fused with the loss in {loss_chunk:,}-token chunks"


def fast_path_line(
    module: nn.Module, device: torch.device, compiled: bool, loss_chunk: int, packed: bool
) -> str:
    """``model: compiled per block; attention ...; head ...; lean RMSNorm/SwiGLU (classes)``."""
    parts = ["compiled per block" if compiled else "eager (parallel.compile off)"]
    parts.append(f"attention {_attention(module, device, packed)}")
    parts.append(f"head {_head(module, loss_chunk)}")
    lean = getattr(module, "lean_ops", None)
    if lean:
        parts.append(f"lean {', '.join(lean)}")
    return "model: " + "; ".join(parts)

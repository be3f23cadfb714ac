"""What one LoRA-adapted decoder layer keeps for backward, with and without `model.lean_ops`.

    python benchmarks/lean_saved_bytes.py OUT.json

A Llama-3-8B-shaped layer scaled down (hidden 256, MLP 896 = 3.5x, 8 heads of which 2 for keys and
values: the 8B's ratios), in bf16 on CPU, LoRA rank 16 on every linear layer, base frozen: the
bytes of every tensor autograd saves (parameters excluded, each storage once), per token and
hidden unit, so the figure scales to the 8B at any batch (x hidden 4,096 x layers x tokens).
"""

from __future__ import annotations

import copy
import json
import sys

import torch
from torch import nn
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding

from zerofit.models.lean_ops import apply_lean_ops
from zerofit.models.lora import LoRALinear

H, INTER, T = 256, 896, 512


def saved_per_token_and_unit(layer: nn.Module, cfg: LlamaConfig) -> float:
    params = {p.untyped_storage().data_ptr() for p in layer.parameters()}
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        ptr = t.untyped_storage().data_ptr()
        if ptr not in params and t.numel() > 1000:  # masks and activations, not scalars
            seen[ptr] = t.untyped_storage().nbytes()
        return t

    x = torch.randn(1, T, H, dtype=torch.bfloat16, requires_grad=True)
    positions = torch.arange(T)[None]
    rope = LlamaRotaryEmbedding(cfg)(x, positions)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        layer(x, position_embeddings=rope, attention_mask=None, position_ids=positions)
    return sum(seen.values()) / T / H


def adapted(base: nn.Module, dropout: float, lean: bool) -> nn.Module:
    layer = copy.deepcopy(base)
    for module in list(layer.modules()):
        for name, child in list(module.named_children()):
            if isinstance(child, nn.Linear):
                setattr(module, name, LoRALinear(child, 16, 32.0, dropout, lean))
    for name, p in layer.named_parameters():
        p.requires_grad_("lora_" in name)
    layer = layer.to(torch.bfloat16)
    if lean:
        apply_lean_ops(layer)
    return layer


def main(out: str) -> None:
    cfg = LlamaConfig(
        hidden_size=H, intermediate_size=INTER, num_attention_heads=8, num_key_value_heads=2
    )
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    base = LlamaDecoderLayer(cfg, 0)
    rows = {
        f"dropout {dropout}, lean {lean}": saved_per_token_and_unit(
            adapted(base, dropout, lean), cfg
        )
        for dropout in (0.05, 0.0)
        for lean in (False, True)
    }
    result = {"bytes_per_token_and_hidden_unit": rows, "torch": torch.__version__}
    with open(out, "w") as f:
        json.dump(result, f, indent=1)
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main(sys.argv[1])

"""What a tiny Hugging Face Llama QLoRA forward keeps for backward, by how its blocks are compiled
and checkpointed: the bytes of the tensors autograd saves, the parameters not counted. CPU only.

    python benchmarks/ac_saved_bytes.py OUT.json

Ways compared (every linear layer LoRA rank 16 over an NF4 base, zerofit's lean ops on):
- eager, no AC / eager, full AC;
- compiled, no AC;
- compiled, full AC, the checkpointed block compiled as a whole (torchtitan's order, zerofit's
  for LoRA blocks before 2026-12-05);
- compiled, full AC, zerofit's `apply_compile` (a LoRA block's forward compiled inside its
  checkpoint);
- the fourth with the LoRA update in plain operations (not zerofit's autograd function), and
  the fourth without LoRA (every parameter trained).
The 8B QLoRA OOM of 2026-12-05 was the fourth on torch 2.11; run this under 2.11 and 2.13.
"""

from __future__ import annotations

import json
import sys

import torch
import transformers
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
from transformers import LlamaConfig, LlamaForCausalLM

from zerofit.distributed.parallelize import apply_ac, apply_compile
from zerofit.models.lean_ops import apply_lean_ops
from zerofit.models.lora import inject, linear_layers
from zerofit.models.nf4 import quantize
from zerofit.report.saved_tensors import saved_bytes

TOKENS = (2, 256)


def qlora_model(
    cfg: LlamaConfig, dropout: float = 0.05, lora: bool = True, lean_lora: bool = True
) -> LlamaForCausalLM:
    """`cfg`'s Llama in bf16 with zerofit's lean ops and, with `lora`, every linear layer LoRA
    r16 (alpha 32) over an NF4 base quantised from its own random weights (seed 0)."""
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).to(torch.bfloat16)
    apply_lean_ops(model)
    layers = linear_layers(model) if lora else {}
    weights = {n: layer.weight.detach().clone() for n, layer in layers.items()}
    inject(model, list(layers), 16, 32, dropout, lean_lora, frozenset(layers))
    model.to(torch.bfloat16)
    with torch.no_grad():
        for name, weight in weights.items():
            layer = model.get_submodule(name)
            for piece, value in quantize(weight).items():
                getattr(layer.nf4, piece).copy_(value)
            layer.lora_A.weight.normal_(0, 0.02)
            layer.lora_B.weight.normal_(0, 0.02)
    return model


def build(lora: bool = True, lean_lora: bool = True) -> LlamaForCausalLM:
    cfg = LlamaConfig(
        hidden_size=512,
        intermediate_size=1024,
        num_attention_heads=8,
        num_key_value_heads=2,
        num_hidden_layers=4,
        vocab_size=1024,
        attn_implementation="sdpa",
    )
    return qlora_model(cfg, 0.05, lora, lean_lora)


def prepared(way: str) -> torch.nn.Module:
    model = build(lora="full fine-tune" not in way, lean_lora="LoRA update plain" not in way)
    blocks = model.model.layers
    if "whole block compiled" in way:
        # as zerofit did: the `kernels` package's set-and-restore write is not replayed
        torch._dynamo.config.skip_fwd_side_effects_in_bwd_under_checkpoint = True
        for i, block in enumerate(list(blocks)):
            blocks[i] = torch.compile(checkpoint_wrapper(block), fullgraph=True)
        return model
    apply_ac(blocks, "full" if "full AC" in way else "none")
    if way.startswith("compiled"):
        apply_compile(blocks)
    return model


def main(out: str) -> None:
    ways = [
        "eager, no AC",
        "eager, full AC",
        "compiled, no AC",
        "compiled, full AC, whole block compiled",
        "compiled, full AC, zerofit",
        "compiled, full AC, whole block compiled, LoRA update plain",
        "full fine-tune: compiled, full AC, whole block compiled",
    ]
    x = torch.randint(0, 1024, TOKENS)
    rows = {}
    for way in ways:
        torch._dynamo.reset()
        model = prepared(way)

        def loss(model: torch.nn.Module = model) -> torch.Tensor:
            return model(input_ids=x, use_cache=False).logits.float().sum()

        saved_bytes(model, loss)  # compiles
        rows[way] = saved_bytes(model, loss) / 2**20
        print(f"{way:60s} {rows[way]:7.2f} MiB", flush=True)
    meta = {"torch": torch.__version__, "transformers": transformers.__version__}
    with open(out, "w") as f:
        json.dump({"meta": meta, "tokens": TOKENS, "saved_mib": rows}, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])

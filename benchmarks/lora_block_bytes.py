"""What one QLoRA Llama decoder block keeps for backward, per token and hidden unit (bytes), eager
and compiled, with and without LoRA dropout. CPU only.

    python benchmarks/lora_block_bytes.py OUT.json

A Hugging Face Llama with Llama-3-8B's proportions at hidden 1024 (ffn 3.5x, 8 heads of 128, 2 KV
heads), every linear layer LoRA r16 over an NF4 base, zerofit's lean ops on; one row of 512
tokens. The block's share is the difference between a 2-layer and a 1-layer model (the embedding
and head cancel), divided by tokens x hidden. The parameters are not counted.
"""

from __future__ import annotations

import json
import sys

import torch
import transformers
from ac_saved_bytes import qlora_model  # the sibling benchmark's model (run from benchmarks/)
from transformers import LlamaConfig, LlamaForCausalLM

from zerofit.distributed.parallelize import apply_compile
from zerofit.report.saved_tensors import saved_bytes

HIDDEN, TOKENS = 1024, (1, 512)


def build(layers: int, dropout: float) -> LlamaForCausalLM:
    cfg = LlamaConfig(
        hidden_size=HIDDEN,
        intermediate_size=int(3.5 * HIDDEN),
        num_attention_heads=8,
        num_key_value_heads=2,
        num_hidden_layers=layers,
        vocab_size=1024,
        attn_implementation="sdpa",
    )
    return qlora_model(cfg, dropout)


def kept(layers: int, dropout: float, compiled: bool) -> int:
    torch._dynamo.reset()
    model = build(layers, dropout)
    if compiled:
        apply_compile(model.model.layers)
    x = torch.randint(0, 1024, TOKENS)

    def loss() -> torch.Tensor:
        return model(input_ids=x, use_cache=False).logits.float().sum()

    saved_bytes(model, loss)  # compiles
    return saved_bytes(model, loss)


def main(out: str) -> None:
    rows = {}
    for dropout in (0.05, 0.0):
        for compiled in (False, True):
            per = (kept(2, dropout, compiled) - kept(1, dropout, compiled)) / (
                TOKENS[0] * TOKENS[1] * HIDDEN
            )
            name = f"{'compiled' if compiled else 'eager'}, dropout {dropout}"
            rows[name] = round(per, 3)
            print(f"{name:25s} {per:6.2f} bytes per token and hidden unit", flush=True)
    meta = {"torch": torch.__version__, "transformers": transformers.__version__}
    with open(out, "w") as f:
        json.dump(
            {"meta": meta, "hidden": HIDDEN, "tokens": TOKENS, "bytes_per_token_h": rows},
            f,
            indent=1,
        )


if __name__ == "__main__":
    main(sys.argv[1])

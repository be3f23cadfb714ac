"""Issue 28 probe: on an H100 (torch 2.11), 8B LoRA DPO under FSDP + full AC peaked at 38.7 GiB,
as without AC, and ran faster than DDP + full AC (20.6 GiB): its blocks seemed not to recompute.
On CPU (torch 2.11 and 2.13) FSDP + full AC + compile saves what DDP does. This runs
zerofit's own path (a Hugging Face Llama, zerofit's LoRA on every linear layer over a frozen bf16
base, `apply_ac`, `apply_compile`, `apply_fsdp` on one rank) and prints, per way, the bytes autograd
saves outside checkpoints and the peak allocated over a no-grad forward (the DPO reference) and
a forward + backward.

    [OUT=dir] python benchmarks/fsdp_lora_mem.py WAY...   (WAY: plain|fsdp, +-ac, +-compile)
    e.g. python benchmarks/fsdp_lora_mem.py plain-ac-compile fsdp-ac-compile fsdp-ac fsdp

Not yet run on a GPU (2026-12-06: the session's device time ran out)."""

from __future__ import annotations

import json
import os
import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from transformers import LlamaConfig, LlamaForCausalLM

from zerofit.backends.fsdp.sharding import apply_fsdp
from zerofit.distributed.parallelize import apply_ac, apply_compile
from zerofit.models.lean_ops import apply_lean_ops
from zerofit.models.lora import inject, linear_layers

GPU = torch.cuda.is_available()
dev = torch.device("cuda" if GPU else "cpu")
# 8B's widths at 8 layers on a GPU (1.75B parameters), a toy on CPU
WIDTHS = (4096, 14336, 32, 8, 8, (4, 2048)) if GPU else (512, 1024, 8, 2, 4, (2, 256))


def build() -> LlamaForCausalLM:
    dim, ffn, heads, kv, layers, _ = WIDTHS
    torch.manual_seed(0)
    cfg = LlamaConfig(
        hidden_size=dim,
        intermediate_size=ffn,
        num_attention_heads=heads,
        num_key_value_heads=kv,
        num_hidden_layers=layers,
        vocab_size=32000,
        attn_implementation="sdpa",
    )
    with torch.device(dev):
        model = LlamaForCausalLM(cfg)
    apply_lean_ops(model)
    inject(model, list(linear_layers(model)), 16, 32, 0.0, True, frozenset())
    for name, p in model.named_parameters():
        if "lora" not in name:  # the frozen base, stored as it is computed
            p.requires_grad_(False)
            p.data = p.data.bfloat16()
    return model


def measured(model: nn.Module, x: torch.Tensor) -> tuple[float, float]:
    """(MiB saved for backward outside checkpoints, peak GiB allocated) of the second step."""
    kept: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        kept[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    for _ in range(2):  # the second one is measured (compiled by then)
        kept.clear()
        if GPU:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        with torch.no_grad():
            model(input_ids=x, use_cache=False)
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            loss = model(input_ids=x, use_cache=False).logits.float().mean()
        loss.backward()
    peak = torch.cuda.max_memory_allocated() / 2**30 if GPU else float("nan")
    return sum(kept.values()) / 2**20, peak


def main(ways: list[str]) -> None:
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29561")
    dist.init_process_group("nccl" if GPU else "gloo", rank=0, world_size=1)
    mesh = init_device_mesh(dev.type, (1,))
    x = torch.randint(0, 32000, WIDTHS[-1], device=dev)
    rows = []
    for way in ways:
        torch._dynamo.reset()
        model = build()
        blocks = model.model.layers
        apply_ac(blocks, "full" if "-ac" in way else "none")
        if "compile" in way:
            apply_compile(blocks)
        if way.startswith("fsdp"):
            bf16, fp32 = torch.bfloat16, torch.float32
            apply_fsdp(model, blocks, mesh, param_dtype=bf16, reduce_dtype=fp32,
                       reshard_after_forward=True, cpu_offload=False)  # fmt: skip
        else:
            model.to(torch.bfloat16)
        saved, peak = measured(model, x)
        rows.append({"way": way, "saved_mib": saved, "peak_alloc_gib": peak})
        print(json.dumps(rows[-1]), flush=True)
        del model
        if GPU:
            torch.cuda.empty_cache()
    if os.environ.get("OUT"):
        meta = {"torch": torch.__version__, "gpu": torch.cuda.get_device_name(0) if GPU else None}
        with open(os.path.join(os.environ["OUT"], "fsdp_lora_mem.json"), "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1:])

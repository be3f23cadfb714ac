"""What the host issues for one decoder block's forward and backward: the counts behind the
planner's host term (`zerofit.planner.speed.host_seconds`). CPU only, no GPU needed.

    python benchmarks/block_launches.py [OUT_JSON]

Every aten operation a training step dispatches is recorded (a TorchDispatchMode) for a tiny
model of 2 and of 3 blocks, bf16, forward + backward of a summed output; the difference is one
block's. Counted per block:
- `kernels`: operations that launch a GPU kernel eagerly (views and allocations left out);
- `forward_kernels`: of which in forward (what a recomputed block issues again);
- `matmuls`: matmuls and attention, which a compiler leaves as their own kernels;
- `fused`: what the compiler launches for the same work, estimated as the matmuls plus one fused
  kernel for each run of other operations between two matmuls (Inductor fuses pointwise ops and
  reductions between matmuls into one kernel, sometimes two: a lower bound);
- `forward_ops`: every forward operation, views included (selective checkpointing calls its
  Python policy once per operation, in forward and again in the recomputation).
Models: zerofit's built-in Llama (`zerofit.models.llama`, the presets), and a Hugging Face
Llama with zerofit's lean ops plus every linear layer LoRA r16 (dropout 0.05) over a bf16 base,
or over an NF4 base (QLoRA), as `benchmarks/ac_saved_bytes.py` builds them. The adapters' counts
are per adapted linear layer (7 a block).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from zerofit.models import build_model

aten = torch.ops.aten
MATMULS = {
    "mm",
    "addmm",
    "bmm",
    "_scaled_mm",
    "_scaled_dot_product_flash_attention_for_cpu",
    "_scaled_dot_product_flash_attention_for_cpu_backward",
    "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_flash_attention",
}
NO_KERNEL = {"empty", "empty_like", "empty_strided", "new_empty", "lift_fresh", "detach", "alias"}


class Recorder(TorchDispatchMode):
    """The names of the aten operations dispatched, in order, and whether each is a view."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[tuple[str, bool]] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        name = func.overloadpacket.__name__
        self.ops.append((name, bool(func.is_view) or name in NO_KERNEL))
        return func(*args, **(kwargs or {}))


def counts(ops: list[tuple[str, bool]]) -> dict[str, int]:
    kernels = [name for name, view in ops if not view]
    fused, run = 0, False
    for name in kernels:
        if name in MATMULS:
            fused, run = fused + 1, False
        elif not run:
            fused, run = fused + 1, True
    matmuls = sum(name in MATMULS for name in kernels)
    return {"ops": len(ops), "kernels": len(kernels), "matmuls": matmuls, "fused": fused}


def step_ops(model: torch.nn.Module, loss: Callable[[torch.nn.Module], torch.Tensor]) -> dict:
    """Counts of a forward and of a forward + backward."""
    with Recorder() as fwd:
        out = loss(model)
    with Recorder() as both:
        out = loss(model)
        out.backward()
    return {"forward": counts(fwd.ops), "step": counts(both.ops)}


def per_block(make: Callable[[int], tuple[torch.nn.Module, Callable]]) -> dict[str, int]:
    """One block's counts: a 3-block model's less a 2-block model's."""
    two, three = (step_ops(*make(n)) for n in (2, 3))
    out = {k: three["step"][k] - two["step"][k] for k in three["step"]}
    out["forward_kernels"] = three["forward"]["kernels"] - two["forward"]["kernels"]
    out["forward_fused"] = three["forward"]["fused"] - two["forward"]["fused"]
    out["forward_ops"] = three["forward"]["ops"] - two["forward"]["ops"]
    return out


def builtin(layers: int) -> tuple[torch.nn.Module, Callable]:
    spec = build_model(
        "llama3-1b",
        overrides={"n_layers": layers, "dim": 256, "n_heads": 4, "n_kv_heads": 2,
                   "ffn_dim": 512, "vocab_size": 512},
        loss_chunk=0,
    )  # fmt: skip
    model = spec.construct().to(torch.bfloat16)
    x = torch.randint(0, 512, (1, 64))
    return model, lambda m: m(x).float().sum()


def hf(layers: int, lora: bool, quantized: bool) -> tuple[torch.nn.Module, Callable]:
    """A Hugging Face Llama with zerofit's lean ops; with `lora` every linear layer LoRA r16
    (alpha 32, dropout 0.05), over an NF4 base when `quantized` (as `ac_saved_bytes.qlora_model`)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from zerofit.models.lean_ops import apply_lean_ops
    from zerofit.models.lora import inject, linear_layers
    from zerofit.models.nf4 import quantize

    cfg = LlamaConfig(
        hidden_size=256,
        intermediate_size=512,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_hidden_layers=layers,
        vocab_size=512,
        attn_implementation="sdpa",
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).to(torch.bfloat16)
    apply_lean_ops(model)
    if lora:
        layers_ = linear_layers(model)
        weights = {n: layer.weight.detach().clone() for n, layer in layers_.items()}
        inject(
            model,
            list(layers_),
            16,
            32,
            0.05,
            True,
            frozenset(layers_) if quantized else frozenset(),
        )
        model.to(torch.bfloat16)
        with torch.no_grad():
            for name, weight in weights.items():
                layer = model.get_submodule(name)
                for piece, value in quantize(weight).items() if quantized else ():
                    getattr(layer.nf4, piece).copy_(value)
                layer.lora_B.weight.normal_(0, 0.02)
    model.train()
    x = torch.randint(0, 512, (1, 64))
    return model, lambda m: m(input_ids=x, use_cache=False).logits.float().sum()


def main(path: str | None) -> dict[str, Any]:
    torch.manual_seed(0)
    found = {"torch": torch.__version__, "builtin": per_block(builtin)}
    base = per_block(lambda n: hf(n, False, False))
    for name, quantized in (("lora", False), ("qlora", True)):
        adapted = per_block(lambda n, q=quantized: hf(n, True, q))
        found[f"{name}_per_layer"] = {k: (adapted[k] - base[k]) / 7 for k in base}
    found["hf"] = base
    text = json.dumps(found, indent=1)
    print(text)
    if path:
        with open(path, "w") as f:
            f.write(text + "\n")
    return found


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else None)

"""LoRA in ``zerofit export``: merge the adapters into the base weights, or write them as a PEFT
adapter folder.

A LoRA run's checkpoint holds the frozen base under the base's own names and the adapters as
``<layer>.lora_A.weight`` [r, in] and ``<layer>.lora_B.weight`` [out, r]; its meta.json says
which layers, the rank and alpha (``model.lora`` of the fingerprint).

- Merged (the default): each adapted weight is written as ``W + (alpha / r) * B @ A``, computed
  in fp32 and then cast to the export dtype; the adapter tensors are not written.
- QLoRA (``model.lora.quantize: nf4``): the 4-bit base is read back as the bf16 weights it holds
  (``DequantizedView``), then merged or written as above.
- Adapter (``--adapter``): ``adapter_config.json`` and ``adapter_model.safetensors`` with PEFT's
  names (``base_model.model.<module>.lora_A.weight``), which ``peft.PeftModel.from_pretrained(base,
  folder)`` loads onto the base model.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import safetensors.torch
import torch

from zerofit.checkpoint.neutral import MODEL, NeutralView
from zerofit.errors import UserError
from zerofit.models.lora import FACTORS, is_adapter
from zerofit.models.nf4 import PIECES, dequantize, piece_of

PEFT_PREFIX = "base_model.model."
Reader = Callable[[str, torch.dtype], torch.Tensor]


@dataclass(frozen=True)
class LoRAInfo:
    """What a LoRA checkpoint's meta.json says about its adapters."""

    rank: int
    alpha: float
    modules: list[str]  # the adapted layers, by their names in the run's model

    @property
    def scale(self) -> float:
        return self.alpha / self.rank


def lora_info(meta: dict[str, Any], view: NeutralView) -> LoRAInfo | None:
    """The checkpoint's LoRA, or None for a run without; UserError if an adapter is missing."""
    found = (meta.get("model") or {}).get("lora")
    if not found:
        return None
    info = LoRAInfo(int(found["rank"]), float(found["alpha"]), list(found["modules"]))
    for module in info.modules:
        for factor in FACTORS:
            if f"{MODEL}{module}.{factor}.weight" not in view.entries:
                raise UserError(f"checkpoint {view.where} lacks the adapter {module}.{factor}")
    return info


def base_names(view: NeutralView) -> list[str]:
    """The checkpoint's parameter names without the adapters'."""
    return [n for n in view.names() if not is_adapter(n)]


def merged_reader(view: NeutralView, lora: LoRAInfo | None) -> Reader:
    """``read(key, dtype)``: a tensor of the checkpoint, adapted weights merged (in fp32)."""
    adapted = set(lora.modules) if lora else set()

    def read(key: str, dtype: torch.dtype) -> torch.Tensor:
        module = key[len(MODEL) :].removesuffix(".weight")
        if lora is None or not key.endswith(".weight") or module not in adapted:
            return view.read(key, dtype)
        w = view.read(key, torch.float32)
        a = view.read(f"{MODEL}{module}.lora_A.weight", torch.float32)
        b = view.read(f"{MODEL}{module}.lora_B.weight", torch.float32)
        return w.addmm_(b, a, alpha=lora.scale).to(dtype)

    return read


def _targets(adapted: list[str], linear: set[str]) -> list[str]:
    """PEFT's ``target_modules``: the layers' last names where they select exactly the adapted
    layers among the model's linear layers, else every adapted layer by its full name."""
    leaves = {m.rsplit(".", 1)[-1] for m in adapted}
    same = {m for m in linear if m.rsplit(".", 1)[-1] in leaves}
    return sorted(leaves) if same == set(adapted) else sorted(adapted)


def adapter_config(
    lora: LoRAInfo, hf_modules: list[str], linear: set[str], dropout: float, base: str
) -> dict[str, Any]:
    """``adapter_config.json`` for the adapters (``hf_modules``: their Hugging Face names)."""
    return {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base,
        "r": lora.rank,
        "lora_alpha": lora.alpha,
        "lora_dropout": dropout,
        "target_modules": _targets(hf_modules, linear),
        "bias": "none",
        "fan_in_fan_out": False,
        "use_rslora": False,
        "use_dora": False,
        "inference_mode": True,
        "modules_to_save": None,
    }


def adapter_tensors(
    lora: LoRAInfo, view: NeutralView, hf_name: Callable[[str], str | None], shapes: dict
) -> list[tuple[str, str]]:
    """(neutral key, PEFT name) of every factor, checked against the HF model's weight shapes."""
    out = []
    for module in lora.modules:
        hf = hf_name(f"{module}.weight")
        if hf is None or hf not in shapes:
            raise UserError(f"checkpoint {view.where}: adapted layer {module} has no HF weight")
        out_f, in_f = shapes[hf]
        for factor, want in (("lora_A", (lora.rank, in_f)), ("lora_B", (out_f, lora.rank))):
            key = f"{MODEL}{module}.{factor}.weight"
            if view.entries[key][0] != want:
                raise UserError(
                    f"checkpoint {view.where}: {key} has shape {view.entries[key][0]}, not {want}"
                )
            out.append((key, f"{PEFT_PREFIX}{hf.removesuffix('.weight')}.{factor}.weight"))
    return out


def write_adapter(
    view: NeutralView, tensors: list[tuple[str, str]], dtype: torch.dtype, config: dict, out: Path
) -> int:
    """Write ``adapter_model.safetensors`` and ``adapter_config.json``; returns their bytes."""
    batch = {name: view.read(key, dtype).contiguous() for key, name in tensors}
    safetensors.torch.save_file(
        batch, str(out / "adapter_model.safetensors"), metadata={"format": "pt"}
    )
    (out / "adapter_config.json").write_text(json.dumps(config, indent=2) + "\n")
    return sum(t.numel() * t.element_size() for t in batch.values())


class DequantizedView(NeutralView):
    """A QLoRA checkpoint seen as its LoRA twin: each layer's NF4 pieces (``<layer>.nf4.*``)
    read as one ``<layer>.weight`` of its shape, the bf16 weight they hold (cast on read)."""

    def __init__(self, view: NeutralView, shapes: dict[str, list[int]]) -> None:
        self.view, self.where, self.shapes = view, view.where, shapes
        self.entries = {}
        for key, entry in view.entries.items():
            found = piece_of(key.removeprefix(MODEL)) if key.startswith(MODEL) else None
            if found is None:
                self.entries[key] = entry
            elif found[1] == "codes":  # the weight takes its pieces' place in the order
                layer = found[0].removesuffix(".weight")
                if layer not in shapes:
                    raise UserError(
                        f"checkpoint {view.where}: {layer} is 4-bit, meta.json says not"
                    )
                self.entries[MODEL + found[0]] = (tuple(shapes[layer]), torch.bfloat16)

    def read(self, key: str, dtype: torch.dtype | None = None) -> torch.Tensor:
        layer = key.removeprefix(MODEL).removesuffix(".weight")
        if key in self.view.entries or layer not in self.shapes:
            return self.view.read(key, dtype)
        pieces = {p: self.view.read(f"{MODEL}{layer}.nf4.{p}") for p in PIECES}
        return dequantize(pieces, tuple(self.shapes[layer]), torch.bfloat16).to(
            dtype or torch.bfloat16
        )


def dequantized(meta: dict[str, Any], view: NeutralView) -> NeutralView:
    """`view`, with a QLoRA run's 4-bit base read as bf16 weights (else `view` itself)."""
    shapes = ((meta.get("model") or {}).get("lora") or {}).get("quantized")
    return DequantizedView(view, shapes) if shapes else view

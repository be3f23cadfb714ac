"""Effective precision, read from the tensors after wrapping (not from the config).

Hidden dtype differences are the usual cause of FSDP-vs-DeepSpeed loss gaps (an fp32 upcast of
master weights in one engine, bf16 gradient reduction in the other). After the first step each
engine reports the dtype of: compute (a Linear's output in forward), master weights (what the
optimizer updates), optimizer states (AdamW's exp_avg) and gradient reduction. Any difference from
what the config asks for becomes a warning that names it.

With `precision.fp8`, the report also says which Linear layers compute in float8 (torchao's
Float8Linear) and with which recipe, and which stay in the compute dtype (the output layer, and any
whose dims are not multiples of 16), by name pattern (block indices as `*`) with their counts.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from zerofit.backends.base import DTYPE
from zerofit.distributed.fp8 import all_gathers_float8, float8_linears, output_layers, recipe_of
from zerofit.models.llama import strip_wrapper_names
from zerofit.models.nf4 import NF4Weight, piece_of

NAMES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}
CONFIG_KEY = {
    "compute": "param_dtype",
    "master_weights": "master_dtype",
    "optimizer_states": "master_dtype",
    "gradient_reduction": "reduce_dtype",
    "frozen_weights": "param_dtype",  # nothing updates them: stored as they are computed
}


def dtype_name(dtype: torch.dtype) -> str:
    return NAMES.get(dtype, str(dtype).removeprefix("torch."))


def watch_compute_dtype(model: nn.Module) -> Callable[[], torch.dtype | None]:
    """Hook the output layer (the last Linear, outside any compiled or checkpointed block); returns
    a getter for the dtype its matmul ran in during the last forward: the autocast dtype where
    autocast is on (DDP mixed precision), else the dtype of its input (FSDP/DeepSpeed casts)."""
    seen: dict[str, torch.dtype] = {}
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    if not linears:
        return lambda: None

    def hook(_m: nn.Module, inputs: tuple[Any, ...]) -> None:
        x = inputs[0]
        device = x.device.type
        if torch.is_autocast_enabled(device):
            seen["dtype"] = torch.get_autocast_dtype(device)
        else:
            seen["dtype"] = x.dtype

    handle = linears[-1].register_forward_pre_hook(hook)

    def read() -> torch.dtype | None:
        handle.remove()
        return seen.get("dtype")

    return read


def optimizer_state_dtype(optimizer: torch.optim.Optimizer) -> torch.dtype | None:
    inner = getattr(optimizer, "optimizer", None)
    opt = inner if isinstance(inner, torch.optim.Optimizer) else optimizer
    for state in opt.state.values():
        if "exp_avg" in state:
            return state["exp_avg"].dtype
    return None


def stored_dtypes(model: nn.Module) -> tuple[torch.dtype | None, torch.dtype | None]:
    """The dtype the module stores its trainable and its frozen floating-point parameters in
    (None: there are none). With LoRA the trainable ones are the adapters, the frozen one the
    base (a QLoRA base's 4-bit layers apart: ``quantized_layers``)."""
    trained = next((p.dtype for p in model.parameters() if p.requires_grad), None)
    frozen = next(
        (
            p.dtype
            for n, p in model.named_parameters()
            if not p.requires_grad and piece_of(n) is None
        ),
        None,
    )
    return trained, frozen


def quantized_layers(model: nn.Module) -> int:
    """How many linear layers hold their frozen weight in NF4 (QLoRA)."""
    return sum(isinstance(m, NF4Weight) for m in model.modules())


def _pattern(name: str) -> str:
    """`layers.3.attention.wq` -> `layers.*.attention.wq` (wrapper segments dropped)."""
    return ".".join("*" if p.isdigit() else p for p in strip_wrapper_names(name).split("."))


def fp8_layers(model: nn.Module) -> dict[str, Any]:
    """Which Linear layers compute in float8 and with which recipe, and which do not (by name
    pattern, with counts); `output_layer_float8` should stay False."""
    converted = dict(float8_linears(model))
    plain = [n for n, m in model.named_modules() if isinstance(m, nn.Linear) and n not in converted]
    heads = {id(m) for m in output_layers(model)}
    recipes = sorted({recipe_of(m) for m in converted.values()})
    return {
        "recipe": ", ".join(recipes) or None,
        "float8_all_gather": all_gathers_float8(model),
        "float8_linears": dict(Counter(_pattern(n) for n in converted)),
        "high_precision_linears": dict(Counter(_pattern(n) for n in plain)),
        "output_layer_float8": any(id(m) in heads for m in converted.values()),
    }


def _fp8_warnings(name: str, wanted: str, fp8: dict[str, Any]) -> list[str]:
    n = sum(fp8["float8_linears"].values())
    if wanted == "none":
        return (
            [f"{name}: {n} Linear layers compute in float8, but precision.fp8 is none"] if n else []
        )
    if n == 0:
        return [f"{name}: no Linear layer computes in float8, but precision.fp8 is {wanted}"]
    out = []
    if fp8["recipe"] != wanted:
        out.append(f"{name}: float8 recipe {fp8['recipe']}, but precision.fp8 is {wanted}")
    if fp8["output_layer_float8"]:
        out.append(
            f"{name}: the output layer computes in float8 (it should stay in high precision)"
        )
    return out


def report(backend: Any, compute: torch.dtype | None) -> dict[str, Any]:
    """Effective dtypes of one engine after its first step, plus warnings against the config.

    With frozen parameters (LoRA), also the dtype the frozen base is stored in (wanted: the
    compute dtype) and the adapters' (their master weights: ``master_weights``; the module's
    copy: ``adapter_weights``, the compute dtype where the engine keeps one)."""
    master = next(iter(backend.master_tensors()), None)
    found = {
        "compute": compute,
        "master_weights": master.dtype if master is not None else None,
        "optimizer_states": optimizer_state_dtype(backend.optimizer),
        "gradient_reduction": backend.reduce_dtype_in_use(),
    }
    adapters, frozen = stored_dtypes(backend.model)
    if frozen is not None:
        found |= {"adapter_weights": adapters, "frozen_weights": frozen}
    effective = {k: dtype_name(v) if v is not None else "unknown" for k, v in found.items()}
    four_bit = quantized_layers(backend.model)
    if four_bit:
        effective["frozen_linears"] = f"nf4 ({four_bit} layers)"
    warnings = []
    for key, value in found.items():
        if key not in CONFIG_KEY:
            continue
        wanted = getattr(backend.precision, CONFIG_KEY[key])
        if value is not None and value != DTYPE[wanted]:
            warnings.append(
                f"{backend.name}: {key.replace('_', ' ')} in {dtype_name(value)}, "
                f"but precision.{CONFIG_KEY[key]} is {wanted}"
            )
    fp8 = fp8_layers(backend.model)
    warnings += _fp8_warnings(backend.name, backend.precision.fp8, fp8)
    out = {"backend": backend.name, "effective": effective, "warnings": warnings}
    if backend.precision.fp8 != "none" or fp8["float8_linears"]:
        out["fp8"] = fp8
    return out

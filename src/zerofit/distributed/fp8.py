"""FP8 training (`precision.fp8`): torchao's float8 matmuls in the model's Linear layers.

`apply_fp8(model, recipe)` swaps every eligible `nn.Linear` for torchao's `Float8Linear` in place
(same parameters, same names, so checkpoints do not change). It runs first, in torchtitan's order:
fp8 -> activation checkpointing -> compile -> FSDP. A Float8Linear casts its input, weight and
output gradient to float8 with dynamic scales (one per tensor for `tensorwise`, one per row for
`rowwise`) and multiplies with `torch._scaled_mm`; the weights, the optimizer and every other op
keep their dtypes.

Kept in high precision:
- the output layer (zerofit's `LMHead`, the fused output layer + chunked loss, and an HF model's
  `get_output_embeddings()`, e.g. `lm_head`): logits are sensitive to float8's 3-bit mantissa;
- Linear layers whose in or out features are not multiples of 16 (`_scaled_mm` needs them).

Tensorwise under FSDP2 also all-gathers the converted weights in float8 (1 byte per parameter
instead of 2); the engine then calls `precompute_scales` after each optimizer step, so the scales
of all those weights come from one all-reduce instead of one per weight.

`require_hardware` refuses anything but a CUDA GPU of compute capability 8.9 (Ada, Hopper) or
newer: the float8 tensor cores the recipe exists for.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from dataclasses import replace
from types import ModuleType

import torch
from torch import nn

from zerofit.errors import UserError
from zerofit.models.loss import LMHead

RECIPES = ("tensorwise", "rowwise")
MIN_CAPABILITY = (8, 9)  # Ada (sm_89) and Hopper (sm_90): float8 tensor cores
DIM_MULTIPLE = 16  # `torch._scaled_mm` wants both dims of each operand a multiple of 16
INSTALL = "pip install 'zerofit[fp8]' (torchao)"


def _float8() -> ModuleType:
    """`torchao.float8` (its import-time noise is filtered: `zerofit.report.quiet`); UserError
    without torchao."""
    try:
        import torchao.float8 as float8  # optional: torchao (the fp8 extra)
    except ImportError:
        raise UserError(f"precision.fp8 needs torchao: {INSTALL}") from None
    return float8


def require_hardware(device: torch.device) -> None:
    """UserError unless `device` is a CUDA GPU with float8 tensor cores (compute capability 8.9+),
    and torchao is installed."""
    if device.type != "cuda":
        raise UserError(
            f"precision.fp8 needs a CUDA GPU of compute capability {_cc(MIN_CAPABILITY)} or newer "
            f"(Ada, Hopper, Blackwell); this run is on {device.type.upper()}"
        )
    cc = torch.cuda.get_device_capability(device)
    if cc < MIN_CAPABILITY:
        name = torch.cuda.get_device_name(device)
        raise UserError(
            f"precision.fp8 needs a GPU of compute capability {_cc(MIN_CAPABILITY)} or newer "
            f"(float8 tensor cores: Ada, Hopper, Blackwell); {name} is {_cc(cc)}"
        )
    _float8()


def _cc(cc: tuple[int, int]) -> str:
    return f"{cc[0]}.{cc[1]}"


def output_layers(model: nn.Module) -> list[nn.Module]:
    """The model's output layers: zerofit's LMHead (the built-in Llama's `output`, an HF model's
    fused head) and whatever an HF model names as its output embeddings (`lm_head`)."""
    found: dict[int, nn.Module] = {}
    for module in model.modules():
        if isinstance(module, LMHead):
            found[id(module)] = module
        head = _output_embeddings(module)
        if head is not None:
            found[id(head)] = head
    return list(found.values())


def _output_embeddings(module: nn.Module) -> nn.Module | None:
    """An HF model's output layer (None for a module that has none, or says it has none)."""
    get = getattr(module, "get_output_embeddings", None)
    try:
        head = get() if callable(get) else None
    except (NotImplementedError, AttributeError):  # a remote-code model may not implement it
        return None
    return head if isinstance(head, nn.Module) else None


def fp8_filter(model: nn.Module) -> Callable[[nn.Module, str], bool]:
    """torchao's `module_filter_fn` for `model`: True for a Linear to convert."""
    keep = {id(m) for m in output_layers(model)}

    def convert(module: nn.Module, fqn: str) -> bool:
        return (
            isinstance(module, nn.Linear)
            and id(module) not in keep
            and module.in_features % DIM_MULTIPLE == 0
            and module.out_features % DIM_MULTIPLE == 0
        )

    return convert


def fp8_config(recipe: str, fsdp_float8_all_gather: bool = False) -> object:
    """torchao's Float8LinearConfig for `recipe`; tensorwise may all-gather in float8 (FSDP2)."""
    if recipe not in RECIPES:
        raise ValueError(f"unknown fp8 recipe {recipe!r}; known: {', '.join(RECIPES)}")
    config = _float8().Float8LinearConfig.from_recipe_name(recipe)
    if fsdp_float8_all_gather:
        if recipe != "tensorwise":
            raise ValueError("float8 all-gather exists for the tensorwise recipe only")
        config = replace(config, enable_fsdp_float8_all_gather=True)
    return config


def apply_fp8(model: nn.Module, recipe: str, *, fsdp_float8_all_gather: bool = False) -> int:
    """Swap `model`'s eligible Linear layers for torchao Float8Linear in place (parameters may be
    on meta); before activation checkpointing, compile and FSDP. Returns how many were swapped."""
    config = fp8_config(recipe, fsdp_float8_all_gather)
    float8 = _float8()
    float8.convert_to_float8_training(model, module_filter_fn=fp8_filter(model), config=config)
    return sum(1 for _ in float8_linears(model))


def convert(model: nn.Module, recipe: str, device: torch.device, fsdp_all_gather: bool) -> int:
    """What an engine does with `precision.fp8`: nothing for "none"; else check the hardware
    (UserError) and `apply_fp8`. Returns the Linear layers converted."""
    if recipe == "none":
        return 0
    require_hardware(device)
    return apply_fp8(model, recipe, fsdp_float8_all_gather=fsdp_all_gather)


def float8_linears(model: nn.Module) -> Iterator[tuple[str, nn.Module]]:
    """(name, module) of every torchao Float8Linear in `model` (none while torchao's float8 is
    not imported: nothing can have been converted)."""
    loaded = sys.modules.get("torchao.float8.float8_linear")
    cls = getattr(loaded, "Float8Linear", None)
    if cls is None:
        return
    for name, module in model.named_modules():
        if isinstance(module, cls):
            yield name, module


def recipe_of(module: nn.Module) -> str:
    """The recipe a Float8Linear runs: scaling granularity of its input cast."""
    granularity = module.config.cast_config_input.scaling_granularity  # type: ignore[union-attr]
    return "rowwise" if granularity.name == "AXISWISE" else "tensorwise"


def all_gathers_float8(model: nn.Module) -> bool:
    """Whether any Float8Linear of `model` has FSDP2 all-gather its weight in float8."""
    return any(
        m.config.enable_fsdp_float8_all_gather  # type: ignore[union-attr]
        for _, m in float8_linears(model)
    )


def precompute_scales(model: nn.Module) -> None:
    """After an optimizer step (and after loading weights): every float8-all-gathered weight's
    scale from one all-reduce of their amaxes, used by the next all-gathers."""
    _float8().precompute_float8_dynamic_scale_for_fsdp(model)

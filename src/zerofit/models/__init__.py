"""One entry point for models: ``build_model(preset=... | hf=...) -> ModelSpec``.

The module in a ``ModelSpec`` has its parameters on the meta device (buffers real); the trainer
shards it, materialises it (``meta.allocate_`` keeps buffers) and fills each parameter with
``init_param_`` or ``weights``.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields, replace
from functools import partial

import torch
from torch import nn

from zerofit.errors import UserError
from zerofit.limits import shown
from zerofit.models.llama import PRESETS, Llama, LlamaArgs, flops_per_token, num_params
from zerofit.models.meta import meta_params

__all__ = ["PRESETS", "LlamaArgs", "ModelSpec", "build_model", "preset_names"]


@dataclass
class ModelSpec:
    module: nn.Module  # params on meta, buffers real; forward(tokens[, targets]) -> logits | loss
    blocks_path: str  # dotted path of the nn.ModuleList of decoder blocks in `module`
    vocab_size: int
    max_seq_len: int
    num_params: int
    flops_per_token: Callable[[int], float]  # seq_len -> FLOPs per token
    init_param_: Callable[[str, torch.Tensor, torch.Generator], None]
    fingerprint: dict  # JSON-able architecture description, to reject foreign checkpoints
    weights: Callable[[str], torch.Tensor] | None  # param name -> full tensor from disk, or None
    construct: Callable[
        [], nn.Module
    ]  # builds the same module with real parameters (for zero.Init)


def preset_names() -> list[str]:
    return list(PRESETS)


def _llama_args(preset: str, overrides: dict | None) -> LlamaArgs:
    if preset not in PRESETS:
        close = difflib.get_close_matches(preset, PRESETS, n=1, cutoff=0.0)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise UserError(
            f"unknown model preset {shown(preset)}{hint} (choices: {', '.join(PRESETS)})"
        )
    args = PRESETS[preset]
    if not overrides:
        return args
    valid = {f.name for f in fields(LlamaArgs)}
    for key in overrides:
        if key not in valid:
            close = difflib.get_close_matches(key, valid, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise UserError(f"unknown model override {shown(key)}{hint}")
    try:
        args = replace(args, **overrides)
        args.validate()
    except (TypeError, ValueError) as e:
        raise UserError(f"bad model override: {e}") from e
    return args


def _build_llama(preset: str, overrides: dict | None, loss_chunk: int) -> ModelSpec:
    args = _llama_args(preset, overrides)
    with meta_params():
        model = Llama(args, loss_chunk)
    return ModelSpec(
        module=model,
        blocks_path="layers",
        vocab_size=args.vocab_size,
        max_seq_len=args.max_seq_len,
        num_params=num_params(args),
        flops_per_token=partial(flops_per_token, args),
        init_param_=model.init_param_,
        fingerprint={"source": "zerofit-llama", "args": asdict(args)},
        weights=None,
        construct=partial(Llama, args, loss_chunk),
    )


def _build_hf(directory: str, overrides: dict | None) -> ModelSpec:
    from zerofit.models.hf import build_hf, construct_hf, load_hf_weights

    module, info = build_hf(directory, overrides)
    return ModelSpec(
        module=module,
        blocks_path=info.blocks_path,
        vocab_size=info.vocab_size,
        max_seq_len=info.max_seq_len,
        num_params=info.num_params,
        flops_per_token=info.flops_per_token,
        init_param_=module.init_param_,
        fingerprint=info.fingerprint,
        weights=load_hf_weights(directory, module),
        construct=partial(construct_hf, info.config),
    )


def build_model(
    preset: str | None = None,
    hf: str | None = None,
    overrides: dict | None = None,
    loss_chunk: int = 4096,
) -> ModelSpec:
    """Build a model spec from exactly one of a zerofit Llama ``preset`` or an ``hf`` directory.

    ``overrides`` changes LlamaArgs fields (preset) or config attributes (hf), e.g. {"n_layers": 2}.
    ``loss_chunk``: tokens per chunk of the fused head + loss of the Llama presets (0: full logits).
    """
    if (preset is None) == (hf is None):
        raise UserError("give exactly one of model.preset or model.hf")
    if preset is not None:
        return _build_llama(preset, overrides, loss_chunk)
    assert hf is not None
    return _build_hf(hf, overrides)

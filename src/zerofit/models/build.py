"""``build_model(preset=... | hf=...) -> ModelSpec`` (re-exported by ``zerofit.models``).

The module in a ``ModelSpec`` has its parameters on the meta device (buffers real); the trainer
shards it, materialises it (``meta.allocate_`` keeps buffers) and fills each parameter with
``init_param_`` (``zerofit.models.init``) or ``weights``. Parameter counts and FLOPs per token come
from ``shape``, a ``zerofit.models.shape.ModelShape``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from functools import partial

import torch
from torch import nn

from zerofit.errors import UserError
from zerofit.models.init import hf_init, llama_init
from zerofit.models.llama import Llama
from zerofit.models.meta import meta_params
from zerofit.models.presets import preset_args
from zerofit.models.shape import ModelShape


@dataclass
class ModelSpec:
    # params on meta, buffers real; forward(tokens, targets=None, positions=None) -> logits | loss
    module: nn.Module
    blocks_path: str  # dotted path of the nn.ModuleList of decoder blocks in `module`
    vocab_size: int
    max_seq_len: int
    shape: ModelShape  # parameter counts, FLOPs per token, fused head
    init_param_: Callable[[str, torch.Tensor, torch.Generator], None]
    fingerprint: dict  # JSON-able architecture description, to reject foreign checkpoints
    # param name -> full tensor from disk (None for a name to initialise), or None: nothing on disk
    weights: Callable[[str], torch.Tensor | None] | None
    construct: Callable[
        [], nn.Module
    ]  # builds the same module with real parameters (for zero.Init)

    @property
    def num_params(self) -> int:
        """``shape.num_params``."""
        return self.shape.num_params

    def flops_per_token(self, seq_len: int) -> float:
        """``shape.flops_per_token``: training FLOPs per token at ``seq_len``."""
        return self.shape.flops_per_token(seq_len)


def _build_llama(preset: str, overrides: dict | None, loss_chunk: int) -> ModelSpec:
    args = preset_args(preset, overrides)
    with meta_params():
        model = Llama(args, loss_chunk)
    return ModelSpec(
        module=model,
        blocks_path="layers",
        vocab_size=args.vocab_size,
        max_seq_len=args.max_seq_len,
        shape=ModelShape.from_llama_args(args, name=preset, fused_head=loss_chunk > 0),
        init_param_=llama_init(args),
        fingerprint={"source": "zerofit-llama", "args": asdict(args)},
        weights=None,
        construct=partial(Llama, args, loss_chunk),
    )


def _build_hf(directory: str, overrides: dict | None, loss_chunk: int, trust: bool) -> ModelSpec:
    from zerofit.models.hf import build_hf, construct_hf, load_hf_weights

    module, info = build_hf(directory, overrides, loss_chunk, trust)
    return ModelSpec(
        module=module,
        blocks_path=info.blocks_path,
        vocab_size=info.vocab_size,
        max_seq_len=info.max_seq_len,
        shape=info.shape,
        init_param_=hf_init(module),
        fingerprint=info.fingerprint,
        weights=load_hf_weights(directory, module),
        construct=partial(construct_hf, info.config, loss_chunk, module.fused, trust),
    )


def build_model(
    preset: str | None = None,
    hf: str | None = None,
    overrides: dict | None = None,
    loss_chunk: int = 4096,
    trust_remote_code: bool = False,
) -> ModelSpec:
    """Build a model spec from exactly one of a zerofit Llama ``preset`` or an ``hf`` directory.

    ``overrides`` changes LlamaArgs fields (preset) or config attributes (hf), e.g. {"n_layers": 2}.
    ``loss_chunk``: tokens per chunk of the fused head + loss (0: full logits; HF models whose
    logits are transformed after the head always use full logits: ``shape.fused_head`` says which).
    ``trust_remote_code``: let an ``hf`` folder run its own Python code.
    """
    if (preset is None) == (hf is None):
        raise UserError("give exactly one of model.preset or model.hf")
    if preset is not None:
        return _build_llama(preset, overrides, loss_chunk)
    assert hf is not None
    return _build_hf(hf, overrides, loss_chunk, trust_remote_code)

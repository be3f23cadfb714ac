"""``build_model(preset=... | hf=...) -> ModelSpec`` (re-exported by ``zerofit.models``).

The module in a ``ModelSpec`` has its parameters on the meta device (buffers real); the trainer
shards it, materialises it (``meta.allocate_`` keeps buffers) and fills each parameter with
``init_param_`` (``zerofit.models.init``) or ``weights``. Parameter counts and FLOPs per token come
from ``shape``, a ``zerofit.models.shape.ModelShape``. An ``hf`` folder must hold weights that fit
the model (``zerofit.models.hf_weights``) unless ``random_init``; presets always start at random.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from functools import partial
from typing import Any

import torch
from torch import nn

from zerofit.config.limits import shown
from zerofit.errors import UserError
from zerofit.models.hf import build_hf, construct_hf
from zerofit.models.hf_weights import load_hf_weights
from zerofit.models.init import hf_init, llama_init
from zerofit.models.llama import Llama
from zerofit.models.meta import meta_params
from zerofit.models.nf4 import weight_count
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
    # where ``weights`` reads from (``hf_weights.WeightFiles.source``), or why there is nothing to
    # read ({"format": "none", "reason": ...}); JSON-able, for the run's first lines and summary
    weights_source: dict[str, Any] | None = None
    # parameters that train (LoRA: the adapters), counted on the module before an engine shards it
    # (``zerofit.train.inputs.build_inputs``); None: not counted
    trainable_params: int | None = None

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
        weights_source={"format": "none", "reason": f"model.preset: {preset}"},
    )


def _build_hf(
    directory: str, overrides: dict | None, loss_chunk: int, trust: bool, random_init: bool
) -> ModelSpec:
    module, info = build_hf(directory, overrides, loss_chunk, trust)
    weights = None if random_init else load_hf_weights(directory, module, bool(overrides))
    source = (
        weights.source()
        if weights is not None
        else {"format": "none", "reason": "model.random_init: true"}
    )
    return ModelSpec(
        module=module,
        blocks_path=info.blocks_path,
        vocab_size=info.vocab_size,
        max_seq_len=info.max_seq_len,
        shape=info.shape,
        init_param_=hf_init(module),
        fingerprint=info.fingerprint,
        weights=weights,
        construct=partial(construct_hf, info.config, loss_chunk, module.fused, trust),
        weights_source=source,
    )


def build_model(
    preset: str | None = None,
    hf: str | None = None,
    overrides: dict | None = None,
    loss_chunk: int = 4096,
    trust_remote_code: bool = False,
    random_init: bool = False,
) -> ModelSpec:
    """Build a model spec from exactly one of a zerofit Llama ``preset`` or an ``hf`` directory.

    ``overrides`` changes LlamaArgs fields (preset) or config attributes (hf), e.g. {"n_layers": 2}.
    ``loss_chunk``: tokens per chunk of the fused head + loss (0: full logits; HF models whose
    logits are transformed after the head always use full logits: ``shape.fused_head`` says which).
    ``trust_remote_code``: let an ``hf`` folder run its own Python code.
    ``random_init``: do not read an ``hf`` folder's weights (else it must hold weights that fit the
    model: UserError otherwise); presets always start from random weights.
    """
    if (preset is None) == (hf is None):
        raise UserError("give exactly one of model.preset or model.hf")
    if preset is not None:
        return _build_llama(preset, overrides, loss_chunk)
    assert hf is not None
    return _build_hf(hf, overrides, loss_chunk, trust_remote_code, random_init)


def param_counts(module: nn.Module) -> tuple[int, int]:
    """(all, trainable) parameters of a module not yet sharded (meta parameters count too); a
    weight stored in NF4 (QLoRA) counts its elements, not its storage's."""
    trainable = sum(p.numel() for p in module.parameters() if p.requires_grad)
    return weight_count(module), trainable


def _short(n: float, units: tuple[str, ...], sep: str) -> str:
    """``n`` in the largest of ``units`` (steps of 1000) it reaches: 3 digits, or whole."""
    i = 0
    while i < len(units) - 1 and n >= 1000:
        n, i = n / 1000, i + 1
    if i == 0:
        return f"{int(n)}{sep}{units[0]}"
    digits = 2 if n < 10 else 1 if n < 100 else 0
    return f"{n:,.{digits}f}{sep}{units[i]}"


def weights_line(source: dict[str, Any] | None) -> str:
    """``weights: 2 safetensors files in DIR, 291 tensors (2.47 GB)``, or ``weights: none
    (model.random_init: true): random initialisation``."""
    if not source or source.get("format") == "none":
        why = (source or {}).get("reason", "nothing to read")
        return f"weights: none ({why}): random initialisation"
    n = len(source["files"])
    kind = {"safetensors": "safetensors", "bin": "PyTorch .bin"}.get(source["format"], "")
    size = _short(source["bytes"], ("bytes", "kB", "MB", "GB", "TB"), " ")
    return (
        f"weights: {n} {kind} file{'s' if n != 1 else ''} in {shown(source['directory'], quote=False)}, "
        f"{source['tensors']} tensors ({size})"
    )


def params_line(total: int, trainable: int) -> str:
    """``params: 1.24B, 1.24B trainable (100%)`` (exact counts in summary.json)."""
    share = f"{100 * trainable / total:.3g}%" if total else "-"
    units = ("", "K", "M", "B", "T")
    return f"params: {_short(total, units, '')}, {_short(trainable, units, '')} trainable ({share})"

"""LoRA: train low-rank updates of chosen linear layers, the rest of the model frozen.

``apply_lora(spec, cfg)`` turns a ``ModelSpec`` into its LoRA form. Each adapted ``nn.Linear``
becomes a ``LoRALinear`` that holds the base layer's own ``weight`` (and ``bias``) parameters,
so their names do not change (base weights load from disk, checkpoints and export keep working),
and gains two factors: ``<layer>.lora_A.weight`` [r, in] and ``<layer>.lora_B.weight`` [out, r]
(PEFT's names). ``forward(x) = base(x) + (alpha / r) * B(A(dropout(x)))``; with ``lean`` (the
default, ``model.lean_ops``) the update is one autograd function that keeps less for backward
(``zerofit.models.lora_delta``), wherever the factors are whole in the layer (not a ZeRO-3
partition, which the factor modules' own calls gather).

A starts as PEFT's default (kaiming-uniform with a = sqrt(5): U(-1/sqrt(in), 1/sqrt(in))) and B at
zero, so a fresh model computes what its base does. Both come from the spec's name-seeded
initialiser, so every engine and sharding starts from the same numbers; on a model whose weights
come from disk, ``weights`` answers None for an adapter ("not on disk: initialise it").
Every parameter but the factors has ``requires_grad`` False. ``'all-linear'`` adapts every
``nn.Linear`` but the output head; a list names modules exactly or by a dotted suffix.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import nn

from zerofit.errors import UserError
from zerofit.models import ModelSpec
from zerofit.models.init import param_seed
from zerofit.models.lean_ops import GATED
from zerofit.models.lora_delta import lora_delta, lora_delta_gated
from zerofit.models.loss import LMHead
from zerofit.models.nf4 import (
    NF4Weight,
    QuantizedSource,
    local_device,
    nf4_linear,
    quantizable,
    weight_count,
)
from zerofit.models.shape import ModelShape, ParamCounts

if TYPE_CHECKING:
    from zerofit.config.schema import LoRAConfig

FACTORS = ("lora_A", "lora_B")
ALL_LINEAR = "all-linear"


class LoRAFactor(nn.Module):
    """One factor, ``x @ weight.T``: a module of its own so that engines that gather parameters
    module by module (ZeRO-3) gather it when it runs. Not an ``nn.Linear``: never a target."""

    def __init__(self, in_features: int, out_features: int, device: torch.device | None) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(out_features, in_features, device=device))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight)


class LoRALinear(nn.Module):
    """``base(x) + scale * lora_B(lora_A(dropout(x)))``, keeping the base's parameter names; with
    `nf4` (QLoRA) the base weight is stored as ``<layer>.nf4.*`` (``zerofit.models.nf4``)."""

    def __init__(
        self,
        base: nn.Linear,
        rank: int,
        alpha: float,
        dropout: float,
        lean: bool = True,
        nf4: bool = False,
    ) -> None:
        super().__init__()
        self.in_features, self.out_features = base.in_features, base.out_features
        device = base.weight.device if base.weight.device.type == "meta" else None
        if nf4:
            self.nf4 = NF4Weight((base.out_features, base.in_features), device=device)
        else:
            self.weight = base.weight
        self.register_parameter("bias", base.bias)
        self.lora_A = LoRAFactor(base.in_features, rank, device)
        self.lora_B = LoRAFactor(rank, base.out_features, device)
        self.dropout = nn.Dropout(dropout) if dropout > 0 else nn.Identity()
        self.p, self.scale, self.lean, self.enabled = dropout, alpha / rank, lean, True

    def _base(self, x: torch.Tensor) -> torch.Tensor:
        if hasattr(self, "nf4"):
            return nf4_linear(x, self.nf4, self.bias)
        return F.linear(x, self.weight, self.bias)

    def _lean(self) -> bool:
        """Whether the update runs as one lean operator: the factors whole here (not ZeRO-3's
        partitions, which their own modules' calls gather)."""
        return self.lean and self.lora_A.weight.dim() == 2 and self.lora_B.weight.dim() == 2

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self._base(x)
        if not self.enabled:  # adapters off (DPO's reference): the base alone
            return out
        a, b = self.lora_A.weight, self.lora_B.weight
        if self._lean():
            return out + lora_delta(x, a, b, self.p, self.scale, self.training)
        return out + self.lora_B(self.lora_A(self.dropout(x))) * self.scale

    def forward_gated(
        self, act: torch.Tensor, gate: torch.Tensor, up: torch.Tensor
    ) -> torch.Tensor:
        """``forward(act)`` for ``act = silu(gate) * up`` (a gated MLP's down projection, called so
        by ``lean_ops``): the lean update keeps `gate` and `up` instead of `act`."""
        if not (self._lean() and self.enabled):
            return self.forward(act)
        a, b = self.lora_A.weight, self.lora_B.weight
        delta = lora_delta_gated(act, gate, up, a, b, self.p, self.scale, self.training)
        return self._base(act) + delta

    def extra_repr(self) -> str:
        rank = self.lora_A.weight.shape[0]
        return f"in={self.in_features}, out={self.out_features}, r={rank}, scale={self.scale:g}"


def is_adapter(name: str) -> bool:
    """Whether a parameter name is a LoRA factor's (``...lora_A.weight``, ``...lora_B.weight``)."""
    parts = name.split(".")
    return len(parts) >= 2 and parts[-2] in FACTORS and parts[-1] == "weight"


def _heads(root: nn.Module) -> set[nn.Module]:
    """The output heads: zerofit's ``LMHead`` and any Hugging Face ``get_output_embeddings()``."""
    heads = {m for m in root.modules() if isinstance(m, LMHead)}
    for m in root.modules():
        get = getattr(m, "get_output_embeddings", None)
        if callable(get) and isinstance(m, nn.Module) and hasattr(m, "config"):
            head = get()
            if head is not None:
                heads.add(head)
    return heads


def linear_layers(root: nn.Module) -> dict[str, nn.Linear]:
    """Every ``nn.Linear`` LoRA may adapt (not the output head), by module name."""
    heads = _heads(root)
    return {n: m for n, m in root.named_modules() if isinstance(m, nn.Linear) and m not in heads}


def _no_match(target: str, names: list[str], head_names: list[str]) -> UserError:
    leaves = sorted({n.rsplit(".", 1)[-1] for n in names})
    close = difflib.get_close_matches(target.rsplit(".", 1)[-1], leaves, n=1, cutoff=0.5)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    if any(h == target or h.endswith("." + target) for h in head_names):
        hint = " (that is the output head, which LoRA leaves alone)"
    return UserError(
        f"model.lora.targets: {target!r} matches no linear layer{hint}; "
        f"valid module-name suffixes: {', '.join(leaves)}"
    )


def select_targets(root: nn.Module, targets: str | list[str]) -> list[str]:
    """Names of the linear layers ``targets`` selects, in module order; UserError for a target
    that selects nothing."""
    layers = linear_layers(root)
    names = list(layers)
    if targets == ALL_LINEAR:
        if not names:
            raise UserError("model.lora: the model has no linear layer to adapt")
        return names
    wanted = [targets] if isinstance(targets, str) else list(targets)
    if not wanted:
        raise UserError("model.lora.targets is empty: give 'all-linear' or module names")
    heads = [n for n, m in root.named_modules() if isinstance(m, nn.Linear) and n not in layers]
    chosen: set[str] = set()
    for target in wanted:
        found = [n for n in names if n == target or n.endswith("." + target)]
        if not found:
            raise _no_match(target, names, heads)
        chosen.update(found)
    return [n for n in names if n in chosen]


def _output_requires_grad(_module: nn.Module, _inputs: Any, output: torch.Tensor) -> torch.Tensor:
    return output.requires_grad_() if torch.is_grad_enabled() else output


def _input_embedding(root: nn.Module) -> nn.Module | None:
    for m in root.modules():
        get = getattr(m, "get_input_embeddings", None)
        if callable(get) and hasattr(m, "config"):
            return get()
    return next((m for m in root.modules() if isinstance(m, nn.Embedding)), None)


def inject(
    root: nn.Module,
    names: list[str],
    rank: int,
    alpha: float,
    dropout: float,
    lean: bool = True,
    nf4: frozenset[str] = frozenset(),
) -> nn.Module:
    """Replace the named linear layers by ``LoRALinear``s, in place (those in `nf4` with their
    base weight in NF4); freeze all but the factors.

    The frozen input embedding's output is marked as requiring grad (as PEFT's
    ``enable_input_require_grads``), so the first block's input does too: DeepSpeed ZeRO-3 with
    leaf blocks otherwise runs that block's backward on released (empty) parameters."""
    for name in names:
        parent_name, _, child = name.rpartition(".")
        parent = root.get_submodule(parent_name) if parent_name else root
        layer = LoRALinear(getattr(parent, child), rank, alpha, dropout, lean, name in nf4)
        setattr(parent, child, layer)
    for pname, p in root.named_parameters():
        p.requires_grad_(is_adapter(pname))
    embedding = _input_embedding(root)
    if embedding is not None:
        embedding.register_forward_hook(_output_requires_grad)
    return root


@torch.no_grad()
def init_adapter_(name: str, tensor: torch.Tensor, generator: torch.Generator) -> None:
    """A: U(-1/sqrt(in), 1/sqrt(in)) (kaiming-uniform, a = sqrt(5)), drawn in fp32; B: zeros."""
    if name.split(".")[-2] == "lora_B":
        tensor.zero_()
        return
    bound = 1.0 / math.sqrt(tensor.shape[1])
    tmp = torch.empty(tensor.shape, dtype=torch.float32, device=tensor.device)
    tmp.uniform_(-bound, bound, generator=generator)
    tensor.copy_(tmp)


def _init_with_adapters(base: Callable) -> Callable:
    def init_(name: str, tensor: torch.Tensor, generator: torch.Generator) -> None:
        (init_adapter_ if is_adapter(name) else base)(name, tensor, generator)

    return init_


def _weights_with_adapters(base: Callable | None) -> Callable | None:
    if base is None:
        return None

    def weights(name: str) -> torch.Tensor | None:
        return None if is_adapter(name) else base(name)

    return weights


def _construct_with_adapters(
    base: Callable, names: list[str], lora: LoRAConfig, lean: bool, nf4: frozenset[str]
) -> Callable:
    def construct() -> nn.Module:
        return inject(base(), names, lora.rank, lora.alpha, lora.dropout, lean, nf4)

    return construct


def _weights_quantized(
    spec: ModelSpec, shapes: dict[str, tuple[int, ...]], init_seed: int
) -> Callable[[str], torch.Tensor | None]:
    """``spec.weights`` for a QLoRA model: each ``<layer>.nf4.*`` piece is quantised from the
    value ``<layer>.weight`` has in the LoRA run of the same config (read from disk, or its
    name-seeded init), on this rank's GPU where there is one."""
    base = _weights_with_adapters(spec.weights)

    def source(weight_name: str, shape: tuple[int, ...]) -> torch.Tensor:
        device = local_device()
        loaded = spec.weights(weight_name) if spec.weights is not None else None
        if loaded is not None:
            return loaded.to(device)
        full = torch.empty(shape, dtype=torch.float32, device=device)
        gen = torch.Generator(device=device).manual_seed(param_seed(init_seed, weight_name))
        spec.init_param_(weight_name, full, gen)
        return full

    pieces = QuantizedSource(source, shapes)

    def weights(name: str) -> torch.Tensor | None:
        piece = pieces(name)
        if piece is not None:
            return piece
        return base(name) if base is not None else None

    return weights


def _nf4_layers(spec: ModelSpec, names: list[str], lora: LoRAConfig) -> dict[str, tuple[int, ...]]:
    """{``<layer>.weight``: shape} of the adapted layers whose base is stored in NF4: all of them
    with ``quantize: nf4``, but those whose size is not a multiple of 16384 (they stay as they
    are, and the report says so)."""
    if lora.quantize != "nf4":
        return {}
    shapes = {n: tuple(spec.module.get_submodule(n).weight.shape) for n in names}
    return {f"{n}.weight": shape for n, shape in shapes.items() if quantizable(shape)}


@dataclass(frozen=True)
class LoRAShape(ModelShape):
    """A LoRA model's shape: its parameter counts include the adapters, and its FLOPs per token
    drop the weight-gradient matmuls of the frozen base (2 of its 6 FLOPs per weight and token);
    the adapters keep all 6."""

    frozen_flops_params: int = 0  # the base's ``flops_params``

    def flops_per_token(self, seq_len: int) -> float:
        return super().flops_per_token(seq_len) - 2.0 * self.frozen_flops_params


def lora_shape(spec: ModelSpec) -> LoRAShape:
    """The shape of ``spec`` (its module already adapted) from the base's: counts measured."""
    module, base = spec.module, spec.shape
    blocks = module.get_submodule(spec.blocks_path)
    total = weight_count(module)
    in_blocks = weight_count(blocks)
    largest = max(weight_count(b) for b in blocks)
    counts = ParamCounts(total, base.embedding_params, largest, total - in_blocks)
    fields = {f.name: getattr(base, f.name) for f in dataclasses.fields(ModelShape)}
    return LoRAShape(**{**fields, "measured": counts}, frozen_flops_params=base.flops_params)


def apply_lora(
    spec: ModelSpec, lora: LoRAConfig, lean: bool = True, init_seed: int = 0
) -> ModelSpec:
    """The LoRA form of ``spec`` for ``model.lora`` (``rank`` 0: ``spec`` itself); ``lean``:
    ``model.lean_ops``; ``init_seed``: ``model.init_seed`` (a QLoRA base quantises the weights
    a random-init run starts from)."""
    if lora.rank == 0:
        return spec
    names = select_targets(spec.module, lora.targets)
    quantized = _nf4_layers(spec, names, lora)
    nf4 = frozenset(n.removesuffix(".weight") for n in quantized)
    weights = (
        _weights_quantized(spec, quantized, init_seed)
        if quantized
        else _weights_with_adapters(spec.weights)
    )
    inject(spec.module, names, lora.rank, lora.alpha, lora.dropout, lean, nf4)
    described: dict[str, Any] = {"rank": lora.rank, "alpha": float(lora.alpha), "modules": names}
    if lora.quantize != "none":  # the 4-bit layers and their weights' shapes, for export
        shapes = {n.removesuffix(".weight"): list(s) for n, s in sorted(quantized.items())}
        described |= {"quantize": lora.quantize, "quantized": shapes}
    out = replace(
        spec,
        init_param_=_init_with_adapters(spec.init_param_),
        weights=weights,
        construct=_construct_with_adapters(spec.construct, names, lora, lean, nf4),
        fingerprint={**spec.fingerprint, "lora": described},
    )
    return replace(out, shape=lora_shape(out))


def adapter_count(module: nn.Module) -> int:
    """Parameters of the LoRA factors in ``module``."""
    return sum(p.numel() for n, p in module.named_parameters() if is_adapter(n))


def _adapted(block: nn.Module) -> list[LoRALinear]:
    return [m for m in block.modules() if isinstance(m, LoRALinear)]


def _most_adapted_block(spec: ModelSpec) -> nn.Module:
    """The decoder block with the most adapted layers (the first of equals)."""
    return max(spec.module.get_submodule(spec.blocks_path), key=lambda b: len(_adapted(b)))


def block_adapters(spec: ModelSpec) -> list[LoRALinear]:
    """The adapted layers of the decoder block that has the most."""
    return _adapted(_most_adapted_block(spec))


def gated_inputs(spec: ModelSpec) -> int:
    """Input features of the adapted layers in the largest block whose input the lean update does
    not keep: a gated MLP's down projection (``LoRALinear.forward_gated``, which ``lean_ops``
    calls), which keeps the gate and up outputs instead."""
    block = _most_adapted_block(spec)
    gated = [m for m in block.modules() if all(hasattr(m, n) for n in GATED)]
    return sum(m.down_proj.in_features for m in gated if isinstance(m.down_proj, LoRALinear))


def quantized_counts(spec: ModelSpec) -> tuple[int, int, int]:
    """QLoRA's NF4 weights (elements): in all, in the decoder block with the most, and the
    largest one; zeros without."""
    sizes = [math.prod(m.shape) for m in spec.module.modules() if isinstance(m, NF4Weight)]
    if not sizes:
        return 0, 0, 0
    blocks = spec.module.get_submodule(spec.blocks_path)
    per_block = [
        sum(math.prod(m.shape) for m in b.modules() if isinstance(m, NF4Weight)) for b in blocks
    ]
    return sum(sizes), max(per_block), max(sizes)

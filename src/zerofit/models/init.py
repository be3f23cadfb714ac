"""Weight initialisation by parameter name, one full (unsharded) tensor at a time.

An initialiser is ``init_(name, tensor, generator)``: it fills ``tensor``, the whole parameter
called ``name`` (wrapper segments such as ``_checkpoint_wrapped_module`` allowed), in place, with
randomness only from ``generator``. ``ModelSpec.init_param_`` is one; ``zerofit.distributed.parallelize``
(``full_param``, ``materialize_``) seeds a generator from the init seed and each parameter's name
and calls it, so the weights do not depend on the sharding, the rank or the global RNG.

- ``llama_init(args)``: the zerofit Llama (``zerofit.models.llama``).
- ``hf_init(adapter)``: a Hugging Face causal LM behind ``zerofit.models.hf.HFCausalLM``.
"""

from __future__ import annotations

import math
import re
import zlib
from collections.abc import Callable
from functools import partial

import torch
from torch import nn

from zerofit.models.llama import LlamaArgs, param_shapes, strip_wrapper_names

Initializer = Callable[[str, torch.Tensor, torch.Generator], None]

_LAYER_RE = re.compile(r"layers\.(\d+)\.(.+)")
_OUT_PROJECTIONS = ("attention.wo.weight", "feed_forward.w2.weight")
_HF_UNKNOWN = "unknown parameter name for this Hugging Face model"


def param_seed(init_seed: int, name: str) -> int:
    """The seed of one parameter's initialisation: its (wrapper-free) name and the run's seed."""
    return (init_seed * 1_000_003 + zlib.crc32(name.encode())) % (2**63)


def _check_shape(
    name: str, tensor: torch.Tensor, expected: tuple[int, ...] | None, unknown: str
) -> None:
    if expected is None:
        raise ValueError(f"{unknown}: {name!r}")
    if tuple(tensor.shape) != expected:
        raise ValueError(f"{name}: expected full shape {expected}, got {tuple(tensor.shape)}")


def _fill_random_(
    tensor: torch.Tensor, std: float, generator: torch.Generator, truncate: bool
) -> None:
    """Normal(0, std), truncated at +-3 std if ``truncate``. Drawn in fp32 so the values do not
    depend on the target dtype (and bf16 erfinv is spotty)."""
    tmp = torch.empty(tensor.shape, dtype=torch.float32, device=tensor.device)
    if truncate:
        nn.init.trunc_normal_(tmp, mean=0.0, std=std, a=-3 * std, b=3 * std, generator=generator)
    else:
        tmp.normal_(0.0, std, generator=generator)
    tensor.copy_(tmp)


def _llama_std(args: LlamaArgs, clean: str) -> float:
    if clean == "tok_embeddings.weight":
        return 0.02
    if clean == "output.weight":
        return args.dim**-0.5
    match = _LAYER_RE.fullmatch(clean)
    assert match is not None  # every other known name is a layer weight
    out_proj = match.group(2) in _OUT_PROJECTIONS
    return 0.02 / math.sqrt(2 * args.n_layers) if out_proj else 0.02


@torch.no_grad()
def init_llama_param_(
    args: LlamaArgs, name: str, tensor: torch.Tensor, generator: torch.Generator
) -> None:
    """Fill one full parameter of ``Llama(args)`` in place, chosen by its name.

    Norm weights -> 1. Embeddings -> normal std 0.02 (not torchtitan's 1.0: the residual stream
    then starts at the same scale as the block outputs, which trains more stably on tiny models).
    wq/wk/wv/w1/w3 -> truncated normal std 0.02; wo/w2 -> std 0.02 / sqrt(2 * n_layers);
    output -> std dim**-0.5. Truncation at +-3 std. Only ``generator`` supplies randomness.
    """
    clean = strip_wrapper_names(name)
    _check_shape(name, tensor, param_shapes(args).get(clean), "unknown Llama parameter name")
    if clean.endswith("norm.weight"):
        tensor.fill_(1.0)
        return
    _fill_random_(tensor, _llama_std(args, clean), generator, truncate=True)


def llama_init(args: LlamaArgs) -> Initializer:
    """The initialiser of ``Llama(args)``."""
    return partial(init_llama_param_, args)


class HFInit:
    """Initialiser of a Hugging Face model: norm weights -> 1, biases -> 0, else normal(0, std).

    ``std`` is ``config.initializer_range`` (0.02 if unset). The full shapes are taken by clean
    name when this is built, before any wrapper or sharding renames or splits the parameters.
    """

    def __init__(self, module: nn.Module, std: float) -> None:
        self.std = std
        self.shapes = {strip_wrapper_names(n): tuple(p.shape) for n, p in module.named_parameters()}

    @torch.no_grad()
    def __call__(self, name: str, tensor: torch.Tensor, generator: torch.Generator) -> None:
        clean = strip_wrapper_names(name)
        _check_shape(name, tensor, self.shapes.get(clean), _HF_UNKNOWN)
        parts = clean.split(".")
        owner = parts[-2] if len(parts) > 1 else ""
        if parts[-1] == "bias":
            tensor.zero_()
        elif tensor.dim() == 1 and ("norm" in owner.lower() or owner.startswith("ln")):
            tensor.fill_(1.0)
        else:
            _fill_random_(tensor, self.std, generator, truncate=False)


def hf_init(adapter: nn.Module) -> HFInit:
    """The initialiser of an ``HFCausalLM`` adapter (its HF model in ``adapter.hf``)."""
    config = adapter.hf.config
    return HFInit(adapter, float(getattr(config, "initializer_range", None) or 0.02))

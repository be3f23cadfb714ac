"""Hugging Face causal LMs as a second model source.

``build_hf(directory)`` reads ``config.json`` (no network), builds ``AutoModelForCausalLM`` with
parameters on the meta device (buffers real), and wraps it in ``HFCausalLM``
(``zerofit.models.hf_head``: ``forward(tokens, targets=None, positions=None)``, the output layer
fused with the loss where the architecture allows). The HF model sits under the attribute ``hf``,
so adapter parameter names are ``"hf." + <HF state-dict name>``; the folder's weight files are read
by ``zerofit.models.hf_weights``. The folder's own Python code runs only with ``trust_remote_code``.
"""

from __future__ import annotations

import json
import math
import os
import sys
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from torch import nn

from zerofit.config.limits import shown
from zerofit.errors import UserError
from zerofit.models.hf_attention import NAME as VARLEN
from zerofit.models.hf_attention import register as register_varlen
from zerofit.models.hf_attention import varlen_refusal
from zerofit.models.hf_head import HFCausalLM, head_structure_fallback
from zerofit.models.meta import meta_params
from zerofit.models.shape import ModelShape, ParamCounts, hf_head_fallback

if TYPE_CHECKING:
    from transformers import PretrainedConfig

__all__ = ["HFCausalLM", "HFInfo", "build_hf", "construct_hf"]

PREFIX = "hf."
# Config keys that describe the run or the file, not the architecture.
_NOT_ARCHITECTURE = {
    "transformers_version", "_name_or_path", "torch_dtype", "dtype", "use_cache", "return_dict",
    "output_hidden_states", "output_attentions", "_attn_implementation", "_commit_hash",
    "attn_implementation", "id2label", "label2id", "problem_type", "tokenizer_class",
}  # fmt: skip


@dataclass
class HFInfo:
    """What ``build_hf`` learned about the model, enough to fill a ``ModelSpec``."""

    config: PretrainedConfig
    blocks_path: str
    vocab_size: int
    max_seq_len: int
    shape: ModelShape  # parameter counts measured on the built model, FLOPs per token
    fingerprint: dict = field(default_factory=dict)
    head_fallback: str | None = None  # why the head computes full logits; None: fused


def _find_blocks(module: nn.Module, block_names: set[str]) -> str:
    """Dotted path of the decoder-layer ModuleList: children in ``block_names``, else all one class."""
    fallback = None
    for path, sub in module.named_modules():
        if not isinstance(sub, nn.ModuleList) or len(sub) == 0:
            continue
        kinds = {type(child).__name__ for child in sub}
        if len(kinds) == 1:
            if kinds <= block_names:
                return path
            fallback = fallback or path
    if fallback is None:
        raise UserError("could not find the decoder layers (an nn.ModuleList) in the HF model")
    return fallback


def fingerprint(config: PretrainedConfig) -> dict:
    raw = {k: v for k, v in config.to_dict().items() if k not in _NOT_ARCHITECTURE}
    return {"source": "hf", "config": json.loads(json.dumps(raw, sort_keys=True, default=str))}


def _raw_config(directory: str) -> dict:
    """config.json as written (the planner's view of it), or {} if it is not a JSON object."""
    try:
        with open(os.path.join(directory, "config.json")) as f:
            raw = json.load(f)
    except (OSError, UnicodeDecodeError, ValueError):
        return {}
    return raw if isinstance(raw, dict) else {}


_WARNED: set[str] = set()


def _remote_code(directory: str, raw: dict, trust: bool) -> None:
    """UserError when the folder needs its own code and ``trust`` is off; with ``trust`` on, one
    warning line on stderr (once per process, from rank 0 only)."""
    if not raw.get("auto_map"):
        return
    if trust:
        if directory not in _WARNED and os.environ.get("RANK", "0") == "0":
            _WARNED.add(directory)
            print(
                f"warning: model.trust_remote_code=true: the Python code in "
                f"{shown(directory, quote=False)} will run",
                file=sys.stderr,
                flush=True,
            )
        return
    from transformers import CONFIG_MAPPING  # optional: transformers (the hf extra)

    kind = raw.get("model_type")
    if not isinstance(kind, str) or kind not in CONFIG_MAPPING:
        raise UserError(
            f"{shown(directory, quote=False)} holds its own model code (model_type "
            f"{shown(kind)} is not in transformers): set model.trust_remote_code=true to run it"
        )


def load_config(
    directory: str, overrides: dict | None = None, trust_remote_code: bool = False
) -> PretrainedConfig:
    """The ``AutoConfig`` in ``directory`` with ``overrides`` applied; UserError on bad input."""
    try:
        from transformers import AutoConfig  # optional: transformers (the hf extra)
    except ImportError as e:
        raise UserError("model.hf needs the 'transformers' package: pip install zerofit[hf]") from e
    if not os.path.isdir(directory):
        raise UserError(f"Hugging Face model directory not found: {shown(directory, quote=False)}")
    if not os.path.isfile(os.path.join(directory, "config.json")):
        raise UserError(
            f"no config.json in Hugging Face model directory {shown(directory, quote=False)}"
        )
    _remote_code(directory, _raw_config(directory), trust_remote_code)
    try:
        config = AutoConfig.from_pretrained(
            directory, local_files_only=True, trust_remote_code=trust_remote_code
        )
    except (OSError, ValueError, KeyError, TypeError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise UserError(
            f"cannot read {shown(directory, quote=False)}/config.json: {shown(first, quote=False)}"
        ) from e
    known = config.to_dict()
    for key, value in (overrides or {}).items():
        if key not in known:
            raise UserError(f"unknown model override {shown(key)} for {type(config).__name__}")
        _check_override(key, value, known[key])
        setattr(config, key, value)
    return config


# Architecture sizes an override may set, with their upper bounds (as for the Llama presets).
_SIZES = {
    "hidden_size": 2**20, "intermediate_size": 2**22, "num_hidden_layers": 1024,
    "num_attention_heads": 2**14, "num_key_value_heads": 2**14, "head_dim": 2**14,
    "vocab_size": 2**24, "max_position_embeddings": 2**24,
}  # fmt: skip


def _check_override(key: str, value: Any, old: Any) -> None:
    """An override keeps the kind of value config.json has there (an integer stays an integer,
    a number stays finite), and a size stays in [1, its bound]: UserError otherwise."""
    bad = f"model.overrides.{key}"
    is_int = isinstance(value, int) and not isinstance(value, bool)
    if key in _SIZES and not (is_int and 1 <= value <= _SIZES[key]):
        raise UserError(f"{bad} must be an integer in [1, {_SIZES[key]}], got {shown(value)}")
    if old is None or value is None:
        return
    if isinstance(old, bool) and not isinstance(value, bool):
        raise UserError(f"{bad}: expected true or false, got {shown(value)}")
    if isinstance(old, int) and not isinstance(old, bool) and not is_int:
        raise UserError(f"{bad}: expected an integer, got {shown(value)}")
    finite = is_int or (isinstance(value, float) and math.isfinite(value))
    if isinstance(old, float) and not finite:
        raise UserError(f"{bad}: expected a finite number, got {shown(value)}")
    if isinstance(old, str | list | dict) and not isinstance(value, type(old)):
        raise UserError(f"{bad}: expected a {type(old).__name__}, got {shown(value)}")


# What transformers raises on a config it cannot build (e.g. a padding id outside the vocabulary).
_BUILD_ERRORS = (
    ValueError, KeyError, TypeError, AttributeError, OverflowError, RuntimeError, AssertionError,
)  # fmt: skip


def _new_model(config: PretrainedConfig, trust_remote_code: bool) -> nn.Module:
    """The model, with packed documents kept apart by ``zerofit_varlen`` where it applies
    (``zerofit.models.hf_attention``); else with transformers' default attention."""
    from transformers import AutoModelForCausalLM  # optional: transformers (the hf extra)

    kwargs: dict[str, Any] = {"trust_remote_code": trust_remote_code}
    if not trust_remote_code and varlen_refusal(config) is None:
        register_varlen()
        kwargs["attn_implementation"] = VARLEN
    return AutoModelForCausalLM.from_config(config, **kwargs)


def construct_hf(
    config: PretrainedConfig,
    loss_chunk: int = 0,
    fused: bool = False,
    trust_remote_code: bool = False,
) -> HFCausalLM:
    """The adapter around a freshly built HF model with real, uninitialised parameters, for
    ``deepspeed.zero.Init``: zerofit fills every parameter afterwards (by name, or from disk).

    HF's own weight init is skipped, as transformers does under ZeRO-3: it would index partitioned
    (empty) parameters, e.g. to zero an embedding's padding row. The head is tied again after."""
    from transformers.initialization import no_init_weights  # optional: transformers

    with no_init_weights():
        model = _new_model(config, trust_remote_code)
    model.tie_weights()
    return HFCausalLM(model, loss_chunk, fused)


def build_hf(
    directory: str,
    overrides: dict | None = None,
    loss_chunk: int = 0,
    trust_remote_code: bool = False,
) -> tuple[HFCausalLM, HFInfo]:
    """Build the HF causal LM in ``directory`` with meta parameters; returns (adapter, info).

    The output layer is fused with the loss in chunks of ``loss_chunk`` tokens unless
    ``hf_head_fallback`` (config.json, as the planner reads it) or the built model's structure
    (``head_structure_fallback``) says otherwise."""
    config = load_config(directory, overrides, trust_remote_code)
    try:
        with meta_params():
            model = _new_model(config, trust_remote_code)
    except _BUILD_ERRORS as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise UserError(
            f"cannot build a causal LM from {directory}/config.json: {shown(first, quote=False)}"
        ) from e
    raw = {**_raw_config(directory), **(overrides or {})}
    fallback = hf_head_fallback(raw, loss_chunk, trust_remote_code)
    fallback = fallback or head_structure_fallback(model)
    adapter = HFCausalLM(model, loss_chunk, fused=fallback is None)
    blocks = PREFIX + _find_blocks(model, set(getattr(model, "_no_split_modules", None) or ()))
    max_seq = getattr(config, "max_position_embeddings", None)
    if max_seq is None:
        raise UserError(f"{directory}/config.json has no max_position_embeddings")
    info = HFInfo(
        config=config,
        blocks_path=blocks,
        vocab_size=int(config.vocab_size),
        max_seq_len=int(max_seq),
        shape=measure_shape(adapter, blocks),
        fingerprint=fingerprint(config),
        head_fallback=fallback,
    )
    return adapter, info


def measure_shape(adapter: HFCausalLM, blocks_path: str) -> ModelShape:
    """The ``ModelShape`` of a built adapter: sizes from its config (read as attributes, so
    aliases such as GPT-2's ``n_embd`` work), parameter counts from its actual parameters."""
    model, config = adapter.hf, adapter.hf.config
    blocks = adapter.get_submodule(blocks_path)
    embed = model.get_input_embeddings().weight
    head = model.get_output_embeddings()
    total = sum(p.numel() for p in adapter.parameters())
    in_blocks = sum(p.numel() for p in blocks.parameters())
    largest = max(sum(p.numel() for p in block.parameters()) for block in blocks)
    hidden = getattr(config, "hidden_size", None) or embed.shape[1]
    heads = getattr(config, "num_attention_heads", None) or 1  # only head_dim depends on it
    sizes = {
        "num_hidden_layers": getattr(config, "num_hidden_layers", None) or len(blocks),
        "hidden_size": hidden,
        "num_attention_heads": heads,
        "num_key_value_heads": getattr(config, "num_key_value_heads", None) or heads,
        "intermediate_size": getattr(config, "intermediate_size", None) or 4 * hidden,
        "vocab_size": getattr(config, "vocab_size", None) or embed.shape[0],
    }
    described = {k: int(v) for k, v in sizes.items()}
    described["tie_word_embeddings"] = head is not None and head.weight is embed
    name = getattr(config, "_name_or_path", None) or type(model).__name__
    counts = ParamCounts(total, embed.numel(), largest, total - in_blocks)
    return ModelShape.from_hf_config(
        described, name=name, measured=counts, fused_head=adapter.fused
    )

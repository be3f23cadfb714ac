"""The arithmetic of a decoder-only transformer: parameter counts and training FLOPs per token.

One ``ModelShape`` serves the models (``ModelSpec.shape``), the trainer's MFU and the planner. Build
it from LlamaArgs (``ModelShape.from_llama_args``) or a preset with overrides
(``shape_from_preset``), from a Hugging Face config, a dict or a config.json path
(``ModelShape.from_hf_config``, ``shape_from_hf_config``), or from a zerofit config
(``shape_from_config``). Plain arithmetic: neither torch nor transformers is imported here.

FLOPs per token follow PaLM (appendix B) and torchtitan: 6 x (parameters - input embedding), the
forward (2) and backward (4) matmuls of every weight (a tied output head still does its matmul, so
it counts), plus 12 x layers x dim x seq_len for attention, i.e. the scores and their product with
the values over the full seq x seq square (4 x dim x seq forward, x3 with backward), although a
causal kernel skips about half of it. Elementwise work (norms, RoPE, softmax, SiLU, the loss) is
not counted, and norm weights are counted as if they were matmul weights (well under 1%).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from zerofit.errors import UserError
from zerofit.models.presets import LlamaArgs, preset_args

if TYPE_CHECKING:
    from zerofit.config import Config

__all__ = [
    "ModelShape",
    "ParamCounts",
    "shape_from_config",
    "shape_from_hf_config",
    "shape_from_preset",
    "hf_head_fallback",
]


@dataclass(frozen=True)
class ParamCounts:
    """Parameter counts measured on a built model, for models the formula does not describe
    exactly (biases, q/k norms, blocks of different sizes)."""

    total: int  # unique parameters (a tied head once)
    embedding: int  # the input embedding
    block: int  # the largest decoder block
    root: int  # everything outside the decoder blocks


@dataclass(frozen=True)
class ModelShape:
    """A decoder-only transformer, in the numbers memory and FLOPs depend on.

    Without ``measured`` the parameter counts are those of a Llama-style block (q/k/v/o without
    biases, a SwiGLU of ``ffn_dim``, two norms) with ``n_heads * head_dim == dim``.
    """

    name: str
    n_layers: int
    dim: int
    n_heads: int
    n_kv_heads: int
    ffn_dim: int
    vocab_size: int
    tied_embeddings: bool = False
    # The output layer + loss are fused, chunk by chunk (zerofit.models.loss; model.loss_chunk > 0).
    fused_head: bool = False
    measured: ParamCounts | None = None  # counts of a built model; None: from the formula

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads

    @property
    def block_linears(self) -> list[tuple[int, int]]:
        """(in, out) of a decoder block's linear layers: q, k, v, o, gate, up, down."""
        d, kv, f = self.dim, self.n_kv_heads * self.head_dim, self.ffn_dim
        return [(d, d), (d, kv), (d, kv), (d, d), (d, f), (d, f), (f, d)]

    @property
    def block_params(self) -> int:
        """Parameters of one decoder block (the largest one, when measured)."""
        if self.measured is not None:
            return self.measured.block
        return sum(i * o for i, o in self.block_linears) + 2 * self.dim  # + two norms

    @property
    def embedding_params(self) -> int:
        """The input embedding."""
        if self.measured is not None:
            return self.measured.embedding
        return self.vocab_size * self.dim

    @property
    def root_params(self) -> int:
        """Parameters outside the blocks: embedding, final norm, output head (if untied)."""
        if self.measured is not None:
            return self.measured.root
        return self.embedding_params * (1 if self.tied_embeddings else 2) + self.dim

    @property
    def num_params(self) -> int:
        """All parameters, a tied head once."""
        if self.measured is not None:
            return self.measured.total
        return self.n_layers * self.block_params + self.root_params

    @property
    def non_embedding_params(self) -> int:
        """All parameters but the input embedding (a tied head goes with it)."""
        return self.num_params - self.embedding_params

    @property
    def flops_params(self) -> int:
        """The parameters that do a matmul per token: all but the input embedding; a tied head
        shares the embedding's weights but still multiplies, so it counts."""
        return self.non_embedding_params + (self.embedding_params if self.tied_embeddings else 0)

    def flops_per_token(self, seq_len: int) -> float:
        """6 x (params - input embedding) + 12 x layers x dim x seq (PaLM/torchtitan convention)."""
        return 6.0 * self.flops_params + 12.0 * self.n_layers * self.dim * seq_len

    @classmethod
    def from_llama_args(
        cls, args: LlamaArgs, name: str = "llama", fused_head: bool = False
    ) -> ModelShape:
        """The shape of ``zerofit.models.llama.Llama(args)`` (its output layer is never tied)."""
        return cls(
            name,
            args.n_layers,
            args.dim,
            args.n_heads,
            args.n_kv_heads,
            args.ffn_dim,
            args.vocab_size,
            fused_head=fused_head,
        )

    @classmethod
    def from_hf_config(
        cls,
        config: Mapping[str, Any],
        name: str | None = None,
        measured: ParamCounts | None = None,
        fused_head: bool = False,
    ) -> ModelShape:
        """From a Hugging Face config as a dict (config.json's keys, e.g. ``config.to_dict()``).

        KeyError, TypeError or ValueError when a size is missing or not a positive integer.
        ``fused_head``: the adapter's decision (``hf_head_fallback`` is None).
        """
        if not isinstance(config, Mapping):
            raise TypeError(f"a config is a mapping, got {type(config).__name__}")
        heads = _size(config, "num_attention_heads")
        kv = _size(config, "num_key_value_heads") if config.get("num_key_value_heads") else heads
        return cls(
            name=name or str(config.get("_name_or_path") or "hf"),
            n_layers=_size(config, "num_hidden_layers"),
            dim=_size(config, "hidden_size"),
            n_heads=heads,
            n_kv_heads=kv,
            ffn_dim=_size(config, "intermediate_size"),
            vocab_size=_size(config, "vocab_size"),
            tied_embeddings=bool(config.get("tie_word_embeddings", False)),
            fused_head=fused_head,
            measured=measured,
        )


def _size(config: Mapping[str, Any], key: str) -> int:
    value = config[key]
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{key} must be a positive integer, got {value!r}")
    return value


def shape_from_preset(
    preset: str, overrides: dict | None = None, loss_chunk: int = 4096
) -> ModelShape:
    """A zerofit Llama preset with LlamaArgs overrides (validated; UserError if bad), built with
    ``loss_chunk`` (> 0: fused head) as ``build_model`` would."""
    args = preset_args(preset, overrides)
    return ModelShape.from_llama_args(args, name=preset, fused_head=loss_chunk > 0)


def shape_from_config(cfg: Config) -> ModelShape:
    """The shape of a zerofit config's model (preset with overrides, or HF config.json with
    overrides), from ``cfg.model`` only."""
    m = cfg.model
    if m.hf:
        return shape_from_hf_config(m.hf, m.overrides, m.loss_chunk, m.trust_remote_code)
    return shape_from_preset(m.preset, m.overrides, m.loss_chunk)


def shape_from_hf_config(
    source: str | Path | Mapping[str, Any],
    overrides: Mapping[str, Any] | None = None,
    loss_chunk: int = 4096,
    trust_remote_code: bool = False,
) -> ModelShape:
    """From a Hugging Face config: a dict, a config.json, or the directory holding it; config
    attributes in ``overrides`` replace its values. The head is fused as the adapter built with
    ``loss_chunk`` would fuse it (``hf_head_fallback``). No transformers needed; UserError if
    unusable."""
    if isinstance(source, Mapping):
        where, config, name = "the Hugging Face config", source, None
    else:
        p = Path(source)
        p = p / "config.json" if p.is_dir() else p
        if not p.is_file():
            raise UserError(f"no config.json at {source}")
        where, name = str(p), p.parent.name
        try:
            config = json.loads(p.read_text())
        except (OSError, UnicodeDecodeError, ValueError) as e:
            raise UserError(f"{p}: not a decoder config the planner understands ({e})") from None
    if not isinstance(config, Mapping):
        raise UserError(f"{where}: not a decoder config the planner understands (not an object)")
    config = {**config, **(overrides or {})}
    fused = hf_head_fallback(config, loss_chunk, trust_remote_code) is None
    try:
        return ModelShape.from_hf_config(
            config, name=config.get("_name_or_path") or name, fused_head=fused
        )
    except (KeyError, TypeError, ValueError) as e:
        raise UserError(f"{where}: not a decoder config the planner understands ({e})") from None


# Config keys that change the logits after the output layer, each with the value that leaves them
# unchanged (then the head is plain and can be fused with the loss).
_LOGIT_KEYS: dict[str, Any] = {
    "final_logit_softcapping": None,  # Gemma 2, Gemma 3n, VaultGemma, NanoChat: cap * tanh(x / cap)
    "logits_soft_cap": None,  # RecurrentGemma
    "output_logit_soft_cap": None,  # xLSTM
    "logit_scale": 1.0,  # Cohere: logits * scale
    "logits_scaling": 1.0,  # Granite (logits / s), HyperCLOVA X (logits * s)
    "lm_head_multiplier": 1.0,  # Falcon-H1
}
# Architectures (config.json's model_type) whose head is not a plain bias-free linear layer when
# config.json does not say otherwise: the key whose class default caps or scales the logits, or
# None where nothing in config.json turns it off (hidden states rescaled before the head, a bias).
_NOT_PLAIN: dict[str, str | None] = {
    **dict.fromkeys(
        ("gemma2", "gemma3n", "gemma3n_text", "vaultgemma", "nanochat", "beam", "inkling2"),
        "final_logit_softcapping",
    ),
    **dict.fromkeys(("cohere", "cohere2", "cohere2_moe", "cohere_compass"), "logit_scale"),
    "recurrent_gemma": None,  # caps unconditionally
    "xlstm": "output_logit_soft_cap",
    "minicpm3": None,  # divides the hidden states before the head
    "inkling_text": None,
    "inkling_mm_model": None,
    "phi": None,  # the head has a bias
    "ctrl": None,
}


def hf_head_fallback(
    config: Mapping[str, Any], loss_chunk: int, trust_remote_code: bool = False
) -> str | None:
    """Why a Hugging Face model (config.json's dict, overrides applied) computes full logits, or
    None when its output layer is fused with the loss (``zerofit.models.loss``).

    The one decision: the adapter (``zerofit.models.hf``) and the planner both call it. Full logits
    where the architecture transforms them after the head (soft-capping, scaling), rescales the
    hidden states before it, or has a head bias; where the folder's own code runs (its head is
    unknown); and where ``loss_chunk`` is 0.
    """
    if loss_chunk <= 0:
        return "model.loss_chunk is 0"
    if trust_remote_code and config.get("auto_map"):
        return "the folder's own code (trust_remote_code) may transform the logits"
    text = config.get("text_config")
    sections = [config, text] if isinstance(text, Mapping) else [config]
    for section in sections:
        for key, neutral in _LOGIT_KEYS.items():
            if key in section and section[key] != neutral:
                return f"{key}={section[key]!r} transforms the logits after the output layer"
    kinds = {section.get("model_type") for section in sections}
    for kind in sorted(k for k in kinds if isinstance(k, str) and k in _NOT_PLAIN):
        key = _NOT_PLAIN[kind]
        if key is None or not any(key in section for section in sections):
            return f"{kind} transforms the logits around its output layer"
    return None

"""The Hugging Face side of ``zerofit export``: the built-in Llama's names and config in
``LlamaForCausalLM`` terms, and any HF model's parameter shapes (built on the meta device)."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

import torch

from zerofit.models.meta import meta_params

if TYPE_CHECKING:
    from transformers import PretrainedConfig

# zerofit Llama parameter -> Hugging Face LlamaForCausalLM parameter (no q/k permutation needed).
LLAMA_TO_HF: list[tuple[re.Pattern[str], str]] = [
    (re.compile(p), r)
    for p, r in (
        (r"tok_embeddings\.weight", "model.embed_tokens.weight"),
        (r"layers\.(\d+)\.attention_norm\.weight", r"model.layers.\1.input_layernorm.weight"),
        (r"layers\.(\d+)\.attention\.wq\.weight", r"model.layers.\1.self_attn.q_proj.weight"),
        (r"layers\.(\d+)\.attention\.wk\.weight", r"model.layers.\1.self_attn.k_proj.weight"),
        (r"layers\.(\d+)\.attention\.wv\.weight", r"model.layers.\1.self_attn.v_proj.weight"),
        (r"layers\.(\d+)\.attention\.wo\.weight", r"model.layers.\1.self_attn.o_proj.weight"),
        (r"layers\.(\d+)\.ffn_norm\.weight", r"model.layers.\1.post_attention_layernorm.weight"),
        (r"layers\.(\d+)\.feed_forward\.w1\.weight", r"model.layers.\1.mlp.gate_proj.weight"),
        (r"layers\.(\d+)\.feed_forward\.w3\.weight", r"model.layers.\1.mlp.up_proj.weight"),
        (r"layers\.(\d+)\.feed_forward\.w2\.weight", r"model.layers.\1.mlp.down_proj.weight"),
        (r"norm\.weight", "model.norm.weight"),
        (r"output\.weight", "lm_head.weight"),
    )
]


def llama_to_hf(name: str) -> str | None:
    """The Hugging Face name of a built-in Llama parameter, or None for an unknown name."""
    for pattern, repl in LLAMA_TO_HF:
        if pattern.fullmatch(name):
            return pattern.sub(repl, name)
    return None


def set_dtype(config: PretrainedConfig, dtype: torch.dtype) -> None:
    import transformers  # optional: transformers (the hf extra)

    v5 = int(transformers.__version__.split(".")[0]) >= 5  # 4.x calls it torch_dtype
    setattr(config, "dtype" if v5 else "torch_dtype", dtype)


def llama_config(args: dict[str, Any], eos_id: int | None) -> PretrainedConfig:
    """The ``LlamaConfig`` of a built-in preset (its resolved ``LlamaArgs`` as a dict)."""
    from transformers import LlamaConfig  # optional: transformers (the hf extra)

    return LlamaConfig(
        vocab_size=args["vocab_size"],
        hidden_size=args["dim"],
        intermediate_size=args["ffn_dim"],
        num_hidden_layers=args["n_layers"],
        num_attention_heads=args["n_heads"],
        num_key_value_heads=args["n_kv_heads"],
        head_dim=args["dim"] // args["n_heads"],
        max_position_embeddings=args["max_seq_len"],
        rms_norm_eps=args["norm_eps"],
        rope_theta=args["rope_theta"],
        hidden_act="silu",
        attention_bias=False,
        mlp_bias=False,
        tie_word_embeddings=False,
        bos_token_id=None,
        eos_token_id=eos_id,
        pad_token_id=None,
        architectures=["LlamaForCausalLM"],
    )


def hf_parameters(
    config: PretrainedConfig, trust_remote_code: bool = False
) -> tuple[str, dict[str, tuple[int, ...]], set[str]]:
    """The model class name, its parameters' shapes in natural order, and tied aliases (lm_head);
    ``trust_remote_code``: the run's model.trust_remote_code (the folder's own classes)."""
    from transformers import AutoModelForCausalLM  # optional: transformers (the hf extra)

    with meta_params():
        model = AutoModelForCausalLM.from_config(config, trust_remote_code=trust_remote_code)
    shapes = {n: tuple(p.shape) for n, p in model.named_parameters()}
    aliases = {n for n, _ in model.named_parameters(remove_duplicate=False)} - set(shapes)
    return type(model).__name__, shapes, aliases

"""Write a Hugging Face `LlamaForCausalLM` folder (config.json only, no weights) of a built-in preset's
shape, so that zerofit can train transformers' Llama and its own model on the same config:

    python benchmarks/hf_shape.py PRESET OUT_DIR

The weights are initialised at random by whoever loads it (zerofit: with model.random_init: true);
speed does not depend on their values.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from zerofit.models.presets import PRESETS


def hf_config(preset: str) -> dict:
    a = PRESETS[preset]
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": a.dim,
        "intermediate_size": a.ffn_dim,
        "num_hidden_layers": a.n_layers,
        "num_attention_heads": a.n_heads,
        "num_key_value_heads": a.n_kv_heads,
        "vocab_size": a.vocab_size,
        "max_position_embeddings": a.max_seq_len,
        "rms_norm_eps": a.norm_eps,
        "rope_theta": a.rope_theta,
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "attention_bias": False,
        "mlp_bias": False,
        "torch_dtype": "bfloat16",
    }


if __name__ == "__main__":
    preset, out = sys.argv[1], Path(sys.argv[2])
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(hf_config(preset), indent=1))
    print(f"wrote {out}/config.json ({preset} shape)")

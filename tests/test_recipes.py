"""Every shipped recipe parses, validates and names a model that fits its sequence length."""

from __future__ import annotations

from pathlib import Path

import pytest

from zerofit.launch.run_config import load_config
from zerofit.models import build_model
from zerofit.models.lora import apply_lora

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
RECIPES = sorted(CONFIGS.rglob("*.yaml"))


def test_there_are_recipes() -> None:
    assert len(RECIPES) >= 3


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.name)
def test_recipe_loads(path: Path, tmp_path: Path) -> None:
    cfg = load_config(path)
    hf = None
    if cfg.model.hf is not None:  # a fine-tuning recipe names the user's folder: build a tiny one
        transformers = pytest.importorskip("transformers")
        hf = str(tmp_path / "hf")
        config = transformers.LlamaConfig(
            hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=128, max_position_embeddings=8192,
        )  # fmt: skip
        transformers.AutoModelForCausalLM.from_config(config).save_pretrained(hf)  # with weights
        cfg = load_config(path, [f"model.hf={hf}"])
    m = cfg.model
    spec = build_model(m.preset, hf, m.overrides, random_init=m.random_init)
    spec = apply_lora(spec, cfg.model.lora)  # targets that match nothing raise
    assert cfg.model.seq_len <= spec.max_seq_len


def test_the_fine_tuning_recipes_are_chat_full_lora_and_qlora() -> None:
    full, lora, qlora = (
        load_config(CONFIGS / f"finetune-{k}.yaml") for k in ("full", "lora", "qlora")
    )
    assert full.data.format == lora.data.format == qlora.data.format == "chat"
    assert (full.model.lora.rank, lora.model.lora.rank, qlora.model.lora.rank) == (0, 16, 16)
    assert (lora.model.lora.quantize, qlora.model.lora.quantize) == ("none", "nf4")

"""A tiny Hugging Face Llama (config written to a temp dir; nothing downloaded) trains under FSDP."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from conftest import deep_update, losses, train_run

from zerofit.config import config_from_dict
from zerofit.inputs import build_inputs, make_loader

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.dist


def tiny_llama(directory: Path, with_weights: bool) -> Path:
    cfg = transformers.LlamaConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=320,
        max_position_embeddings=256,
    )
    if with_weights:
        torch.manual_seed(0)
        transformers.LlamaForCausalLM(cfg).save_pretrained(directory, safe_serialization=True)
    else:
        cfg.save_pretrained(directory)
    return directory


def test_hf_llama_trains_under_fsdp(tmp_path: Path) -> None:
    model_dir = tiny_llama(tmp_path / "llama", with_weights=False)
    run = train_run(
        tmp_path,
        "hf",
        {"model": {"preset": None, "hf": str(model_dir), "overrides": {}}, "train": {"steps": 20}},
        "--nproc",
        "2",
    )
    got = losses(run)
    assert got[20] < got[1] - 1.0, got


def test_hf_weights_are_loaded_into_shards(tmp_path: Path) -> None:
    """Step 1's loss under FSDP equals the saved model's own loss on the same global batch."""
    model_dir = tiny_llama(tmp_path / "llama", with_weights=True)
    extra = {
        "model": {"preset": None, "hf": str(model_dir), "overrides": {}},
        "train": {"steps": 1},
    }
    run = train_run(tmp_path, "hfw", extra, "--nproc", "2")
    from conftest import TINY

    cfg = config_from_dict(deep_update(TINY, extra))
    data = build_inputs(cfg).data
    batch = [make_loader(cfg, data, r, 2).next_microbatch() for r in range(2)]
    inputs = torch.cat([b[0] for b in batch])
    targets = torch.cat([b[1] for b in batch])
    model = transformers.LlamaForCausalLM.from_pretrained(model_dir)
    with torch.no_grad():
        expected = F.cross_entropy(
            model(inputs).logits.flatten(0, 1).float(), targets.flatten()
        ).item()
    assert losses(run)[1] == pytest.approx(expected, rel=1e-5)

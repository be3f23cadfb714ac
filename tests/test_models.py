"""Fast CPU tests for zerofit.models: Llama presets, meta building, init, shapes, and the HF adapter.

The HF tests take the ``transformers`` fixture, which skips just them when it is not installed.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch
from torch import nn

from zerofit.errors import UserError
from zerofit.launch.run_config import config_from_dict
from zerofit.models import PRESETS, build_model, preset_names
from zerofit.models.init import Initializer, init_llama_param_, llama_init
from zerofit.models.llama import Llama, LlamaArgs, grouped_attention, param_shapes
from zerofit.models.meta import allocate_, meta_params
from zerofit.models.shape import ModelShape, shape_from_config, shape_from_hf_config

MICRO = LlamaArgs(
    dim=32, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=64, ffn_dim=48, max_seq_len=64
)


def _init_all(module: nn.Module, init_param_: Initializer, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            init_param_(name, p, gen)


def _built_llama(args: LlamaArgs, seed: int = 0) -> Llama:
    with meta_params():
        model = Llama(args)
    model.to_empty(device="cpu")
    _init_all(model, llama_init(args), seed)
    return model


def _numel(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def test_shape_counts_match_built_model() -> None:
    for name in preset_names():
        with meta_params():
            model = Llama(PRESETS[name])
        shape = ModelShape.from_llama_args(PRESETS[name])
        assert shape.num_params == _numel(model), name
        assert shape.num_params == sum(
            torch.Size(s).numel() for s in param_shapes(PRESETS[name]).values()
        )
        assert shape.block_params == _numel(model.layers[0]), name
        assert shape.root_params == _numel(model) - _numel(model.layers), name
        assert shape.embedding_params == model.tok_embeddings.weight.numel(), name
    published = {"llama3-8b": 8_030_261_248, "llama3-1b": 1_498_482_688, "13b": 13_015_864_320}
    published["70b"] = 70_553_706_496
    for name, count in published.items():
        assert ModelShape.from_llama_args(PRESETS[name]).num_params == count, name
    tiny = ModelShape.from_llama_args(PRESETS["tiny"])
    assert 2e6 < tiny.num_params < 4e6
    assert tiny.non_embedding_params == tiny.num_params - 512 * 256 == tiny.flops_params


def test_flops_per_token_by_hand() -> None:
    per_layer = 2 * 256 * 256 + 2 * 256 * 128 + 3 * 256 * 768 + 2 * 256
    n_no_embed = 4 * per_layer + 256 + 512 * 256  # layers + final norm + output head
    spec = build_model(preset="tiny")
    assert spec.shape == ModelShape.from_llama_args(PRESETS["tiny"], "tiny", fused_head=True)
    assert spec.flops_per_token(128) == 6 * n_no_embed + 12 * 4 * 256 * 128
    assert spec.num_params == spec.shape.num_params == n_no_embed + 512 * 256
    assert build_model(preset="tiny", loss_chunk=0).shape.fused_head is False
    # A tied head shares the embedding's weights (counted once) but still does its matmul.
    tied = ModelShape("t", 4, 256, 4, 2, 768, 512, tied_embeddings=True)
    assert tied.num_params == spec.num_params - 512 * 256
    assert tied.flops_params == n_no_embed and tied.non_embedding_params == n_no_embed - 512 * 256


def test_shape_from_hf_and_zerofit_configs(tmp_path: Path) -> None:
    hf = {"num_hidden_layers": 4, "hidden_size": 256, "num_attention_heads": 4, "vocab_size": 512,
          "num_key_value_heads": 2, "intermediate_size": 768, "tie_word_embeddings": False}  # fmt: skip
    tiny = ModelShape.from_llama_args(PRESETS["tiny"], "tiny")
    assert shape_from_hf_config(hf).num_params == tiny.num_params
    (tmp_path / "config.json").write_text(json.dumps(hf))
    from_file = shape_from_hf_config(tmp_path / "config.json")
    assert from_file.flops_per_token(64) == tiny.flops_per_token(64)
    from_dir = shape_from_hf_config(tmp_path, {"num_hidden_layers": 2})
    assert from_dir.n_layers == 2 and from_dir.name == tmp_path.name

    preset = {"preset": "tiny", "overrides": {"n_layers": 2}, "loss_chunk": 0}
    two = ModelShape.from_llama_args(replace(PRESETS["tiny"], n_layers=2), "tiny")
    assert shape_from_config(config_from_dict({"model": preset})) == two
    hf_model = {"preset": None, "hf": str(tmp_path), "overrides": {"num_hidden_layers": 3}}
    from_cfg = shape_from_config(config_from_dict({"model": hf_model}))
    assert from_cfg.n_layers == 3 and from_cfg.fused_head  # a plain head: fused, as built

    for bad in ({**hf, "hidden_size": "256"}, {**hf, "vocab_size": 0}, {"hidden_size": 8}):
        with pytest.raises(UserError, match="not a decoder config"):
            shape_from_hf_config(bad)
    (tmp_path / "config.json").write_text("[1]")
    with pytest.raises(UserError, match="not a decoder config"):
        shape_from_hf_config(tmp_path)
    with pytest.raises(UserError, match="no config.json"):
        shape_from_hf_config(tmp_path / "missing")


def test_model_has_no_buffers_and_params_on_meta() -> None:
    spec = build_model(preset="tiny")
    assert list(spec.module.buffers()) == []
    assert all(p.device.type == "meta" for p in spec.module.parameters())
    assert isinstance(spec.module.get_submodule(spec.blocks_path), nn.ModuleList)
    json.dumps(spec.fingerprint)


def test_forward_shape_and_causality() -> None:
    model = _built_llama(MICRO)
    tokens = torch.randint(0, 64, (2, 10), generator=torch.Generator().manual_seed(1))
    logits = model(tokens)
    assert logits.shape == (2, 10, 64)
    changed = tokens.clone()
    changed[:, 7] = (changed[:, 7] + 1) % 64
    logits2 = model(changed)
    torch.testing.assert_close(logits[:, :7], logits2[:, :7])
    assert not torch.allclose(logits[:, 7:], logits2[:, 7:])


def test_gqa_equals_repeat_kv_reference() -> None:
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 8, 6, 16, generator=g)
    k = torch.randn(2, 2, 6, 16, generator=g)
    v = torch.randn(2, 2, 6, 16, generator=g)
    kr, vr = k.repeat_interleave(4, dim=1), v.repeat_interleave(4, dim=1)
    ref = (
        torch.softmax(
            (q @ kr.transpose(-1, -2)) / 4.0 + torch.full((6, 6), float("-inf")).triu(1), -1
        )
        @ vr
    )
    torch.testing.assert_close(grouped_attention(q, k, v), ref)
    torch.testing.assert_close(grouped_attention(q, k, v, use_gqa_kernel=False), ref)


def test_bf16_model_forward() -> None:
    model = _built_llama(MICRO).to(torch.bfloat16)
    logits = model(torch.randint(0, 64, (1, 8)))
    assert logits.dtype == torch.bfloat16 and torch.isfinite(logits.float()).all()


def test_init_is_deterministic_and_uses_only_generator() -> None:
    a = _built_llama(PRESETS["tiny"], seed=3)
    torch.manual_seed(123)  # global RNG must not matter
    b = _built_llama(PRESETS["tiny"], seed=3)
    for (na, pa), (nb, pb) in zip(a.named_parameters(), b.named_parameters(), strict=True):
        assert na == nb and torch.equal(pa, pb), na
    c = _built_llama(PRESETS["tiny"], seed=4)
    assert not torch.equal(a.layers[0].attention.wq.weight, c.layers[0].attention.wq.weight)

    state = torch.random.get_rng_state()
    t = torch.empty(256, 256)
    init_ = llama_init(PRESETS["tiny"])
    init_("layers.1.attention.wq.weight", t, torch.Generator().manual_seed(5))
    assert torch.equal(state, torch.random.get_rng_state())


def test_init_values_and_wrapped_names() -> None:
    model = _built_llama(PRESETS["tiny"])
    assert torch.equal(model.norm.weight, torch.ones(256))
    assert abs(model.output.weight.std().item() - 256**-0.5) < 0.01
    wo_std = model.layers[0].attention.wo.weight.std().item()
    assert abs(wo_std - 0.02 / (8**0.5)) < 0.002
    gen = torch.Generator().manual_seed(0)
    t1, t2 = torch.empty(768, 256), torch.empty(768, 256)
    a = PRESETS["tiny"]
    init_llama_param_(a, "layers.2._checkpoint_wrapped_module.feed_forward.w1.weight", t1, gen)
    init_llama_param_(
        a, "_orig_mod.layers.2.feed_forward.w1.weight", t2, torch.Generator().manual_seed(0)
    )
    assert torch.equal(t1, t2)
    with pytest.raises(ValueError, match="unknown Llama parameter"):
        init_llama_param_(a, "layers.2.feed_forward.w9.weight", t1, gen)
    with pytest.raises(ValueError, match="expected full shape"):
        init_llama_param_(a, "layers.2.feed_forward.w1.weight", torch.empty(10, 256), gen)


def test_checkpoint_wrapped_blocks_init_and_forward() -> None:
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
        apply_activation_checkpointing,
    )

    ref = _built_llama(MICRO, seed=7)
    with meta_params():
        model = Llama(MICRO)
    apply_activation_checkpointing(model, check_fn=lambda m: type(m).__name__ == "TransformerBlock")
    assert any("_checkpoint_wrapped_module" in n for n, _ in model.named_parameters())
    model.to_empty(device="cpu")
    _init_all(model, llama_init(MICRO), seed=7)
    tokens = torch.randint(0, 64, (2, 9))
    torch.testing.assert_close(model(tokens), ref(tokens))
    model(tokens).sum().backward()


def test_unknown_preset_and_override() -> None:
    with pytest.raises(UserError, match="llama3-8b"):
        build_model(preset="llama3-8")
    with pytest.raises(UserError, match="n_layer"):
        build_model(preset="tiny", overrides={"n_layer": 2})
    with pytest.raises(UserError):
        build_model(preset="tiny", hf="/nonexistent")
    spec = build_model(preset="tiny", overrides={"n_layers": 2})
    assert len(spec.module.layers) == 2 and spec.fingerprint["args"]["n_layers"] == 2


# ---- Hugging Face ----------------------------------------------------------------------------


@pytest.fixture
def transformers() -> ModuleType:
    """The transformers package; skips the test (only it) when it is not installed."""
    return pytest.importorskip("transformers")


def _tiny_llama_config(transformers: ModuleType, **kw: object) -> Any:
    return transformers.LlamaConfig(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        vocab_size=128, intermediate_size=128, max_position_embeddings=256, **kw,
    )  # fmt: skip


def test_hf_build_and_forward(tmp_path: Path, transformers: ModuleType) -> None:
    _tiny_llama_config(transformers).save_pretrained(tmp_path)
    spec = build_model(hf=str(tmp_path), random_init=True)
    blocks = spec.module.get_submodule(spec.blocks_path)
    assert isinstance(blocks, nn.ModuleList) and len(blocks) == 2
    assert spec.vocab_size == 128 and spec.max_seq_len == 256 and spec.weights is None
    assert all(p.device.type == "meta" for p in spec.module.parameters())
    assert all(b.device.type == "cpu" for b in spec.module.buffers())
    assert spec.num_params == sum(p.numel() for p in spec.module.parameters())
    n_no_embed = spec.num_params - 128 * 64
    assert spec.flops_per_token(32) == 6 * n_no_embed + 12 * 2 * 64 * 32
    assert spec.shape.measured is not None and spec.shape.fused_head
    blocks_numel = sum(p.numel() for p in blocks.parameters())
    assert spec.shape.block_params == blocks_numel // 2
    assert spec.shape.root_params == spec.num_params - blocks_numel
    # The planner's view (config.json alone) agrees with the counts of the built model.
    from_config = shape_from_hf_config(tmp_path)
    assert from_config.num_params == spec.num_params
    assert from_config.flops_per_token(32) == spec.flops_per_token(32)
    json.dumps(spec.fingerprint)

    allocate_(spec.module, "cpu")
    _init_all(spec.module, spec.init_param_, seed=0)
    logits = spec.module(torch.randint(0, 128, (2, 12)))
    assert logits.shape == (2, 12, 128) and torch.isfinite(logits).all()
    norm = dict(spec.module.named_parameters())["hf.model.norm.weight"]
    assert torch.equal(norm, torch.ones(64))
    bias_free = torch.empty(64, 64)
    wrapped = "hf.model.layers.0._checkpoint_wrapped_module.self_attn.q_proj.weight"
    spec.init_param_(wrapped, bias_free, torch.Generator().manual_seed(0))
    assert abs(bias_free.std().item() - 0.02) < 0.003
    with pytest.raises(ValueError):
        spec.init_param_("hf.model.nothing.weight", bias_free, torch.Generator())


@pytest.mark.parametrize("tied", [False, True])
def test_hf_weights_roundtrip(tmp_path: Path, transformers: ModuleType, tied: bool) -> None:
    torch.manual_seed(0)
    real = transformers.AutoModelForCausalLM.from_config(
        _tiny_llama_config(transformers, tie_word_embeddings=tied)
    )
    real.save_pretrained(tmp_path, safe_serialization=True)
    saved = real.state_dict()
    spec = build_model(hf=str(tmp_path))
    assert spec.shape.tied_embeddings is tied
    assert spec.shape.flops_params == spec.num_params - (0 if tied else 128 * 64)
    assert spec.weights is not None
    for name, p in spec.module.named_parameters():
        got = spec.weights(name)
        assert got.shape == p.shape
        assert torch.equal(got, saved[name.removeprefix("hf.")]), name
    # a head-only lookup works even when the checkpoint stores only the embedding
    assert torch.equal(spec.weights("hf.lm_head.weight"), saved["lm_head.weight"])
    assert torch.equal(spec.weights("hf._orig_mod.model.norm.weight"), saved["model.norm.weight"])


def test_hf_user_errors(tmp_path: Path, transformers: ModuleType) -> None:
    with pytest.raises(UserError, match="not found"):
        build_model(hf=str(tmp_path / "missing"))
    with pytest.raises(UserError, match="config.json"):
        build_model(hf=str(tmp_path))
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(UserError):
        build_model(hf=str(tmp_path))

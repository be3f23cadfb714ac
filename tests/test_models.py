"""Fast CPU tests for zerofit.models: Llama presets, meta building, init, and the HF adapter."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn

from zerofit.errors import UserError
from zerofit.models import PRESETS, build_model, preset_names
from zerofit.models.llama import (
    Llama,
    LlamaArgs,
    flops_per_token,
    grouped_attention,
    num_params,
)
from zerofit.models.meta import allocate_, meta_params

MICRO = LlamaArgs(
    dim=32, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=64, ffn_dim=48, max_seq_len=64
)


def _init_all(module: nn.Module, init_param_, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            init_param_(name, p, gen)


def _built_llama(args: LlamaArgs, seed: int = 0) -> Llama:
    with meta_params():
        model = Llama(args)
    model.to_empty(device="cpu")
    _init_all(model, model.init_param_, seed)
    return model


def test_num_params_matches_built_model() -> None:
    for name in preset_names():
        with meta_params():
            model = Llama(PRESETS[name])
        assert num_params(PRESETS[name]) == sum(p.numel() for p in model.parameters()), name
    assert num_params(PRESETS["llama3-8b"]) == 8_030_261_248
    assert num_params(PRESETS["llama3-1b"]) == 1_498_482_688
    assert num_params(PRESETS["13b"]) == 13_015_864_320
    assert num_params(PRESETS["70b"]) == 70_553_706_496
    tiny = PRESETS["tiny"]
    assert 2e6 < num_params(tiny) < 4e6
    assert num_params(tiny, exclude_embedding=True) == num_params(tiny) - 512 * 256


def test_flops_per_token_by_hand() -> None:
    a = PRESETS["tiny"]
    per_layer = 2 * 256 * 256 + 2 * 256 * 128 + 3 * 256 * 768 + 2 * 256
    n_no_embed = 4 * per_layer + 256 + 512 * 256  # layers + final norm + output head
    assert flops_per_token(a, 128) == 6 * n_no_embed + 12 * 4 * 256 * 128
    spec = build_model(preset="tiny")
    assert spec.flops_per_token(128) == flops_per_token(a, 128)


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
    a.init_param_("layers.1.attention.wq.weight", t, torch.Generator().manual_seed(5))
    assert torch.equal(state, torch.random.get_rng_state())


def test_init_values_and_wrapped_names() -> None:
    model = _built_llama(PRESETS["tiny"])
    assert torch.equal(model.norm.weight, torch.ones(256))
    assert abs(model.output.weight.std().item() - 256**-0.5) < 0.01
    wo_std = model.layers[0].attention.wo.weight.std().item()
    assert abs(wo_std - 0.02 / (8**0.5)) < 0.002
    gen = torch.Generator().manual_seed(0)
    t1, t2 = torch.empty(768, 256), torch.empty(768, 256)
    model.init_param_("layers.2._checkpoint_wrapped_module.feed_forward.w1.weight", t1, gen)
    model.init_param_(
        "_orig_mod.layers.2.feed_forward.w1.weight", t2, torch.Generator().manual_seed(0)
    )
    assert torch.equal(t1, t2)
    with pytest.raises(ValueError):
        model.init_param_("layers.2.feed_forward.w9.weight", t1, gen)
    with pytest.raises(ValueError):
        model.init_param_("layers.2.feed_forward.w1.weight", torch.empty(10, 256), gen)


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
    _init_all(model, model.init_param_, seed=7)
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

transformers = pytest.importorskip("transformers")


def _tiny_llama_config(**kw) -> transformers.LlamaConfig:
    return transformers.LlamaConfig(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        vocab_size=128, intermediate_size=128, max_position_embeddings=256, **kw,
    )  # fmt: skip


def test_hf_build_and_forward(tmp_path: Path) -> None:
    _tiny_llama_config().save_pretrained(tmp_path)
    spec = build_model(hf=str(tmp_path))
    blocks = spec.module.get_submodule(spec.blocks_path)
    assert isinstance(blocks, nn.ModuleList) and len(blocks) == 2
    assert spec.vocab_size == 128 and spec.max_seq_len == 256 and spec.weights is None
    assert all(p.device.type == "meta" for p in spec.module.parameters())
    assert all(b.device.type == "cpu" for b in spec.module.buffers())
    assert spec.num_params == sum(p.numel() for p in spec.module.parameters())
    n_no_embed = spec.num_params - 128 * 64
    assert spec.flops_per_token(32) == 6 * n_no_embed + 12 * 2 * 64 * 32
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
def test_hf_weights_roundtrip(tmp_path: Path, tied: bool) -> None:
    torch.manual_seed(0)
    real = transformers.AutoModelForCausalLM.from_config(
        _tiny_llama_config(tie_word_embeddings=tied)
    )
    real.save_pretrained(tmp_path, safe_serialization=True)
    saved = real.state_dict()
    spec = build_model(hf=str(tmp_path))
    assert spec.weights is not None
    for name, p in spec.module.named_parameters():
        got = spec.weights(name)
        assert got.shape == p.shape
        assert torch.equal(got, saved[name.removeprefix("hf.")]), name
    # a head-only lookup works even when the checkpoint stores only the embedding
    assert torch.equal(spec.weights("hf.lm_head.weight"), saved["lm_head.weight"])
    assert torch.equal(spec.weights("hf._orig_mod.model.norm.weight"), saved["model.norm.weight"])


def test_hf_user_errors(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="not found"):
        build_model(hf=str(tmp_path / "missing"))
    with pytest.raises(UserError, match="config.json"):
        build_model(hf=str(tmp_path))
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(UserError):
        build_model(hf=str(tmp_path))

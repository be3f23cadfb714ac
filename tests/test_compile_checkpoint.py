"""Compiled blocks under activation checkpointing (`distributed.parallelize`):
- a Hugging Face decoder layer trains compiled and recomputed with eager's values. transformers
  5.25 with the `kernels` package sets a context variable in a hub-kernel layer's forward, which
  Dynamo refused inside a checkpointed block ("HOP: Unsafe side effect");
- a LoRA block compiled and checkpointed keeps for backward what eager checkpointing keeps (its
  input), no activation more. Compiled as a whole on torch 2.11, it kept nearly all of them."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from torch import nn

from zerofit.distributed.parallelize import apply_ac, apply_compile
from zerofit.models.lora import inject, linear_layers
from zerofit.report.saved_tensors import saved_bytes

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.slow  # one small Inductor compile on CPU (~20 s)


class Blocks(nn.Module):
    def __init__(self, config: object) -> None:
        super().__init__()
        llama = transformers.models.llama.modeling_llama
        self.layers = nn.ModuleList(llama.LlamaDecoderLayer(config, i) for i in range(2))
        self.rotary = llama.LlamaRotaryEmbedding(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(x.shape[1]).unsqueeze(0)
        cos_sin = self.rotary(x, positions)
        for layer in self.layers:
            x = layer(x, position_embeddings=cos_sin, position_ids=positions)
        return x


def _blocks(compiled: bool, lora_dropout: float | None = None, mode: str = "full") -> Blocks:
    """Two layers checkpointed under `mode`; with `lora_dropout`, LoRA on every linear layer
    (base frozen)."""
    config = transformers.LlamaConfig(
        hidden_size=64,
        intermediate_size=128,
        num_attention_heads=4,
        num_key_value_heads=2,
        attn_implementation="sdpa",
    )
    torch.manual_seed(0)
    model = Blocks(config)
    if lora_dropout is not None:
        inject(model, list(linear_layers(model)), 4, 8, lora_dropout)
        for p in model.parameters():
            if p.requires_grad:  # the factors, made empty: nonzero both, so both get gradients
                torch.nn.init.normal_(p, std=0.02)
    apply_ac(model.layers, mode)
    if compiled:
        apply_compile(model.layers)
    return model


def _grads(compiled: bool, lora: bool = False) -> tuple[torch.Tensor, list[torch.Tensor]]:
    model = _blocks(compiled, 0.0 if lora else None)
    x = torch.randn(2, 16, 64, requires_grad=lora)
    out = model(x)
    out.square().mean().backward()
    return out.detach(), [p.grad for p in model.parameters() if p.grad is not None]


def _saved_bytes(model: nn.Module, x: torch.Tensor) -> int:
    return saved_bytes(model, lambda: model(x).square().mean())


@pytest.fixture
def restored_switches(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """apply_compile sets process-wide switches: put them back after the test."""
    import torch._dynamo.config as dynamo_config  # the switches' home

    from zerofit.models import loss

    monkeypatch.setattr(loss, "COMPILE_CHUNKS", loss.COMPILE_CHUNKS)
    flag = "skip_fwd_side_effects_in_bwd_under_checkpoint"
    monkeypatch.setattr(dynamo_config, flag, getattr(dynamo_config, flag, False), raising=False)
    limit = dynamo_config.recompile_limit  # set back by hand: monkeypatch cannot (an alias)
    yield
    dynamo_config.recompile_limit = limit


@pytest.mark.usefixtures("restored_switches")
def test_a_checkpointed_hf_layer_trains_compiled_as_eager() -> None:
    out, grads = _grads(compiled=True)
    want_out, want_grads = _grads(compiled=False)
    torch.testing.assert_close(out, want_out, rtol=1e-4, atol=1e-5)
    assert len(grads) == len(want_grads) > 0
    for got, want in zip(grads, want_grads, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-3, atol=1e-5)


@pytest.mark.usefixtures("restored_switches")
def test_a_checkpointed_lora_block_compiled_keeps_only_what_eager_checkpointing_keeps() -> None:
    x = torch.randn(2, 16, 64, requires_grad=True)
    want = _saved_bytes(_blocks(compiled=False, lora_dropout=0.1), x)
    got = _saved_bytes(_blocks(compiled=True, lora_dropout=0.1), x)
    assert got == want, f"compiled and checkpointed, the forward kept {got} bytes; eager {want}"


@pytest.mark.usefixtures("restored_switches")
def test_a_checkpointed_lora_block_trains_compiled_as_eager() -> None:
    out, grads = _grads(compiled=True, lora=True)
    want_out, want_grads = _grads(compiled=False, lora=True)
    torch.testing.assert_close(out, want_out, rtol=1e-4, atol=1e-5)
    assert len(grads) == len(want_grads) > 0
    for got, want in zip(grads, want_grads, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-3, atol=1e-5)


@pytest.mark.usefixtures("restored_switches")
@pytest.mark.parametrize(
    ("mode", "lora", "inside"),
    [("full", True, True), ("selective", True, False), ("full", False, False)],
)
def test_only_fully_recomputed_blocks_with_a_frozen_base_compile_inside(
    mode: str, lora: bool, inside: bool
) -> None:
    model = _blocks(compiled=True, lora_dropout=0.1 if lora else None, mode=mode)  # lazy
    compiled_whole = [isinstance(b, torch._dynamo.eval_frame.OptimizedModule) for b in model.layers]
    assert compiled_whole == [not inside] * 2

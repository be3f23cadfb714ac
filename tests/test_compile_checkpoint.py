"""Compiled blocks under activation checkpointing (`distributed.parallelize`): a Hugging Face
decoder layer trains compiled and recomputed with eager's values. transformers 5.25 with the
`kernels` package sets a context variable in a hub-kernel layer's forward, which Dynamo refused
inside a checkpointed block ("HOP: Unsafe side effect")."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from zerofit.distributed.parallelize import apply_ac, apply_compile

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


def _grads(compiled: bool) -> tuple[torch.Tensor, list[torch.Tensor]]:
    config = transformers.LlamaConfig(
        hidden_size=64,
        intermediate_size=128,
        num_attention_heads=4,
        num_key_value_heads=2,
        attn_implementation="sdpa",
    )
    torch.manual_seed(0)
    model = Blocks(config)
    apply_ac(model.layers, "full")
    if compiled:
        apply_compile(model.layers)
    x = torch.randn(2, 16, 64)
    out = model(x)
    out.square().mean().backward()
    return out.detach(), [p.grad for p in model.parameters() if p.grad is not None]


def test_a_checkpointed_hf_layer_trains_compiled_as_eager(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch._dynamo.config as dynamo_config  # apply_compile sets these process-wide

    from zerofit.models import loss

    monkeypatch.setattr(loss, "COMPILE_CHUNKS", loss.COMPILE_CHUNKS)
    flag = "skip_fwd_side_effects_in_bwd_under_checkpoint"
    monkeypatch.setattr(dynamo_config, flag, getattr(dynamo_config, flag, False), raising=False)
    out, grads = _grads(compiled=True)
    want_out, want_grads = _grads(compiled=False)
    torch.testing.assert_close(out, want_out, rtol=1e-4, atol=1e-5)
    assert len(grads) == len(want_grads) > 0
    for got, want in zip(grads, want_grads, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-3, atol=1e-5)

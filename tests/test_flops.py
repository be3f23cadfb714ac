"""FLOPs per token (``ModelShape.flops_per_token``) against torch's ``FlopCounterMode``.

The counter adds up the FLOPs of matmuls (mm, bmm, addmm and the SDPA kernels it knows) in one
forward + backward; the formula is 6 x (params - input embedding) + 12 x layers x dim x seq.
Term by term, on the models below:

- linear weights (q/k/v/o, SwiGLU, output head): 2 FLOPs per weight and token forward, 4 backward,
  on both sides.
- input embedding: a lookup, no matmul. The formula leaves it out, the counter sees nothing.
- tied head (HF, tie_word_embeddings): the embedding's weights, counted once in ``num_params``, but
  it still multiplies, so ``flops_params`` adds it back; the counter sees the matmul.
- fused head (Llama, loss_chunk > 0): its three matmuls (logits, dlogits @ W, dlogits^T @ h) run in
  the forward pass and backward only rescales, so the count is the plain head's 6 x vocab x dim.
- attention: the formula counts the full seq x seq square (PaLM/torchtitan convention: scores and
  their product with v, 4 x dim x seq forward, x3 with backward). SDPA's math backend, forced here,
  computes every score and masks the upper half, so the counter sees the full square too. Flash
  kernels on GPU skip about half of it (real work is ~6 x layers x dim x seq lower), and the
  counter's SDPA formulas count the full square anyway. On CPU the default fused kernel is not in
  the counter's registry at all (it would count 0), hence MATH.
- norm weights: the formula counts 6 FLOPs per weight and token; they are elementwise, so the
  counter sees 0. For the built-in Llama this is the only difference: exact check.
- elementwise work (RoPE, softmax, SiLU, the loss): neither side.

Tolerance: built-in Llama: counted == formula - 6 x norm weights, exactly; the raw formula is within
REL_TOL = 0.5% of the count (the norm term is 0.07% of it here, 0.28% for the HF model). HF model:
within CORRECTED_TOL = 0.1% of formula - 6 x norm weights, room for small matmuls transformers may
add (e.g. RoPE angles as a matmul: head_dim FLOPs per token, 0.002%). The mistakes this must catch
are 3.5% to 70% here (``_mistakes``), and each is checked to be more than 5 x REL_TOL away.
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest
import torch
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from zerofit.models import ModelSpec, build_model
from zerofit.models.meta import allocate_
from zerofit.models.shape import ModelShape

REL_TOL = 5e-3  # raw formula vs count: norm weights (< 0.3% here) plus slack
CORRECTED_TOL = 1e-3  # HF: formula minus the norm weights vs count
BATCH, SEQ = 2, 128


def _materialized(spec: ModelSpec) -> nn.Module:
    """The spec's module on CPU, initialised (its tied head re-tied: to_empty unties it)."""
    module = allocate_(spec.module, "cpu")
    if spec.shape.tied_embeddings:
        module.hf.tie_weights()
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in module.named_parameters():
            spec.init_param_(name, p, gen)
    return module


def _counted_per_token(module: nn.Module, vocab_size: int) -> float:
    """Matmul FLOPs of one forward (with the loss) + backward, per token."""
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, vocab_size, (BATCH, SEQ), generator=gen)
    targets = torch.randint(0, vocab_size, (BATCH, SEQ), generator=gen)
    counter = FlopCounterMode(display=False)
    with sdpa_kernel(SDPBackend.MATH), counter:
        module(tokens, targets).backward()
    return counter.get_total_flops() / (BATCH * SEQ)


def _norm_weights(module: nn.Module) -> int:
    """Weights of the norms: 1-D parameters of modules with 'norm' in their name."""
    return sum(
        p.numel() for n, p in module.named_parameters() if p.dim() == 1 and "norm" in n.lower()
    )


def _mistakes(m: ModelShape, seq: int) -> dict[str, float]:
    """FLOPs per token as plausible wrong formulas would give them."""
    attention = 12.0 * m.n_layers * m.dim * seq
    head = m.vocab_size * m.dim
    return {
        "no attention term": 6.0 * m.flops_params,
        "causal half of attention": 6.0 * m.flops_params + attention / 2,
        "factor 2 lost (3 x params)": 3.0 * m.flops_params + attention,
        "forward only": 2.0 * m.flops_params + attention / 3,
        "output head left out": 6.0 * (m.flops_params - head) + attention,
        "input embedding counted": 6.0 * (m.flops_params + head) + attention,
    }


def _check(spec: ModelSpec, counted: float, corrected_tol: float) -> None:
    formula = spec.flops_per_token(SEQ)
    corrected = formula - 6 * _norm_weights(spec.module)
    assert counted == pytest.approx(corrected, rel=corrected_tol, abs=0)
    assert counted == pytest.approx(formula, rel=REL_TOL, abs=0)
    for mistake, wrong in _mistakes(spec.shape, SEQ).items():
        assert abs(wrong - counted) > 5 * REL_TOL * counted, f"test too weak for: {mistake}"


@pytest.mark.parametrize("loss_chunk", [0, 48], ids=["plain_head", "fused_head"])
def test_llama_flops_match_counter(loss_chunk: int) -> None:
    spec = build_model(preset="tiny", overrides={"n_layers": 2}, loss_chunk=loss_chunk)
    assert spec.shape.fused_head is (loss_chunk > 0)
    counted = _counted_per_token(_materialized(spec), spec.vocab_size)
    _check(spec, counted, corrected_tol=0.0)  # exact: norm weights are the only difference


@pytest.fixture
def transformers() -> ModuleType:
    """The transformers package; skips the test (only it) when it is not installed."""
    return pytest.importorskip("transformers")


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_hf_llama_flops_match_counter(tmp_path: Path, transformers: ModuleType, tied: bool) -> None:
    transformers.LlamaConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=128, max_position_embeddings=256,
        tie_word_embeddings=tied,
    ).save_pretrained(tmp_path)  # fmt: skip
    spec = build_model(hf=str(tmp_path), random_init=True)
    assert spec.shape.tied_embeddings is tied and spec.shape.fused_head
    counted = _counted_per_token(_materialized(spec), spec.vocab_size)
    _check(spec, counted, corrected_tol=CORRECTED_TOL)

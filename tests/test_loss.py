"""The fused, chunked output layer + cross-entropy against the plain one: same loss, same gradients."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from zerofit.models import build_model
from zerofit.models.loss import IGNORE_INDEX, LMHead, linear_cross_entropy, linear_token_nll


@pytest.mark.parametrize("chunk", [1, 5, 7, 64])
def test_matches_plain_cross_entropy(chunk: int) -> None:
    gen = torch.Generator().manual_seed(0)
    h = torch.randn(3, 7, 16, generator=gen, dtype=torch.float32, requires_grad=True)
    w = torch.randn(50, 16, generator=gen, dtype=torch.float32, requires_grad=True)
    targets = torch.randint(0, 50, (3, 7), generator=gen)
    targets[0, :3] = IGNORE_INDEX
    ref = F.cross_entropy((h @ w.t()).flatten(0, 1), targets.flatten(), ignore_index=IGNORE_INDEX)
    (ref * 3.0).backward()
    gh, gw = h.grad.clone(), w.grad.clone()
    h.grad = w.grad = None
    loss = linear_cross_entropy(h, w, targets, chunk)
    (loss * 3.0).backward()
    torch.testing.assert_close(loss, ref, rtol=1e-6, atol=0)
    torch.testing.assert_close(h.grad, gh, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(w.grad, gw, rtol=1e-5, atol=1e-6)


def test_llama_loss_paths_agree() -> None:
    """model(tokens, targets) is the same loss whether the head is fused (chunked) or not."""
    from zerofit.distributed.parallelize import materialize_

    losses, grads = [], []
    for chunk in (0, 48):
        spec = build_model(preset="tiny", overrides={"n_layers": 2}, loss_chunk=chunk)
        materialize_(spec.module, torch.device("cpu"), init_seed=0, init_param_=spec.init_param_)
        tokens = torch.randint(0, 512, (2, 64), generator=torch.Generator().manual_seed(1))
        loss = spec.module(tokens[:, :-1], tokens[:, 1:])
        loss.backward()
        losses.append(loss.detach())
        grads.append(spec.module.output.weight.grad.clone())
    torch.testing.assert_close(losses[0], losses[1], rtol=1e-5, atol=0)
    torch.testing.assert_close(grads[0], grads[1], rtol=1e-4, atol=1e-7)


def test_rejects_bad_chunk() -> None:
    with pytest.raises(ValueError, match="chunk"):
        linear_cross_entropy(
            torch.zeros(2, 4), torch.zeros(3, 4), torch.zeros(2, dtype=torch.long), 0
        )


def _backward_matmuls(mode: str) -> tuple[int, torch.Tensor]:
    from torch.utils._python_dispatch import TorchDispatchMode

    from zerofit.distributed.parallelize import apply_ac, get_blocks, materialize_

    class Count(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.mm = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
            if func.__name__.split(".")[0] in ("mm", "addmm", "bmm"):
                self.mm += 1
            return func(*args, **(kwargs or {}))

    spec = build_model(preset="tiny", overrides={"n_layers": 2}, loss_chunk=0)
    materialize_(spec.module, torch.device("cpu"), init_seed=0, init_param_=spec.init_param_)
    apply_ac(get_blocks(spec.module, "layers"), mode)
    tokens = torch.randint(0, 512, (2, 33), generator=torch.Generator().manual_seed(1))
    loss = spec.module(tokens[:, :-1], tokens[:, 1:])
    with Count() as counter:
        loss.backward()
    return counter.mm, spec.module.output.weight.grad


def test_selective_checkpointing_recomputes_no_matmul() -> None:
    """Selective AC keeps matmul outputs: backward runs the same matmuls as without AC, and full AC
    runs each block's forward matmuls again; all three give the same gradients."""
    none, g_none = _backward_matmuls("none")
    selective, g_sel = _backward_matmuls("selective")
    full, g_full = _backward_matmuls("full")
    assert selective == none
    # Full AC re-runs each block's forward matmuls; the last (w2) is skipped by the non-reentrant
    # checkpoint's early stop, as its output is not needed for backward.
    assert full == none + 2 * 6
    torch.testing.assert_close(g_sel, g_none)
    torch.testing.assert_close(g_full, g_none)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_compiled_chunk_matches_eager(dtype: torch.dtype) -> None:
    """The compiler's form of a chunk (`softmax_grad`) equals the in-place eager one: loss, count
    and the gradient of the logits, with ignored targets and the true class at both edges."""
    from zerofit.models.loss import _softmax_grad_eager, softmax_grad

    gen = torch.Generator().manual_seed(3)
    logits = (4 * torch.randn(9, 37, generator=gen)).to(dtype)
    targets = torch.randint(0, 37, (9,), generator=gen)
    targets[[1, 4]] = IGNORE_INDEX
    targets[0], targets[2] = 0, 36
    ref = _softmax_grad_eager(logits.clone(), targets)
    got = torch.compile(softmax_grad, fullgraph=True, dynamic=False)(logits, targets)
    plain = softmax_grad(logits, targets)
    for out in (got, plain):
        torch.testing.assert_close(out[0], ref[0], rtol=1e-5, atol=1e-5)
        assert int(out[1]) == int(ref[1]) == 7
        assert out[2].dtype == dtype
        torch.testing.assert_close(out[2].float(), ref[2].float(), rtol=1e-2, atol=1e-2)
    assert torch.all(plain[2][[1, 4]] == 0)


def test_compiled_head_trains_like_eager(monkeypatch: pytest.MonkeyPatch) -> None:
    """With parallel.compile's flag set, the fused head gives the plain loss and gradients."""
    from zerofit.models import loss as loss_mod

    monkeypatch.setattr(loss_mod, "COMPILE_CHUNKS", True)
    monkeypatch.setattr(loss_mod, "_compiled", {})
    gen = torch.Generator().manual_seed(0)
    h = torch.randn(2, 6, 16, generator=gen, requires_grad=True)
    w = torch.randn(40, 16, generator=gen, requires_grad=True)
    targets = torch.randint(0, 40, (2, 6), generator=gen)
    targets[1, :2] = IGNORE_INDEX
    ref = F.cross_entropy((h @ w.t()).flatten(0, 1), targets.flatten(), ignore_index=IGNORE_INDEX)
    ref.backward()
    gh, gw = h.grad.clone(), w.grad.clone()
    h.grad = w.grad = None
    got = linear_cross_entropy(h, w, targets, chunk=4)  # 3 full chunks: one graph
    got.backward()
    assert "fn" in loss_mod._compiled
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(h.grad, gh, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(w.grad, gw, rtol=1e-4, atol=1e-5)


# ------------------------------------------------------------------ per-token losses (DPO's input)


def _head_case(w_trains: bool, dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, ...]:
    """h [3, 7, 16], weight [50, 16], targets (4 ignored), random upstream gradients [3, 7]."""
    gen = torch.Generator().manual_seed(0)
    h = torch.randn(3, 7, 16, generator=gen).to(dtype).requires_grad_()
    w = torch.randn(50, 16, generator=gen).to(dtype).requires_grad_(w_trains)
    targets = torch.randint(0, 50, (3, 7), generator=gen)
    targets[0, :3] = targets[2, 6] = IGNORE_INDEX
    upstream = torch.randn(3, 7, generator=gen)
    return h, w, targets, upstream


def _plain_token_nll(h: torch.Tensor, w: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    logits = (h @ w.t()).float().flatten(0, 1)  # the plain head's logits, in the inputs' dtype
    nll = F.cross_entropy(logits, targets.flatten(), ignore_index=IGNORE_INDEX, reduction="none")
    return nll.view(targets.shape)


def _grads(fn, h, w, targets, upstream) -> tuple[torch.Tensor, ...]:  # noqa: ANN001
    h.grad = w.grad = None
    nll = fn(h, w, targets)
    (nll * upstream).sum().backward()
    return nll.detach(), h.grad, w.grad


@pytest.mark.parametrize("w_trains", [True, False], ids=["head-trains", "head-frozen"])
@pytest.mark.parametrize("chunk", [1, 5, 8, 64])
def test_token_nll_matches_plain_per_token(chunk: int, w_trains: bool) -> None:
    """Each token's loss and the gradients for per-token upstream gradients equal
    F.cross_entropy(reduction="none") on the full logits, the head trained or frozen (LoRA);
    21 tokens in chunks of 1, 5 (a short last one), 8, and one chunk."""
    h, w, targets, upstream = _head_case(w_trains)
    want, gh, gw = _grads(_plain_token_nll, h, w, targets, upstream)
    got, h_grad, w_grad = _grads(
        lambda *a: linear_token_nll(*a, chunk=chunk), h, w, targets, upstream
    )
    assert got.dtype == torch.float32 and got.shape == targets.shape
    assert torch.all(got[targets == IGNORE_INDEX] == 0)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(h_grad, gh, rtol=1e-5, atol=1e-6)
    if w_trains:
        torch.testing.assert_close(w_grad, gw, rtol=1e-5, atol=1e-6)
    else:
        assert w_grad is None


def test_token_nll_edge_cases() -> None:
    """Every target ignored (a row of prompts only): zero losses and zero gradients. Inputs that
    need no gradient with a trained head: the head's gradient alone, still right."""
    h, w, targets, upstream = _head_case(True)
    ignored = torch.full_like(targets, IGNORE_INDEX)
    nll, h_grad, w_grad = _grads(lambda *a: linear_token_nll(*a, chunk=5), h, w, ignored, upstream)
    assert torch.all(nll == 0) and torch.all(h_grad == 0) and torch.all(w_grad == 0)
    h = h.detach()
    want = _grads(_plain_token_nll, h, w, targets, upstream)
    got = _grads(lambda *a: linear_token_nll(*a, chunk=5), h, w, targets, upstream)
    assert got[1] is None
    torch.testing.assert_close(got[0], want[0], rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(got[2], want[2], rtol=1e-5, atol=1e-6)


def test_token_nll_without_gradients_is_the_same_loss() -> None:
    """Under no_grad (the frozen reference) only the losses are computed: the same values, bit
    for bit, as with gradients, and no graph."""
    h, w, targets, _ = _head_case(True)
    with_grad = linear_token_nll(h, w, targets, chunk=5)
    with torch.no_grad():
        without = linear_token_nll(h, w, targets, chunk=5)
    assert without.grad_fn is None
    assert torch.equal(without, with_grad.detach())
    torch.testing.assert_close(without, _plain_token_nll(h, w, targets).detach())


def test_token_nll_bf16_head_trains() -> None:
    """bf16 inputs: the losses in fp32, gradients in bf16 near the fp32 ones."""
    h, w, targets, upstream = _head_case(True, torch.bfloat16)
    want, gh, gw = _grads(_plain_token_nll, h, w, targets, upstream)
    got, h_grad, w_grad = _grads(lambda *a: linear_token_nll(*a, chunk=4), h, w, targets, upstream)
    assert got.dtype == torch.float32 and h_grad.dtype == w_grad.dtype == torch.bfloat16
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(h_grad, gh, rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(w_grad, gw, rtol=2e-2, atol=2e-2)


def test_head_per_token_both_paths_and_the_mean_as_before() -> None:
    """LMHead(h, targets, per_token=True): chunked or on full logits, the same per-token losses,
    whose mean over the valid targets is the (unchanged) mean loss; no targets is an error."""
    h, w, targets, _ = _head_case(True)
    head = LMHead(16, 50, bias=False)
    with torch.no_grad():
        head.weight.copy_(w)
    valid = targets != IGNORE_INDEX
    per_token = {}
    for chunk in (0, 5):
        head.loss_chunk = chunk
        per_token[chunk] = head(h, targets, per_token=True)
        mean = head(h, targets)
        torch.testing.assert_close(per_token[chunk][valid].mean(), mean, rtol=1e-6, atol=0)
    torch.testing.assert_close(per_token[0], per_token[5], rtol=1e-6, atol=1e-6)
    with pytest.raises(ValueError, match="targets"):
        head(h, per_token=True)


def test_compiled_token_nll_trains_like_eager(monkeypatch: pytest.MonkeyPatch) -> None:
    """With parallel.compile's flag set, the per-token head (its forward chunks and backward's
    recomputation) gives the plain losses and gradients."""
    from zerofit.models import loss as loss_mod

    monkeypatch.setattr(loss_mod, "COMPILE_CHUNKS", True)
    monkeypatch.setattr(loss_mod, "_compiled", {})
    h, w, targets, upstream = _head_case(True)
    want, gh, gw = _grads(_plain_token_nll, h, w, targets, upstream)
    got, h_grad, w_grad = _grads(lambda *a: linear_token_nll(*a, chunk=7), h, w, targets, upstream)
    assert "rows" in loss_mod._compiled
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(h_grad, gh, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(w_grad, gw, rtol=1e-4, atol=1e-5)


def _per_token_against_logits(model: torch.nn.Module, logits_model: torch.nn.Module, **kw) -> None:  # noqa: ANN003
    """model(tokens, targets, per_token=True): 0 on ignored targets, its mean over the valid ones
    the mean loss, and for random per-token upstream gradients every parameter's gradient equals
    that of F.cross_entropy(reduction="none") on ``logits_model``'s full logits (same weights)."""
    gen = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, 300, (2, 40), generator=gen)
    targets = torch.randint(0, 300, (2, 40), generator=gen)
    targets[0, :5] = targets[1, 20:23] = IGNORE_INDEX
    upstream = torch.randn(2, 40, generator=gen)
    valid = targets != IGNORE_INDEX
    nll = model(tokens, targets, per_token=True, **kw)
    assert nll.shape == targets.shape and nll.dtype == torch.float32
    assert not nll._is_view()  # FSDP2 warns of a module that returns a view
    assert torch.all(nll[~valid] == 0)
    with torch.no_grad():
        torch.testing.assert_close(
            nll[valid].mean(), model(tokens, targets, **kw), rtol=1e-6, atol=0
        )
    (nll * upstream).sum().backward()
    logits = logits_model(tokens, **kw).float()
    ref = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction="none")  # -100: 0
    torch.testing.assert_close(nll.detach(), ref.detach().view_as(nll), rtol=1e-5, atol=1e-5)
    (ref.view_as(upstream) * upstream).sum().backward()
    theirs = dict(logits_model.named_parameters())
    for name, p in model.named_parameters():
        want = theirs[name].grad
        if not p.requires_grad:
            assert p.grad is None and want is None, name
            continue
        scale = want.abs().max().item()
        torch.testing.assert_close(p.grad, want, rtol=1e-4, atol=1e-5 * scale, msg=name)


@pytest.mark.parametrize("head_trains", [True, False], ids=["head-trains", "head-frozen"])
@pytest.mark.parametrize("chunk", [0, 24])
def test_llama_per_token_losses(chunk: int, head_trains: bool) -> None:
    """zerofit's Llama with packed documents: the fused (80 tokens in chunks of 24) and the plain
    head, trained or frozen."""
    import copy  # only here: the reference model is a copy

    from zerofit.distributed.parallelize import materialize_

    spec = build_model(preset="tiny", overrides={"n_layers": 2, "dim": 64}, loss_chunk=chunk)
    materialize_(spec.module, torch.device("cpu"), init_seed=0, init_param_=spec.init_param_)
    model = spec.module
    model.output.weight.requires_grad_(head_trains)
    reference = copy.deepcopy(model)
    positions = torch.cat([torch.arange(25), torch.arange(15)]).repeat(2, 1)
    _per_token_against_logits(model, reference, positions=positions)


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
@pytest.mark.parametrize("fused", [True, False], ids=["fused", "full-logits"])
def test_hf_per_token_losses(fused: bool, tied: bool) -> None:
    """The Hugging Face adapter: its fused head (chunks of 16) or transformers' full logits, an
    untied head or one tied to the embedding; the reference is transformers' own model."""
    import copy  # only here: the reference model is a copy

    transformers = pytest.importorskip("transformers")
    from zerofit.models.hf_head import HFCausalLM  # transformers only past the skip

    config = transformers.LlamaConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=320, tie_word_embeddings=tied,
    )  # fmt: skip
    torch.manual_seed(0)
    hf = transformers.LlamaForCausalLM(config)
    reference = copy.deepcopy(hf)
    model = HFCausalLM(hf, loss_chunk=16, fused=fused)

    class Logits(torch.nn.Module):  # the reference under the adapter's parameter names
        def __init__(self) -> None:
            super().__init__()
            self.hf = reference

        def forward(self, tokens: torch.Tensor) -> torch.Tensor:
            return self.hf(input_ids=tokens).logits

    _per_token_against_logits(model, Logits())

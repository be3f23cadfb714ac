"""The fused, chunked output layer + cross-entropy against the plain one: same loss, same gradients."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from zerofit.models import build_model
from zerofit.models.loss import IGNORE_INDEX, linear_cross_entropy


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

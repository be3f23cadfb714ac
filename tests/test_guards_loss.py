"""The fused output layer + loss (`zerofit.models.loss`) on the cases a training run meets besides
the common one: every target ignored (a fully masked packed row), a frozen head (LoRA), inputs
that need no gradient, low-precision logits, and `LMHead`'s two paths. Each is checked against
``F.cross_entropy`` on materialised logits."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from zerofit.models.loss import (
    IGNORE_INDEX,
    LMHead,
    _softmax_grad_eager,
    cross_entropy,
    linear_cross_entropy,
    softmax_grad,
)


def data(n: int = 10, d: int = 8, v: int = 13, seed: int = 0):  # noqa: ANN201
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(n, d, generator=g)
    w = torch.randn(v, d, generator=g)
    t = torch.randint(0, v, (n,), generator=g)
    return h, w, t


def reference(h: torch.Tensor, w: torch.Tensor, t: torch.Tensor, scale: float = 1.0):  # noqa: ANN201
    h, w = h.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    loss = F.cross_entropy(h @ w.T, t, ignore_index=IGNORE_INDEX)
    (loss * scale).backward()
    return loss.detach(), h.grad, w.grad


@pytest.mark.parametrize("chunk", [1, 3, 4, 10, 11, 4096])
def test_loss_and_gradients_equal_the_plain_loss(chunk: int) -> None:
    h0, w0, t = data()
    t[[0, 5, 9]] = IGNORE_INDEX  # the first and last tokens among them
    ref_loss, ref_gh, ref_gw = reference(h0, w0, t, 2.5)
    h, w = h0.clone().requires_grad_(), w0.clone().requires_grad_()
    loss = linear_cross_entropy(h, w, t, chunk)
    (loss * 2.5).backward()
    torch.testing.assert_close(loss, ref_loss, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(h.grad, ref_gh, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(w.grad, ref_gw, rtol=1e-5, atol=1e-6)
    assert loss.dtype == torch.float32 and w.grad.dtype == torch.float32


@pytest.mark.parametrize("chunk", [1, 4, 64])
def test_every_target_ignored_is_a_zero_loss_with_zero_gradients(chunk: int) -> None:
    h0, w0, t = data()
    t[:] = IGNORE_INDEX
    h, w = h0.clone().requires_grad_(), w0.clone().requires_grad_()
    loss = linear_cross_entropy(h, w, t, chunk)
    assert loss.item() == 0.0 and torch.isfinite(loss)
    loss.backward()
    assert not h.grad.any() and not w.grad.any()


def test_a_frozen_head_gets_no_gradient_and_the_input_gets_the_right_one() -> None:
    h0, w0, t = data()
    _, ref_gh, _ = reference(h0, w0, t)
    h = h0.clone().requires_grad_()
    loss = linear_cross_entropy(h, w0, t, 3)  # w0: requires_grad False (LoRA's frozen head)
    loss.backward()
    torch.testing.assert_close(h.grad, ref_gh, rtol=1e-5, atol=1e-6)
    assert w0.grad is None


def test_inputs_without_gradient_still_train_the_head() -> None:
    h0, w0, t = data()
    _, _, ref_gw = reference(h0, w0, t)
    w = w0.clone().requires_grad_()
    linear_cross_entropy(h0, w, t, 4).backward()
    torch.testing.assert_close(w.grad, ref_gw, rtol=1e-5, atol=1e-6)


def test_batches_of_sequences_are_flattened() -> None:
    h0, w0, t = data(n=12)
    ref_loss, ref_gh, _ = reference(h0, w0, t)
    h = h0.reshape(3, 4, -1).clone().requires_grad_()
    loss = linear_cross_entropy(h, w0, t.reshape(3, 4), 5)
    loss.backward()
    torch.testing.assert_close(loss, ref_loss, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(h.grad.reshape(12, -1), ref_gh, rtol=1e-5, atol=1e-6)


def test_bf16_inputs_give_bf16_gradients_close_to_fp32() -> None:
    h0, w0, t = data()
    ref_loss, ref_gh, ref_gw = reference(h0, w0, t)
    h = h0.to(torch.bfloat16).requires_grad_()
    w = w0.to(torch.bfloat16).requires_grad_()
    loss = linear_cross_entropy(h, w, t, 4)
    loss.backward()
    assert loss.dtype == torch.float32
    assert h.grad.dtype == torch.bfloat16 and w.grad.dtype == torch.bfloat16
    torch.testing.assert_close(loss, ref_loss, rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(h.grad.float(), ref_gh, rtol=5e-2, atol=5e-3)
    torch.testing.assert_close(w.grad.float(), ref_gw, rtol=5e-2, atol=5e-3)


@pytest.mark.parametrize("chunk", [0, -1])
def test_a_chunk_below_one_is_refused(chunk: int) -> None:
    h, w, t = data()
    with pytest.raises(ValueError, match=f"chunk must be >= 1, got {chunk}"):
        linear_cross_entropy(h, w, t, chunk)


@pytest.mark.parametrize(
    "form", [softmax_grad, _softmax_grad_eager], ids=["compiled-form", "eager"]
)
def test_one_chunk_is_the_loss_sum_the_count_and_softmax_minus_onehot(form) -> None:  # noqa: ANN001
    g = torch.Generator().manual_seed(1)
    logits = 3 * torch.randn(6, 9, generator=g)
    t = torch.tensor([0, 8, IGNORE_INDEX, 4, IGNORE_INDEX, 2])
    loss, count, grad = form(logits.clone(), t)
    valid = t != IGNORE_INDEX
    want = F.cross_entropy(logits[valid], t[valid], reduction="sum")
    torch.testing.assert_close(loss, want, rtol=1e-6, atol=1e-6)
    assert int(count) == 4
    onehot = F.one_hot(t.clamp(min=0), 9).float()
    want_grad = (torch.softmax(logits, -1) - onehot) * valid[:, None]
    torch.testing.assert_close(grad, want_grad, rtol=1e-5, atol=1e-6)
    assert not grad[~valid].any()


def test_plain_cross_entropy_is_fp32_and_skips_ignored_targets() -> None:
    g = torch.Generator().manual_seed(2)
    logits = torch.randn(2, 3, 7, generator=g).to(torch.bfloat16)
    t = torch.tensor([[1, IGNORE_INDEX, 3], [6, 0, IGNORE_INDEX]])
    got = cross_entropy(logits, t)
    assert got.dtype == torch.float32
    valid = t.flatten() != IGNORE_INDEX
    want = F.cross_entropy(logits.float().flatten(0, 1)[valid], t.flatten()[valid])
    torch.testing.assert_close(got, want)


@pytest.mark.parametrize("chunk", [0, 3])
def test_the_head_gives_logits_or_the_mean_loss(chunk: int) -> None:
    head = LMHead(8, 13, bias=False)
    head.loss_chunk = chunk
    h, _, t = data()
    with torch.no_grad():
        head.weight.copy_(data()[1])
    logits = head(h)
    assert logits.shape == (10, 13)
    torch.testing.assert_close(logits, h @ head.weight.T)
    want = F.cross_entropy(h @ head.weight.T, t)
    torch.testing.assert_close(head(h, t), want, rtol=1e-5, atol=1e-6)


def test_the_ignored_target_is_the_one_the_data_writes() -> None:
    """zerofit.data writes -100 where no loss falls (it does not import the models' constant)."""
    from zerofit.data.packing import IGNORE_INDEX as DATA_IGNORE

    assert IGNORE_INDEX == DATA_IGNORE == -100
    h, w, t = data()
    t[[1, 2, 7]] = -100
    want = F.cross_entropy(h @ w.T, t, ignore_index=-100)
    torch.testing.assert_close(linear_cross_entropy(h, w, t, 3), want, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(cross_entropy((h @ w.T)[None], t[None]), want)


@pytest.mark.parametrize("chunk", [1, 4, 64])
def test_a_single_target_is_its_own_mean(chunk: int) -> None:
    h, w, t = data()
    t[:] = -100
    t[6] = 3
    want = F.cross_entropy((h @ w.T)[6:7], t[6:7])
    torch.testing.assert_close(linear_cross_entropy(h, w, t, chunk), want, rtol=1e-6, atol=1e-6)


def _one_chunk_past_fp16(device: str, dtype: torch.dtype) -> None:
    """4096 tokens in one chunk, every target 0, h = 64 everywhere and a zero head (softmax 1/16):
    each token adds (1/16 - 1) * 64 to row 0 of the head's gradient, -245760 over the chunk, past
    fp16's largest value (65504); the mean's gradient, -60, is well inside it."""
    n, d, v = 4096, 8, 16
    h = torch.full((n, d), 64.0, dtype=dtype, device=device)
    w = torch.zeros(v, d, dtype=dtype, device=device, requires_grad=True)
    t = torch.zeros(n, dtype=torch.long, device=device)
    loss = linear_cross_entropy(h, w, t, n)
    loss.backward()
    want = torch.full((v, d), 64.0 / 16)
    want[0] = 64.0 * (1 / 16 - 1)
    torch.testing.assert_close(loss.cpu(), torch.tensor(16.0).log())
    assert w.grad is not None and w.grad.dtype == dtype
    torch.testing.assert_close(w.grad.float().cpu(), want)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_on_cpu_a_chunks_head_gradient_is_summed_in_fp32(dtype: torch.dtype) -> None:
    """The CPU path too: a CPU matmul of fp16 inputs returns fp16, so the chunk's product is formed
    from inputs cast to fp32 (before, fp16 gave -inf in row 0 of the head's gradient)."""
    _one_chunk_past_fp16("cpu", dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_on_cuda_a_chunks_head_gradient_is_summed_in_fp32(dtype: torch.dtype) -> None:
    """On CUDA the weight gradient of a 16-bit chunk is accumulated by the GEMM into fp32: a chunk
    whose sum passes fp16's range still gives the finite, exact mean gradient (a product formed
    in fp16 first is -inf), and the head gets a gradient at all."""
    _one_chunk_past_fp16("cuda", dtype)

"""Cross-entropy over a large vocabulary without ever holding the full logits.

`linear_cross_entropy(h, weight, targets)` equals ``F.cross_entropy(h @ weight.T, targets)`` but walks
the tokens in chunks: each chunk's logits exist only while its loss and its gradients (for `h` and
`weight`) are computed, in the forward pass itself. Backward then only scales the stored gradients.
So a 128K-vocabulary head costs one chunk of fp32 logits instead of [tokens, vocab] in bf16 plus an
fp32 copy plus the saved softmax, and nothing is recomputed (the matmul FLOPs are those of the
plain head: forward logits, then the two gradient matmuls).

Gradients of logits are (softmax - onehot) in [-1, 1], kept unnormalised so fp16 does not underflow;
the 1/N of the mean (and any loss scale) is applied in backward.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

IGNORE_INDEX = -100


# Set by `zerofit.distributed.parallelize.apply_compile` (parallel.compile: true): each chunk's softmax and its
# gradient then run as one compiled kernel instead of half a dozen passes over fp32 logits.
COMPILE_CHUNKS = False
_compiled: dict[str, object] = {}


def _chunk_loss(
    x: torch.Tensor, targets: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """One chunk's fp32 logits ``x`` -> (sum of the valid losses, valid mask, clamped targets,
    logsumexp per row): what both forms of `softmax_grad` start from."""
    valid = targets != IGNORE_INDEX
    safe = targets.clamp(min=0)
    lse = torch.logsumexp(x, dim=-1)
    picked = x.gather(1, safe[:, None]).squeeze(1)
    return torch.where(valid, lse - picked, 0.0).sum(), valid, safe, lse


def softmax_grad(
    logits: torch.Tensor, targets: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One chunk, written for the compiler: (sum of the valid losses, their count, the unscaled
    gradient of the logits, softmax - onehot on valid rows, in the logits' dtype)."""
    x = logits.float()
    loss, valid, safe, lse = _chunk_loss(x, targets)
    onehot = torch.arange(x.shape[1], device=x.device)[None, :] == safe[:, None]
    g = (torch.exp(x - lse[:, None]) - onehot.to(x.dtype)) * valid[:, None]
    return loss, valid.sum(), g.to(logits.dtype)


def _softmax_grad_eager(
    logits: torch.Tensor, targets: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`softmax_grad` in place on one fp32 copy of the logits: the least memory without a compiler."""
    x = logits.float()
    loss, valid, safe, lse = _chunk_loss(x, targets)
    probs = x.sub_(lse[:, None]).exp_()  # softmax, in place
    probs.scatter_add_(1, safe[:, None], torch.full_like(lse[:, None], -1.0))
    probs.mul_(valid[:, None])
    return loss, valid.sum(), probs.to(logits.dtype)


def _chunk_fn():  # noqa: ANN202
    if not COMPILE_CHUNKS:
        return _softmax_grad_eager
    if "fn" not in _compiled:
        _compiled["fn"] = torch.compile(softmax_grad, fullgraph=True, dynamic=False)
    return _compiled["fn"]


def _accumulate_grad_w(grad_w: torch.Tensor, g: torch.Tensor, hc: torch.Tensor) -> torch.Tensor:
    """grad_w (fp32) + g.T @ hc, the product summed in fp32 whatever the inputs' dtype. On CUDA the
    GEMM itself accumulates bf16/fp16 inputs into an fp32 output (``addmm``); elsewhere the
    inputs are cast up first (a CPU matmul in fp16 returns fp16: a chunk's sum of unnormalised
    gradients would overflow to inf past 65,504)."""
    if grad_w.is_cuda and g.dtype in (torch.bfloat16, torch.float16):
        return torch.ops.aten.addmm.dtype(grad_w, g.t(), hc.to(g.dtype), torch.float32)
    return grad_w.add_(torch.matmul(g.t().float(), hc.float()))


class _LinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(  # type: ignore[override]
        ctx: torch.autograd.function.FunctionCtx,
        h: torch.Tensor,
        weight: torch.Tensor,
        targets: torch.Tensor,
        chunk: int,
    ) -> torch.Tensor:
        n_tokens = h.shape[0]
        grad_h = torch.empty_like(h) if h.requires_grad else None
        grad_w = (
            torch.zeros(weight.shape, dtype=torch.float32, device=weight.device)
            if weight.requires_grad
            else None
        )
        total = torch.zeros((), dtype=torch.float32, device=h.device)
        count = torch.zeros((), dtype=torch.float32, device=h.device)
        fn = _chunk_fn()
        for start in range(0, n_tokens, chunk):
            hc, tc = h[start : start + chunk], targets[start : start + chunk]
            logits = torch.matmul(hc, weight.t())  # [c, V]: the only full-vocab buffer
            loss, n, g = fn(logits, tc)
            total += loss
            count += n
            del logits
            if grad_h is not None:
                grad_h[start : start + chunk] = torch.matmul(g, weight.to(g.dtype))
            if grad_w is not None:
                grad_w = _accumulate_grad_w(grad_w, g, hc)
        count = count.clamp(min=1)
        ctx.save_for_backward(grad_h, grad_w, count)
        ctx.weight_dtype = weight.dtype
        return total / count

    @staticmethod
    def backward(ctx: torch.autograd.function.FunctionCtx, grad_out: torch.Tensor):  # type: ignore[override]
        grad_h, grad_w, count = ctx.saved_tensors  # type: ignore[attr-defined]
        scale = grad_out / count
        gh = (grad_h * scale.to(grad_h.dtype)) if grad_h is not None else None
        gw = (grad_w * scale).to(ctx.weight_dtype) if grad_w is not None else None  # type: ignore[attr-defined]
        return gh, gw, None, None


def linear_cross_entropy(
    h: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, chunk: int = 4096
) -> torch.Tensor:
    """Mean cross-entropy of ``h @ weight.T`` against ``targets`` (IGNORE_INDEX skipped).

    h: [..., d], weight: [V, d], targets: [...]. `chunk` tokens' logits exist at a time.
    """
    if chunk < 1:
        raise ValueError(f"chunk must be >= 1, got {chunk}")
    return _LinearCrossEntropy.apply(h.flatten(0, -2), weight, targets.flatten(), chunk)


def cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """The plain loss on materialised logits [..., V], in fp32."""
    return F.cross_entropy(
        logits.flatten(0, -2).float(), targets.flatten(), ignore_index=IGNORE_INDEX
    )


class LMHead(nn.Linear):
    """The output projection. ``head(h)`` gives logits; ``head(h, targets)`` the mean loss, chunked
    through `linear_cross_entropy` when ``loss_chunk`` > 0 (0: materialise the logits)."""

    loss_chunk: int = 4096

    def forward(self, h: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:  # type: ignore[override]
        if targets is None:
            return super().forward(h)
        if self.loss_chunk <= 0:
            return cross_entropy(super().forward(h), targets)
        return linear_cross_entropy(h, self.weight, targets, self.loss_chunk)

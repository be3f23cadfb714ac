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
        for start in range(0, n_tokens, chunk):
            hc, tc = h[start : start + chunk], targets[start : start + chunk]
            logits = torch.matmul(hc, weight.t()).float()  # [c, V]: the only full-vocab buffer
            valid = tc != IGNORE_INDEX
            safe = tc.clamp(min=0)
            lse = torch.logsumexp(logits, dim=-1)
            picked = logits.gather(1, safe[:, None]).squeeze(1)
            total += torch.where(valid, lse - picked, 0.0).sum()
            count += valid.sum()
            if grad_h is None and grad_w is None:
                continue
            probs = logits.sub_(lse[:, None]).exp_()  # softmax, in place
            probs.scatter_add_(1, safe[:, None], torch.full_like(picked[:, None], -1.0))
            probs.mul_(valid[:, None])
            g = probs.to(hc.dtype)
            del logits, probs
            if grad_h is not None:
                grad_h[start : start + chunk] = torch.matmul(g, weight.to(g.dtype))
            if grad_w is not None:
                grad_w += torch.matmul(g.t(), hc.to(g.dtype)).float()
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

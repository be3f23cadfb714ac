"""Cross-entropy over a large vocabulary without ever holding the full logits.

`linear_cross_entropy(h, weight, targets)` equals ``F.cross_entropy(h @ weight.T, targets)`` but walks
the tokens in chunks: each chunk's logits exist only while its loss and its gradients (for `h` and
`weight`) are computed, in the forward pass itself. Backward then only scales the stored gradients.
So a 128K-vocabulary head costs one chunk of fp32 logits instead of [tokens, vocab] in bf16 plus an
fp32 copy plus the saved softmax, and nothing is recomputed (the matmul FLOPs are those of the
plain head: forward logits, then the two gradient matmuls).

Gradients of logits are (softmax - onehot) in [-1, 1], kept unnormalised so fp16 does not underflow;
the 1/N of the mean (and any loss scale) is applied in backward.

`linear_token_nll(h, weight, targets)` gives each token's loss instead (0 where the target is
ignored), as ``F.cross_entropy(h @ weight.T, targets, reduction="none")``: what DPO sums into a
response's log-probability. Each token's upstream gradient is known only in backward. The gradient
of `h` is still prepared in forward, unscaled, and scaled row by row in backward; the weight's,
a sum over tokens of products weighted by those gradients, is not: where the weight trains, backward
computes each chunk's logits and softmax again (one chunk of logits at a time, as in forward; one
more matmul per chunk). A frozen head (LoRA) skips that, and with no gradient wanted at all (a
frozen reference model, eval) only the losses are computed.
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
    """One chunk's fp32 logits ``x`` -> (each row's loss, 0 where ignored; valid mask, clamped
    targets, logsumexp per row): what every form of `softmax_grad` starts from."""
    valid = targets != IGNORE_INDEX
    safe = targets.clamp(min=0)
    lse = torch.logsumexp(x, dim=-1)
    picked = x.gather(1, safe[:, None]).squeeze(1)
    return torch.where(valid, lse - picked, 0.0), valid, safe, lse


def softmax_grad_rows(
    logits: torch.Tensor, targets: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """One chunk, written for the compiler: (each row's loss in fp32, 0 where ignored; the unscaled
    gradient of the logits, softmax - onehot on valid rows, in the logits' dtype)."""
    x = logits.float()
    rows, valid, safe, lse = _chunk_loss(x, targets)
    onehot = torch.arange(x.shape[1], device=x.device)[None, :] == safe[:, None]
    g = (torch.exp(x - lse[:, None]) - onehot.to(x.dtype)) * valid[:, None]
    return rows, g.to(logits.dtype)


def softmax_grad(
    logits: torch.Tensor, targets: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`softmax_grad_rows` for the mean: (sum of the valid losses, their count, the gradient)."""
    rows, g = softmax_grad_rows(logits, targets)
    return rows.sum(), (targets != IGNORE_INDEX).sum(), g


def _softmax_grad_rows_eager(
    logits: torch.Tensor, targets: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """`softmax_grad_rows` in place on one fp32 copy of the logits: the least memory without a
    compiler."""
    x = logits.float()
    rows, valid, safe, lse = _chunk_loss(x, targets)
    probs = x.sub_(lse[:, None]).exp_()  # softmax, in place
    probs.scatter_add_(1, safe[:, None], torch.full_like(lse[:, None], -1.0))
    probs.mul_(valid[:, None])
    return rows, probs.to(logits.dtype)


def _softmax_grad_eager(
    logits: torch.Tensor, targets: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`softmax_grad` in place on one fp32 copy of the logits."""
    rows, g = _softmax_grad_rows_eager(logits, targets)
    return rows.sum(), (targets != IGNORE_INDEX).sum(), g


def _chunk_fn(per_token: bool = False):  # noqa: ANN202
    """The chunk's function: `softmax_grad` (the mean) or `softmax_grad_rows` (``per_token``),
    compiled once each when parallel.compile set COMPILE_CHUNKS."""
    if not COMPILE_CHUNKS:
        return _softmax_grad_rows_eager if per_token else _softmax_grad_eager
    key, fn = ("rows", softmax_grad_rows) if per_token else ("fn", softmax_grad)
    if key not in _compiled:
        _compiled[key] = torch.compile(fn, fullgraph=True, dynamic=False)
    return _compiled[key]


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


def _chunk_nll(logits: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, None]:
    """One chunk's losses alone (no gradient wanted): `softmax_grad_rows` less the softmax."""
    return _chunk_loss(logits.float(), targets)[0], None


def _token_grad_w(
    h: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, grad_out: torch.Tensor, chunk: int
) -> torch.Tensor:
    """sum_i grad_out[i] (softmax_i - onehot_i) h_i^T, in fp32: each chunk's logits and softmax
    computed again, the upstream gradient applied to the rows of `h` (fp32 product, cast back)."""
    grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device)
    fn = _chunk_fn(per_token=True)
    for start in range(0, h.shape[0], chunk):
        hc, rows = h[start : start + chunk], slice(start, start + chunk)
        logits = torch.matmul(hc, weight.t())
        _, g = fn(logits, targets[rows])
        del logits
        scaled = (hc.float() * grad_out[rows, None].float()).to(hc.dtype)
        grad_w = _accumulate_grad_w(grad_w, g, scaled)
    return grad_w


class _LinearTokenNLL(torch.autograd.Function):
    """h [N, d], targets [...] (N places) -> each place's loss, shaped as targets: a tensor of its
    own, not a view (FSDP2 warns of a module that returns a view)."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: torch.autograd.function.FunctionCtx,
        h: torch.Tensor,
        weight: torch.Tensor,
        targets: torch.Tensor,
        chunk: int,
    ) -> torch.Tensor:
        grad_h = torch.empty_like(h) if h.requires_grad else None
        nll = torch.empty(targets.shape, dtype=torch.float32, device=h.device)
        flat_nll, flat_t = nll.view(-1), targets.reshape(-1)
        fn = _chunk_fn(per_token=True) if grad_h is not None else _chunk_nll
        for start in range(0, h.shape[0], chunk):
            rows = slice(start, start + chunk)
            logits = torch.matmul(h[rows], weight.t())  # [c, V]: the only full-vocab buffer
            flat_nll[rows], g = fn(logits, flat_t[rows])
            del logits
            if grad_h is not None:
                grad_h[rows] = torch.matmul(g, weight.to(g.dtype))
        trains = weight.requires_grad  # its gradient needs grad_out: recomputed in backward
        ctx.save_for_backward(grad_h, *((h, weight, targets) if trains else (None,) * 3))
        ctx.chunk, ctx.weight_dtype = chunk, weight.dtype
        return nll

    @staticmethod
    def backward(ctx: torch.autograd.function.FunctionCtx, grad_out: torch.Tensor):  # type: ignore[override]
        grad_h, h, weight, targets = ctx.saved_tensors  # type: ignore[attr-defined]
        grad_out = grad_out.reshape(-1)
        gh = gw = None
        if grad_h is not None:
            gh = grad_h * grad_out[:, None].to(grad_h.dtype)
        if weight is not None and ctx.needs_input_grad[1]:  # type: ignore[attr-defined]
            flat_t = targets.reshape(-1)
            gw = _token_grad_w(h, weight, flat_t, grad_out, ctx.chunk)  # type: ignore[attr-defined]
            gw = gw.to(ctx.weight_dtype)  # type: ignore[attr-defined]
        return gh, gw, None, None


def linear_token_nll(
    h: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, chunk: int = 4096
) -> torch.Tensor:
    """Each token's cross-entropy of ``h @ weight.T`` against ``targets``, in fp32, shaped as
    ``targets`` (0 where a target is IGNORE_INDEX); gradients for any upstream per-token gradient.

    h: [..., d], weight: [V, d], targets: [...]. `chunk` tokens' logits exist at a time. With no
    gradient wanted (no_grad, or neither input requires one) only the losses are computed.
    """
    if chunk < 1:
        raise ValueError(f"chunk must be >= 1, got {chunk}")
    flat_h = h.flatten(0, -2)
    if torch.is_grad_enabled() and (h.requires_grad or weight.requires_grad):
        return _LinearTokenNLL.apply(flat_h, weight, targets, chunk)
    nll = torch.empty(targets.shape, dtype=torch.float32, device=h.device)
    flat_nll, flat_t = nll.view(-1), targets.reshape(-1)
    for start in range(0, flat_h.shape[0], chunk):
        rows = slice(start, start + chunk)
        flat_nll[rows] = _chunk_nll(torch.matmul(flat_h[rows], weight.t()), flat_t[rows])[0]
    return nll


def token_cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Each token's loss on materialised logits [..., V], in fp32, shaped as ``targets`` (0 where
    a target is IGNORE_INDEX). A tensor of its own (a copy of [..., T] losses), not a view."""
    flat = F.cross_entropy(
        logits.flatten(0, -2).float(),
        targets.flatten(),
        ignore_index=IGNORE_INDEX,
        reduction="none",
    )
    return flat.view(targets.shape).clone()  # FSDP2 warns of a module that returns a view


def cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """The plain loss on materialised logits [..., V], in fp32."""
    return F.cross_entropy(
        logits.flatten(0, -2).float(), targets.flatten(), ignore_index=IGNORE_INDEX
    )


class LMHead(nn.Linear):
    """The output projection. ``head(h)`` gives logits; ``head(h, targets)`` the mean loss, chunked
    through `linear_cross_entropy` when ``loss_chunk`` > 0 (0: materialise the logits);
    ``head(h, targets, per_token=True)`` each token's loss [..., T] in fp32 (`linear_token_nll`,
    or `token_cross_entropy` on the logits)."""

    loss_chunk: int = 4096

    def forward(  # type: ignore[override]
        self, h: torch.Tensor, targets: torch.Tensor | None = None, per_token: bool = False
    ) -> torch.Tensor:
        if targets is None:
            if per_token:
                raise ValueError("per_token=True needs the targets")
            return super().forward(h)
        if self.loss_chunk <= 0:
            logits = super().forward(h)
            loss = token_cross_entropy if per_token else cross_entropy
            return loss(logits, targets)
        if per_token:
            return linear_token_nll(h, self.weight, targets, self.loss_chunk)
        return linear_cross_entropy(h, self.weight, targets, self.loss_chunk)

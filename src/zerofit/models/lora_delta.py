"""LoRA's update ``scale * B(A(dropout(x)))`` as one operation that keeps little for backward.

Done module by module (PEFT's way, and zerofit's before), each adapted layer keeps its own dropped
copy of the input and the dropout mask for backward: q, k and v each copy the same normalised
hidden states. ``lora_delta`` keeps the input itself (one tensor, so layers that read the same
input share it), the dropout mask packed eight to a byte, and the rank-r intermediate; backward
drops the input again from the mask: the same values and gradients.

Each update is an autograd function whose backward rebuilds what it needs from what it keeps: a
mask packed in bits is not the expression forward used, so a compiler tracing both into one graph
cannot fold the two and keep the dropped input instead (with boolean masks it did: ~8 bytes per
token and hidden unit more than eager). A gated MLP's down projection (``lora_delta_gated``)
keeps the gate and up outputs, which the SwiGLU keeps anyway, instead of its input.
`benchmarks/lora_block_bytes.py` counts what a QLoRA Llama block keeps: with dropout 0.05, 28.45
bytes per token and hidden unit eager and 24.45 compiled, from 43.76 and 51.76; with dropout 0
compiled, the compiler still keeps the down projection's input (34.26, as before). They stay autograd
functions, not custom operators, so that a compiled block runs them inside its own graph: an
opaque operator costs a Python call per layer, which at small micro-batches leaves the GPU idle.
On CUDA outside a compiled block their bodies run as ``torch.compile``d kernels
(``lean_ops.fused``).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from zerofit.models.autocast import linear_inputs
from zerofit.models.lean_ops import fused, swiglu_grads, swiglu_values

try:
    from zerofit.models.dropout_kernel import keep_mask, new_seed  # optional: Triton (CUDA torch)
except ImportError:  # no Triton: torch's bernoulli everywhere
    keep_mask = new_seed = None  # type: ignore[assignment]

NO_MASK = 0  # packed mask length when nothing is dropped
# The keep mask on CUDA drawn packed by dropout_kernel's Triton kernel (an eighth of the Philox
# work of bernoulli_). Off until tests/test_gpu_dropout.py passes on a GPU: torch's bernoulli_,
# then packed, everywhere.
USE_MASK_KERNEL = False
MASK_DEVICES = ("cuda",)  # where the kernel runs (a CPU test puts a stand-in op there)


def pack_mask(mask: torch.Tensor) -> torch.Tensor:
    """Booleans -> uint8 [ceil(n / 8)], eight to a byte (element i at bit i % 8)."""
    flat = mask.reshape(-1).to(torch.uint8)
    pad = -flat.numel() % 8
    if pad:
        flat = F.pad(flat, (0, pad))
    shifts = torch.arange(8, dtype=torch.uint8, device=mask.device)
    return (flat.view(-1, 8) << shifts).sum(-1, dtype=torch.uint8)


def unpack_mask(packed: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """`pack_mask`'s inverse: booleans shaped as `like`."""
    shifts = torch.arange(8, dtype=torch.uint8, device=packed.device)
    bits = (packed[:, None] >> shifts) & 1
    return bits.reshape(-1)[: like.numel()].view(like.shape).bool()


def _delta_fwd(
    x: torch.Tensor, a: torch.Tensor, b: torch.Tensor, dropout: float, scale: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(update, packed mask (empty when `dropout` is 0), the rank-r intermediate)."""
    packed = x.new_empty(NO_MASK, dtype=torch.uint8)
    dropped = x
    if dropout > 0:
        if USE_MASK_KERNEL and keep_mask is not None and x.device.type in MASK_DEVICES:
            packed = keep_mask(new_seed(x.device), x.numel(), dropout)
            mask = unpack_mask(packed, x)
        else:
            mask = torch.empty_like(x, dtype=torch.bool).bernoulli_(1 - dropout)
            packed = pack_mask(mask)
        dropped = x * mask / (1 - dropout)
    h = F.linear(dropped, a)
    return F.linear(h, b) * scale, packed, h


def _delta_bwd(
    grad: torch.Tensor,
    x: torch.Tensor,
    packed: torch.Tensor,
    h: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    dropout: float,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(grad x, grad a, grad b): the input dropped again from the mask."""
    g = grad * scale
    grad_h = F.linear(g, b.t())  # [..., r]
    grad_b = g.reshape(-1, g.shape[-1]).t().mm(h.reshape(-1, h.shape[-1]))
    mask = unpack_mask(packed, x) if dropout > 0 else None
    dropped = x if mask is None else x * mask / (1 - dropout)
    grad_a = grad_h.reshape(-1, grad_h.shape[-1]).t().mm(dropped.reshape(-1, x.shape[-1]))
    grad_x = F.linear(grad_h, a.t())
    if mask is not None:
        grad_x = grad_x * mask / (1 - dropout)
    return grad_x, grad_a, grad_b


class _LoRADelta(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any, x: torch.Tensor, a: torch.Tensor, b: torch.Tensor, dropout: float, scale: float
    ) -> torch.Tensor:
        out, packed, h = fused(_delta_fwd, x, a, b, dropout, scale)
        ctx.save_for_backward(x, packed, h, a, b)
        ctx.dropout, ctx.scale = dropout, scale
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        x, packed, h, a, b = ctx.saved_tensors
        grads = fused(_delta_bwd, grad, x, packed, h, a, b, ctx.dropout, ctx.scale)
        return (*grads, None, None)


def _gated_bwd(
    grad: torch.Tensor,
    gate: torch.Tensor,
    up: torch.Tensor,
    packed: torch.Tensor,
    h: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    dropout: float,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(grad gate, grad up, grad a, grad b): the input ``silu(gate) * up`` rebuilt, and its
    gradient carried on through the SwiGLU."""
    act = swiglu_values(gate, up)
    grad_act, grad_a, grad_b = _delta_bwd(grad, act, packed, h, a, b, dropout, scale)
    grad_gate, grad_up = swiglu_grads(grad_act, gate, up)
    return grad_gate, grad_up, grad_a, grad_b


class _LoRADeltaGated(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any,
        act: torch.Tensor,
        gate: torch.Tensor,
        up: torch.Tensor,
        a: torch.Tensor,
        b: torch.Tensor,
        dropout: float,
        scale: float,
    ) -> torch.Tensor:
        out, packed, h = fused(_delta_fwd, act, a, b, dropout, scale)
        ctx.save_for_backward(gate, up, packed, h, a, b)
        ctx.dropout, ctx.scale = dropout, scale
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        gate, up, packed, h, a, b = ctx.saved_tensors
        grads = fused(_gated_bwd, grad, gate, up, packed, h, a, b, ctx.dropout, ctx.scale)
        return (None, *grads, None, None)  # the input's gradient flows through gate and up


def _apply(
    fn: type[torch.autograd.Function],
    tensors: tuple[torch.Tensor, ...],
    dropout: float,
    scale: float,
    training: bool,
) -> torch.Tensor:
    """``fn.apply(*tensors, dropout, scale)``, dropout only when ``training`` (as ``nn.Dropout``).
    Under autocast the tensors are cast to its dtype first, as ``F.linear`` would cast them, and
    the function runs with autocast off: it computes in its inputs' dtype."""
    device = tensors[0].device.type
    tensors = linear_inputs(*tensors)
    with torch.autocast(device, enabled=False):
        return fn.apply(*tensors, dropout if training else 0.0, scale)  # type: ignore[no-any-return]


def lora_delta_gated(
    act: torch.Tensor,
    gate: torch.Tensor,
    up: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    dropout: float,
    scale: float,
    training: bool = True,
) -> torch.Tensor:
    """`lora_delta` of ``act = silu(gate) * up`` (a gated MLP's down projection) that keeps
    `gate` and `up` for backward, which the SwiGLU keeps already, instead of `act` (3.5 hidden
    widths a token on Llama): backward rebuilds `act` and returns the gradients of `gate` and
    `up` (none for `act`, which is theirs)."""
    return _apply(_LoRADeltaGated, (act, gate, up, a, b), dropout, scale, training)


def lora_delta(
    x: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    dropout: float,
    scale: float,
    training: bool = True,
) -> torch.Tensor:
    """``scale * (dropout(x) @ a.T) @ b.T``; ``a`` [r, in], ``b`` [out, r]. Dropout only when
    ``training``, as ``nn.Dropout``; under autocast, computed in its dtype (`_apply`)."""
    return _apply(_LoRADelta, (x, a, b), dropout, scale, training)

"""LoRA's update ``scale * B(A(dropout(x)))`` as one operation that keeps little for backward.

Done module by module (PEFT's way, and zerofit's before), each adapted layer keeps its own dropped
copy of the input and the dropout mask for backward: q, k and v each copy the same normalised
hidden states. ``lora_delta`` keeps the input itself (one tensor, so layers that read the same
input share it), the dropout mask packed eight to a byte, and the rank-r intermediate; backward
drops the input again from the mask. On a Llama layer with dropout 0.05 that keeps ~35 bytes per
token and hidden unit where the module-by-module update keeps ~55: the same values and gradients.

The update is a custom operator (``zerofit::lora_delta``, with its backward as another), opaque to
``torch.compile``: inside a compiled block the compiler would otherwise choose what to keep, and it
keeps each layer's dropped input (a dropped value depends on a random draw, which it will not
redraw), ~8 bytes per token and hidden unit more than eager. On CUDA the operators' bodies run as
``torch.compile``d kernels of their own (``lean_ops.fused``). Their FLOPs are registered with
``torch.utils.flop_counter``, which cannot see inside a custom operator.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils.flop_counter import register_flop_formula

from zerofit.models.lean_ops import fused, swiglu_grads, swiglu_values

NO_MASK = 0  # packed mask length when nothing is dropped


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
        mask = torch.empty_like(x, dtype=torch.bool).bernoulli_(1 - dropout)
        dropped = x * mask / (1 - dropout)
        packed = pack_mask(mask)
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


@torch.library.custom_op("zerofit::lora_delta", mutates_args=())
def _delta_op(
    x: torch.Tensor, a: torch.Tensor, b: torch.Tensor, dropout: float, scale: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return fused(_delta_fwd, x, a, b, dropout, scale)  # type: ignore[no-any-return]


@_delta_op.register_fake
def _delta_fake(
    x: torch.Tensor, a: torch.Tensor, b: torch.Tensor, dropout: float, scale: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    lead = x.shape[:-1]
    packed = -(-x.numel() // 8) if dropout > 0 else NO_MASK
    return (
        x.new_empty((*lead, b.shape[0])),
        x.new_empty(packed, dtype=torch.uint8),
        x.new_empty((*lead, a.shape[0])),
    )


@torch.library.custom_op("zerofit::lora_delta_backward", mutates_args=())
def _delta_backward_op(
    grad: torch.Tensor,
    x: torch.Tensor,
    packed: torch.Tensor,
    h: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    dropout: float,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return fused(_delta_bwd, grad, x, packed, h, a, b, dropout, scale)  # type: ignore[no-any-return]


@_delta_backward_op.register_fake
def _delta_backward_fake(
    grad: torch.Tensor,
    x: torch.Tensor,
    packed: torch.Tensor,
    h: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    dropout: float,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return torch.empty_like(x), torch.empty_like(a), torch.empty_like(b)


def _setup_context(ctx: Any, inputs: tuple[Any, ...], output: tuple[torch.Tensor, ...]) -> None:
    x, a, b, dropout, scale = inputs
    _, packed, h = output
    ctx.save_for_backward(x, packed, h, a, b)
    ctx.dropout, ctx.scale = dropout, scale


def _backward(ctx: Any, grad: torch.Tensor, *_unused: Any) -> tuple[torch.Tensor | None, ...]:
    x, packed, h, a, b = ctx.saved_tensors
    grads = _delta_backward_op(grad.contiguous(), x, packed, h, a, b, ctx.dropout, ctx.scale)
    return (*grads, None, None)


_delta_op.register_autograd(_backward, setup_context=_setup_context)


def _matmul_flops(x_shape: torch.Size, a_shape: torch.Size, b_shape: torch.Size) -> int:
    """Two FLOPs per multiply-add of ``x @ a.T`` then ``@ b.T``: the forward's matmuls."""
    rows = math.prod(x_shape[:-1])
    return 2 * rows * a_shape[0] * (a_shape[1] + b_shape[0])


@register_flop_formula(torch.ops.zerofit.lora_delta)
def _delta_flops(x_shape: Any, a_shape: Any, b_shape: Any, *_args: Any, **_kw: Any) -> int:
    return _matmul_flops(x_shape, a_shape, b_shape)


@register_flop_formula(torch.ops.zerofit.lora_delta_backward)
def _delta_backward_flops(
    grad_shape: Any,
    x_shape: Any,
    packed: Any,
    h: Any,
    a_shape: Any,
    b_shape: Any,
    *_: Any,
    **__: Any,
) -> int:
    """Four matmuls, each the size of one of the forward's two: twice the forward."""
    return 2 * _matmul_flops(x_shape, a_shape, b_shape)


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


@torch.library.custom_op("zerofit::lora_delta_gated", mutates_args=())
def _gated_op(
    act: torch.Tensor,
    gate: torch.Tensor,
    up: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    dropout: float,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return fused(_delta_fwd, act, a, b, dropout, scale)  # type: ignore[no-any-return]


@_gated_op.register_fake
def _gated_fake(
    act: torch.Tensor,
    gate: torch.Tensor,
    up: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    dropout: float,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return _delta_fake(act, a, b, dropout, scale)


@torch.library.custom_op("zerofit::lora_delta_gated_backward", mutates_args=())
def _gated_backward_op(
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
    return fused(_gated_bwd, grad, gate, up, packed, h, a, b, dropout, scale)  # type: ignore[no-any-return]


@_gated_backward_op.register_fake
def _gated_backward_fake(
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
    return tuple(torch.empty_like(t) for t in (gate, up, a, b))  # type: ignore[return-value]


def _gated_setup(ctx: Any, inputs: tuple[Any, ...], output: tuple[torch.Tensor, ...]) -> None:
    _, gate, up, a, b, dropout, scale = inputs
    _, packed, h = output
    ctx.save_for_backward(gate, up, packed, h, a, b)
    ctx.dropout, ctx.scale = dropout, scale


def _gated_backward(ctx: Any, grad: torch.Tensor, *_unused: Any) -> tuple[torch.Tensor | None, ...]:
    gate, up, packed, h, a, b = ctx.saved_tensors
    grads = _gated_backward_op(grad.contiguous(), gate, up, packed, h, a, b, ctx.dropout, ctx.scale)
    return (None, *grads, None, None)  # the input's gradient flows through gate and up


_gated_op.register_autograd(_gated_backward, setup_context=_gated_setup)


@register_flop_formula(torch.ops.zerofit.lora_delta_gated)
def _gated_flops(act_shape: Any, _gate: Any, _up: Any, a_shape: Any, b_shape: Any, *_: Any) -> int:
    return _matmul_flops(act_shape, a_shape, b_shape)


@register_flop_formula(torch.ops.zerofit.lora_delta_gated_backward)
def _gated_backward_flops(
    _grad: Any, gate_shape: Any, _up: Any, _p: Any, _h: Any, a_shape: Any, b_shape: Any, *_: Any
) -> int:
    return 2 * _matmul_flops(gate_shape, a_shape, b_shape)


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
    if torch.is_autocast_enabled(act.device.type):
        dtype = torch.get_autocast_dtype(act.device.type)
        act, gate, up, a, b = (t.to(dtype) for t in (act, gate, up, a, b))
    with torch.autocast(act.device.type, enabled=False):
        out, _, _ = _gated_op(act, gate, up, a, b, dropout if training else 0.0, scale)
    return out


def lora_delta(
    x: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    dropout: float,
    scale: float,
    training: bool = True,
) -> torch.Tensor:
    """``scale * (dropout(x) @ a.T) @ b.T``; ``a`` [r, in], ``b`` [out, r]. Dropout only when
    ``training``, as ``nn.Dropout``. Under autocast the three are cast to its dtype first, as
    ``F.linear`` would be (the operator itself computes in its inputs' dtype)."""
    if torch.is_autocast_enabled(x.device.type):
        dtype = torch.get_autocast_dtype(x.device.type)
        x, a, b = x.to(dtype), a.to(dtype), b.to(dtype)
    with torch.autocast(x.device.type, enabled=False):
        out, _, _ = _delta_op(x, a, b, dropout if training else 0.0, scale)
    return out

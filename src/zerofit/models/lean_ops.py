"""Memory-lean RMSNorm and SwiGLU for Hugging Face decoder layers (``model.lean_ops``).

transformers' eager RMSNorm keeps an fp32 copy of its input and the normalised bf16 output for
backward, and its MLP keeps ``act(gate)`` beside ``gate`` and ``up``. On a Llama-3-8B LoRA step at
micro-batch 4 x 2,048 that is ~15 GiB more than the inputs alone (60 KB per token and layer).
These autograd functions keep only what backward cannot cheaply recompute:

- ``rms_norm``: the input (its own dtype) and one fp32 reciprocal RMS per row; backward
  recomputes the normalised input. Same arithmetic as Llama's ``LlamaRMSNorm``: normalise in
  fp32, cast to the input dtype, then scale by the weight.
- ``swiglu``: ``gate`` and ``up`` only; backward recomputes ``silu(gate)`` in fp32. A LoRA down
  projection (``LoRALinear.forward_gated``) then keeps those two for its update too, instead of
  their product.

``apply_lean_ops(model)`` swaps them into every module whose class computes exactly that: each
candidate class is probed once on a small CPU copy and must match its own forward (Gemma's
``1 + weight`` norm and GELU MLPs do not, and are left alone).
"""

from __future__ import annotations

import copy
import dataclasses
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import nn

if TYPE_CHECKING:
    from zerofit.models.build import ModelSpec

GATED = ("gate_proj", "up_proj", "down_proj")


_COMPILED: dict[Any, Any] = {}


def fused(fn: Any, *args: Any) -> Any:
    """``fn(*args)``; on CUDA outside a compiled region, as one ``torch.compile``d kernel (what
    Liger Kernel writes by hand in Triton: eager runs these pointwise chains in one pass, not one
    kernel per operation). Inside a compiled block the block's own graph takes them in."""
    if not (args[0].is_cuda and not torch.compiler.is_compiling()):
        return fn(*args)
    compiled = _COMPILED.get(fn)
    if compiled is None:
        compiled = _COMPILED[fn] = torch.compile(fn, dynamic=False, fullgraph=True)
    return compiled(*args)


def _norm_fwd(x: torch.Tensor, weight: torch.Tensor, eps: float) -> tuple[torch.Tensor, ...]:
    xf = x.float()
    rstd = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * (xf * rstd).to(x.dtype), rstd


def _norm_bwd(
    grad: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, rstd: torch.Tensor, want_w: bool
) -> tuple[torch.Tensor, torch.Tensor | None]:
    normed = x.float() * rstd
    grad_weight = None
    if want_w:
        rows = grad.float() * normed.to(x.dtype).float()
        grad_weight = rows.reshape(-1, rows.shape[-1]).sum(0).to(weight.dtype)
    g = (grad * weight).float()
    dot = (g * normed).mean(-1, keepdim=True)
    return ((g - normed * dot) * rstd).to(x.dtype), grad_weight


def swiglu_values(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    return F.silu(gate) * up


def swiglu_grads(
    grad: torch.Tensor, gate: torch.Tensor, up: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    g, u, dy = gate.float(), up.float(), grad.float()
    sig = torch.sigmoid(g)
    grad_gate = dy * u * sig * (1 + g * (1 - sig))
    return grad_gate.to(gate.dtype), (dy * g * sig).to(up.dtype)


class _RMSNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        out, rstd = fused(_norm_fwd, x, weight, eps)
        ctx.save_for_backward(x, weight, rstd)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        x, weight, rstd = ctx.saved_tensors
        grad_x, grad_w = fused(_norm_bwd, grad, x, weight, rstd, ctx.needs_input_grad[1])
        return grad_x, grad_w, None


class _SwiGLU(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(gate, up)
        return fused(swiglu_values, gate, up)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        gate, up = ctx.saved_tensors
        return fused(swiglu_grads, grad, gate, up)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``weight * (x / rms(x)).to(x.dtype)``, the RMS in fp32, keeping only ``x`` for backward."""
    return _RMSNorm.apply(x, weight, eps)  # type: ignore[no-any-return]


def swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up``, keeping only ``gate`` and ``up`` for backward."""
    return _SwiGLU.apply(gate, up)  # type: ignore[no-any-return]


def _eps(module: nn.Module) -> float | None:
    for name in ("variance_epsilon", "eps"):
        value = getattr(module, name, None)
        if isinstance(value, float):
            return value
    return None


def _lean_norm_forward(self: nn.Module, hidden_states: torch.Tensor) -> torch.Tensor:
    return rms_norm(hidden_states, self.weight, self.zerofit_eps)


def _lean_mlp_forward(self: nn.Module, x: torch.Tensor) -> torch.Tensor:
    gate, up = self.gate_proj(x), self.up_proj(x)
    act = swiglu(gate, up)
    # a LoRA down projection keeps gate and up (kept here anyway) instead of their product
    gated = getattr(self.down_proj, "forward_gated", None)
    return gated(act, gate, up) if gated is not None else self.down_proj(act)


def _is_norm(module: nn.Module) -> bool:
    weight = getattr(module, "weight", None)
    return (
        type(module).__name__.endswith("RMSNorm")
        and isinstance(weight, nn.Parameter)
        and weight.dim() == 1
        and _eps(module) is not None
        and len(list(module.children())) == 0
    )


def _is_gated_mlp(module: nn.Module) -> bool:
    return all(isinstance(getattr(module, n, None), nn.Module) for n in GATED) and isinstance(
        getattr(module, "act_fn", None), nn.Module
    )


def _probe_norm(module: nn.Module) -> bool:
    """Whether the class's own forward is Llama's RMSNorm, on a small CPU copy."""
    probe = copy.copy(module)
    probe._parameters = dict(module._parameters)
    gen = torch.Generator().manual_seed(0)
    probe.weight = nn.Parameter(torch.randn(16, generator=gen) + 1.0)
    x = torch.randn(3, 16, generator=gen, dtype=torch.float32).to(torch.bfloat16)
    eps = _eps(module)
    with torch.no_grad():
        want = type(module).forward(probe, x)
        got = rms_norm(x, probe.weight, eps or 0.0)
    return want.dtype == got.dtype and torch.equal(want, got)


def _probe_mlp(module: nn.Module) -> bool:
    """Whether the class's own forward is ``down(silu(gate(x)) * up(x))``, on a small CPU copy."""
    probe = copy.copy(module)
    probe._modules = dict(module._modules)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, shape in zip(GATED, ((12, 8), (12, 8), (8, 12)), strict=True):
            layer = nn.Linear(shape[1], shape[0], bias=False)
            layer.weight.copy_(torch.randn(shape, generator=gen))
            probe._modules[name] = layer
        x = torch.randn(2, 8, generator=gen)
        want = type(module).forward(probe, x)
        got = _lean_mlp_forward(probe, x)
    return torch.allclose(want, got, rtol=1e-5, atol=1e-6)


def _verdicts(model: nn.Module) -> dict[type, bool]:
    """Each RMSNorm-like and gated-MLP class in ``model``: whether its forward passed its probe."""
    verdicts: dict[type, bool] = {}
    for module in model.modules():
        kind = type(module)
        if kind in verdicts:
            continue
        if _is_norm(module):
            verdicts[kind] = _probe_norm(module)
        elif _is_gated_mlp(module):
            verdicts[kind] = _probe_mlp(module)
    return verdicts


def _swap(model: nn.Module, verdicts: dict[type, bool]) -> list[str]:
    for module in model.modules():
        if not verdicts.get(type(module)):
            continue
        if _is_norm(module):
            module.zerofit_eps = _eps(module)
            module.forward = _lean_norm_forward.__get__(module)  # type: ignore[method-assign]
        else:
            module.forward = _lean_mlp_forward.__get__(module)  # type: ignore[method-assign]
    return sorted(k.__name__ for k, ok in verdicts.items() if ok)


def apply_lean_ops(model: nn.Module) -> list[str]:
    """Swap the lean functions into every RMSNorm and SwiGLU MLP of ``model`` whose class passes
    its probe (the forward is replaced on the instance; parameters and names are untouched).
    Returns the names of the classes changed."""
    return _swap(model, _verdicts(model))


def with_lean_ops(spec: ModelSpec) -> ModelSpec:
    """``spec`` (a ``ModelSpec``) with the lean functions in its module and in every module its
    ``construct`` builds (DeepSpeed's ``zero.Init``, where no probe may run: a module made there
    is partitioned, so the verdicts on ``spec.module``, the same classes, are reused)."""
    verdicts = _verdicts(spec.module)
    spec.module.lean_ops = _swap(spec.module, verdicts)
    base = spec.construct

    def construct() -> nn.Module:
        module = base()
        module.lean_ops = _swap(module, verdicts)
        return module

    return dataclasses.replace(spec, construct=construct)

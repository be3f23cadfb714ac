"""A Llama-style decoder (RMSNorm, RoPE, grouped-query attention, SwiGLU) that reads in one sitting.

Design notes:
- The model has NO buffers. RoPE cos/sin are computed in fp32 inside ``Llama.forward`` from
  ``torch.arange`` and handed to every block as one tensor, so the model can be built with
  parameters on the meta device or cast to bf16 without losing RoPE precision.
- Blocks are called as ``block(x, rope)`` with two tensors only, so activation checkpointing and
  ``torch.compile`` can wrap them.
- Initialisation is by parameter name (``Llama.init_param_``) on one full tensor at a time, using
  only the given generator, so it gives the same weights whatever the sharding.
- RoPE uses the "rotate half" layout (as in Hugging Face Llama) and no Llama-3.1 frequency scaling.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from zerofit.limits import shown
from zerofit.models.loss import LMHead

# Upper bounds of the integer fields: far above any real model, low enough that a typo cannot
# ask for a model whose structure alone takes minutes to build (n_layers) or overflows int64.
_SIZE_LIMITS = {
    "dim": 2**20,
    "n_layers": 1024,
    "n_heads": 2**14,
    "n_kv_heads": 2**14,
    "vocab_size": 2**24,
    "ffn_dim": 2**22,
    "max_seq_len": 2**24,
}


@dataclass(frozen=True)
class LlamaArgs:
    dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    vocab_size: int
    ffn_dim: int
    max_seq_len: int
    norm_eps: float = 1e-5
    rope_theta: float = 500000.0

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads

    def validate(self) -> None:
        """Raise ValueError for shapes that cannot build a model (or only an absurd one)."""
        for name, high in _SIZE_LIMITS.items():
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"{name} must be an integer, got {shown(value)}")
            if value <= 0:
                raise ValueError(f"{name} must be positive, got {shown(value)}")
            if value > high:
                raise ValueError(f"{name} must be at most {high}, got {shown(value)}")
        for name in ("norm_eps", "rope_theta"):
            value = getattr(self, name)
            number = isinstance(value, int | float) and not isinstance(value, bool)
            if not (number and math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a finite number > 0, got {shown(value)}")
        if self.dim % self.n_heads:
            raise ValueError(f"dim {self.dim} is not divisible by n_heads {self.n_heads}")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(
                f"n_heads {self.n_heads} is not divisible by n_kv_heads {self.n_kv_heads}"
            )
        if self.head_dim % 2:
            raise ValueError(f"head_dim {self.head_dim} must be even for RoPE")


PRESETS: dict[str, LlamaArgs] = {
    # ~3.4M parameters, made for CPU tests.
    "tiny": LlamaArgs(dim=256, n_layers=4, n_heads=4, n_kv_heads=2, vocab_size=512, ffn_dim=768, max_seq_len=1024),
    # ~25.7M parameters, a quick single-GPU smoke run.
    "small": LlamaArgs(dim=512, n_layers=8, n_heads=8, n_kv_heads=4, vocab_size=512, ffn_dim=1536, max_seq_len=2048),
    # Llama-3.2-1B shape, but with an untied output layer.
    "llama3-1b": LlamaArgs(dim=2048, n_layers=16, n_heads=32, n_kv_heads=8, vocab_size=128256, ffn_dim=8192, max_seq_len=131072),
    "llama3-8b": LlamaArgs(dim=4096, n_layers=32, n_heads=32, n_kv_heads=8, vocab_size=128256, ffn_dim=14336, max_seq_len=131072),
    # Llama-2-13B shape (multi-head attention, 32k vocabulary).
    "13b": LlamaArgs(dim=5120, n_layers=40, n_heads=40, n_kv_heads=40, vocab_size=32000, ffn_dim=13824, max_seq_len=4096, rope_theta=10000.0),
    # Llama-3-70B shape.
    "70b": LlamaArgs(dim=8192, n_layers=80, n_heads=64, n_kv_heads=8, vocab_size=128256, ffn_dim=28672, max_seq_len=131072),
}  # fmt: skip


def param_shapes(args: LlamaArgs) -> dict[str, tuple[int, ...]]:
    """Name -> shape of every parameter of ``Llama(args)``, in ``named_parameters()`` order."""
    d, hd, f = args.dim, args.head_dim, args.ffn_dim
    shapes: dict[str, tuple[int, ...]] = {"tok_embeddings.weight": (args.vocab_size, d)}
    for i in range(args.n_layers):
        p = f"layers.{i}."
        shapes[p + "attention_norm.weight"] = (d,)
        shapes[p + "attention.wq.weight"] = (args.n_heads * hd, d)
        shapes[p + "attention.wk.weight"] = (args.n_kv_heads * hd, d)
        shapes[p + "attention.wv.weight"] = (args.n_kv_heads * hd, d)
        shapes[p + "attention.wo.weight"] = (d, args.n_heads * hd)
        shapes[p + "ffn_norm.weight"] = (d,)
        shapes[p + "feed_forward.w1.weight"] = (f, d)
        shapes[p + "feed_forward.w2.weight"] = (d, f)
        shapes[p + "feed_forward.w3.weight"] = (f, d)
    shapes["norm.weight"] = (d,)
    shapes["output.weight"] = (args.vocab_size, d)
    return shapes


def num_params(args: LlamaArgs, exclude_embedding: bool = False) -> int:
    """Parameter count of ``Llama(args)``; ``exclude_embedding`` drops only the input embedding."""
    total = sum(math.prod(s) for s in param_shapes(args).values())
    return total - args.vocab_size * args.dim if exclude_embedding else total


def flops_per_token(args: LlamaArgs, seq_len: int) -> float:
    """Training FLOPs per token: 6 * non-embedding params + 12 * layers * dim * seq_len (attention)."""
    n = num_params(args, exclude_embedding=True)
    return 6.0 * n + 12.0 * args.n_layers * args.dim * seq_len


def _probe_enable_gqa() -> bool:
    q = torch.zeros(1, 2, 1, 2)
    kv = torch.zeros(1, 1, 1, 2)
    try:
        F.scaled_dot_product_attention(q, kv, kv, is_causal=True, enable_gqa=True)
    except (TypeError, RuntimeError):
        return False
    return True


SDPA_HAS_GQA = _probe_enable_gqa()
# Set by set_attention_backend: cuDNN attention wants as many kv heads as q heads.
_EXPAND_KV = False


def set_attention_backend(name: str) -> None:
    """Pick the SDPA kernel process-wide: 'auto' (PyTorch's order), 'flash', 'cudnn' or 'efficient'.

    Set before the model is compiled. The other fused kernels are disabled (math stays as fallback).
    """
    global _EXPAND_KV
    if name not in ("auto", "flash", "cudnn", "efficient"):
        raise ValueError(f"unknown attention backend {name!r}")
    if not torch.cuda.is_available():
        return
    cuda = torch.backends.cuda
    cuda.enable_flash_sdp(name in ("auto", "flash"))
    cuda.enable_mem_efficient_sdp(name in ("auto", "efficient"))
    cuda.enable_cudnn_sdp(name in ("auto", "cudnn"))
    _EXPAND_KV = name == "cudnn"


def rope_table(head_dim: int, seq_len: int, theta: float, device: torch.device) -> torch.Tensor:
    """fp32 tensor [2, seq_len, head_dim]: cos and sin of the rotary angles ("rotate half" layout)."""
    exponents = torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim
    inv_freq = 1.0 / (theta**exponents)
    pos = torch.arange(seq_len, device=device, dtype=torch.float32)
    angles = pos[:, None] * inv_freq[None, :]  # elementwise, so autocast leaves it in fp32
    angles = torch.cat([angles, angles], dim=-1)
    return torch.stack([angles.cos(), angles.sin()])


def apply_rope(x: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
    """Rotate x [B, H, T, head_dim] by the table from ``rope_table``; math in fp32."""
    cos, sin = rope[0], rope[1]
    xf = x.float()
    x1, x2 = xf.chunk(2, dim=-1)
    rotated = torch.cat([-x2, x1], dim=-1)
    return (xf * cos + rotated * sin).to(x.dtype)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (xf * self.weight.float()).to(x.dtype)


class Attention(nn.Module):
    def __init__(self, args: LlamaArgs) -> None:
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = args.n_heads, args.n_kv_heads, args.head_dim
        self.wq = nn.Linear(args.dim, args.n_heads * args.head_dim, bias=False)
        self.wk = nn.Linear(args.dim, args.n_kv_heads * args.head_dim, bias=False)
        self.wv = nn.Linear(args.dim, args.n_kv_heads * args.head_dim, bias=False)
        self.wo = nn.Linear(args.n_heads * args.head_dim, args.dim, bias=False)

    def forward(self, x: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q = self.wq(x).view(b, t, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.wk(x).view(b, t, self.n_kv_heads, self.head_dim).transpose(1, 2)
        v = self.wv(x).view(b, t, self.n_kv_heads, self.head_dim).transpose(1, 2)
        q, k = apply_rope(q, rope), apply_rope(k, rope)
        out = grouped_attention(q, k, v)
        return self.wo(out.transpose(1, 2).reshape(b, t, -1))


def grouped_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, use_gqa_kernel: bool | None = None
) -> torch.Tensor:
    """Causal attention with fewer kv heads than q heads; q [B,H,T,D], k/v [B,KV,T,D]."""
    if use_gqa_kernel is None:
        use_gqa_kernel = SDPA_HAS_GQA and not _EXPAND_KV
    if k.shape[1] == q.shape[1]:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    if use_gqa_kernel:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    rep = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


class FeedForward(nn.Module):
    """SwiGLU: w2(silu(w1 x) * w3 x)."""

    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)
        self.w3 = nn.Linear(dim, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class TransformerBlock(nn.Module):
    def __init__(self, args: LlamaArgs) -> None:
        super().__init__()
        self.attention_norm = RMSNorm(args.dim, args.norm_eps)
        self.attention = Attention(args)
        self.ffn_norm = RMSNorm(args.dim, args.norm_eps)
        self.feed_forward = FeedForward(args.dim, args.ffn_dim)

    def forward(self, x: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x), rope)
        return x + self.feed_forward(self.ffn_norm(x))


# Segments that wrappers (activation checkpointing, torch.compile, FSDP1, DDP) add to names.
_WRAPPER_SEGMENTS = {"_checkpoint_wrapped_module", "_orig_mod", "_fsdp_wrapped_module"}
_LAYER_RE = re.compile(r"layers\.(\d+)\.(.+)")


def strip_wrapper_names(name: str) -> str:
    """Drop wrapper segments (and a leading DDP ``module.``) from a parameter name."""
    parts = [p for p in name.split(".") if p not in _WRAPPER_SEGMENTS]
    if parts and parts[0] == "module":
        parts = parts[1:]
    return ".".join(parts)


class Llama(nn.Module):
    def __init__(self, args: LlamaArgs, loss_chunk: int = 4096) -> None:
        super().__init__()
        args.validate()
        self.args = args
        self.tok_embeddings = nn.Embedding(args.vocab_size, args.dim)
        self.layers = nn.ModuleList(TransformerBlock(args) for _ in range(args.n_layers))
        self.norm = RMSNorm(args.dim, args.norm_eps)
        self.output = LMHead(args.dim, args.vocab_size, bias=False)
        self.output.loss_chunk = loss_chunk

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        """tokens [B, T] (int64) -> logits [B, T, vocab_size]; with targets [B, T], the mean loss
        (computed chunk by chunk, never holding all logits: see ``zerofit.models.loss``)."""
        rope = rope_table(self.args.head_dim, tokens.shape[1], self.args.rope_theta, tokens.device)
        h = self.tok_embeddings(tokens)
        for layer in self.layers:
            h = layer(h, rope)
        return self.output(self.norm(h), targets)

    @torch.no_grad()
    def init_param_(self, name: str, tensor: torch.Tensor, generator: torch.Generator) -> None:
        """Fill one full (unsharded) parameter in place, chosen by its name.

        Norm weights -> 1. Embeddings -> normal std 0.02 (not torchtitan's 1.0: the residual stream
        then starts at the same scale as the block outputs, which trains more stably on tiny models).
        wq/wk/wv/w1/w3 -> truncated normal std 0.02; wo/w2 -> std 0.02 / sqrt(2 * n_layers);
        output -> std dim**-0.5. Truncation at +-3 std. Only ``generator`` supplies randomness.
        """
        clean = strip_wrapper_names(name)
        expected = param_shapes(self.args).get(clean)
        if expected is None:
            raise ValueError(f"unknown Llama parameter name: {name!r}")
        if tuple(tensor.shape) != expected:
            raise ValueError(f"{name}: expected full shape {expected}, got {tuple(tensor.shape)}")
        if clean.endswith("norm.weight"):
            tensor.fill_(1.0)
            return
        if clean == "tok_embeddings.weight":
            std = 0.02
        elif clean == "output.weight":
            std = self.args.dim**-0.5
        else:
            match = _LAYER_RE.fullmatch(clean)
            assert match is not None  # every other known name is a layer weight
            out_proj = match.group(2) in ("attention.wo.weight", "feed_forward.w2.weight")
            std = 0.02 / math.sqrt(2 * self.args.n_layers) if out_proj else 0.02
        # Draw in fp32 so the values do not depend on the target dtype (and bf16 erfinv is spotty).
        tmp = torch.empty(tensor.shape, dtype=torch.float32, device=tensor.device)
        nn.init.trunc_normal_(tmp, mean=0.0, std=std, a=-3 * std, b=3 * std, generator=generator)
        tensor.copy_(tmp)

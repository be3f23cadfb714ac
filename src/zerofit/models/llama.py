"""A Llama-style decoder (RMSNorm, RoPE, grouped-query attention, SwiGLU) that reads in one sitting.

Design notes:
- The model has NO buffers. RoPE cos/sin are computed in fp32 inside ``Llama.forward`` from
  ``torch.arange`` and handed to every block as one tensor, so the model can be built with
  parameters on the meta device or cast to bf16 without losing RoPE precision.
- Blocks are called as ``block(x, rope)`` with tensors only, so activation checkpointing and
  ``torch.compile`` can wrap them; packed samples add a third, ``block(x, rope, docs)``.
- Packed samples (``positions`` given): a token attends only to earlier tokens of its own document
  (document id = cumsum(positions == 0)) and RoPE rotates by the given positions. On CPU the mask
  is a dense boolean one through SDPA; on CUDA, FlexAttention with a document block mask
  (``zerofit.models.doc_attention``). Without positions the model is exactly the causal one.
- Initialisation is by parameter name (``zerofit.models.init.init_llama_param_``) on one full
  tensor at a time, using only the given generator, so it gives the same weights whatever the
  sharding. Parameter counts and FLOPs are ``zerofit.models.shape.ModelShape``'s.
- RoPE uses the "rotate half" layout (as in Hugging Face Llama) and no Llama-3.1 frequency scaling.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from zerofit.models.doc_attention import document_attention, document_ids
from zerofit.models.loss import LMHead
from zerofit.models.presets import PRESETS, LlamaArgs, param_shapes  # noqa: F401  (the model's own names)
from zerofit.models.shape import ModelShape


def num_params(args: LlamaArgs, exclude_embedding: bool = False) -> int:
    """Parameter count of ``Llama(args)``; ``exclude_embedding`` drops only the input embedding.

    A shortcut to ``ModelShape.from_llama_args(args)``, where the arithmetic lives.
    """
    shape = ModelShape.from_llama_args(args)
    return shape.non_embedding_params if exclude_embedding else shape.num_params


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
    _EXPAND_KV = name in ("cudnn", "efficient")


def rope_table(
    head_dim: int,
    seq_len: int,
    theta: float,
    device: torch.device,
    positions: torch.Tensor | None = None,
) -> torch.Tensor:
    """fp32 tensor [2, seq_len, head_dim]: cos and sin of the rotary angles ("rotate half" layout);
    [2, B, 1, seq_len, head_dim] for per-sequence ``positions`` [B, seq_len]."""
    exponents = torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim
    inv_freq = 1.0 / (theta**exponents)
    if positions is not None:
        angles = positions.to(torch.float32)[:, None, :, None] * inv_freq
        angles = torch.cat([angles, angles], dim=-1)
        return torch.stack([angles.cos(), angles.sin()])
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

    def forward(
        self, x: torch.Tensor, rope: torch.Tensor, docs: torch.Tensor | None = None
    ) -> torch.Tensor:
        b, t, _ = x.shape
        q = self.wq(x).view(b, t, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.wk(x).view(b, t, self.n_kv_heads, self.head_dim).transpose(1, 2)
        v = self.wv(x).view(b, t, self.n_kv_heads, self.head_dim).transpose(1, 2)
        q, k = apply_rope(q, rope), apply_rope(k, rope)
        if docs is None:
            out = grouped_attention(q, k, v)
        else:
            out = document_attention(q, k, v, docs, SDPA_HAS_GQA and not _EXPAND_KV)
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

    def forward(
        self, x: torch.Tensor, rope: torch.Tensor, docs: torch.Tensor | None = None
    ) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x), rope, docs)  # docs None: plain causal
        return x + self.feed_forward(self.ffn_norm(x))


# Segments that wrappers (activation checkpointing, torch.compile, FSDP1, DDP) add to names.
_WRAPPER_SEGMENTS = {"_checkpoint_wrapped_module", "_orig_mod", "_fsdp_wrapped_module"}


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

    def forward(
        self,
        tokens: torch.Tensor,
        targets: torch.Tensor | None = None,
        positions: torch.Tensor | None = None,
        documents: torch.Tensor | None = None,
        per_token: bool = False,
    ) -> torch.Tensor:
        """tokens [B, T] (int64) -> logits [B, T, vocab_size]; with targets [B, T] (-100: no loss),
        the mean loss over the valid targets (computed chunk by chunk, never holding all logits:
        see ``zerofit.models.loss``); with ``per_token`` too, each place's loss [B, T] in fp32
        (0 where the target is -100). ``positions`` [B, T] (int64) restart at 0 at each packed
        document: attention stays within documents and RoPE uses them. ``documents`` (the
        documents' bounds that the HF adapter takes) is not needed: the ids come from positions."""
        del documents
        args = self.args
        rope = rope_table(args.head_dim, tokens.shape[1], args.rope_theta, tokens.device, positions)
        h = self.tok_embeddings(tokens)
        if positions is None:
            for layer in self.layers:
                h = layer(h, rope)
        else:
            docs = document_ids(positions)
            for layer in self.layers:
                h = layer(h, rope, docs)
        return self.output(self.norm(h), targets, per_token=per_token)

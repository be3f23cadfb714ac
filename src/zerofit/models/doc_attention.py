"""Attention over packed documents: a token attends only to earlier tokens of its own document.

Document ids come from the positions (``cumsum(positions == 0)``: each document restarts at 0).
On CPU (and wherever FlexAttention is off) the mask is a dense boolean [B, 1, T, T] through SDPA.
On CUDA, in eager blocks, it is FlexAttention with a document block mask: fully masked blocks are
skipped, so the cost falls with the documents' lengths (on an H200, bf16, B=4, T=4096, 32/8 heads,
documents of 512: 1.6 ms forward + backward against 4.0 ms for causal SDPA and 13 ms for SDPA with
the dense mask). The block mask is built once per forward (about 10 ms) and reused by every layer,
and by activation-checkpointing recomputation, while the same ``docs`` tensor comes back.
Inside ``torch.compile``d blocks the dense mask is used: building a block mask there is a side
effect that Dynamo refuses under activation checkpointing.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import BlockMask, create_block_mask, flex_attention

USE_FLEX = True  # FlexAttention on CUDA (False: dense-mask SDPA everywhere)
# The documents' bounds a micro-batch passes are padded to a multiple of this. At 64: one shape
# for nearly every batch (rows of a few thousand tokens hold fewer than 63 documents), so that a
# compiled block neither recompiles for a new count nor, under CUDA graphs, records a graph per
# count. FlashAttention varlen gives bitwise the same output with the padding's empty documents
# (tests/test_gpu.py's varlen kernel test, passed on an H100 on 2026-12-07:
# docs/benchmarks/data/2026-12-07-qlora-rebuild-h100/call1/varlen.txt).
BOUNDS_MULTIPLE = 64
_compiled_flex: Any = None
_last: tuple[torch.Tensor, int, BlockMask] | None = None  # (docs, its version, block mask)


def document_ids(positions: torch.Tensor) -> torch.Tensor:
    """[B, T] int32: which packed document each token belongs to."""
    return (positions == 0).cumsum(dim=1, dtype=torch.int32)


def document_bounds(positions: torch.Tensor, multiple: int = 1) -> torch.Tensor:
    """int32 [N+1]: where each of the N packed documents of the [B, T] `positions` starts in the
    flattened batch, then B*T (FlashAttention varlen's cumulative lengths). A row's first token
    starts a document, and so does each token whose position is not the previous one's plus one
    (transformers' rule). On the host, before the batch moves, it costs no device sync.

    `multiple`: B*T is repeated until the length is a multiple of it, as empty documents at the
    end (they attend nothing and cost nothing), so that batches with different counts of
    documents give the compiled blocks the same shape (`BOUNDS_MULTIPLE`)."""
    starts = torch.ones_like(positions, dtype=torch.bool)
    starts[:, 1:] = positions[:, 1:] - positions[:, :-1] != 1
    idx = starts.flatten().nonzero().flatten()
    end = torch.tensor([positions.numel()], dtype=idx.dtype, device=positions.device)
    pad = -(idx.numel() + 1) % multiple
    return torch.cat([idx, end.expand(1 + pad)]).to(torch.int32)


def dense_document_mask(docs: torch.Tensor) -> torch.Tensor:
    """[B, 1, T, T] bool: query i may attend key j (same document, j <= i)."""
    t = docs.shape[1]
    causal = torch.ones(t, t, dtype=torch.bool, device=docs.device).tril()
    return ((docs[:, :, None] == docs[:, None, :]) & causal)[:, None]


def document_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, docs: torch.Tensor, use_gqa_kernel: bool
) -> torch.Tensor:
    """q [B,H,T,D], k/v [B,KV,T,D], docs [B,T] -> [B,H,T,D], causal within each document."""
    if q.is_cuda and USE_FLEX and not torch.compiler.is_compiling():
        return _flex_document_attention(q, k, v, docs)
    mask = dense_document_mask(docs)
    if k.shape[1] != q.shape[1]:
        if use_gqa_kernel:
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
        rep = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def _block_mask(docs: torch.Tensor) -> BlockMask:
    global _last
    if _last is not None and _last[0] is docs and _last[1] == docs._version:
        return _last[2]

    def same_document(b: Any, h: Any, q_idx: Any, kv_idx: Any) -> Any:
        return (docs[b, q_idx] == docs[b, kv_idx]) & (q_idx >= kv_idx)

    b, t = docs.shape
    mask = create_block_mask(same_document, b, None, t, t, device=docs.device)
    _last = (docs, docs._version, mask)  # holding `docs` keeps its memory from being reused
    return mask


def _flex_document_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, docs: torch.Tensor
) -> torch.Tensor:
    global _compiled_flex
    if _compiled_flex is None:
        _compiled_flex = torch.compile(flex_attention, dynamic=False)
    gqa = k.shape[1] != q.shape[1]
    return _compiled_flex(q, k, v, block_mask=_block_mask(docs), enable_gqa=gqa)

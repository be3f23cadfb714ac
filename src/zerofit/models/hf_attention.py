"""Packed-document attention for Hugging Face models: FlashAttention varlen on CUDA.

transformers keeps packed documents apart by building a dense block-diagonal mask [B, 1, T, T]
from the position ids, and SDPA with a dense mask cannot use its flash kernel. zerofit registers
its own attention implementation, ``zerofit_varlen``, with transformers' ``AttentionInterface``:

- On CUDA (bf16/fp16 compute), each layer runs ``torch.nn.attention.varlen.varlen_attn`` (causal) over
  the batch flattened to [B*T] tokens, cut into documents by cumulative lengths that
  ``doc_bounds`` computes once per forward (documents start where the positions do not step by
  one, transformers' own rule). No mask is built, and no work is done across documents.
- On CUDA in fp32, with dropout or before Ampere, SDPA with the same documents as a dense mask.
- On CPU, it is transformers' SDPA with transformers' own mask, unchanged.

Only architectures whose attention is plain causal softmax attention use it (``varlen_refusal``):
no sliding window, no logit soft-capping, no attention dropout; others keep their own.
"""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from zerofit.models.doc_attention import document_bounds

if TYPE_CHECKING:
    from transformers import PretrainedConfig

NAME = "zerofit_varlen"
CU_KEY, MAX_KEY = "zerofit_cu_seqlens", "zerofit_max_len"  # kwargs carried to every layer
# Model types whose attention is plain causal softmax attention over (q, k, v) in transformers.
PLAIN_CAUSAL = frozenset({"llama", "mistral", "qwen2", "qwen3", "gemma", "phi3"})
HALF = (torch.bfloat16, torch.float16)


def _varlen() -> Any | None:
    try:
        from torch.nn.attention.varlen import varlen_attn  # optional: torch >= 2.10 has it
    except ImportError:  # torch before 2.10
        return None
    return varlen_attn


def varlen_refusal(config: PretrainedConfig) -> str | None:
    """Why the model with this HF ``config`` keeps transformers' attention, or None if it can use
    ``zerofit_varlen``."""
    if _varlen() is None:
        return "this torch has no torch.nn.attention.varlen"
    kind = getattr(config, "model_type", "")
    if kind not in PLAIN_CAUSAL:
        return f"model_type {kind!r} is not one of {sorted(PLAIN_CAUSAL)}"
    layer_types = getattr(config, "layer_types", None)
    if layer_types is not None and any(t != "full_attention" for t in layer_types):
        return "some layers use another attention than full attention"
    window = getattr(config, "sliding_window", None)
    if layer_types is None and window and getattr(config, "use_sliding_window", True):
        return "it uses sliding-window attention"
    if getattr(config, "attn_logit_softcapping", None):
        return "it soft-caps the attention logits"
    if getattr(config, "attention_dropout", 0.0):
        return "it has attention dropout"
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    if head_dim > 256 or head_dim % 8:
        return f"head_dim {head_dim}: FlashAttention takes multiples of 8 up to 256"
    return None


def runs_varlen(device: torch.device | str) -> bool:
    """Whether attention on this device goes through ``doc_bounds`` instead of a dense mask."""
    return torch.device(device).type == "cuda"


# Memos read inside compiled blocks: plain dicts, which Dynamo traces without the warning it gives
# for a `functools.cache` wrapper.
_FLASH: dict[torch.device, bool] = {}
_PARAMS: dict[Any, frozenset[str]] = {}
_GQA: dict[torch.device, bool] = {}  # varlen_attn takes fewer key/value heads as they are
_PREPARED: dict[torch.device, torch.Tensor] = {}


def _flash_capable(device: torch.device) -> bool:
    """FlashAttention needs compute capability 8.0 (Ampere) or later."""
    if device not in _FLASH:
        _FLASH[device] = torch.cuda.get_device_capability(device) >= (8, 0)
    return _FLASH[device]


def doc_bounds(
    positions: torch.Tensor | None,
    batch: int,
    seq: int,
    device: torch.device,
    documents: torch.Tensor | None = None,
):  # noqa: ANN201
    """(cumulative document lengths int32 [N+1] over the flattened batch, the longest possible
    document). ``documents``: those lengths already computed (``document_bounds`` on the host,
    moved to `device`): no device sync. Else from the positions (one host sync per forward, for
    the count of documents), or, without positions, each row one document."""
    if documents is not None:
        return documents, seq
    if positions is None:
        return torch.arange(0, (batch + 1) * seq, seq, dtype=torch.int32, device=device), seq
    return document_bounds(positions.expand(batch, seq)), seq


def prepared_mask(device: torch.device) -> torch.Tensor:
    """A 4-D placeholder for transformers' ``attention_mask`` on the varlen device. transformers
    passes a 4-D mask through as already prepared, so it neither builds one nor looks for packed
    documents in the positions (``find_packed_sequence_indices``: a device sync per forward);
    ``varlen_attention`` ignores it there (the documents come as ``CU_KEY``)."""
    if device not in _PREPARED:
        _PREPARED[device] = torch.ones(1, 1, 1, 1, dtype=torch.bool, device=device)
    return _PREPARED[device]


def prime(device: torch.device) -> None:
    """Fill the memos the attention reads inside the compiled blocks, before the first block runs
    (the model's forward calls this): their first write, made inside an activation-checkpointed
    compiled block, is a side effect Dynamo refuses ("HOP: Unsafe side effect")."""
    _flash_capable(device)
    fn = _varlen()
    if fn is not None:
        _params(fn)
        if device not in _GQA:  # (the kernel runs from Ampere on: no probe before)
            named = "enable_gqa" in _params(fn)
            _GQA[device] = named or (_flash_capable(device) and _gqa_native(fn, device))


def _gqa_native(fn: Any, device: torch.device) -> bool:
    """Whether ``fn`` computes grouped-query attention from fewer key/value heads without being
    told (torch 2.11's ``varlen_attn`` has no ``enable_gqa``, but its FlashAttention kernels
    take Hkv < H heads): its output and input gradients on a small problem against the same
    with the key/value heads repeated. Expanding them for every layer keeps H/Hkv times their
    bytes saved for backward (+3 bytes a token and hidden unit at Llama-3-8B's 32/8 heads)."""
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32

    def run(expand: bool) -> list[torch.Tensor]:
        gen = torch.Generator(device="cpu").manual_seed(0)
        shapes = ((32, 4, 64), (32, 2, 64), (32, 2, 64))  # q, k, v: 4 query heads, 2 key/value
        leaves = [torch.randn(s, generator=gen).to(device, dtype).requires_grad_() for s in shapes]
        cu = torch.tensor([0, 20, 32], dtype=torch.int32, device=device)
        kk, vv = leaves[1:]
        if expand:
            kk, vv = kk.repeat_interleave(2, dim=1), vv.repeat_interleave(2, dim=1)
        out = _call(fn, leaves[0], kk, vv, cu, 20, None)
        out.float().square().sum().backward()
        return [out.detach(), *(x.grad for x in leaves)]

    # (prime runs in any forward: an evaluation's no_grad, inference mode, a reference pass's)
    with torch.inference_mode(False), torch.enable_grad(), torch.autocast(device.type, enabled=False):  # fmt: skip
        try:
            got = run(expand=False)
        except (RuntimeError, ValueError):  # the kernel refuses mismatched head counts
            return False
        want = run(expand=True)
    return all(torch.allclose(a.float(), b.float(), rtol=0.05, atol=0.05) for a, b in zip(got, want, strict=True))  # fmt: skip


def _params(fn: Any) -> frozenset[str]:
    """The keyword names ``fn`` takes (read once, not in every layer's call)."""
    if fn not in _PARAMS:
        _PARAMS[fn] = frozenset(inspect.signature(fn).parameters)
    return _PARAMS[fn]


def _varlen_call(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu: torch.Tensor, max_len: int, scale: float | None) -> torch.Tensor:  # fmt: skip
    """q [T, H, D], k/v [T, Hkv, D] -> [T, H, D], causal within each document. The key/value
    heads go as they are where the kernel takes them (``prime`` found out), else repeated."""
    fn = _varlen()
    assert fn is not None
    if q.shape[1] != k.shape[1] and not _GQA.get(q.device, False):
        rep = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    return _call(fn, q, k, v, cu, max_len, scale)


def _call(fn: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu: torch.Tensor, max_len: int, scale: float | None) -> torch.Tensor:  # fmt: skip
    """``fn`` (a torch ``varlen_attn``), causal, in the keywords this torch's version takes."""
    params = _params(fn)
    kwargs: dict[str, Any] = {"scale": scale}
    if q.shape[1] != k.shape[1] and "enable_gqa" in params:
        kwargs["enable_gqa"] = True
    if "window_size" in params:
        kwargs["window_size"] = (-1, 0)
    else:
        kwargs["is_causal"] = True
    return fn(q, k, v, cu, cu, max_len, max_len, **kwargs)


def varlen_attention(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' attention interface: q [B, H, T, D], k/v [B, Hkv, T, D] -> [B, T, H, D]."""
    if not runs_varlen(query.device):  # transformers' own mask and SDPA
        return _sdpa(module, query, key, value, attention_mask, dropout, scaling, kwargs)
    cu = kwargs.get(CU_KEY)
    if cu is None:
        raise RuntimeError(f"{NAME} on CUDA needs {CU_KEY}: run the model through HFCausalLM")
    if dropout or query.dtype not in HALF or not _flash_capable(query.device):
        # the kernel takes neither dropout nor fp32, nor runs before Ampere: the same documents
        # as a dense mask
        mask = _dense_mask(cu, query.shape[0], query.shape[2])
        return _sdpa(module, query, key, value, mask, dropout, scaling, kwargs)
    b, h, t, d = query.shape
    q = query.transpose(1, 2).reshape(b * t, h, d)
    k = key.transpose(1, 2).reshape(b * t, key.shape[1], d)
    v = value.transpose(1, 2).reshape(b * t, value.shape[1], d)
    out = _varlen_call(q, k, v, cu, kwargs[MAX_KEY], scaling)
    return out.view(b, t, h, d), None


def _dense_mask(cu: torch.Tensor, batch: int, seq: int) -> torch.Tensor:
    """The block-diagonal causal mask [B, 1, T, T] (True: attend) of documents ``cu``."""
    flat = torch.arange(batch * seq, device=cu.device)
    doc = torch.searchsorted(cu[1:].to(flat.dtype), flat, right=True).view(batch, seq)
    causal = torch.ones(seq, seq, dtype=torch.bool, device=cu.device).tril()
    return ((doc[:, :, None] == doc[:, None, :]) & causal)[:, None]


def _sdpa(module: nn.Module, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, dropout: float, scaling: float | None, kwargs: dict[str, Any]) -> tuple[torch.Tensor, None]:  # fmt: skip
    from transformers.integrations.sdpa_attention import sdpa_attention_forward  # optional: hf

    kwargs = {k_: v_ for k_, v_ in kwargs.items() if k_ not in (CU_KEY, MAX_KEY)}
    return sdpa_attention_forward(module, q, k, v, mask, dropout=dropout, scaling=scaling, **kwargs)


def varlen_mask(*args: Any, device: torch.device | str = "cpu", **kwargs: Any) -> torch.Tensor | None:  # fmt: skip
    """transformers' mask interface: none on CUDA (documents come as ``doc_bounds``), else
    SDPA's own mask."""
    if runs_varlen(device):
        return None
    from transformers.masking_utils import sdpa_mask  # optional: transformers (the hf extra)

    return sdpa_mask(*args, device=device, **kwargs)


def register() -> None:
    """Make ``zerofit_varlen`` known to transformers (idempotent)."""
    from transformers import AttentionInterface  # optional: transformers (the hf extra)
    from transformers.masking_utils import AttentionMaskInterface  # optional: transformers

    AttentionInterface.register(NAME, varlen_attention)
    AttentionMaskInterface.register(NAME, varlen_mask)

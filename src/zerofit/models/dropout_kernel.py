"""LoRA dropout's keep mask on CUDA, drawn by one Triton kernel straight into the packed form that
``zerofit.models.lora_delta`` keeps for backward: ``keep_mask`` (imported there where Triton is
installed).

Compiled, ``torch.empty_like(x).bernoulli_(1 - p)`` draws one Philox4x32-10 call per element
(Inductor's ``tl.rand``: four 32-bit words computed, one used) and packs the booleans in a second
step. On an H100 at 8B QLoRA the kernels that draw masks took ~313 ms of a 2.85 s step (an upper
bound: they fuse other work; docs/benchmarks/2026-12-07-qlora-kernel-h100.md). Here one Philox
call gives 4 words, each two 16-bit draws: eight keep bits, one packed byte, so an eighth of the
Philox work and no separate packing.

Element ``8 i + j`` is kept when draw ``j`` of byte ``i`` (the low half of word ``j // 2`` for
even ``j``, the high half for odd) is at least ``round(p * 65536)``: it is dropped with
probability ``round(p * 65536) / 65536`` (0.0500031 for p = 0.05), within 8e-6 of ``p`` for any
``p``. The seed is a one-element tensor drawn from torch's generator, so ``torch.manual_seed``
and activation checkpointing's saved RNG state replay the same mask. tests/test_gpu_dropout.py
checks it on a GPU; tests/test_dropout_kernel.py runs it in Triton's CPU interpreter.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

# Packed bytes a Triton program draws, and its warps (not yet swept on a GPU)
BYTES_PER_PROGRAM = 1024
WARPS = 4
LEVELS = 65536  # 16-bit draws


@triton.jit
def _bits(word, threshold, shift: tl.constexpr):  # noqa: ANN001, ANN202
    """Two keep bits from one 32-bit word (its low and high 16-bit halves), at `shift`, `+ 1`."""
    low = ((word & 0xFFFF).to(tl.int32) >= threshold).to(tl.int32)
    high = ((word >> 16).to(tl.int32) >= threshold).to(tl.int32)
    return (low << shift) | (high << (shift + 1))


@triton.jit
def _draw(seed_ptr, out, n_bytes, threshold, BLOCK: tl.constexpr):  # noqa: ANN001, ANN202, N803
    """BLOCK packed bytes a program, one Philox call (four words, eight draws) a byte."""
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    seed = tl.load(seed_ptr)
    w0, w1, w2, w3 = tl.randint4x(seed, i)
    byte = _bits(w0, threshold, 0) | _bits(w1, threshold, 2)
    byte = byte | _bits(w2, threshold, 4) | _bits(w3, threshold, 6)
    tl.store(out + i, byte.to(tl.uint8), mask=i < n_bytes)


def threshold(p: float) -> int:
    """The 16-bit draw below which an element is dropped."""
    return round(p * LEVELS)


@torch.library.triton_op("zerofit::lora_keep_mask", mutates_args=())
def keep_mask(seed: torch.Tensor, numel: int, p: float) -> torch.Tensor:
    """uint8 [ceil(numel / 8)]: element i kept at bit i % 8 of byte i // 8 (``pack_mask``'s
    layout), each dropped with probability ~`p`; `seed`: an int64 tensor of one element on the
    device. A Triton op: a compiled graph launches the kernel itself (no Python call)."""
    return launch(seed, numel, p, BYTES_PER_PROGRAM, WARPS)


def launch(seed: torch.Tensor, numel: int, p: float, block: int, warps: int) -> torch.Tensor:
    """`keep_mask`'s kernel at `block` bytes and `warps` warps a program."""
    n_bytes = -(-numel // 8)
    if n_bytes >= 2**31:
        raise ValueError(f"a dropout mask of {numel} elements: want fewer than 2**34")
    out = torch.empty(n_bytes, dtype=torch.uint8, device=seed.device)
    torch.library.wrap_triton(_draw)[(triton.cdiv(n_bytes, block),)](
        seed, out, n_bytes, threshold(p), BLOCK=block, num_warps=warps
    )
    return out


def new_seed(device: torch.device) -> torch.Tensor:
    """A seed for `keep_mask` from torch's generator on `device` (replayed where its state is)."""
    return torch.randint(0, 2**62, (1,), device=device, dtype=torch.int64)

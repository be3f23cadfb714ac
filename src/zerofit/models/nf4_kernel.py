"""The NF4 rebuild on CUDA in one hand-written Triton kernel: ``rebuild_bf16`` (imported by
``zerofit.models.nf4`` where Triton is installed).

Compiled by Inductor for an H100, ``nf4.dequantize``'s torch ops ran as two kernels a weight: the
rebuild, then a ``view`` + ``_to_copy`` kernel whose 118 us for a 4096 x 14336 weight match an
fp32 copy read back and written in bf16 (10.5 bytes a weight moved where 2.5 suffice: 0.5 of
codes read, 2 of bf16 written). On CPU, Inductor writes the weights of the same ops in one
kernel (tests/test_nf4.py counts the kernels), so no CPU test sees it. Those kernels took about
a quarter of an 8B QLoRA step's device time (docs/benchmarks/2026-12-07-qlora-rebuild-h100.md).
This kernel reads each code byte once and writes its two weights as one 32-bit word.

The numbers are ``nf4.dequantize``'s, bit for bit (tests/test_gpu_nf4.py checks it on the GPU):
the block scale is ``bf16(bf16(scale / factor) + mean)`` with an IEEE division (``div_rn``; Triton's
plain ``/`` is approximate), each weight is its level (a bf16 value) times that scale, exact in
fp32, rounded once to bf16 (to nearest, ties to even, as torch casts). Every rounding is done on
the bits, as ``nf4._bf16`` does, so that it does not hang on how a conversion rounds: with
conversions, Triton's CPU interpreter (``TRITON_INTERPRET=1``) gave 16-54% of the weights one
bf16 step toward zero. tests/test_nf4_kernel_interpreted.py runs it there.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import triton
import triton.language as tl

BLOCK_BYTES = 32  # code bytes (64 weights) under one scale
# Program size: the fastest of 20 (8-128 scale blocks x 1-8 warps) rebuilding one 8B block's
# seven weights on an H100, 0.295 ms against 0.469 at 32 x 4 (benchmarks/nf4_formats.py's
# kernel_sweep; docs/benchmarks/data/2026-12-07-qlora-kernel-h100/call9/formats.json)
ROWS_PER_PROGRAM = 64  # scale blocks per Triton program (2,048 code bytes, 4,096 weights)
WARPS = 2  # warps per program


@triton.jit
def _nearest_bf16(x):  # noqa: ANN001, ANN202
    """fp32 `x` -> the int32 bits of the nearest bf16 (ties to even) as fp32, low half zero: done
    on the bits, as `nf4._bf16`, so that no conversion's rounding mode enters."""
    bits = x.to(tl.int32, bitcast=True)
    return (bits + 0x7FFF + ((bits >> 16) & 1)) & -65536


@triton.jit
def _rebuild(
    codes, scales, factors, mean, levels, out, n_blocks, ROWS: tl.constexpr, BLOCK: tl.constexpr
):  # noqa: ANN001, ANN202, N803
    """ROWS scale blocks a program, laid out [ROWS, BLOCK bytes]: each block's scale (an IEEE
    division and two roundings) is computed once and broadcast over its bytes; 256 scales share
    a factor (nf4.SCALER_BLOCK). Offsets are int32: the caller keeps a weight under 2**31 code
    bytes."""
    row = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    live = row < n_blocks
    scale = tl.load(scales + row, mask=live, other=0).to(tl.float32)
    factor = tl.load(factors + row // 256, mask=live, other=1.0).to(tl.float32)
    ratio = _nearest_bf16(tl.math.div_rn(scale, factor)).to(tl.float32, bitcast=True)
    per_block = _nearest_bf16(ratio + tl.load(mean).to(tl.float32)).to(tl.float32, bitcast=True)
    per_block = per_block[:, None]
    k = row[:, None] * BLOCK + tl.arange(0, BLOCK)[None, :]
    byte = tl.load(codes + k, mask=live[:, None], other=0).to(tl.int32)
    first = _nearest_bf16(tl.load(levels + (byte >> 4)) * per_block)  # high nibble first
    second = _nearest_bf16(tl.load(levels + (byte & 15)) * per_block)
    tl.store(out + k, ((first >> 16) & 0xFFFF) | second, mask=live[:, None])  # little-endian


_TABLES: dict[tuple[torch.device, tuple[float, ...]], torch.Tensor] = {}  # levels in fp32


@torch.library.custom_op("zerofit::nf4_rebuild_bf16", mutates_args=())
def rebuild_bf16(
    codes: torch.Tensor,
    scales: torch.Tensor,
    factors: torch.Tensor,
    mean: torch.Tensor,
    levels: Sequence[float],
    backward: bool,
) -> torch.Tensor:
    """The flat bf16 weight that NF4 pieces (as stored or as bytes) on a CUDA device hold;
    `levels`: the 16 NF4 levels (each read in bf16). Opaque to torch.compile: it runs as it is.

    `backward` (the kernel ignores it) tells the backward's rebuild from the forward's. Without
    it the compiler merges the two identical calls into one node (common subexpressions), and
    since it may not recompute an opaque op, it keeps that node's bf16 weight from forward to
    backward: 2 bytes a weight of every 4-bit layer held (an 8B QLoRA run out of memory on an
    H200 at 23 GiB, docs/benchmarks/2026-12-07-qlora-kernel-h200.md)."""
    return launch(codes, scales, factors, mean, levels, ROWS_PER_PROGRAM, WARPS)


def launch(
    codes: torch.Tensor,
    scales: torch.Tensor,
    factors: torch.Tensor,
    mean: torch.Tensor,
    levels: Sequence[float],
    rows: int,
    warps: int,
) -> torch.Tensor:
    """`rebuild_bf16`'s kernel at `rows` scale blocks and `warps` warps a program
    (benchmarks/nf4_formats.py sweeps them; ROWS_PER_PROGRAM and WARPS are what it chose)."""
    key = (codes.device, tuple(levels))
    if key not in _TABLES:
        _TABLES[key] = torch.tensor(levels, dtype=torch.bfloat16, device=codes.device).float()
    code_bytes = codes.contiguous().view(torch.uint8)
    n_bytes = code_bytes.numel()
    if n_bytes % BLOCK_BYTES or n_bytes >= 2**31:
        raise ValueError(
            f"NF4 codes of {n_bytes} bytes: want a multiple of {BLOCK_BYTES} under 2**31"
        )
    n_blocks = n_bytes // BLOCK_BYTES
    out = torch.empty(2 * n_bytes, dtype=torch.bfloat16, device=codes.device)
    _rebuild[(triton.cdiv(n_blocks, rows),)](
        code_bytes,
        scales.contiguous().view(torch.int8),
        factors.contiguous(),
        mean,
        _TABLES[key],
        out.view(torch.int32),
        n_blocks,
        ROWS=rows,
        BLOCK=BLOCK_BYTES,
        num_warps=warps,
    )
    return out


@rebuild_bf16.register_fake
def _(
    codes: torch.Tensor,
    scales: torch.Tensor,
    factors: torch.Tensor,
    mean: torch.Tensor,
    levels: Sequence[float],
    backward: bool,
) -> torch.Tensor:
    n_bytes = codes.numel() * codes.element_size()
    return codes.new_empty(2 * n_bytes, dtype=torch.bfloat16)

"""QLoRA's frozen base: linear weights stored in 4-bit NormalFloat (NF4), double-quantised.

The numbers are torchao's NF4 (`torchao.quantization.to_nf4`, the format torchtune trains QLoRA
with): blocks of 64 weights share one absmax scale; the scales, less their mean, are themselves
quantised to int8 in blocks of 256 with one bf16 factor each. A weight of N elements is then
N/2 bytes of codes (two 4-bit indices into the 16 NF4 levels per byte), N/64 int8 scales and
N/16384 factors: 0.516 bytes per weight, against 2 in bf16.

zerofit keeps those four pieces as plain tensors (``NF4Weight``: ``codes``, ``scales``, ``factors``
and ``mean``), not as torchao's tensor subclass, so that every engine treats them as ordinary
frozen parameters: FSDP2 shards them over the ranks and all-gathers them in their 4-bit form (0.5
bytes per weight on the wire), checkpoints save and load them, and a run resumes on another engine
or world size like any other. All four are stored as bf16 words: the codes' and scales' bytes
viewed two to a bf16 (``STORAGE``), the factors and mean as the bf16 values they are. That is
bitsandbytes' "quant_storage" idea (FSDP shards a 4-bit weight stored in a float dtype) with
torchao's numbers, and it is needed: FSDP2 before torch 2.12 cannot hold an integer parameter
(it makes every sharded parameter require grad). Nothing may convert the words (a cast would
change the bits): the engines store frozen weights in the compute dtype except these, FSDP2 does
not cast a parameter already in its ``param_dtype``, and an fp32 run shards without a cast at
all; fp16 compute is refused (it would cast them). ``dequantize`` rebuilds the weight, bit for bit
what torchao's ``get_original_weight`` gives (tests/test_nf4.py), in plain torch ops that
``torch.compile`` fuses; on CUDA in bf16, once ``USE_KERNEL`` is on, in one Triton kernel
(``zerofit.models.nf4_kernel``).

``nf4_linear`` computes ``x @ W.T`` with W rebuilt in the input's dtype (autocast's, under
autocast) in forward and again in backward (nothing of W's size is kept between them), and gives
no gradient to the base.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from zerofit.errors import UserError
from zerofit.models.autocast import linear_inputs

try:
    from zerofit.models.nf4_kernel import rebuild_bf16  # optional: Triton (CUDA builds of torch)
except ImportError:  # no Triton: the torch ops below everywhere
    rebuild_bf16 = None
# The bf16 rebuild on CUDA goes through nf4_kernel's Triton kernel: tests/test_gpu_nf4.py passed
# on an H100 (its bits are the torch ops' and torchao's; a compiled layer keeps no rebuilt weight
# for backward) and an 8B QLoRA step ran 1.093x the torch ops' at the same peak memory
# (docs/benchmarks/2026-12-07-qlora-kernel-h100.md). False: the torch ops everywhere.
USE_KERNEL = True
KERNEL_DEVICES = ("cuda",)  # where the kernel runs (a CPU test puts a stand-in op there)

BLOCK = 64  # weights per absmax scale
SCALER_BLOCK = 256  # scales per int8 factor
QUANTUM = BLOCK * SCALER_BLOCK  # a weight's element count must be a multiple of this
PIECES = ("codes", "scales", "factors", "mean")
STORAGE = torch.bfloat16  # every piece's dtype: the codes' and scales' bytes two to a word
BITS = {"codes": torch.uint8, "scales": torch.int8}  # what those words hold
# torchao's 16 NF4 levels (QLoRA's quantiles of N(0, 1), scaled to [-1, 1]), read in bf16
LEVELS = (
    -1.0, -0.6962, -0.5251, -0.3949, -0.2844, -0.1848, -0.0911, 0.0,
    0.0796, 0.1609, 0.2461, 0.3379, 0.4407, 0.5626, 0.7230, 1.0,
)  # fmt: skip


def quantizable(shape: tuple[int, ...] | torch.Size) -> bool:
    """Whether a weight of `shape` can be stored in NF4 (2-D, its size a multiple of 16384)."""
    return len(shape) == 2 and math.prod(shape) % QUANTUM == 0


def piece_shapes(shape: tuple[int, ...] | torch.Size) -> dict[str, tuple[int, ...]]:
    """Each piece's shape in bf16 words: N/2 code bytes and N/64 scale bytes, two to a word."""
    n = math.prod(shape)
    return {"codes": (n // 4,), "scales": (n // 128,), "factors": (n // QUANTUM,), "mean": (1,)}


def piece_dtypes() -> dict[str, torch.dtype]:
    return dict.fromkeys(PIECES, STORAGE)


def as_words(pieces: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Pieces as stored: codes (uint8) and scales (int8) viewed as bf16 words."""
    return {n: t.view(STORAGE) if n in BITS else t.to(STORAGE) for n, t in pieces.items()}


def as_bits(pieces: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Stored pieces with the codes and scales viewed back as their bytes (as given if already)."""
    return {n: t.view(BITS[n]) if n in BITS else t for n, t in pieces.items()}


@torch.no_grad()
def quantize(weight: torch.Tensor) -> dict[str, torch.Tensor]:
    """The NF4 pieces of a 2-D weight as stored (bf16 words), quantised from its bf16 value by
    torchao."""
    try:
        from torchao.quantization import to_nf4  # optional dependency (the `qlora` extra)
    except ImportError:
        raise UserError(
            "model.lora.quantize: nf4 quantises with torchao, which is not installed here: "
            "pip install 'zerofit[qlora]'"
        ) from None
    q = to_nf4(weight.detach().to(torch.bfloat16).contiguous(), BLOCK, SCALER_BLOCK)
    return as_words(
        {
            "codes": q.quantized_data.reshape(-1).contiguous(),
            "scales": q.quantized_scalers.reshape(-1).contiguous(),
            "factors": q.quantization_factor.reshape(-1),
            "mean": q.scaler_mean.reshape(1),
        }
    )


def _bf16(x: torch.Tensor) -> torch.Tensor:
    """Finite fp32 `x` rounded to the nearest bf16 (ties to even), kept in fp32: an eager bf16
    operation's result. Done on the bits: ``torch.compile`` drops a ``.to(bf16).float()`` pair
    inside a fused kernel, and the weights would then differ from torchao's in the last bit."""
    bits = x.view(torch.int32)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & -65536  # add half an ulp (ties to even), cut
    return bits.view(torch.float32)


def dequantize(
    pieces: dict[str, torch.Tensor],
    shape: tuple[int, ...] | torch.Size,
    dtype: torch.dtype,
    backward: bool = False,
) -> torch.Tensor:
    """The weight the pieces (stored or as bytes) hold, in `dtype` (its bf16 value, then cast).

    torchao's bf16 steps (scale / factor, + mean, level x scale), each in fp32 and rounded to bf16
    as eager bf16 arithmetic does: the same bits eager and compiled. `backward`: the rebuild is
    a backward's (see ``nf4_kernel.rebuild_bf16``)."""
    kernel = rebuild_bf16 if USE_KERNEL else None
    on = pieces["codes"].device.type in KERNEL_DEVICES
    if kernel is not None and dtype == torch.bfloat16 and on:
        words = (pieces[n] for n in PIECES)  # one kernel: 2.5 bytes a weight (nf4_kernel)
        return kernel(*words, LEVELS, backward).view(shape)
    bits = as_bits(pieces)
    codes, scales = bits["codes"], bits["scales"]
    factors = bits["factors"].float().unsqueeze(-1)
    ratio = _bf16(scales.view(-1, SCALER_BLOCK).float() / factors).flatten()
    per_block = _bf16(ratio + bits["mean"].float()).unsqueeze(-1)
    pairs = _pair_table(codes.device)[codes.long()]  # a byte's two levels, in order: [N/2, 2]
    out = pairs.view(-1, BLOCK) * per_block  # exact in fp32 (8-bit mantissas), rounded below
    if dtype == torch.bfloat16:  # a cast rounds to nearest even: one fused kernel, 2.5 B a weight
        return out.reshape(shape).to(dtype)
    return _bf16(out).reshape(shape).to(dtype)  # the bf16 value, then cast


def _pair_table(device: torch.device) -> torch.Tensor:
    """[256, 2] fp32: the two NF4 levels (high nibble first) that each code byte holds, read in
    bf16 as torchao reads them. One gather per byte instead of one per nibble and a stack."""
    levels = torch.tensor(LEVELS, dtype=torch.bfloat16, device=device).float()
    byte = torch.arange(256, device=device)
    return torch.stack([levels[byte >> 4], levels[byte & 0x0F]], dim=-1)


class NF4Weight(nn.Module):
    """A frozen linear weight of `shape` [out, in] in NF4 (four frozen parameters)."""

    def __init__(self, shape: tuple[int, int], device: torch.device | str | None = None) -> None:
        super().__init__()
        self.shape = tuple(shape)
        dtypes = piece_dtypes()
        for name, size in piece_shapes(shape).items():
            empty = torch.empty(size, dtype=dtypes[name], device=device)
            self.register_parameter(name, nn.Parameter(empty, requires_grad=False))

    def pieces(self) -> dict[str, torch.Tensor]:
        return {name: getattr(self, name) for name in PIECES}

    def weight(self, dtype: torch.dtype) -> torch.Tensor:
        return dequantize(self.pieces(), self.shape, dtype)

    def extra_repr(self) -> str:
        return f"shape={list(self.shape)}, nf4 (block {BLOCK}, double-quantised scales)"


def weight_count(module: nn.Module) -> int:
    """The parameters `module` holds, counting a weight stored in NF4 by its elements (the model's
    parameter count), not by its storage's."""
    plain = sum(p.numel() for n, p in module.named_parameters() if piece_of(n) is None)
    return plain + sum(math.prod(m.shape) for m in module.modules() if isinstance(m, NF4Weight))


def local_device() -> torch.device:
    """Where a rank quantises: its GPU where there is one (the current CUDA device), else CPU."""
    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")


class _NF4Linear(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx, x: torch.Tensor, shape: tuple[int, int], *pieces: torch.Tensor
    ) -> torch.Tensor:  # type: ignore[override]  # noqa: ANN001
        ctx.shape = shape
        ctx.save_for_backward(*pieces)
        return F.linear(x, dequantize(dict(zip(PIECES, pieces, strict=True)), shape, x.dtype))

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:  # type: ignore[override]  # noqa: ANN001
        pieces = dict(zip(PIECES, ctx.saved_tensors, strict=True))
        w = dequantize(pieces, ctx.shape, grad.dtype, backward=True)
        return (grad @ w, None, *(None for _ in PIECES))


def nf4_linear(
    x: torch.Tensor, weight: NF4Weight, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """``x @ W.T (+ bias)`` for the NF4 weight W; gradients flow to `x` (and `bias`) only.

    Under autocast (DDP's mixed precision) `x` and `bias` are cast to its dtype first, as
    ``F.linear`` would cast them, so that W is rebuilt in that dtype at once: rebuilt in an fp32
    input's dtype, autocast would cast all of it again, 4 bytes a weight written and read more."""
    x, bias = linear_inputs(x, bias)
    out = _NF4Linear.apply(x, weight.shape, *(weight.pieces()[n] for n in PIECES))
    return out if bias is None else out + bias


def piece_of(name: str) -> tuple[str, str] | None:
    """``("<layer>.weight", piece)`` for a parameter name ``<layer>.nf4.<piece>``, else None."""
    parts = name.rsplit(".", 2)
    if len(parts) == 3 and parts[1] == "nf4" and parts[2] in PIECES:
        return f"{parts[0]}.weight", parts[2]
    return None


class QuantizedSource:
    """The NF4 pieces of the layers in `shapes` ({``<layer>.weight``: shape}), quantised from the
    value ``source(weight_name, shape)`` gives (read from disk, or the name-seeded init). A layer
    is quantised once, when its first piece is asked for, and kept until another layer's is.

    In a process group of several ranks each layer has one owner (layer i: rank i mod world), which
    alone reads and quantises it and broadcasts its pieces (0.52 bytes a weight); every rank asks
    for the layers in the same order (they materialise the same model). So the ranks share the
    reading and the quantising, and none holds more than one layer's full weight."""

    def __init__(
        self,
        source: Callable[[str, tuple[int, ...]], torch.Tensor],
        shapes: dict[str, tuple[int, ...]],
    ) -> None:
        self.source, self.shapes = source, shapes
        self.order = {name: i for i, name in enumerate(shapes)}
        self.last: tuple[str, dict[str, torch.Tensor]] | None = None

    def __call__(self, name: str) -> torch.Tensor | None:
        found = piece_of(name)
        if found is None or found[0] not in self.shapes:
            return None
        weight_name, piece = found
        if self.last is None or self.last[0] != weight_name:
            self.last = (weight_name, self._pieces(weight_name))
        return self.last[1][piece]

    def _pieces(self, weight_name: str) -> dict[str, torch.Tensor]:
        shape = self.shapes[weight_name]
        dist = torch.distributed
        world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
        if world == 1:
            return quantize(self.source(weight_name, shape))
        owner = self.order[weight_name] % world
        if dist.get_rank() == owner:
            pieces = quantize(self.source(weight_name, shape))
        else:
            dtypes = piece_dtypes()
            pieces = {
                n: torch.empty(size, dtype=dtypes[n], device=local_device())
                for n, size in piece_shapes(shape).items()
            }
        for n in PIECES:
            dist.broadcast(pieces[n], src=owner)
        return pieces

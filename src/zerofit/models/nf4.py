"""QLoRA's frozen base: linear weights stored in 4-bit NormalFloat (NF4), double-quantised.

The numbers are torchao's NF4 (`torchao.quantization.to_nf4`, the format torchtune trains QLoRA
with): blocks of 64 weights share one absmax scale; the scales, less their mean, are themselves
quantised to int8 in blocks of 256 with one bf16 factor each. A weight of N elements is then
N/2 bytes of codes (two 4-bit indices into the 16 NF4 levels per byte), N/64 int8 scales and
N/16384 factors: 0.516 bytes per weight, against 2 in bf16.

zerofit keeps those four pieces as plain tensors (``NF4Weight``: ``codes`` uint8, ``scales`` int8,
``factors`` and ``mean`` bf16), not as torchao's tensor subclass, so that every engine treats them
as ordinary frozen parameters: FSDP2 shards them over the ranks and all-gathers them in their
4-bit form (0.5 bytes per weight on the wire; non-float parameters are never cast), checkpoints
save and load them, and a run resumes on another engine or world size like any other. This is
bitsandbytes' "quant_storage" idea (FSDP shards a 4-bit weight stored in an ordinary dtype) with
torchao's numbers. ``dequantize`` rebuilds the weight, bit for bit what torchao's
``get_original_weight`` gives (tests/test_nf4.py), in plain torch ops that ``torch.compile`` fuses.

``nf4_linear`` computes ``x @ W.T`` with W rebuilt in the input's dtype in forward and again in
backward (nothing of W's size is kept between them), and gives no gradient to the base.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from zerofit.errors import UserError

BLOCK = 64  # weights per absmax scale
SCALER_BLOCK = 256  # scales per int8 factor
QUANTUM = BLOCK * SCALER_BLOCK  # a weight's element count must be a multiple of this
PIECES = ("codes", "scales", "factors", "mean")
# torchao's 16 NF4 levels (QLoRA's quantiles of N(0, 1), scaled to [-1, 1]), read in bf16
LEVELS = (
    -1.0, -0.6962, -0.5251, -0.3949, -0.2844, -0.1848, -0.0911, 0.0,
    0.0796, 0.1609, 0.2461, 0.3379, 0.4407, 0.5626, 0.7230, 1.0,
)  # fmt: skip


def quantizable(shape: tuple[int, ...] | torch.Size) -> bool:
    """Whether a weight of `shape` can be stored in NF4 (2-D, its size a multiple of 16384)."""
    return len(shape) == 2 and math.prod(shape) % QUANTUM == 0


def piece_shapes(shape: tuple[int, ...] | torch.Size) -> dict[str, tuple[int, ...]]:
    n = math.prod(shape)
    return {"codes": (n // 2,), "scales": (n // BLOCK,), "factors": (n // QUANTUM,), "mean": (1,)}


def piece_dtypes() -> dict[str, torch.dtype]:
    return {
        "codes": torch.uint8,
        "scales": torch.int8,
        "factors": torch.bfloat16,
        "mean": torch.bfloat16,
    }


@torch.no_grad()
def quantize(weight: torch.Tensor) -> dict[str, torch.Tensor]:
    """The NF4 pieces of a 2-D weight, quantised from its bf16 value by torchao."""
    try:
        from torchao.quantization import to_nf4  # optional dependency (the `qlora` extra)
    except ImportError:
        raise UserError(
            "model.lora.quantize: nf4 quantises with torchao, which is not installed here: "
            "pip install 'zerofit[qlora]'"
        ) from None
    q = to_nf4(weight.detach().to(torch.bfloat16).contiguous(), BLOCK, SCALER_BLOCK)
    return {
        "codes": q.quantized_data.reshape(-1),
        "scales": q.quantized_scalers.reshape(-1),
        "factors": q.quantization_factor.reshape(-1).to(torch.bfloat16),
        "mean": q.scaler_mean.reshape(1).to(torch.bfloat16),
    }


def dequantize(
    pieces: dict[str, torch.Tensor], shape: tuple[int, ...] | torch.Size, dtype: torch.dtype
) -> torch.Tensor:
    """The weight the pieces hold, in `dtype` (its bf16 value, then cast)."""
    codes, scales = pieces["codes"], pieces["scales"]
    factors = pieces["factors"].to(torch.bfloat16)
    mean = pieces["mean"].to(torch.bfloat16)
    levels = torch.tensor(LEVELS, dtype=torch.bfloat16, device=codes.device)
    block_scale = (scales.view(-1, SCALER_BLOCK) / factors.unsqueeze(-1)).flatten() + mean
    high = levels[(codes >> 4).long()].view(-1, BLOCK // 2)
    low = levels[(codes & 0x0F).long()].view(-1, BLOCK // 2)
    per_block = block_scale.unsqueeze(-1)
    out = torch.stack([high * per_block, low * per_block], dim=-1)  # codes hold pairs in order
    return out.reshape(shape).to(dtype)


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
        w = dequantize(pieces, ctx.shape, grad.dtype)
        return (grad @ w, None, *(None for _ in PIECES))


def nf4_linear(
    x: torch.Tensor, weight: NF4Weight, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """``x @ W.T (+ bias)`` for the NF4 weight W; gradients flow to `x` (and `bias`) only."""
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

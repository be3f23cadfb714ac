"""A compiled 4-bit linear keeps nothing of its rebuilt weight's size for backward, whether the
weight is rebuilt by the torch ops or by an opaque op (the Triton kernel on CUDA; here a CPU
stand-in of its signature, `backward` given a default so that the old call still reaches it).
The compiler merges two identical calls of an opaque op into one and may not recompute it: the
backward's rebuild must be a call of its own, or the bf16 weight of every 4-bit layer is held
from forward to backward (an 8B QLoRA run out of memory on an H200)."""

from __future__ import annotations

import pytest
import torch
from compiled_saved import kept_for_backward
from conftest import nf4_layer

from zerofit.models import nf4

SHAPE = (256, 128)


@torch.library.custom_op("zerofit_test::nf4_rebuild_stand_in", mutates_args=())
def stand_in(
    codes: torch.Tensor,
    scales: torch.Tensor,
    factors: torch.Tensor,
    mean: torch.Tensor,
    levels: list[float],
    backward: bool = False,
) -> torch.Tensor:
    """nf4_kernel.rebuild_bf16's contract on CPU: the flat bf16 weight, by the torch ops."""
    pieces = {"codes": codes, "scales": scales, "factors": factors, "mean": mean}
    count = 2 * codes.numel() * codes.element_size()
    return nf4.dequantize(pieces, (count,), torch.float32).to(torch.bfloat16)


@stand_in.register_fake
def _(codes, scales, factors, mean, levels, backward=False):  # noqa: ANN001, ANN202
    return codes.new_empty(2 * codes.numel() * codes.element_size(), dtype=torch.bfloat16)


def _layer() -> nf4.NF4Weight:
    pytest.importorskip("torchao.quantization")
    weight = torch.randn(SHAPE, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    return nf4_layer(weight)


@pytest.mark.parametrize("opaque", [False, True], ids=["torch-ops", "opaque-op"])
def test_a_compiled_4bit_linear_keeps_no_rebuilt_weight(
    opaque: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = _layer()
    if opaque:
        monkeypatch.setattr(nf4, "rebuild_bf16", stand_in)
        monkeypatch.setattr(nf4, "USE_KERNEL", True)
        monkeypatch.setattr(nf4, "KERNEL_DEVICES", ("cpu",))
    x = torch.randn(2, 8, SHAPE[1], dtype=torch.bfloat16, requires_grad=True)
    kept = kept_for_backward(lambda x: nf4.nf4_linear(x, store), x)
    assert kept, "nothing kept: the capture did not see the forward graph"
    biggest = max(t.numel() for t in kept)
    assert biggest < SHAPE[0] * SHAPE[1], [(tuple(t.shape), t.dtype) for t in kept]


def test_the_stand_in_takes_the_kernels_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """The opaque case above runs the kernel's branch of dequantize (its calls counted), and gives
    the torch ops' weight."""
    store = _layer()
    calls: list[bool] = []

    def counted(*args: object) -> torch.Tensor:
        calls.append(bool(args[-1]))
        return stand_in(*args)

    monkeypatch.setattr(nf4, "rebuild_bf16", counted)
    monkeypatch.setattr(nf4, "USE_KERNEL", True)
    monkeypatch.setattr(nf4, "KERNEL_DEVICES", ("cpu",))
    x = torch.randn(3, SHAPE[1], dtype=torch.bfloat16, requires_grad=True)
    out = nf4.nf4_linear(x, store)
    out.float().sum().backward()
    assert calls == [False, True]
    monkeypatch.setattr(nf4, "USE_KERNEL", False)
    assert torch.equal(out, nf4.nf4_linear(x.detach(), store))

"""The NF4 rebuild's Triton kernel (``zerofit.models.nf4_kernel``) against the torch ops it
replaces on CUDA: the same bits, eager and inside a compiled block, and torchao's weight.

Marked `gpu` (tests/conftest.py skips them without CUDA); skipped too without Triton or torchao.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from conftest import nf4_layer

pytestmark = pytest.mark.gpu

SRC = str(Path(__file__).resolve().parents[1] / "src")
if SRC not in sys.path:
    sys.path.insert(0, SRC)


def _weight(shape: tuple[int, int], seed: int):  # noqa: ANN202
    import torch

    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(shape, generator=gen) * torch.logspace(-4, 1, shape[1])  # wide scales
    w[0, :64] = 0.0  # an all-zero block (scale 0)
    return w.to(torch.bfloat16)


@pytest.mark.parametrize("shape", [(128, 128), (1024, 4096), (4096, 1536)])
def test_the_kernel_rebuilds_the_torch_ops_bits(
    shape: tuple[int, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch

    torchao = pytest.importorskip("torchao.quantization")
    from zerofit.models import nf4

    if nf4.rebuild_bf16 is None:
        pytest.skip("no Triton here")
    monkeypatch.setattr(nf4, "USE_KERNEL", True)  # the test that decides whether it may be on
    stored = nf4.quantize(_weight(shape, seed=shape[0]).cuda())
    got = nf4.dequantize(stored, shape, torch.bfloat16)
    assert got.dtype == torch.bfloat16 and got.shape == shape and got.is_cuda
    on_cpu = {n: t.cpu() for n, t in stored.items()}
    want = nf4.dequantize(on_cpu, shape, torch.bfloat16)  # the torch ops (CPU: no kernel)
    assert torch.equal(got.cpu(), want)
    ao = torchao.to_nf4(_weight(shape, seed=shape[0]).cuda(), nf4.BLOCK, nf4.SCALER_BLOCK)
    assert torch.equal(got, ao.get_original_weight().to(torch.bfloat16))


def test_a_compiled_4bit_linear_runs_the_kernel_and_matches_eager(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Inside torch.compile the kernel is an opaque op: forward and the input's gradient match
    eager bit for bit."""
    import torch

    pytest.importorskip("torchao.quantization")
    from zerofit.models import nf4

    if nf4.rebuild_bf16 is None:
        pytest.skip("no Triton here")
    monkeypatch.setattr(nf4, "USE_KERNEL", True)  # the test that decides whether it may be on
    store = nf4_layer(_weight((512, 256), seed=5).cuda())
    x = torch.randn(4, 33, 256, device="cuda", dtype=torch.bfloat16)
    results = []
    for fn in (nf4.nf4_linear, torch.compile(nf4.nf4_linear, fullgraph=True)):
        xi = x.clone().requires_grad_()
        out = fn(xi, store)
        out.float().square().sum().backward()
        results.append((out, xi.grad))
    (out_e, grad_e), (out_c, grad_c) = results
    assert torch.equal(out_e, out_c) and torch.equal(grad_e, grad_c)


def test_a_compiled_4bit_linear_with_the_kernel_keeps_no_rebuilt_weight(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The forward's and the backward's kernel calls stay two calls under torch.compile: the bf16
    weight is rebuilt in backward, not kept from forward (tests/test_nf4_kept.py on CPU)."""
    import torch
    from compiled_saved import kept_for_backward

    pytest.importorskip("torchao.quantization")
    from zerofit.models import nf4

    if nf4.rebuild_bf16 is None:
        pytest.skip("no Triton here")
    monkeypatch.setattr(nf4, "USE_KERNEL", True)  # the test that decides whether it may be on
    shape = (1024, 512)
    store = nf4_layer(_weight(shape, seed=7).cuda())
    x = torch.randn(2, 16, 512, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    kept = kept_for_backward(lambda x: nf4.nf4_linear(x, store), x)
    assert kept and max(t.numel() for t in kept) < shape[0] * shape[1], kept

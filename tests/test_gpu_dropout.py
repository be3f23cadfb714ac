"""LoRA dropout's keep mask drawn by the Triton kernel (``zerofit.models.dropout_kernel``) on
CUDA: the keep rate and its bits, the same mask replayed by a compiled block under activation
checkpointing (its time against ``bernoulli_`` + packing: benchmarks/dropout_mask.py).

Marked `gpu` (tests/conftest.py skips them without CUDA); skipped too without Triton. The test
that decides whether ``lora_delta.USE_MASK_KERNEL`` may be on.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

SRC = str(Path(__file__).resolve().parents[1] / "src")
if SRC not in sys.path:
    sys.path.insert(0, SRC)


def _kernel():  # noqa: ANN202
    from zerofit.models import lora_delta

    if lora_delta.keep_mask is None:
        pytest.skip("no Triton here")
    return lora_delta


@pytest.mark.parametrize("p", [0.05, 0.1, 0.5])
def test_the_kernel_keeps_each_element_with_probability_1_minus_p(p: float) -> None:
    import torch

    ld = _kernel()
    n = 50_000_001
    torch.manual_seed(0)
    packed = ld.keep_mask(ld.new_seed(torch.device("cuda")), n, p)
    assert packed.dtype == torch.uint8 and packed.numel() == 6_250_001 and packed.is_cuda
    bits = ((packed[:, None] >> torch.arange(8, dtype=torch.uint8, device="cuda")) & 1).float()
    want = 1 - round(p * 65536) / 65536
    sd = (want * (1 - want) / n) ** 0.5
    keep = ld.unpack_mask(packed, torch.empty(n, device="cuda")).float().mean().item()
    assert abs(keep - want) < 5 * sd, (keep, want)
    per_bit = bits.mean(0)
    assert (per_bit - want).abs().max().item() < 5 * 8**0.5 * sd, per_bit
    torch.manual_seed(0)
    assert torch.equal(ld.keep_mask(ld.new_seed(torch.device("cuda")), n, p), packed)


def test_a_compiled_checkpointed_update_replays_the_kernels_mask(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A compiled function holding the update, under activation checkpointing, against the same
    without checkpointing from the same seed: the same loss and gradients (bf16), so the
    recomputation drew the same mask."""
    import torch
    from torch.utils.checkpoint import checkpoint

    ld = _kernel()
    monkeypatch.setattr(ld, "USE_MASK_KERNEL", True)

    def block(x, a, b):  # noqa: ANN001, ANN202
        return torch.nn.functional.silu(ld.lora_delta(x, a, b, 0.1, 2.0))

    compiled = torch.compile(block, fullgraph=True)
    runs = []
    for recompute in (False, True):
        gen = torch.Generator().manual_seed(1)
        x, a, b = (
            (torch.randn(*s, generator=gen) / 4).cuda().bfloat16().requires_grad_()
            for s in ((2, 512, 256), (16, 256), (256, 16))
        )
        torch.manual_seed(5)
        run = (lambda *t: checkpoint(compiled, *t, use_reentrant=False)) if recompute else compiled
        out = run(x, a, b)
        out.float().square().sum().backward()
        runs.append([out.detach(), x.grad, a.grad, b.grad])
    for got, want in zip(runs[1], runs[0], strict=True):
        assert torch.equal(got, want)

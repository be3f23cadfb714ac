"""LoRA dropout's packed keep mask drawn by a kernel (``zerofit.models.dropout_kernel``, used by
``zerofit.models.lora_delta`` where ``USE_MASK_KERNEL`` is on and the device is one of
``MASK_DEVICES``).

On CPU the Triton kernel runs only in Triton's interpreter (``TRITON_INTERPRET=1``, skipped where
Triton is not installed: a CPU build of torch does not bring it). The way ``lora_delta`` uses the
kernel's packed bytes is checked on CPU with a stand-in op of the same contract (a uint8 mask,
eight to a byte, a function of a seed drawn from torch's generator): forward and backward drop
the same elements, the seed comes from torch's generator (so ``manual_seed`` replays a run), and
activation checkpointing's recomputation draws the same mask. tests/test_gpu_dropout.py checks
the kernel itself on a GPU.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch.utils.checkpoint import checkpoint

from zerofit.models import lora_delta as ld

SRC = Path(__file__).resolve().parents[1] / "src"


def _stand_in(calls: list[int]):  # noqa: ANN202
    """A keep-mask op of the kernel's contract: bytes a function of the seed's value."""

    def keep_mask(seed: torch.Tensor, numel: int, p: float) -> torch.Tensor:
        calls.append(int(seed))
        gen = torch.Generator().manual_seed(int(seed) % 2**63)
        mask = torch.rand(numel, generator=gen) >= p
        return ld.pack_mask(mask)

    return keep_mask


@pytest.fixture
def kernel_on_cpu(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []
    monkeypatch.setattr(ld, "USE_MASK_KERNEL", True)
    monkeypatch.setattr(ld, "MASK_DEVICES", ("cpu",))
    monkeypatch.setattr(ld, "keep_mask", _stand_in(calls))
    monkeypatch.setattr(
        ld, "new_seed", lambda device: torch.randint(0, 2**62, (1,), dtype=torch.int64)
    )
    return calls


def _leaves(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(3, 37, 16, generator=gen)  # 1,776 elements: not a multiple of 8 a row
    a = torch.randn(4, 16, generator=gen) / 4
    b = torch.randn(5, 4, generator=gen) / 2
    return x.requires_grad_(), a.requires_grad_(), b.requires_grad_()


def test_the_kernels_mask_is_the_one_dropped_forward_and_backward(kernel_on_cpu: list[int]) -> None:
    """The update and every gradient are those of dropping exactly the elements whose bit the
    op left 0, scaled by 1 / (1 - p); the op was called once, with a seed from torch's
    generator."""
    p, scale = 0.3, 2.0
    x, a, b = _leaves()
    torch.manual_seed(7)
    out = ld.lora_delta(x, a, b, p, scale)
    out.square().sum().backward()
    assert len(kernel_on_cpu) == 1
    mask = ld.unpack_mask(_stand_in([])(torch.tensor(kernel_on_cpu[0]), x.numel(), p), x)
    assert 0.6 < mask.float().mean() < 0.8
    x2, a2, b2 = (t.detach().clone().requires_grad_() for t in (x, a, b))
    want = (x2 * mask / (1 - p)) @ a2.T @ b2.T * scale
    want.square().sum().backward()
    torch.testing.assert_close(out, want)
    for got, ref in ((x.grad, x2.grad), (a.grad, a2.grad), (b.grad, b2.grad)):
        torch.testing.assert_close(got, ref)
    torch.manual_seed(7)
    again = ld.lora_delta(x.detach(), a.detach(), b.detach(), p, scale)
    assert kernel_on_cpu[1] == kernel_on_cpu[0] and torch.equal(again, out.detach())


def test_recomputation_draws_the_same_mask(kernel_on_cpu: list[int]) -> None:
    """Under activation checkpointing the forward runs again in backward: it must drop the same
    elements (the checkpoint restores torch's generator, from which the seed is drawn), so the
    gradients are those of the run without it."""
    p = 0.25
    grads = []
    for recompute in (False, True):
        x, a, b = _leaves(1)
        torch.manual_seed(11)
        if recompute:
            out = checkpoint(ld.lora_delta, x, a, b, p, 1.5, use_reentrant=False)
        else:
            out = ld.lora_delta(x, a, b, p, 1.5)
        out.square().sum().backward()
        grads.append([x.grad, a.grad, b.grad])
    assert len(kernel_on_cpu) == 3 and len(set(kernel_on_cpu)) == 1  # plain, forward, recompute
    for got, want in zip(grads[1], grads[0], strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_off_or_elsewhere_bernoulli_draws_it(kernel_on_cpu: list[int], monkeypatch) -> None:  # noqa: ANN001
    x, a, b = _leaves()
    ld.lora_delta(x, a, b, 0.0, 1.0)  # nothing dropped: no mask at all
    monkeypatch.setattr(ld, "MASK_DEVICES", ("cuda",))
    ld.lora_delta(x, a, b, 0.2, 1.0)
    monkeypatch.setattr(ld, "MASK_DEVICES", ("cpu",))
    monkeypatch.setattr(ld, "USE_MASK_KERNEL", False)
    ld.lora_delta(x, a, b, 0.2, 1.0)
    assert kernel_on_cpu == []


SCRIPT = """
import torch
from zerofit.models import dropout_kernel as dk
from zerofit.models.lora_delta import unpack_mask
n = 400_003
for p in (0.05, 0.5):
    seed = torch.tensor([12345], dtype=torch.int64)
    a = dk.launch(seed, n, p, 1024, 4)
    same = torch.equal(a, dk.launch(seed, n, p, 256, 1))  # another program size: the same bytes
    other = float((a != dk.launch(seed + 1, n, p, 1024, 4)).float().mean())
    keep = float(unpack_mask(a, torch.empty(n)).float().mean())
    bits = ((a[:, None] >> torch.arange(8, dtype=torch.uint8)) & 1).float()
    d = bits - bits.mean(0)
    corr = (d.T @ d) / len(d) / (bits.std(0)[:, None] * bits.std(0)[None, :]) - torch.eye(8)
    print(p, a.numel(), same, other, keep, float(bits.mean(0).min()), float(bits.mean(0).max()),
          float(corr.abs().max()))
"""


def test_the_interpreted_kernel_keeps_each_element_with_probability_1_minus_p() -> None:
    """Each packed byte's eight bits: kept with probability 1 - round(p * 65536) / 65536, every
    bit position alike and uncorrelated with the others (a bit drawn twice from the same 16 bits,
    or one never set, fails), the same bytes for the same seed at any program size, others for
    another seed."""
    triton = pytest.importorskip("triton")
    found = Path(triton.__file__).parents[1]  # where Triton was found, for the child too
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": f"{SRC}{os.pathsep}{found}"}
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    for line in proc.stdout.splitlines():
        p, n_bytes, same, other, keep, low, high, corr = line.split()
        want = 1 - round(float(p) * 65536) / 65536
        sd = (want * (1 - want) / 400_003) ** 0.5
        assert n_bytes == "50001" and same == "True" and float(other) > 0.09
        assert abs(float(keep) - want) < 5 * sd
        assert want - 5 * 8**0.5 * sd < float(low) <= float(high) < want + 5 * 8**0.5 * sd
        assert float(corr) < 0.03

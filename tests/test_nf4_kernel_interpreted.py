"""The NF4 rebuild's Triton kernel (``zerofit.models.nf4_kernel``) run on CPU by Triton's
interpreter (``TRITON_INTERPRET=1``): the same bits as ``nf4.dequantize``'s torch ops. It checks
the kernel's logic (which byte, which nibble first, which scale, the pair's word order, each
rounding) where no GPU is; tests/test_gpu_nf4.py checks it compiled on a GPU. Skipped where
Triton is not installed (a CPU build of torch does not bring it)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
SCRIPT = """
import torch
from zerofit.models import nf4, nf4_kernel
for shape in [(128, 128), (256, 512), (64, 3072)]:
    gen = torch.Generator().manual_seed(shape[1])
    w = torch.randn(shape, generator=gen) * torch.logspace(-4, 1, shape[1])  # wide scales
    w[0, :64] = 0.0  # a block whose scale is 0
    pieces = nf4.quantize(w.to(torch.bfloat16))
    want = nf4.dequantize(pieces, shape, torch.bfloat16)
    words = [pieces[n] for n in nf4.PIECES]
    got = nf4_kernel.rebuild_bf16(*words, nf4.LEVELS, False).view(shape)
    other = nf4_kernel.launch(*words, nf4.LEVELS, 8, 1).view(shape)  # another program size
    wrong = (got.view(torch.int16) != want.view(torch.int16)).sum()
    print(shape, int(wrong + (other.view(torch.int16) != want.view(torch.int16)).sum()))
"""


def test_the_interpreted_kernel_gives_the_torch_ops_bits() -> None:
    triton = pytest.importorskip("triton")
    pytest.importorskip("torchao.quantization")
    found = Path(triton.__file__).parents[1]  # where Triton was found, for the child too
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": f"{SRC}{os.pathsep}{found}"}
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert len(lines) == 3 and all(line.endswith(" 0") for line in lines), lines

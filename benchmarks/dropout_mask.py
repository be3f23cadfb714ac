"""Time LoRA dropout's keep masks for one Llama-3-8B block at 2 x 2,048 tokens (seven masks: six
of 4,096 features, one of 14,336) on a CUDA GPU: the Triton kernel (``dropout_kernel.keep_mask``)
against ``bernoulli_`` then ``pack_mask``, compiled. Median of 20 after 3 warm-up rounds.

    python benchmarks/dropout_mask.py OUT.json
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable

import torch

from zerofit.models import lora_delta as ld

SIZES = [2 * 2048 * 4096] * 6 + [2 * 2048 * 14336]


def ms(fn: Callable[[], None]) -> float:
    for _ in range(3):
        fn()
    times = []
    for _ in range(20):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


def main(out: str) -> None:
    if ld.keep_mask is None:
        raise SystemExit("no Triton here")
    device = torch.device("cuda")
    like = {n: torch.empty(n, device=device, dtype=torch.bfloat16) for n in set(SIZES)}

    def kernel() -> None:
        for n in SIZES:
            ld.keep_mask(ld.new_seed(device), n, 0.05)

    @torch.compile
    def bernoulli() -> None:
        for n in SIZES:
            ld.pack_mask(torch.empty_like(like[n], dtype=torch.bool).bernoulli_(0.95))

    result = {
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "elements": sum(SIZES),
        "kernel_ms": ms(kernel),
        "bernoulli_pack_compiled_ms": ms(bernoulli),
    }
    print(json.dumps(result))
    with open(out, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])

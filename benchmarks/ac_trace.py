"""Issue 28 probe: whether a zerofit run's blocks recompute, and what autograd keeps outside the
checkpoints. Runs `zerofit` in this process (one rank under torchrun) after wrapping `apply_ac`
in the DDP and FSDP engines: each block's inner module counts its forward calls (with full AC a
step calls each three times in DPO: reference, policy, recomputation), and a process-wide
saved-tensors hook counts the bytes autograd saves outside the checkpoints (parameters left out).
Written to OUT/ac-trace-<pid>.json as the run goes.

    torchrun --standalone --nproc-per-node 1 benchmarks/ac_trace.py OUT train -c CONFIG [k=v...]

On CPU (torch 2.11 and 2.13, a 2-layer Hugging Face Llama, DPO LoRA, compiled, full AC) DDP and
FSDP both call each block 6 times in 2 steps and save the same 2.1 MB. The 8B H100 run of
2026-12-06 (FSDP + full AC at DDP-without-AC memory) has not been traced with it yet."""

from __future__ import annotations

import collections
import json
import os
import sys
from pathlib import Path

import torch
from torch import nn

import zerofit.backends.ddp.runtime as ddp_runtime
import zerofit.backends.fsdp.runtime as fsdp_runtime
from zerofit.cli import main
from zerofit.distributed import parallelize

OUT = Path(sys.argv[1])
counts: collections.Counter = collections.Counter()


def _write() -> None:
    (OUT / f"ac-trace-{os.getpid()}.json").write_text(json.dumps(dict(counts), indent=1))


@torch._dynamo.disable  # a hook inside a compiled block's call stays eager
def _called(i: int) -> None:
    counts[f"block {i} forwards"] += 1
    _write()


def _pack(t: torch.Tensor) -> torch.Tensor:
    if not isinstance(t, nn.Parameter):
        counts["bytes saved outside checkpoints"] += t.untyped_storage().nbytes()
    return t


def traced_ac(blocks: nn.ModuleList, mode: str, every: int = 2, first: int | None = None) -> int:
    wrapped = parallelize.apply_ac(blocks, mode, every, first)
    for i, block in enumerate(blocks):
        inner = getattr(block, "_checkpoint_wrapped_module", block)
        inner.register_forward_pre_hook(lambda _m, _a, i=i: _called(i))
        counts[f"block {i} checkpointed"] = int(inner is not block)
    return wrapped


if __name__ == "__main__":
    OUT.mkdir(parents=True, exist_ok=True)
    ddp_runtime.apply_ac = fsdp_runtime.apply_ac = traced_ac  # type: ignore[assignment]
    torch.autograd.graph.saved_tensors_hooks(_pack, lambda t: t).__enter__()
    code = main(sys.argv[2:])
    if torch.cuda.is_available():
        counts["peak allocated GiB"] = torch.cuda.max_memory_allocated() / 2**30
    _write()
    sys.exit(code)

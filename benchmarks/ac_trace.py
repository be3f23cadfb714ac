"""Issue 28 probe: whether a zerofit run's blocks recompute, and what autograd keeps outside the
checkpoints. Runs `zerofit` in this process (one rank under torchrun) after wrapping `apply_ac`
in the DDP and FSDP engines: each block's inner module counts its forward calls (with full AC a
step calls each three times in DPO: reference, policy, recomputation), and a process-wide
saved-tensors hook counts the bytes autograd saves outside the checkpoints (parameters left out).
Each block call's start and end is logged with grad mode, allocated GiB (GPU) and how many
FSDP blocks hold gathered parameters (the first 20,000 calls). Written to
OUT/ac-trace-<pid>.json as the run goes.

    torchrun --standalone --nproc-per-node 1 benchmarks/ac_trace.py OUT train -c CONFIG [k=v...]

On CPU (torch 2.11 and 2.13, a 2-layer Hugging Face Llama, DPO LoRA, compiled, full AC) DDP and
FSDP both call each block 6 times in 2 steps and save the same 2.1 MB. On the 8B H100 run of
2026-12-06 (`benchmarks/fsdp_ac_probe.sh`) it showed `auto` resolving to FSDP without AC (the
launcher lost the written setting; fixed). A run without AC cannot be traced: its blocks compile
whole (fullgraph), and Dynamo refuses the disabled hook ("Skip calling torch.compiler.disable()d
function")."""

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
    data = {**counts, "timeline": timeline}
    (OUT / f"ac-trace-{os.getpid()}.json").write_text(json.dumps(data))


timeline: list[list] = []  # [block, "pre"|"post", grad enabled, allocated GiB, unsharded blocks]
blocks_seen: list[nn.Module] = []


def _unsharded() -> int:
    """How many FSDP blocks hold their gathered parameters now (0 without FSDP)."""
    n = 0
    for block in blocks_seen:
        state = getattr(block, "_get_fsdp_state", None)
        group = state()._fsdp_param_group if state is not None else None
        n += int(bool(group is not None and getattr(group, "is_unsharded", False)))
    return n


@torch._dynamo.disable  # a hook inside a compiled block's call stays eager
def _mark(i: int, where: str) -> None:
    if where == "pre":
        counts[f"block {i} forwards"] += 1
    if len(timeline) < 20000:
        gib = torch.cuda.memory_allocated() / 2**30 if torch.cuda.is_available() else 0.0
        timeline.append([i, where, torch.is_grad_enabled(), round(gib, 3), _unsharded()])
    if i == 0 or len(timeline) % 500 == 0:
        _write()


def _pack(t: torch.Tensor) -> torch.Tensor:
    if not isinstance(t, nn.Parameter):
        counts["bytes saved outside checkpoints"] += t.untyped_storage().nbytes()
    return t


def traced_ac(blocks: nn.ModuleList, mode: str, every: int = 2, first: int | None = None) -> int:
    wrapped = parallelize.apply_ac(blocks, mode, every, first)
    for i, block in enumerate(blocks):
        inner = getattr(block, "_checkpoint_wrapped_module", block)
        inner.register_forward_pre_hook(lambda _m, _a, i=i: _mark(i, "pre"))
        inner.register_forward_hook(lambda _m, _a, _o, i=i: _mark(i, "post"))
        blocks_seen.append(block)
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

"""DeepSpeed's peak memory by phase (`backends/deepspeed/spec.py`), against its 0.19.8 source
read by hand, for one rank. ZeRO-1/2 (`_stage12_phases`, `stage_1_and_2.py`):

- forward: bf16 parameters + master + two moments (R = 14 bytes/param with fp32 masters, 8 with
  bf16) and the activations; no gradients (the step frees them), no buckets;
- inside backward: R + the contiguous bf16 gradients + two 5e8-element bf16 buckets (and an fp32
  copy of the bucket being reduced) + the activations not yet freed;
- the step: R + the gradients + their flattened copy (+ a copy cast to the master dtype): 22
  bytes/param with fp32 masters, 12 with bf16.

ZeRO-3 (`_stage3_phases`, `stage3.py`): bf16 gradient partitions and one fp32 reduce bucket from
the start, no gathered copies at world size 1, and the step's flatten and cast of one sub-group.

The expected GiB come from an independent script of that reading (not from the planner), for the
2026-12-03/04 held-out configurations; what those runs measured is in test_planner_measured.
"""

from __future__ import annotations

import math

import pytest

from zerofit.backends.deepspeed.costs import sub_groups
from zerofit.backends.terms import GIB, Workload
from zerofit.models.shape import shape_from_preset
from zerofit.planner.memory import Strategy, estimate

SHAPES = {
    "1.5B": shape_from_preset("llama3-1b"),
    "3.6B": shape_from_preset(
        "llama3-1b", {"dim": 3072, "n_layers": 28, "n_heads": 24, "n_kv_heads": 8, "ffn_dim": 8192}
    ),
}
# (model, micro-batch, seq, master, AC): the phases' GiB (forward, 1st and 2nd bucket reduced, step)
CASES = {
    "a ZeRO-1": ("1.5B", 4, 1024, "bf16", "none", (23.53, 21.40, 19.47, 16.75)),
    "b ZeRO-2 + SAC": ("1.5B", 2, 2048, "fp32", "selective", (28.37, 27.21, 27.34, 30.70)),
    "c ZeRO-1": ("3.6B", 2, 1024, "fp32", "none", (58.51, 63.30, 63.74, 73.90)),
    "d ZeRO-1": ("3.6B", 1, 2048, "bf16", "none", (38.36, 43.14, 43.59, 40.31)),
}


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("stage", [1, 2])
def test_the_peak_is_the_largest_phase(name: str, stage: int) -> None:
    model, mbs, seq, master, ac, phases = CASES[name]
    w = Workload(mbs, seq, 1, master_dtype=master)
    s = Strategy.of("deepspeed", ac, stage=stage)
    got = estimate(SHAPES[model], w, s).peak_allocated / GIB
    assert got == pytest.approx(max(phases), abs=0.01)


def test_the_step_holds_gradients_their_copy_and_its_cast() -> None:
    """With almost no activations the step is the peak: 22 bytes/param with fp32 masters (2 + 12
    resident, 2 gradients, 2 flat copy, 4 cast), 12 with bf16 (2 + 6, 2, 2)."""
    m = SHAPES["3.6B"]
    for master, per_param in (("fp32", 22), ("bf16", 12)):
        w = Workload(1, 16, 1, master_dtype=master)
        got = estimate(m, w, Strategy.of("deepspeed", stage=2)).peak_allocated
        assert got == pytest.approx(per_param * m.num_params, rel=1e-3)


def test_gradients_are_held_in_forward_only_when_accumulated() -> None:
    """The step frees the gradients: with accumulation they live on into the next micro-batch's
    forward, so the forward phase grows by them (2 bytes/param) and, at ZeRO-1, by the two reduce
    buckets no epilogue released (2 x 5e8 elements in bf16)."""
    m, s = SHAPES["1.5B"], Strategy.of("deepspeed", stage=1)
    one, many = (estimate(m, Workload(8, 2048, 1, acc), s) for acc in (1, 8))
    assert one.peak_allocated == pytest.approx(
        one.parameters + one.optimizer_states + one.activations + one.logits
    )
    assert many.peak_allocated - one.peak_allocated == pytest.approx(2 * m.num_params + 2 * 10**9)


def test_zero2_accumulating_holds_two_gradient_partitions_in_the_last_backward() -> None:
    """ZeRO-2, 2 micro-batches a step, where the peak is inside backward: the
    boundary's backward allocates a new gradient partition beside the accumulated one, 2 bytes a
    parameter more than with one micro-batch."""
    m, s = SHAPES["3.6B"], Strategy.of("deepspeed", stage=2)  # "d": the peak inside backward
    one, two = (estimate(m, Workload(1, 2048, 1, acc, master_dtype="bf16"), s) for acc in (1, 2))
    assert two.peak_allocated - one.peak_allocated == pytest.approx(2 * m.num_params)


def test_without_overlap_there_is_one_bucket() -> None:
    m = SHAPES["3.6B"]
    w = Workload(1, 2048, 1, master_dtype="bf16")  # its peak is inside backward (d ZeRO-1)
    two = estimate(m, w, Strategy.of("deepspeed", stage=1)).peak_allocated
    one = estimate(m, w, Strategy.of("deepspeed", stage=1, overlap_comm=False)).peak_allocated
    assert two - one == pytest.approx(5e8 * 2, rel=1e-6)


BUCKET = 5 * 10**8  # reduce_bucket_size, fp32 (the reduce dtype) in ZeRO-3


def test_zero3_step_flattens_and_casts_the_largest_sub_group() -> None:
    """c with ZeRO-3 + AC (measured 61.30 GiB): bf16 parameters and gradients, fp32 master and
    moments, the fp32 bucket, and in the step the 1.0B-element sub-group flattened (bf16) and cast
    (fp32)."""
    m = SHAPES["3.6B"]
    P, w = m.num_params, Workload(2, 1024, 1)
    n = max(sub_groups(m, w))
    want = P * (2 + 2 + 12) + 4 * BUCKET + n * (2 + 4)
    got = estimate(m, w, Strategy.of("deepspeed", "full", stage=3)).peak_allocated
    assert got == pytest.approx(want) and got / GIB == pytest.approx(61.23, abs=0.01)


def test_zero3_offload_keeps_parameters_and_the_bucket_on_the_gpu() -> None:
    """The optimizer on the CPU: the gradient partitions go to pinned host memory with the fp32
    master, moments and gradients; a sub-group kept on the GPU brings its gradient buffer. Each
    pinned buffer is rounded up to a power of two (torch's pinned allocator), and the step
    converts the largest sub-group's master to bf16 on the host."""
    m = SHAPES["1.5B"]
    P, w = m.num_params, Workload(4, 1024, 1)
    e = estimate(m, w, Strategy.of("deepspeed", stage=3, offload_optimizer="cpu"))
    assert (e.parameters, e.gradients, e.optimizer_states) == (2 * P, 0, 0)
    groups = sub_groups(m, w)
    pow2 = [2 ** math.ceil(math.log2(b)) for b in (2 * P, *(4 * g for g in groups))]
    assert e.buffers == 4 * BUCKET
    assert e.host == pytest.approx(sum(pow2) + 12 * P + 2 * max(groups))
    unpinned = Strategy.of("deepspeed", stage=3, offload_optimizer="cpu", pin_memory=False)
    assert estimate(m, w, unpinned).host == pytest.approx(P * (2 + 16) + 2 * max(groups))
    part = Strategy.of("deepspeed", stage=3, offload_optimizer="cpu", offload_ratio=0.5)
    gpu = sub_groups(m, w)[0]
    half = estimate(m, w, part)
    assert half.optimizer_states == pytest.approx(gpu * 12)
    assert half.gradients == pytest.approx(gpu * 4)


def test_zero3_gathers_copies_only_across_ranks_or_from_the_host() -> None:
    """At world size 1 a gathered parameter is a view of its partition; two ranks, or parameters
    on the CPU, gather real copies (two blocks and the head in flight)."""
    m = SHAPES["1.5B"]
    copies = (2 * m.block_params + m.vocab_size * m.dim) * 2
    one = estimate(m, Workload(4, 1024, 1), Strategy.of("deepspeed", stage=3))
    two = estimate(m, Workload(4, 1024, 2), Strategy.of("deepspeed", stage=3))
    host = Strategy.of("deepspeed", stage=3, offload_optimizer="cpu", offload_param="cpu")
    off = estimate(m, Workload(4, 1024, 1), host)
    assert one.buffers == 4 * BUCKET
    assert two.buffers == off.buffers == pytest.approx(4 * BUCKET + copies)

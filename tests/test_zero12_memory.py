"""ZeRO-1/2 peak memory by phase (`backends/deepspeed/spec.py: _stage12_phases`), against the
phases read off DeepSpeed 0.19.8's `stage_1_and_2.py` by hand, for one rank:

- forward: bf16 parameters + master + two moments (R = 14 bytes/param with fp32 masters, 8 with
  bf16) and the activations; no gradients (the step frees them), no buckets;
- inside backward: R + the contiguous bf16 gradients + two 5e8-element bf16 buckets (and an fp32
  copy of the bucket being reduced) + the activations not yet freed;
- the step: R + the gradients + their flattened copy (+ a copy cast to the master dtype): 22
  bytes/param with fp32 masters, 12 with bf16.

The expected GiB come from an independent script of that reading (not from the planner), for the
2026-12-03/04 held-out configurations; what those runs measured is in test_planner_measured.
"""

from __future__ import annotations

import pytest

from zerofit.models.shape import shape_from_preset
from zerofit.planner.memory import Strategy, estimate
from zerofit.planner.terms import GIB, Workload

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
    forward, so the forward phase grows by them (2 bytes/param)."""
    m, s = SHAPES["1.5B"], Strategy.of("deepspeed", stage=1)
    one, many = (estimate(m, Workload(8, 2048, 1, acc), s) for acc in (1, 8))
    assert one.peak_allocated == pytest.approx(
        one.parameters + one.optimizer_states + one.activations + one.logits
    )
    assert many.peak_allocated - one.peak_allocated == pytest.approx(2 * m.num_params)


def test_without_overlap_there_is_one_bucket() -> None:
    m = SHAPES["3.6B"]
    w = Workload(1, 2048, 1, master_dtype="bf16")  # its peak is inside backward (d ZeRO-1)
    two = estimate(m, w, Strategy.of("deepspeed", stage=1)).peak_allocated
    one = estimate(m, w, Strategy.of("deepspeed", stage=1, overlap_comm=False)).peak_allocated
    assert two - one == pytest.approx(5e8 * 2, rel=1e-6)

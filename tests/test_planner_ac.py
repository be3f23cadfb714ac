"""Block-level activation checkpointing in the planner: full, every_k and first_k counted block by
block (memory in backward's order, recompute share), and the planner's search for the fewest
first blocks that fit."""

from __future__ import annotations

from dataclasses import replace

import pytest

from zerofit.backends.terms import Adapters, Workload
from zerofit.config import with_fields
from zerofit.distributed.ac_blocks import checkpointed_blocks
from zerofit.errors import UserError
from zerofit.launch.run_config import config_from_dict
from zerofit.models.shape import ModelShape, shape_from_preset
from zerofit.planner.memory import (
    Strategy,
    activation_parts,
    block_activation_bytes,
    estimate,
    saved_after,
    strategy_for,
)
from zerofit.planner.plan import evaluate, plan
from zerofit.planner.shape import Hardware
from zerofit.planner.speed import predict

GIB = 2**30
M8 = shape_from_preset("llama3-8b")
W8 = Workload(2, 4096, 1)
H200 = Hardware(1, 141 * 10**9, cpu_mem=512 * GIB)


def fsdp(ac: str, **kw) -> Strategy:
    return replace(Strategy.of("fsdp", activation_checkpointing=ac), **kw)


def test_which_blocks_recompute() -> None:
    assert checkpointed_blocks("first_k", 8, first=3) == [0, 1, 2]
    assert checkpointed_blocks("first_k", 8, first=0) == []
    assert checkpointed_blocks("every_k", 8, every=3) == [0, 3, 6]
    assert checkpointed_blocks("full", 4) == [0, 1, 2, 3]
    assert checkpointed_blocks("none", 4) == []
    with pytest.raises(UserError, match="parallel.ac_blocks=9: the model has 8 blocks"):
        checkpointed_blocks("first_k", 8, first=9)


@pytest.mark.parametrize(
    ("parallel", "message"),
    [
        ({"activation_checkpointing": "first_k"}, "give both or neither"),
        ({"activation_checkpointing": "full", "ac_blocks": 4}, "give both or neither"),
    ],
)
def test_ac_blocks_goes_with_first_k(parallel: dict, message: str) -> None:
    with pytest.raises(UserError, match=message):
        config_from_dict({"parallel": parallel})


def test_first_k_activations_by_hand() -> None:
    """k recomputed blocks keep their input (bf16 under FSDP2); the other L - k all they save; one
    block is recomputed at a time."""
    L, k = M8.n_layers, 12
    per_block = block_activation_bytes(M8, W8.tokens, 2)
    blocks, inflight, _ = activation_parts(M8, W8, fsdp("first_k", ac_blocks=k))
    assert blocks == k * W8.tokens * M8.dim * 2 + (L - k) * per_block
    assert inflight == per_block
    none, full = estimate(M8, W8, fsdp("none")), estimate(M8, W8, fsdp("full"))
    assert estimate(M8, W8, fsdp("first_k", ac_blocks=0)).activations == none.activations
    assert estimate(M8, W8, fsdp("first_k", ac_blocks=L)).activations == full.activations
    acts = [estimate(M8, W8, fsdp("first_k", ac_blocks=n)).activations for n in range(1, L)]
    assert all(
        a > b for a, b in zip(acts, acts[1:], strict=False)
    )  # each block recomputed saves memory


def test_every_k_counts_its_blocks() -> None:
    """every_k 2 (no longer counted as full): half the blocks keep everything."""
    every = estimate(M8, W8, fsdp("every_k", ac_every=2)).activations
    half = estimate(M8, W8, fsdp("first_k", ac_blocks=M8.n_layers // 2)).activations
    assert every == half  # the same blocks' worth, in a different order


def test_backward_frees_the_kept_blocks_first() -> None:
    """Backward runs from the output: once it has passed the L - k blocks that keep everything,
    only the k recomputed ones' inputs are left, as under full checkpointing."""
    L, k = M8.n_layers, 8
    s = fsdp("first_k", ac_blocks=k)
    head = M8.vocab_size * M8.dim + M8.dim
    passed = head + (L - k) * M8.block_params
    kept = k * W8.tokens * M8.dim * 2
    _, inflight, _ = activation_parts(M8, W8, s)
    assert saved_after(M8, W8, s, passed) == pytest.approx(kept + inflight)
    assert saved_after(M8, W8, s, head) == pytest.approx(activation_parts(M8, W8, s)[0] + inflight)
    every = fsdp("every_k", ac_every=2)  # the same memory in total, freed more evenly
    assert saved_after(M8, W8, every, passed) > saved_after(M8, W8, s, passed)


def test_recompute_costs_a_third_of_each_block() -> None:
    """A recomputed block runs its forward again: +1/3 of its training FLOPs."""
    steps = {n: predict(M8, W8, fsdp("first_k", ac_blocks=n), H200).compute for n in (0, 16, 32)}
    assert steps[16] / steps[0] == pytest.approx(1 + 1 / 6)
    assert steps[32] == pytest.approx(predict(M8, W8, fsdp("full"), H200).compute)


def test_the_plan_recomputes_the_fewest_blocks_that_fit() -> None:
    """Between what full AC and no AC need, the first_k option has k blocks that fit, and
    k - 1 would not."""
    w = Workload(4, 4096, 1, master_dtype="bf16")
    s = Strategy.of("fsdp", activation_checkpointing="first_k")
    full = estimate(M8, w, fsdp("full")).peak_reserved
    none = estimate(M8, w, fsdp("none")).peak_reserved
    hw = replace(H200, gpu_mem=(full + none) / 2 / 0.9)
    o = evaluate(M8, w, hw, s)
    k = o.strategy.ac_blocks
    assert o.fits and 0 < k < M8.n_layers
    assert not evaluate(M8, w, hw, replace(s, ac_blocks=k - 1)).fits
    assert o.strategy.label.endswith(f"+ AC first {k}")
    eager = config_from_dict({"parallel": {"compile": False}})  # as `s`, evaluated eager
    found = [o.strategy for o in plan(M8, w, hw, eager)]  # every engine's options, each AC mode
    assert replace(s, ac_blocks=k) in found  # FSDP2 full-shard's first_k row


def test_overrides_clear_or_set_ac_blocks() -> None:
    """A plan written over a first_k config (or `backend: auto` resolving one) stays valid."""
    cfg = config_from_dict({"parallel": {"activation_checkpointing": "first_k", "ac_blocks": 1}})
    s = strategy_for(cfg)
    assert (s.activation_checkpointing, s.ac_blocks) == ("first_k", 1)
    full = with_fields(cfg, fsdp("full").overrides())
    assert (full.parallel.activation_checkpointing, full.parallel.ac_blocks) == ("full", None)
    first = with_fields(full, fsdp("first_k", ac_blocks=3).overrides())
    assert (first.parallel.activation_checkpointing, first.parallel.ac_blocks) == ("first_k", 3)
    every = with_fields(cfg, fsdp("every_k", ac_every=4).overrides())
    assert (every.parallel.ac_every, every.parallel.ac_blocks) == (4, None)


def test_a_compiled_lora_block_keeps_what_the_cpu_listing_lists() -> None:
    """A compiled block over a frozen base with LoRA dropout keeps its input, the residual after
    attention, the rotated q and the attention output, k and v, the gate and up outputs, the
    log-sum-exp and two rsqrt, beside the adapters' rank-r outputs and masks: 24.45 bytes a token
    and hidden unit in the tensor-by-tensor CPU listing of that block (hidden 1,024 with
    Llama-3-8B's proportions, r16 on 7 layers: docs/benchmarks/data/2026-12-07-qlora-kernel-h200/
    cpu-block/block-saved.json). The planner counted 30.45: the norms' outputs, which no weight
    gradient needs, and the down projection's input. Eager and without dropout it is unchanged."""
    m = ModelShape("cpu-block", 1, 1024, 8, 2, 3584, 1024)
    lora = Adapters(0, 16, 7, 6 * 1024 + 3584, rebuilt_inputs=3584)
    w = Workload(1, 512, 1, lora=lora)
    compiled = Strategy.of("ddp", activation_checkpointing="none", compile=True)
    per = activation_parts(m, w, compiled)[0] / (w.tokens * m.dim)
    assert per == pytest.approx(24.4453125, abs=1e-6)
    eager = replace(compiled, compile=False)
    plain = block_activation_bytes(m, w.tokens, 2) + lora.activation_bytes(w.tokens, 2)
    assert activation_parts(m, w, eager)[0] == pytest.approx(plain)
    no_dropout = replace(w, lora=replace(lora, block_inputs=0))
    before = block_activation_bytes(m, 512, 2, True) + replace(
        lora, block_inputs=0
    ).activation_bytes(512, 2, True)
    assert activation_parts(m, no_dropout, compiled)[0] == pytest.approx(before)

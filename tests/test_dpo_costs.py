"""What DPO costs and counts (no processes launched): the frozen reference copy in the planner's
memory, traffic and `zerofit plan` line, engine by engine; and each pair's shared prompt counted
once in the tokens, FLOPs and MFU a run and `zerofit bench` report."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from zerofit.backends.terms import Workload
from zerofit.data.loader import to_batch
from zerofit.data.pair_rows import pack_pairs
from zerofit.data.pairs import Pair
from zerofit.data.samples import Sample
from zerofit.models.shape import shape_from_preset
from zerofit.planner.memory import Strategy, estimate
from zerofit.train.preference import shared_prefix_tokens

M = shape_from_preset("llama3-1b")
W = Workload(2, 2048, 4, grad_accum_steps=2)  # bf16 compute, fp32 master weights
COPY = replace(W, reference_forward=True, reference_copy=True)


@pytest.mark.parametrize(
    ("backend", "fields", "shards"),
    [("ddp", {}, 1), ("fsdp", {}, 4), ("deepspeed", {"stage": 2}, 1),
     ("deepspeed", {"stage": 3}, 4)],
)  # fmt: skip
def test_the_copy_is_counted_as_each_engine_shards_it(
    backend: str, fields: dict, shards: int
) -> None:
    """Its weights in the compute dtype (2 bytes), over the ranks that shard the policy; DDP keeps
    the embedding and norms in fp32 (autocast runs them so); the peak holds them too."""
    s = Strategy.of(backend, **fields)
    plain, copied = estimate(M, W, s), estimate(M, COPY, s)
    want = 2 * M.num_params / shards
    if backend == "ddp":
        want += 2 * (M.embedding_params + (2 * M.n_layers + 1) * M.dim)
    assert copied.parameters - plain.parameters == pytest.approx(want)
    assert copied.peak_allocated >= plain.peak_allocated + want


def test_the_copy_goes_to_the_host_with_the_policys_shards() -> None:
    s = Strategy.of("fsdp", cpu_offload=True)
    plain, copied = estimate(M, W, s), estimate(M, COPY, s)
    assert copied.host - plain.host == pytest.approx(2 * M.num_params / 4)
    assert copied.parameters == plain.parameters == 0


@pytest.mark.parametrize(("backend", "fields"), [("fsdp", {}), ("deepspeed", {"stage": 3})])
def test_a_sharded_copy_is_gathered_in_its_forward(backend: str, fields: dict) -> None:
    """One more all-gather of the whole model, in the compute dtype, each micro-batch."""
    s = Strategy.of(backend, **fields)
    plain, copied = (s.engine.traffic(M, w, s.options) for w in (W, COPY))
    extra = 2 * M.num_params * W.grad_accum_steps
    assert copied.volume - plain.volume == pytest.approx(extra)


def _pair(prompt: list[int], chosen: list[int], rejected: list[int]) -> Pair:
    def doc(ids: list[int]) -> Sample:
        mask = np.arange(len(prompt) + len(ids)) >= len(prompt)
        return Sample(np.asarray(prompt + ids, dtype=np.int32), mask, "x:1")

    return Pair(doc(chosen), doc(rejected), len(prompt), len(prompt), "x:1")


def test_the_shared_prompt_of_each_pair_is_found_in_packed_rows() -> None:
    """Each pair's chosen and rejected inputs share their prompt (and, pair 1, a first response
    token): those places compute the same hidden states twice and count once."""
    pairs = [
        _pair([5, 6, 7, 8], [9, 10, 11], [12, 13]),  # a 4-token prompt
        _pair([5, 6], [20, 21, 22], [20, 23]),  # a 2-token prompt + a shared first token
        _pair([30, 31, 32], [33], [34, 35, 36]),  # inputs: the document less its last token
    ]
    rows, _ = pack_pairs(pairs, seq_len=24, packing=True)
    assert len(rows) == 2  # pair 2 in a row of its own, after padding in the first
    # a document of L tokens has L - 1 inputs: pair 0 shares 4, pair 1 shares 3 (2 + 1 of 4
    # and 3 inputs), pair 2 shares 3 of 3 and 5 inputs
    assert shared_prefix_tokens(to_batch(rows)) == 4 + 3 + 3
    assert shared_prefix_tokens(to_batch(rows[:1])) == 7


def test_the_objective_counts_each_pairs_prompt_once() -> None:
    from conftest import TINY, deep_update

    from zerofit.distributed.mesh import DistContext
    from zerofit.launch.run_config import config_from_dict
    from zerofit.train.objectives import Preference
    from zerofit.train.reference import Precomputed

    rows, _ = pack_pairs([_pair([5, 6, 7, 8], [9, 10, 11], [12, 13])], 16, packing=True)
    cfg = config_from_dict(deep_update(TINY, {"train": {"objective": "dpo"},
                                              "data": {"format": "preference"}}))  # fmt: skip
    ctx = DistContext(0, 1, 0, torch.device("cpu"), 1, 1)
    objective = Preference(cfg, ctx, Precomputed({"train": torch.zeros(1, 2)}))
    _, real = objective.weights([to_batch(rows)])
    assert objective.repeated is not None and int(objective.repeated) == 4
    assert int(real) == 6 + 5 - 4  # the two documents' inputs, the prompt once


def test_throughput_counts_repeated_places_once() -> None:
    """Tokens/s, FLOPs and MFU leave the repeated places out; what they left out is logged."""
    from zerofit.report.metrics import Throughput

    meter = Throughput(tokens_per_step=1000, flops_per_token=6.0, world_size=2, peak=1e3)
    meter.tick(torch.tensor(900.0), torch.tensor(300.0))
    meter.tick(torch.tensor(900.0), torch.tensor(100.0))
    meter.t0 -= 10.0  # ten seconds for the two steps
    got = meter.read()
    assert got["tokens_per_s"] == pytest.approx(1600 / 10, rel=1e-3)
    assert got["real_tokens_per_s"] == pytest.approx(1800 / 10, rel=1e-3)
    assert got["repeated_tokens_per_s"] == pytest.approx(400 / 10, rel=1e-3)
    assert got["mfu"] == pytest.approx(6.0 * 160 / 2 / 1e3, rel=1e-3)


def test_bench_counts_repeated_places_once() -> None:
    from zerofit.bench.run import measure

    summary = {"tokens_per_step": 1000, "flops_per_token": 6.0, "world_size": 1,
               "step_times_s": [9.0, 1.0, 1.0, 1.0], "step_repeated_tokens": [0, 200, 200, 200]}  # fmt: skip
    assert measure(summary, warmup=1)["tokens_per_s"] == pytest.approx(800)


def test_the_doctor_compares_every_place_with_the_roofline(tmp_path: Path) -> None:
    """The roofline forecasts every place of the rows: the doctor adds DPO's repeated prompts
    back before comparing."""
    import json

    from conftest import TINY, deep_update

    from zerofit.launch.run_config import config_from_dict
    from zerofit.report.doctor import check_speed

    (tmp_path / "env.json").write_text(json.dumps({"device": "cuda", "gpus": ["NVIDIA H200"]}))
    window = {"tokens_per_s": 600.0, "repeated_tokens_per_s": 400.0}
    (tmp_path / "metrics.jsonl").write_text(json.dumps(window) + "\n")
    cfg = config_from_dict(deep_update(TINY, {"train": {"objective": "dpo"},
                                              "data": {"format": "preference"}}))  # fmt: skip
    assert "measured 1,000 tokens/s" in check_speed(cfg, tmp_path).message


def test_the_zero3_copys_engine_has_no_optimizer_and_its_own_swap_folder() -> None:
    """DeepSpeed empties the NVMe swap folder of each engine it starts: the copy's is its own."""
    from zerofit.backends.deepspeed.runtime import frozen_json

    policy = {
        "optimizer": {"type": "AdamW"}, "zero_force_ds_cpu_optimizer": False, "bf16": {"enabled": True},
        "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"},
                              "offload_param": {"device": "nvme", "nvme_path": "/nvme"}},
    }  # fmt: skip
    got = frozen_json(policy)
    assert got == {
        "bf16": {"enabled": True},
        "zero_optimization": {"stage": 3, "offload_param": {"device": "nvme",
                                                            "nvme_path": "/nvme/dpo_reference"}},
    }  # fmt: skip
    assert policy["zero_optimization"]["offload_param"]["nvme_path"] == "/nvme"  # not changed


def test_a_replicated_copy_is_stored_as_autocast_computes_it() -> None:
    """DDP's copy under autocast: Linear weights in the compute dtype (autocast casts them the
    same way), embeddings and norms kept (autocast leaves them: an fp32 residual stream), a tied
    head with its embedding; nothing takes a gradient."""
    from zerofit.backends.torch_common import frozen_
    from zerofit.models import build_model

    for tied in (False, True):
        module = build_model(preset="tiny", overrides={"n_layers": 1}).module
        if tied:
            module.output.weight = module.tok_embeddings.weight
        frozen_(module, torch.bfloat16, linears_only=True)
        dtypes = {n: p.dtype for n, p in module.named_parameters(remove_duplicate=False)}
        assert dtypes["layers.0.attention.wq.weight"] == torch.bfloat16
        assert dtypes["output.weight"] == (torch.float32 if tied else torch.bfloat16)
        assert dtypes["tok_embeddings.weight"] == dtypes["norm.weight"] == torch.float32
        assert not any(p.requires_grad for p in module.parameters())

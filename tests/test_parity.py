"""Every engine and sharding option reproduces a single-process reference's loss trajectory.

World size 2 (gloo, CPU) with micro-batch 4 and no accumulation against one process with
micro-batch 4 and 2 accumulation steps: the data layout guarantees both see the same samples in
the same micro-batches, so the only differences are floating-point summation order (gradient
all-reduce / reduce-scatter vs local accumulation). In fp32 that is ~1e-7 relative per step;
AdamW's normalisation can amplify it for tiny gradients, so over 10 steps we allow 1e-5
relative (observed: at most 8.5e-7; each test prints its maximum). A real bug (wrong shard, missing reduction,
double-counted gradients, different init) moves the loss by 1e-2 or more within two steps.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path

import pytest
from conftest import POOL, losses, train_run, wait_all

pytestmark = pytest.mark.dist
RTOL = 1e-5

# The first three are conftest's shared runs (other files resume, inspect or export them).
SHARED_VARIANTS = {"ddp": "ddp@2", "fsdp_full_shard": "fsdp@2", "fsdp_hybrid": "fsdp-hybrid@2"}
VARIANTS = {
    "fsdp_grad_op": {"parallel": {"backend": "fsdp", "fsdp": {"reshard_after_forward": False}}},
    "fsdp_cpu_offload": {"parallel": {"backend": "fsdp", "fsdp": {"cpu_offload": True}}},
    "fsdp_ac_full": {"parallel": {"backend": "fsdp", "activation_checkpointing": "full"}},
    "fsdp_ac_selective": {"parallel": {"backend": "fsdp", "activation_checkpointing": "selective"}},
    "fsdp_ac_first_k": {
        "parallel": {"backend": "fsdp", "activation_checkpointing": "first_k", "ac_blocks": 1}
    },
    "fsdp_size_wrap_ac_every2": {
        "parallel": {
            "backend": "fsdp",
            "wrap": "size",
            "min_num_params": 200_000,
            "activation_checkpointing": "every_k",
            "ac_every": 2,
        }
    },
}


@pytest.fixture(scope="module")
def runs(session_tmp: Path, shared_run) -> Iterator[dict[str, Callable[[], Path]]]:  # noqa: ANN001
    """Every variant's run, started together in the background (two at a time)."""
    shared_run.start("ddp@1", *SHARED_VARIANTS.values())
    local = {
        name: POOL.submit(train_run, session_tmp, name, extra, "--nproc", "2")
        for name, extra in VARIANTS.items()
    }
    out = {name: partial(shared_run, layout) for name, layout in SHARED_VARIANTS.items()}
    out |= {name: future.result for name, future in local.items()}
    yield out
    wait_all(local.values())


@pytest.fixture(scope="module")
def reference(shared_run, runs) -> dict[int, float]:  # noqa: ANN001
    """One process, micro-batch 4 x 2 accumulation steps (conftest's shared ddp@1 run)."""
    ref = losses(shared_run("ddp@1"))
    assert len(ref) == 10 and ref[10] < ref[1] - 0.5, ref  # it learns
    return ref


@pytest.mark.slow
@pytest.mark.parametrize("name", [*SHARED_VARIANTS, *VARIANTS])
def test_matches_single_process_reference(
    name: str, reference: dict[int, float], runs: dict[str, Callable[[], Path]]
) -> None:
    run = runs[name]()
    got = losses(run)
    assert sorted(got) == sorted(reference)
    worst = max(abs(got[s] - reference[s]) / abs(reference[s]) for s in reference)
    print(f"{name}: max relative loss difference over 10 steps = {worst:.2e}")
    assert worst <= RTOL, {s: (reference[s], got[s]) for s in reference}
    if name == "fsdp_full_shard":
        _check_sharding(run, world=2)


def _check_sharding(run: Path, world: int) -> None:
    """Each rank holds 1/N of every parameter (dim-0 chunks, as torch.chunk splits them)."""
    reports = [json.loads((run / "sharding" / f"rank{r}.json").read_text()) for r in range(world)]
    for name, (_, full) in reports[0]["params"].items():
        local = [rep["params"][name][0] for rep in reports]
        assert sum(local) == full, name
        assert max(local) <= -(-full // world), (name, local)
    total = reports[0]["global_numel"]
    for rep in reports:
        assert abs(rep["local_numel"] - total / world) <= 0.01 * total, rep["local_numel"]


@pytest.mark.parametrize(
    ("fused", "offloaded", "expected"),
    [(None, False, False), (None, True, True), (False, True, False), (True, False, True)],
)
def test_adamw_is_fused_for_offloaded_states_unless_told(
    fused: bool | None, offloaded: bool, expected: bool
) -> None:
    """On CPU: states offloaded to host RAM (FSDP cpu_offload, the variant above) step with
    torch's fused AdamW, one vectorised pass; others with foreach; `optim.fused` decides when
    set. The fused update matches foreach to float rounding."""
    import torch

    from zerofit.backends.torch_common import build_adamw
    from zerofit.launch.run_config import load_config

    cfg = load_config(None, [] if fused is None else [f"optim.fused={str(fused).lower()}"]).optim
    results = []
    for flag in (offloaded, not offloaded):
        torch.manual_seed(0)
        model = torch.nn.Linear(64, 64)
        opt = build_adamw(model, cfg, torch.device("cpu"), offloaded=flag)
        if flag == offloaded:
            assert bool(opt.defaults["fused"]) is expected
        model(torch.randn(8, 64)).square().mean().backward()
        opt.step()
        results.append(model.weight.detach().clone())
    torch.testing.assert_close(results[0], results[1], rtol=1e-6, atol=1e-7)

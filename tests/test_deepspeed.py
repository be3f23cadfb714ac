"""DeepSpeed ZeRO behind the same config: parity with FSDP, partitioning, the seed's JSON, resume."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path

import pytest
import yaml
from conftest import (
    POOL,
    TINY,
    assert_resume_exact,
    deep_update,
    losses,
    shared_extra,
    train_run,
    wait_all,
    write_config,
    zerofit,
)

pytest.importorskip("deepspeed")
pytestmark = pytest.mark.dist

# fp32 on CPU. ZeRO reduces gradients in buckets of flattened tensors and clips/steps on flat fp32
# partitions; FSDP reduce-scatters per parameter. Same math, different summation order: ~1e-6
# relative per step, amplified by AdamW over 10 steps (observed: at most 6.4e-7 over all cases,
# 5.4e-7 for ZeRO-3 with and without activation checkpointing). A wrong partition or a missing
# reduction moves the loss by > 1e-2 in one or two steps.
RTOL = 1e-5

ZERO = {
    "zero1": {"stage": 1},
    "zero2": {"stage": 2},
    "zero3": {"stage": 3},
    "zero3_offload_optimizer_cpu": {"stage": 3, "offload_optimizer": "cpu", "pin_memory": False},
    "zero3_activation_checkpointing": {"stage": 3},
}
# Keys of the `parallel` section (beside `deepspeed`) a case sets.
PARALLEL_EXTRA = {"zero3_activation_checkpointing": {"activation_checkpointing": "full"}}
# The cases that are conftest's shared runs (other files resume, inspect or export them).
SHARED_ZERO = {
    "zero1": "zero1@2",
    "zero2": "zero2@2",
    "zero3": "zero3@2",
    "zero3_offload_optimizer_cpu": "zero3-offload@2",
}
# checkpoint_wrapper's segment in a parameter's name: present exactly where a block is checkpointed.
AC_SEGMENT = "._checkpoint_wrapped_module."

PARTIAL = {"stage": 3, "offload_optimizer": "cpu", "offload_ratio": 0.5, "sub_group_size": 100_000}


@pytest.fixture(scope="module")
def zero_runs(session_tmp: Path, shared_run) -> Iterator[dict[str, Callable[[], Path]]]:  # noqa: ANN001
    """One training run per case (the AC case also compares against plain zero3; the partial
    offload is the last test's), all started together in the background (two at a time)."""
    shared_run.start("fsdp@2", *SHARED_ZERO.values())
    for name, layout in SHARED_ZERO.items():
        assert shared_extra(layout)["parallel"]["deepspeed"] == ZERO[name]
    cases = {name: ZERO[name] for name in ZERO if name not in SHARED_ZERO}
    cases["zero3_partial_offload"] = {**PARTIAL, "pin_memory": False}
    local = {}
    for name, zero in cases.items():
        parallel = {"backend": "deepspeed", "deepspeed": zero, **PARALLEL_EXTRA.get(name, {})}
        extra = {"parallel": parallel}
        local[name] = POOL.submit(train_run, session_tmp, name, extra, "--nproc", "2")
    runs = {name: partial(shared_run, layout) for name, layout in SHARED_ZERO.items()}
    yield runs | {name: future.result for name, future in local.items()}
    wait_all(local.values())


def sharding_reports(run: Path) -> list[dict]:
    return [json.loads((run / "sharding" / f"rank{r}.json").read_text()) for r in range(2)]


@pytest.fixture(scope="module")
def fsdp_reference(shared_run, zero_runs) -> dict[int, float]:  # noqa: ANN001
    return losses(shared_run("fsdp@2"))  # started with zero_runs


@pytest.mark.slow
@pytest.mark.parametrize("name", list(ZERO))
def test_zero_matches_fsdp(
    name: str, fsdp_reference: dict[int, float], zero_runs: dict[str, Callable[[], Path]]
) -> None:
    run = zero_runs[name]()
    got = losses(run)
    assert sorted(got) == sorted(fsdp_reference)
    worst = max(abs(got[s] - fsdp_reference[s]) / fsdp_reference[s] for s in got)
    print(f"{name}: max relative loss difference vs FSDP over 10 steps = {worst:.2e}")
    assert worst <= RTOL, {s: (fsdp_reference[s], got[s]) for s in got}
    reports = sharding_reports(run)
    # The trained module's parameter names (written after setup) show which blocks were wrapped
    # in checkpoint_wrapper: with `full`, every block's parameters; otherwise none.
    block_params = [p for p in reports[0]["params"] if p.startswith("layers.")]
    wrapped = [p for p in block_params if AC_SEGMENT in p]
    if PARALLEL_EXTRA.get(name, {}).get("activation_checkpointing") == "full":
        assert block_params and wrapped == block_params, block_params
    else:
        assert wrapped == [], wrapped
    if ZERO[name]["stage"] == 3:
        for rep in reports:  # each rank owns half of every parameter (rounded up to the partition)
            assert (
                abs(rep["local_numel"] - rep["global_numel"] / 2) <= 0.01 * rep["global_numel"]
            ), rep["local_numel"]
            for pname, (local, full) in rep["params"].items():
                assert local == -(-full // 2), pname


@pytest.mark.slow
def test_zero3_activation_checkpointing_recomputes_the_same_math(
    zero_runs: dict[str, Callable[[], Path]],
) -> None:
    """Recomputing each block in backward (fp32, CPU) redoes the same ops on the same values, so
    the losses equal plain ZeRO-3's bit for bit (AC must change memory, never the math)."""
    plain = losses(zero_runs["zero3"]())
    ac = losses(zero_runs["zero3_activation_checkpointing"]())
    assert sorted(ac) == sorted(plain)
    assert all(ac[s] == plain[s] for s in ac), {s: (plain[s], ac[s]) for s in ac}


SEED_JSON = (
    Path(__file__).resolve().parents[1] / "configs" / "deepspeed" / "seed_zero3_offload.json"
)
SEED = {
    "parallel": {"backend": "deepspeed", "deepspeed": {"config": str(SEED_JSON)}},
    "optim": {"lr": 6e-5},  # the same value as the JSON: agreeing is fine
    "precision": {"mode": "auto"},
    "train": {"steps": 4, "micro_batch_size": 32},
}
PURE_BF16 = {
    "parallel": {"backend": "deepspeed"},
    "precision": {"mode": "bf16", "master_dtype": "bf16"},
    "train": {"steps": 2},
}
MASTER_CHECK = """
import sys, torch
from pathlib import Path
from deepspeed.utils import safe_get_full_fp32_param
from zerofit.launch.run_config import load_config
from zerofit.distributed.mesh import init_distributed
from zerofit.distributed.parallelize import full_param
from zerofit.launch.resolve import resolve
from zerofit.train.trainer import Trainer

cfg = load_config(sys.argv[1], ["parallel.backend=deepspeed", f"parallel.deepspeed.stage={sys.argv[2]}", "precision.mode=bf16"])
cfg = resolve(cfg, 1, "cpu")
trainer = Trainer(cfg, Path(sys.argv[3]), init_distributed())
bad = [n for n, p in trainer.backend.model.module.named_parameters()
       if not torch.equal(safe_get_full_fp32_param(p).cpu(),
                          full_param(n, getattr(p, "ds_shape", p.shape), torch.device("cpu"), init_seed=0, init_param_=trainer.spec.init_param_))]
print("MISMATCHED", len(bad), bad[:3])
"""


def _master_check(tmp: Path, stage: int) -> subprocess.CompletedProcess:
    script = tmp / "check.py"
    script.write_text(MASTER_CHECK)
    cfg = write_config(tmp / "c.yaml")
    src = str(Path(__file__).resolve().parents[1] / "src")
    return subprocess.run(
        [sys.executable, str(script), str(cfg), str(stage), str(tmp / "run")],
        env={"PYTHONPATH": src, "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=900,  # a hang guard: it takes ~10 s
    )


def _seed(tmp: Path) -> tuple[Path, subprocess.CompletedProcess]:
    cfg = write_config(
        tmp / "seed.yaml", deep_update(SEED, {"log": {"run_dir": str(tmp / "seed")}})
    )
    return tmp / "seed", zerofit("train", "-c", str(cfg), "--nproc", "2", cwd=tmp)


@pytest.fixture(scope="module")
def side_runs(tmp_path_factory: pytest.TempPathFactory, shared_run) -> Iterator[dict]:  # noqa: ANN001
    """The launches of the tests below (each its own), started together in the background."""
    out = {
        "seed": POOL.submit(_seed, tmp_path_factory.mktemp("seed")),
        "pure_bf16": POOL.submit(
            train_run, tmp_path_factory.mktemp("pure_bf16"), "pure_bf16", PURE_BF16, "--nproc", "2"
        ),
    }
    for stage in (2, 3):
        out[f"master{stage}"] = POOL.submit(_master_check, tmp_path_factory.mktemp("master"), stage)
    zero3 = shared_run("zero3@2")
    cut = tmp_path_factory.mktemp("zero3-resume")
    out["resume"] = POOL.submit(assert_resume_exact, cut, zero3, shared_extra("zero3@2"))
    yield out
    wait_all(out.values())


@pytest.mark.slow
def test_seed_ds_config_trains_as_written(side_runs) -> None:  # noqa: ANN001
    """The seed document's section-3.1 JSON (fp16, ZeRO-3, CPU optimizer offload) unchanged."""
    from deepspeed.accelerator import get_accelerator

    run, proc = side_runs["seed"].result()
    if not get_accelerator().is_fp16_supported():  # CPUs differ: then one clear line, exit 2
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
        assert proc.stderr.strip().splitlines()[-1].startswith("error: fp16 compute"), proc.stderr
        return
    assert proc.returncode == 0, f"seed failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    got = losses(run)
    assert len(got) == 4 and all(v == v for v in got.values()), got
    precision = json.loads((run / "precision.json").read_text())["effective"]
    assert precision["compute"] == "fp16" and precision["master_weights"] == "fp32"


@pytest.mark.slow
def test_deepspeed_resume_is_bitwise_exact(side_runs) -> None:  # noqa: ANN001
    cut = side_runs["resume"].result()  # assert_resume_exact: steps 6-10 bitwise equal
    assert (cut / "checkpoints" / "step_00000005" / "model").is_dir()  # DeepSpeed's own format


def test_one_config_same_effective_dtypes_on_every_engine(tmp_path: Path, shared_run) -> None:  # noqa: ANN001
    shared_run.start("fsdp-bf16@2")  # tests/test_precision.py reads this run too
    bf16 = {"precision": {"mode": "bf16"}, "train": {"steps": 2}}
    runs = {
        backend: POOL.submit(
            train_run, tmp_path, backend, {**bf16, "parallel": {"backend": backend}}, "--nproc", "2"
        )
        for backend in ("ddp", "deepspeed")
    }  # all three at once, in the background
    reports = {"fsdp": json.loads((shared_run("fsdp-bf16@2") / "precision.json").read_text())}
    for backend, future in runs.items():
        reports[backend] = json.loads((future.result() / "precision.json").read_text())
    expected = {
        "compute": "bf16",
        "master_weights": "fp32",
        "optimizer_states": "fp32",
        "gradient_reduction": "fp32",
    }
    for backend, rep in reports.items():
        assert rep["effective"] == expected, backend
        assert rep["warnings"] == [], backend


@pytest.mark.slow
def test_bf16_master_weights_and_states(side_runs) -> None:  # noqa: ANN001
    """precision.master_dtype=bf16 maps to DeepSpeed's bf16 master weights, gradients and states."""
    run = side_runs["pure_bf16"].result()
    rep = json.loads((run / "precision.json").read_text())
    assert rep["effective"]["master_weights"] == "bf16", rep
    assert rep["effective"]["optimizer_states"] == "bf16", rep
    assert not rep["warnings"], rep["warnings"]


@pytest.mark.slow
@pytest.mark.parametrize("stage", [2, 3])
def test_bf16_master_weights_are_the_exact_fp32_init(side_runs, stage: int) -> None:  # noqa: ANN001
    """DeepSpeed would derive fp32 masters from the bf16 copy; zerofit restores the exact init, so
    ZeRO and FSDP (which shards the fp32 init itself) start from identical master weights."""
    proc = side_runs[f"master{stage}"].result()
    assert "MISMATCHED 0 []" in proc.stdout, proc.stdout[-2000:] + proc.stderr[-3000:]


def test_fp16_where_deepspeed_cannot_run_it_is_one_line(
    tmp_path: Path, monkeypatch, capsys
) -> None:  # noqa: ANN001
    """Forced path: an accelerator without fp16 (some CPUs). The seed JSON asks for fp16; the
    launcher refuses before any worker starts, in one line, exit 2, on every machine."""
    from deepspeed.accelerator import get_accelerator

    from zerofit.cli import main

    monkeypatch.setattr(type(get_accelerator()), "is_fp16_supported", lambda self: False)
    monkeypatch.chdir(tmp_path)
    # TINY's optim.lr and precision.mode left unwritten: written, they conflict with the file's
    # (one line each, before this one)
    data = {k: v for k, v in TINY.items() if k not in ("optim", "precision")}
    data["parallel"] = {"backend": "deepspeed", "deepspeed": {"config": str(SEED_JSON)}}
    cfg = tmp_path / "seed.yaml"
    cfg.write_text(yaml.safe_dump(data))
    code = main(["train", "-c", str(cfg), "--nproc", "2", "--train.micro_batch_size", "32"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert err[0].startswith("error: fp16 compute") and "use bf16 or fp32" in err[0], err
    assert not (tmp_path / "runs").exists()  # refused before the run directory


@pytest.mark.slow
def test_partial_offload_trains_in_the_sub_groups_the_planner_counts(
    fsdp_reference: dict[int, float], zero_runs: dict[str, Callable[[], Path]]
) -> None:
    """offload_ratio 0.5 in 100,000-element sub-groups (Twin-Flow: the first half of the
    sub-groups stepped by torch AdamW on the accelerator, here the CPU too, the rest by
    DeepSpeedCPUAdam, which a CPU run now gets by default): the same losses as FSDP, and
    DeepSpeed cut each rank's optimizer into exactly the sub-groups `spec.sub_groups` counts."""
    import torch

    from zerofit.backends.deepspeed.costs import sub_groups
    from zerofit.backends.terms import Workload
    from zerofit.launch.run_config import load_config
    from zerofit.models.shape import shape_from_config

    run = zero_runs["zero3_partial_offload"]()
    got = losses(run)
    assert sorted(got) == sorted(fsdp_reference) and got[10] < 0.5 * got[1], got
    worst = max(abs(got[s] - fsdp_reference[s]) / fsdp_reference[s] for s in got)
    assert worst <= RTOL, {s: (fsdp_reference[s], got[s]) for s in got}
    cfg = load_config(run / "config.yaml")
    assert cfg.parallel.deepspeed.torch_adam is False  # the hybrid optimizer needs CPU Adam
    planned = sub_groups(shape_from_config(cfg), Workload(4, 64, 2), PARTIAL["sub_group_size"])
    assert len(planned) > 4  # several sub-groups: the ratio splits them
    for rank in range(2):
        path = next(run.glob(f"checkpoints/step_*/model/zero_pp_rank_{rank}_*optim_states.pt"))
        state = torch.load(path, map_location="cpu", weights_only=False)
        zero = state["ds_config"]["zero_optimization"]
        assert (zero["sub_group_size"], zero["offload_optimizer"]["ratio"]) == (100_000, 0.5)
        flat = state["optimizer_state_dict"]["fp32_flat_groups"]
        assert [t.numel() for t in flat] == planned, rank

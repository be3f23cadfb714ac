"""The planner's candidates (compile carried, selective checkpointing, engines that refuse the
config) and its offload terms: DeepSpeed's per-micro-batch gradient round trip and sub-group
placement, FSDP2's per-micro-batch parameter fetches, and how the speed model hides them.

Nothing here needs a GPU: the local card is a fixed answer where one matters.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from test_plan_batch import _ratio_options  # the same DeepSpeed optimizer-offload selection

from zerofit.backends import get_engine
from zerofit.backends.deepspeed.costs import (
    CPU_ADAM_BW,
    FINE_SUB_GROUP_SIZE,
    SUB_GROUP_SIZE,
    cpu_share,
    decayed_matrices,
    sub_groups,
)
from zerofit.backends.deepspeed.ds_json import to_ds_json
from zerofit.backends.deepspeed.options import DeepSpeedOptions
from zerofit.backends.fsdp.spec import FOREACH_CPU_ADAM_BW, FUSED_CPU_ADAM_BW
from zerofit.backends.terms import GIB, Workload
from zerofit.cli import main
from zerofit.launch.run_config import config_from_dict, load_config
from zerofit.models.shape import ModelShape, shape_from_preset
from zerofit.planner.memory import Strategy, estimate
from zerofit.planner.plan import (
    Option,
    batch_splits,
    candidates,
    evaluate,
    left_out,
    plan,
    recommend,
)
from zerofit.planner.shape import Hardware
from zerofit.planner.speed import OVERLAP, predict

M = shape_from_preset("llama3-1b")
P = M.num_params
GB24 = 24 * 10**9
PCIE = 25e9
HW = Hardware(1, GB24, cpu_mem=128 * GIB, pcie_bw=PCIE)
OFFLOAD = Strategy.of("deepspeed", stage=3, offload_optimizer="cpu")
SHAPE_3_6B = {"dim": 3072, "n_layers": 28, "n_heads": 24, "n_kv_heads": 8, "ffn_dim": 8192}


@pytest.fixture(autouse=True)
def fixed_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    """No local GPU and 128 GiB of host RAM, whatever runs the tests."""
    import zerofit.commands.plan as command

    monkeypatch.setattr(command, "detect_hardware", lambda: None)
    monkeypatch.setattr(command, "host_ram", lambda: 128 * GIB)


# -- the candidates ---------------------------------------------------------------------------


@pytest.mark.parametrize("compiled", [True, False])
def test_candidates_carry_the_configs_compile(compiled: bool) -> None:
    """Every candidate takes the config's compile, ZeRO-3 with activation checkpointing too
    (planned eager on 2026-12-03 after a torch 2.11 failure; compiled on the H200 on 2026-12-04
    once the run stopped recording CUDA allocations around it: speed2_h200.sh c10)."""
    base = config_from_dict({"parallel": {"compile": compiled}})
    found = candidates(HW, base)
    assert found and all(s.compile == compiled for s in found)
    zero3 = [s for s in found if s.options.__class__ is DeepSpeedOptions and s.options.stage == 3]
    assert {s.activation_checkpointing for s in zero3} == {"none", "selective", "first_k", "full"}


def _plan_and_write(tmp_path: Path, capsys, fields: dict, cpu_mem: str) -> tuple[dict, Path]:
    """`zerofit plan --json --write` on a config of `fields` for one 24 GB card: (its JSON, the
    written config's path)."""
    cfg, out = tmp_path / "c.yaml", tmp_path / "out.yaml"
    cfg.write_text(yaml.safe_dump(fields))
    args = ["plan", "-c", str(cfg), "--gpus", "1", "--gpu-mem", "24GB", "--cpu-mem", cpu_mem]
    assert main([*args, "--json", "--write", str(out)]) == 0
    text = capsys.readouterr().out
    return json.loads(text[: text.rindex("}") + 1]), out


def test_the_written_config_keeps_compile(tmp_path: Path, capsys) -> None:
    """The 2026-12-03 fault: a config with compile on was written back with compile off."""
    fields = {
        "model": {"preset": "llama3-1b", "seq_len": 2048},
        "train": {"global_batch_size": 64},
        "parallel": {"compile": True},
    }
    data, out = _plan_and_write(tmp_path, capsys, fields, "128GiB")
    for o in data["options"]:
        assert o["config"]["parallel.compile"] is True, o["strategy"]
    first = data["options"][0]["config"]
    assert load_config(out).parallel.compile is first["parallel.compile"]


def test_every_engine_is_planned_with_each_checkpointing_mode() -> None:
    found = {(s.backend, s.activation_checkpointing) for s in candidates(HW)}
    assert found == {
        (e, ac)
        for e in ("ddp", "fsdp", "deepspeed")
        for ac in ("none", "selective", "first_k", "full")
    }
    sac = [o for o in plan(M, Workload(1, 2048, 1), HW) if o.strategy.label.endswith("+ SAC")]
    assert sac and all(o.strategy.activation_checkpointing == "selective" for o in sac)


FP8 = {"precision": {"fp8": "tensorwise"}}


def test_an_engine_that_refuses_the_config_is_left_out() -> None:
    base = config_from_dict(FP8)
    refused = left_out(base)
    assert list(refused) == ["deepspeed"] and "no float8 path" in refused["deepspeed"]
    assert {s.backend for s in candidates(HW, base)} == {"ddp", "fsdp"}
    assert left_out(config_from_dict({})) == {}
    assert "deepspeed" in {s.backend for s in candidates(HW, config_from_dict({}))}


def test_the_plan_says_which_engines_were_left_out(tmp_path: Path, capsys) -> None:
    """On a 24 GB card ZeRO-3 offload wins without fp8; with fp8 DeepSpeed is not planned."""
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump({"model": {"preset": "llama3-1b"}, **FP8}))
    args = ["plan", "-c", str(cfg), "--gpus", "1", "--gpu-mem", "24GB", "--global-batch", "64"]
    assert main([*args, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert list(data["left_out"]) == ["deepspeed"]
    assert not any(o["config"]["parallel.backend"] == "deepspeed" for o in data["options"])
    assert data["recommendation"] and "ZeRO" not in data["recommendation"]
    assert main(args) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if "left out" in line]
    assert len(lines) == 1 and lines[0].startswith("left out: deepspeed (precision.fp8=tensorwise")


# -- DeepSpeed: sub-groups, and what stays on the GPU -----------------------------------------


def test_sub_groups_of_the_1_5b_model_by_hand() -> None:
    """Embedding (128256 x 2048), then 12 blocks of 60,817,408 matrix parameters, then block 13's
    q (2048 x 2048), k, v (2048 x 512) and o: past 1e9, the first sub-group ends there. The rest
    of the matrices make the second; the 33 norms (2048 each) the third."""
    embedding, block = 128256 * 2048, 60_817_408
    first = embedding + 12 * block + 2 * 2048 * 2048 + 2 * 2048 * 512
    norms = 33 * 2048
    assert sum(decayed_matrices(M)) == P - norms
    assert sub_groups(M, Workload(1, 2048, 1)) == [first, P - norms - first, norms]
    assert sub_groups(M, Workload(1, 2048, 8)) == [(P - norms) / 8, norms / 8]  # under 1e9 each


@pytest.mark.parametrize(
    ("ratio", "world", "on_gpu"),
    [(1.0, 1, 0), (0.7, 1, 0), (0.65, 1, 1), (0.35, 1, 1), (0.3, 1, 2), (0.5, 8, 1), (0.55, 8, 0)],
)
def test_the_ratio_places_whole_sub_groups(ratio: float, world: int, on_gpu: int) -> None:
    """DeepSpeed puts the first int((1 - ratio) x count) sub-groups on the GPU."""
    w = Workload(1, 2048, world)
    groups = sub_groups(M, w)
    opts = replace(OFFLOAD.options, offload_ratio=ratio)
    assert cpu_share(M, w, opts) == pytest.approx(sum(groups[on_gpu:]) / sum(groups))


def test_the_1_5b_rehearsals_optimizer_was_all_on_the_cpu() -> None:
    """offload_ratio 0.7 on one GPU: nothing of the optimizer on the GPU (the plan had counted
    5.0 GiB of states and 1.7 GiB of gradients there; the run peaked 6 GiB under the forecast)."""
    s = replace(OFFLOAD, options=replace(OFFLOAD.options, offload_ratio=0.7))
    mem = estimate(M, Workload(1, 2048, 1, 64), s)
    assert mem.optimizer_states == mem.gradients == 0
    # bf16 gradient partitions + fp32 master, moments and gradients (stage3.py), and the step's
    # bf16 copy of the largest sub-group; pinned, each buffer rounds up to a power of two
    unpinned = replace(s, options=replace(s.options, pin_memory=False))
    temp = 2 * max(sub_groups(M, Workload(1, 2048, 1)))
    assert estimate(M, Workload(1, 2048, 1, 64), unpinned).host == pytest.approx(P * 18 + temp)
    assert P * 18 + temp < mem.host < 2 * P * 18
    half = estimate(
        M, Workload(1, 2048, 1, 64), replace(s, options=replace(s.options, offload_ratio=0.5))
    )
    gpu = sub_groups(M, Workload(1, 2048, 1))[0]
    assert half.optimizer_states == pytest.approx(gpu * 12)
    assert half.gradients == pytest.approx(gpu * 4)  # a GPU sub-group's fp32 gradient buffer


def test_sub_groups_follow_the_options_size() -> None:
    """At 1e8 elements: the embedding (263M) alone, then cuts after the parameter that reaches
    1e8 (a block's matrices are 60.8M, the largest 16.8M), the output layer (263M) in the last
    matrix sub-group, the norms last: 12 in all. `cpu_share` reads the options' size, not
    DeepSpeed's default."""
    w = Workload(1, 2048, 1)
    fine = sub_groups(M, w, FINE_SUB_GROUP_SIZE)
    assert DeepSpeedOptions().sub_group_size == SUB_GROUP_SIZE == 10**9
    assert sum(fine) == P and fine[0] == 128256 * 2048 and fine[-1] == 33 * 2048
    assert all(FINE_SUB_GROUP_SIZE <= g < FINE_SUB_GROUP_SIZE + 2048 * 8192 for g in fine[1:-2])
    assert len(fine) == 12 and len(sub_groups(M, w)) == 3
    assert fine[-2] == 2048 * 8192 + 128256 * 2048  # the last block's last FFN matrix + head
    opts = replace(OFFLOAD.options, offload_ratio=0.5, sub_group_size=FINE_SUB_GROUP_SIZE)
    assert cpu_share(M, w, opts) == pytest.approx(sum(fine[6:]) / P)  # 6 of 12 on the GPU


def test_tunings_try_finer_sub_groups_after_the_configs_own() -> None:
    """ZeRO-3 optimizer offload with GPU parameters: the 20 ratios at the options' size, then at
    FINE_SUB_GROUP_SIZE (only when finer); other candidates have nothing to tune."""
    engine = get_engine("deepspeed")
    tuned = engine.tunings(OFFLOAD.options)
    ratios = [round(1 - i * 0.05, 2) for i in range(20)]
    assert [(t.sub_group_size, t.offload_ratio) for t in tuned] == [
        (size, r) for size in (SUB_GROUP_SIZE, FINE_SUB_GROUP_SIZE) for r in ratios
    ]
    own = replace(OFFLOAD.options, sub_group_size=5 * 10**7)
    assert {t.sub_group_size for t in engine.tunings(own)} == {5 * 10**7}
    for other in (Strategy.of("deepspeed", stage=3), Strategy.of("deepspeed", stage=2)):
        assert engine.tunings(other.options) == [other.options]
    both = replace(OFFLOAD.options, offload_param="cpu")
    assert engine.tunings(both) == [both]
    label = engine.label(replace(OFFLOAD.options, offload_ratio=0.75, sub_group_size=10**8))
    assert label == "ZeRO-3 + optim 75%->cpu (100M sub-groups)"
    assert engine.label(replace(OFFLOAD.options, sub_group_size=10**8)) == "ZeRO-3 + optim->cpu"


def test_the_written_config_carries_the_chosen_sub_group_size(tmp_path: Path, capsys) -> None:
    """llama3-1b, seq 2048, fp32 masters, global batch 64, compiled, one 24 GB card: part of the
    optimizer stays on the GPU in 1e8-element sub-groups, and `--write` says so, down to the
    DeepSpeed JSON the run starts from. Without a global batch nothing is tuned."""
    fields = {
        "model": {"preset": "llama3-1b", "seq_len": 2048},
        "precision": {"mode": "bf16", "master_dtype": "fp32"},
        "train": {"global_batch_size": 64},
        "parallel": {"compile": True},
    }
    data, out = _plan_and_write(tmp_path, capsys, fields, "126GiB")
    first = data["options"][0]
    chosen = {k.split(".")[-1]: v for k, v in first["config"].items()}
    assert first["fits"] and first["gpu_gib"]["optimizer_states"] > 1  # some of it on the GPU
    assert chosen["sub_group_size"] == FINE_SUB_GROUP_SIZE and 0 < chosen["offload_ratio"] < 1
    ds = load_config(out).parallel.deepspeed
    assert (ds.sub_group_size, ds.offload_ratio) == (FINE_SUB_GROUP_SIZE, chosen["offload_ratio"])
    zero = to_ds_json(load_config(out), 1)["zero_optimization"]
    assert (zero["sub_group_size"], zero["offload_optimizer"]["ratio"]) == (
        FINE_SUB_GROUP_SIZE,
        chosen["offload_ratio"],
    )
    base = config_from_dict({"parallel": {"compile": True}})
    for o in _ratio_options(plan(M, Workload(4, 2048, 1, 16), HW, base)):  # no global batch
        assert (o.strategy.options.offload_ratio, o.strategy.options.sub_group_size) == (
            1.0,
            SUB_GROUP_SIZE,
        )


# -- offload time -----------------------------------------------------------------------------


def test_deepspeed_offload_seconds_by_hand() -> None:
    """Every micro-batch the bf16 gradient partition goes to the GPU and back, in turn; every
    step CPU Adam (7 fp32 streams) and the fp32 gradient down, the bf16 parameters up. Parameter
    offload adds two bf16 fetches per micro-batch, which share only the way up with the gradient
    (PCIe is full duplex), and drops the upload."""
    w = Workload(1, 2048, 1, 64)
    t = get_engine("deepspeed").offload_seconds(M, w, OFFLOAD.options, HW)
    assert t.micro_batch == pytest.approx(2 * P * 2 / PCIE)
    assert t.step == pytest.approx(P * 7 * 4 / CPU_ADAM_BW + P * (4 + 2) / PCIE)
    both = replace(OFFLOAD.options, offload_param="cpu")
    t = get_engine("deepspeed").offload_seconds(M, w, both, HW)
    assert t.micro_batch == pytest.approx(P * 2 / PCIE + 2 * P * 2 / PCIE)
    assert t.step == pytest.approx(P * 7 * 4 / CPU_ADAM_BW + P * 4 / PCIE)
    none = get_engine("deepspeed").offload_seconds(M, w, Strategy.of("deepspeed").options, HW)
    assert (none.micro_batch, none.step) == (0, 0)


def test_fsdp_offload_seconds_by_hand() -> None:
    """Every micro-batch the fp32 shards go up for each all-gather: 15 blocks twice, the last
    block and the root once; every step the fp32 gradient down and torch's CPU AdamW (7 fp32
    streams), fused unless `optim.fused` is false."""
    opts = Strategy.of("fsdp", cpu_offload=True).options
    for fused, rate in ((True, FUSED_CPU_ADAM_BW), (False, FOREACH_CPU_ADAM_BW)):
        w = Workload(1, 2048, 1, 64, fused_optim=fused)
        t = get_engine("fsdp").offload_seconds(M, w, opts, HW)
        fetched = (31 * M.block_params + M.root_params) * 4
        assert t.micro_batch == pytest.approx(fetched / PCIE)
        assert t.step == pytest.approx(P * 7 * 4 / rate + P * 4 / PCIE)
    assert FUSED_CPU_ADAM_BW > 2 * FOREACH_CPU_ADAM_BW


def test_copies_hide_under_compute_only_up_to_the_overlap() -> None:
    """step = compute + CPU step + what of the micro-batch copies exceeds OVERLAP x compute."""
    for w in (Workload(1, 2048, 1, 64), Workload(32, 2048, 1, 2)):
        t = get_engine("deepspeed").offload_seconds(M, w, OFFLOAD.options, HW)
        speed = predict(M, w, OFFLOAD, HW)
        copies = max(0.0, 64 // w.micro_batch_size * t.micro_batch - OVERLAP * speed.compute)
        assert speed.offload == pytest.approx(t.step + copies)
    assert predict(M, Workload(1, 2048, 1, 64), OFFLOAD, HW).offload > 10  # 64 round trips
    assert predict(M, Workload(32, 2048, 1, 2), OFFLOAD, HW).offload < 2  # 2, hidden


def test_with_offload_fewer_micro_batches_are_faster() -> None:
    """A fixed global batch on one GPU: without offload every split computes the same, until
    micro-batches are so small that the host's launches and hooks (each micro-batch's) take
    longer; with offload each micro-batch adds its copies, so the largest micro-batch is the
    fastest."""
    splits = batch_splits(64, 1)
    for s in (OFFLOAD, Strategy.of("fsdp", cpu_offload=True)):
        times = [predict(M, Workload(mb, 2048, 1, acc), s, HW).step_time for mb, acc in splits]
        assert times == sorted(times), s.label  # largest micro-batch first: fastest first
        assert times[-1] > 3 * times[0], s.label
    plain = Strategy.of("deepspeed", stage=3)
    times = [predict(M, Workload(mb, 2048, 1, acc), plain, HW).step_time for mb, acc in splits]
    assert times[1] == pytest.approx(times[0]) and times == sorted(times)


def test_fsdp_offload_holds_unsharded_gradients_between_syncs() -> None:
    """zerofit syncs FSDP2 gradients on the last micro-batch only: until then each rank keeps the
    unsharded fp32 gradients on the GPU, CPU offload or not."""
    s = Strategy.of("fsdp", cpu_offload=True)
    one, many = (estimate(M, Workload(4, 2048, 1, acc), s) for acc in (1, 16))
    assert many.peak_allocated - one.peak_allocated == pytest.approx(P * 4)


def test_offload_picks_the_largest_micro_batch_that_fits_for_the_3_6b_shape() -> None:
    """The 2026-12-03 rehearsal's second shape (compile on): once recommended at micro-batch
    1 x 64 (written eager, ~79 s a step by today's terms; it did not finish 4 steps in 240 s);
    now a larger micro-batch under full activation checkpointing, its copies hidden."""
    m = shape_from_preset("llama3-1b", SHAPE_3_6B)
    old = Strategy.of("deepspeed", stage=3, offload_optimizer="cpu", offload_param="cpu")
    assert predict(m, Workload(1, 2048, 1, 64), old, HW).step_time > 60
    base = config_from_dict({"parallel": {"compile": True}})
    best = recommend(plan(m, Workload(1, 2048, 1), HW, base, batch_splits(64, 1)))
    assert best is not None and best.workload is not None and best.memory.host > 0
    assert best.workload.micro_batch_size >= 8 and best.strategy.activation_checkpointing == "full"
    assert best.strategy.compile  # the config's compile, kept
    assert best.speed.offload < 0.5 * best.speed.step_time


# -- the offload ratio, and the micro-batch offload runs at ------------------------------------

SHAPES = {"1.5B": M, "3B": ModelShape("3b", 28, 3072, 24, 8, 8192, 128256)}


def _planned(m: ModelShape) -> list[Option]:
    return plan(m, Workload(1, 2048, 1), HW, splits=batch_splits(64, 1))


def _check_ratio(m: ModelShape, o: Option, hw: Hardware = HW) -> None:
    """A fitting partial offload's ratio: in steps of 0.05; the next smaller one that moves a
    sub-group onto the GPU does not fit (and would have been faster); the next larger one moves
    a sub-group off (of ratios DeepSpeed places alike, the largest is taken)."""
    ratio, w = o.strategy.options.offload_ratio, o.workload
    assert round(ratio / 0.05) * 0.05 == pytest.approx(ratio)  # in steps of 0.05
    assert o.strategy.label.startswith("ZeRO-3 + optim")
    share = cpu_share(m, w, o.strategy.options)
    ratios = [round(i * 0.05, 2) for i in range(1, 21)]
    moved = {r: replace(o.strategy.options, offload_ratio=r) for r in ratios}
    smaller = [r for r in ratios if r < ratio and cpu_share(m, w, moved[r]) < share]
    if smaller:
        less = evaluate(m, w, hw, replace(o.strategy, options=moved[smaller[-1]]))
        assert not less.fits, o.strategy.label
        assert less.speed.step_time < o.speed.step_time  # what it would have won
    if ratio < 1:
        assert cpu_share(m, w, moved[round(ratio + 0.05, 2)]) > share, o.strategy.label


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_the_offload_ratio_is_the_fastest_that_fits(name: str) -> None:
    """On a 24 GB card a GPU-resident sub-group of DeepSpeed's default size (a billion elements,
    16 GB in fp32) never fits beside the rest. In 1e8-element sub-groups the 1.5B model keeps
    its first ones (the embedding, 263M, then about 100M each) on the GPU; the 3B model's first
    sub-group is its embedding alone (394M, 6.3 GB), too large: all of it goes to the CPU."""
    m = SHAPES[name]
    partial = _ratio_options(_planned(m))
    assert len(partial) == 4  # without, selective, the fewest first blocks and full checkpointing
    fitting = [o for o in partial if o.fits]
    assert fitting
    for o in fitting:
        opts = o.strategy.options
        if opts.offload_ratio < 1:
            assert opts.sub_group_size == FINE_SUB_GROUP_SIZE, o.strategy.label
        else:
            assert opts.sub_group_size == SUB_GROUP_SIZE, o.strategy.label  # the default first
        _check_ratio(m, o)
    kept = [o.strategy.options.offload_ratio < 1 for o in fitting]
    assert any(kept) == (name == "1.5B"), [o.strategy.label for o in fitting]


def test_a_partial_offload_fits_where_a_sub_group_does() -> None:
    """13B with bf16 states on an 80 GB card: part of the optimizer stays on the GPU."""
    m = shape_from_preset("13b")
    w = Workload(1, 2048, 1, master_dtype="bf16")
    hw = Hardware(1, 80 * 10**9, cpu_mem=256 * GIB)
    partial = [o for o in _ratio_options(plan(m, w, hw, splits=batch_splits(16, 1))) if o.fits]
    assert any(o.strategy.options.offload_ratio < 1 for o in partial)
    for o in partial:
        assert o.workload is not None
        _check_ratio(m, o, hw)


def test_on_the_1_5b_shape_offload_wins_at_a_large_micro_batch() -> None:
    """One 24 GB card, 64 x 2048 sequences: no strategy without offload fits. Offload copies
    every micro-batch (gradients for ZeRO-3, parameters for FSDP2), so the winner checkpoints
    activations to run fewer, larger micro-batches than it could without."""
    options = _planned(SHAPES["1.5B"])
    assert not any(o.fits for o in options if o.memory.host == 0)
    best = recommend(options)
    assert best is not None and best.memory.host > 0
    assert best.workload is not None and best.strategy.activation_checkpointing != "none"

    def kind(o: Option) -> object:  # the strategy but its AC mode (and DeepSpeed's split)
        opts = o.strategy.options
        if isinstance(opts, DeepSpeedOptions):
            opts = replace(opts, offload_ratio=1.0, sub_group_size=SUB_GROUP_SIZE)
        return (o.strategy.backend, opts)

    plain = next(
        o
        for o in options
        if o.strategy.activation_checkpointing == "none" and kind(o) == kind(best)
    )
    assert plain.fits and plain.workload is not None
    assert plain.workload.micro_batch_size < best.workload.micro_batch_size
    assert plain.speed.step_time > best.speed.step_time

"""A fixed global batch and a GPU memory cap: the planner picks micro-batch x accumulation and
DeepSpeed's offload_ratio per strategy; `train.gpu_memory_limit` rehearses a smaller card.

Nothing here needs a GPU: the local card is a fixed answer where one matters, and the CUDA calls
of the cap are replaced by recorders.
"""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import yaml

from zerofit.backends.terms import Workload
from zerofit.cli import main
from zerofit.config import check_world
from zerofit.config.sizes import memory_fraction, parse_size
from zerofit.distributed.mesh import DistContext, cap_gpu_memory
from zerofit.errors import UserError
from zerofit.launch import run_lock
from zerofit.launch.options import LaunchOptions
from zerofit.launch.prepare import prepare_run
from zerofit.launch.resolve import resolve
from zerofit.launch.run_config import config_from_dict, load_config
from zerofit.models.shape import ModelShape, shape_from_preset
from zerofit.planner import auto
from zerofit.planner.plan import Option, batch_splits, candidates, evaluate, plan, recommend
from zerofit.planner.shape import Hardware
from zerofit.report.doctor import oom_advice

GIB = 2**30
GB24 = 24 * 10**9
SHAPES = {
    "1.5B": shape_from_preset("llama3-1b"),
    "3B": ModelShape("3b", 28, 3072, 24, 8, 8192, 128256),  # Llama-3.2-3B's shape
}
GLOBAL, SEQ = 64, 2048


@pytest.fixture(autouse=True)
def fixed_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    """No local GPU and 128 GiB of host RAM, whatever runs the tests."""
    import zerofit.commands.plan as command

    monkeypatch.setattr(command, "detect_hardware", lambda: None)
    monkeypatch.setattr(command, "host_ram", lambda: 128 * GIB)


def one_line_exit_2(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    try:
        code = main(list(args))
    except SystemExit as e:
        code = e.code
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert len(err.splitlines()) == 1 and err.startswith("error: "), err
    return err


# -- sizes ------------------------------------------------------------------------------------


def test_one_size_reader_for_every_size() -> None:
    from zerofit.export.run import parse_size as shard_size
    from zerofit.planner.shape import parse_size as plan_size

    assert parse_size("24GB") == GB24 and parse_size("22GiB") == 22 * GIB
    assert parse_size("24e9") == GB24 and parse_size("512G") == 512 * GIB
    assert plan_size("2.5e3") == 2500 and shard_size("20MiB") == 20 * 2**20
    with pytest.raises(UserError, match="at least 1 byte"):
        shard_size("0")  # a shard of no bytes: refused by the export alone
    assert plan_size("0") == 0


@pytest.mark.parametrize(
    ("value", "needle"),
    [
        ("lots", "train.gpu_memory_limit: cannot read: 'lots'"),
        ("-5GB", "train.gpu_memory_limit: a size cannot be negative: '-5GB'"),
        ("0GB", "train.gpu_memory_limit must be >= 1, got '0GB'"),
        ("1e400", "train.gpu_memory_limit: cannot read: '1e400'"),
        ("3PB", "train.gpu_memory_limit must be <= 1125899906842624"),
    ],
)
def test_a_bad_limit_is_one_line_and_exit_2_at_config_load(
    capsys, tmp_path: Path, value: str, needle: str
) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump({"train": {"gpu_memory_limit": value}}))
    assert needle in one_line_exit_2(capsys, "train", "-c", str(cfg))
    assert needle in one_line_exit_2(capsys, "plan", "-c", str(cfg), "--gpus", "1")
    err = one_line_exit_2(capsys, "train", f"--train.gpu_memory_limit={value}")
    assert needle in err


@pytest.mark.parametrize(
    ("value", "size"),
    [("24GB", GB24), ("22GiB", 22 * GIB), ("24e9", GB24), (GB24, GB24), (2.4e10, GB24)],
)
def test_a_limit_reads_as_bytes(value: object, size: int) -> None:
    assert config_from_dict({"train": {"gpu_memory_limit": value}}).train.gpu_memory_limit == size
    assert config_from_dict({}).train.gpu_memory_limit is None


# -- the cap in each worker -------------------------------------------------------------------


def test_the_fraction_is_the_limit_over_the_card() -> None:
    assert memory_fraction(GB24, 80 * 10**9) == pytest.approx(0.3)
    assert memory_fraction(80 * 10**9, 80 * 10**9) == 1.0
    with pytest.raises(UserError) as e:
        memory_fraction(GB24, 16 * GIB, "NVIDIA RTX A4000")
    msg = str(e.value)
    assert "more than the 16.0 GiB of NVIDIA RTX A4000" in msg and "\n" not in msg


def _ctx(rank: int, device: str) -> DistContext:
    return DistContext(rank, 2, rank, torch.device(device), 1, 2)


def test_on_cpu_the_limit_is_a_note_on_rank_0(capsys) -> None:
    assert cap_gpu_memory(GB24, _ctx(0, "cpu")) is None
    out = capsys.readouterr().out.strip().splitlines()
    assert out == [
        "note: train.gpu_memory_limit (22.4 GiB) is ignored on CPU: there is no GPU memory to cap"
    ]
    assert cap_gpu_memory(GB24, _ctx(1, "cpu")) is None
    assert cap_gpu_memory(None, _ctx(0, "cpu")) is None
    assert capsys.readouterr().out == ""


def test_on_cuda_the_allocator_gets_the_fraction(monkeypatch, capsys) -> None:
    calls: list[tuple[float, object]] = []
    total = 80 * GIB
    monkeypatch.setattr(
        torch.cuda, "get_device_properties", lambda d=None: SimpleNamespace(total_memory=total)
    )
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda d=None: "NVIDIA H100 80GB HBM3")
    monkeypatch.setattr(
        torch.cuda, "set_per_process_memory_fraction", lambda f, d=None: calls.append((f, d))
    )
    ctx = _ctx(0, "cuda:0")
    assert cap_gpu_memory(GB24, ctx) == pytest.approx(GB24 / total)
    assert calls == [(pytest.approx(GB24 / total), ctx.device)]
    assert "capped at 22.4 GiB of 80.0 GiB" in capsys.readouterr().out
    with pytest.raises(UserError, match="more than the 80.0 GiB of NVIDIA H100 80GB HBM3"):
        cap_gpu_memory(100 * GIB, ctx)
    assert len(calls) == 1  # nothing applied when refused


def test_the_worker_caps_before_it_builds_the_model(monkeypatch, capsys, tmp_path) -> None:
    import zerofit.train.run as run
    from zerofit.distributed.mesh import shutdown

    class Built(Exception):
        """The Trainer (the model) is being built: what was said before it."""

    def trainer(*args: object, **kwargs: object) -> None:
        raise Built(capsys.readouterr().out)

    monkeypatch.setattr(run, "Trainer", trainer)
    cfg = config_from_dict({"train": {"gpu_memory_limit": "24GB"}})
    try:
        with pytest.raises(Built) as e:
            run.run_training(cfg, tmp_path, None)
    finally:
        shutdown()
    assert "note: train.gpu_memory_limit (22.4 GiB) is ignored on CPU" in str(e.value)


def test_the_oom_advice_plans_for_the_cap() -> None:
    fields = {"model": {"preset": "llama3-1b", "seq_len": SEQ}, "train": {"micro_batch_size": 8}}
    plain = oom_advice(config_from_dict(fields), 1, 80 * 10**9)
    fields["train"]["gpu_memory_limit"] = "24GB"
    capped = oom_advice(config_from_dict(fields), 1, 80 * 10**9)
    assert "next step: turn on activation checkpointing" in plain and "capped" not in plain
    assert "capped at 22.4 GiB by train.gpu_memory_limit" in capped
    assert "turn on activation checkpointing" not in capped  # 26.6 GiB: over a 24 GB card


# -- micro-batch x accumulation and the offload ratio -----------------------------------------


def test_splits_of_a_global_batch() -> None:
    assert batch_splits(64, 2) == [(32, 1), (16, 2), (8, 4), (4, 8), (2, 16), (1, 32)]
    assert batch_splits(64, 2, micro=4) == [(4, 8)] and batch_splits(12, 1, accum=4) == [(3, 4)]
    with pytest.raises(UserError, match="64 sequences does not split over 3 GPUs"):
        batch_splits(64, 3)
    with pytest.raises(UserError, match="micro-batch 3 does not make it"):
        batch_splits(64, 2, micro=3)


def _planned(shape: ModelShape, gpus: int = 1) -> list[Option]:
    hw = Hardware(gpus, GB24, cpu_mem=128 * GIB)
    return plan(shape, Workload(1, SEQ, gpus), hw, splits=batch_splits(GLOBAL, gpus))


def _hw(o: Option) -> Hardware:
    assert o.workload is not None
    return Hardware(o.workload.world_size, GB24, cpu_mem=128 * GIB)


@pytest.mark.parametrize("name", sorted(SHAPES))
@pytest.mark.parametrize("gpus", [1, 2])
def test_each_strategy_takes_the_largest_micro_batch_that_fits(name: str, gpus: int) -> None:
    m = SHAPES[name]
    options = _planned(m, gpus)
    best = recommend(options)
    assert best is not None and best.fits
    fitting = [o for o in options if o.fits]
    assert len(fitting) >= 3
    for o in options:
        w = o.workload
        assert w is not None and w.micro_batch_size * w.grad_accum_steps * gpus == GLOBAL
    for o in fitting:
        w = o.workload
        larger = [(mb, acc) for mb, acc in batch_splits(GLOBAL, gpus) if mb > w.micro_batch_size]
        if larger:  # the next larger divisor does not fit (at the same engine options)
            mb, acc = larger[-1]
            bigger = evaluate(
                m, replace(w, micro_batch_size=mb, grad_accum_steps=acc), _hw(o), o.strategy
            )
            assert not bigger.fits, (o.strategy.label, mb)


def _ratio_options(options: list[Option]) -> list[Option]:
    return [
        o
        for o in options
        if o.strategy.backend == "deepspeed"
        and o.strategy.options.offload_optimizer == "cpu"
        and o.strategy.options.offload_param == "none"
    ]


def test_without_a_global_batch_the_config_micro_batch_stays() -> None:
    w = Workload(2, SEQ, 1, grad_accum_steps=3)
    options = plan(SHAPES["1.5B"], w, Hardware(1, GB24, cpu_mem=128 * GIB))
    assert {o.workload for o in options} == {w}
    assert all(o.strategy.options.offload_ratio == 1.0 for o in _ratio_options(options))


# -- the command ------------------------------------------------------------------------------


PLAN = ("plan", "--preset", "llama3-1b", "--gpus", "1", "--cpu-mem", "128GiB", "--seq-len", "2048")


def test_written_config_round_trips_with_the_choices(tmp_path: Path, capsys) -> None:
    out = tmp_path / "best.yaml"
    args = (*PLAN, "--gpu-mem", "24GB", "--global-batch", "64", "--json", "--write", str(out))
    assert main(list(args)) == 0
    captured = capsys.readouterr()
    data = json.loads(captured.out)  # with --json stdout is the JSON alone; notes go to stderr
    text = captured.err
    assert data["workload"]["global_batch_size"] == 64
    first = data["options"][0]
    assert first["strategy"] == data["recommendation"] and first["fits"]
    mbs, acc = first["micro_batch_size"], first["grad_accum_steps"]
    assert f"micro-batch {mbs} x accumulation {acc} x 1 GPUs = global batch 64" in text
    cfg = load_config(out)
    t = cfg.train
    assert (t.micro_batch_size, t.grad_accum_steps, t.global_batch_size) == (mbs, acc, 64)
    assert mbs > 1  # offload copies every micro-batch: fewer, larger ones
    assert check_world(cfg, 1) == 1  # the batch arithmetic a run checks
    for key, value in first["config"].items():  # every field the plan chose, as written
        section, _, name = key.rpartition(".")
        node = cfg
        for part in section.split("."):
            node = getattr(node, part)
        assert getattr(node, name) == value, key
    ac = first["config"]["parallel.activation_checkpointing"]
    assert ac in ("first_k", "full")  # activations recomputed: 24 GB holds too few of them
    assert (cfg.parallel.ac_blocks is not None) == (ac == "first_k")
    offload = cfg.parallel.fsdp.cpu_offload or cfg.parallel.deepspeed.offload_optimizer == "cpu"
    assert offload and cfg.parallel.backend == first["config"]["parallel.backend"]
    assert t.gpu_memory_limit is None  # no GPU here: nothing to rehearse on


def test_the_table_shows_micro_batch_x_accumulation(capsys) -> None:
    assert main([*PLAN, "--gpu-mem", "24GB", "--global-batch", "64"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "global batch 64 x seq 2048 (micro-batch x accumulation per strategy)" in text
    assert "micro x acc" in text and "│ 8 x 8 │" in text and "│ 2 x 32 │" in text
    # parallel.compile auto plans compiled blocks (a plan is for a GPU): c18's measured 24 GB plan
    best = r"recommended: ZeRO-3 \+ optim 80%->cpu .*\+ AC( first \d+)? at micro-batch 8 x accumulation 8"
    assert re.search(best, text), text


def test_plan_uses_the_configs_limit_and_global_batch(tmp_path: Path, capsys) -> None:
    cfg = tmp_path / "c.yaml"
    fields = {
        "model": {"preset": "llama3-1b", "seq_len": SEQ},
        "train": {"gpu_memory_limit": "24GB", "global_batch_size": 64},
    }
    cfg.write_text(yaml.safe_dump(fields))
    args = ["plan", "-c", str(cfg), "--gpus", "1", "--cpu-mem", "128GiB", "--json"]
    assert main(args) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["hardware"]["gpu_mem_gib"] == pytest.approx(GB24 / GIB)
    assert data["hardware"]["gpu_mem_from"] == "train.gpu_memory_limit"
    assert data["workload"]["global_batch_size"] == 64
    assert "offload" in data["recommendation"] or "optim" in data["recommendation"]  # 24 GB
    assert main([*args, "--gpu-mem", "80GB"]) == 0  # the flag wins
    data = json.loads(capsys.readouterr().out)
    assert data["hardware"]["gpu_mem_gib"] == pytest.approx(80e9 / GIB)
    assert "cpu" not in data["recommendation"] and "offload" not in data["recommendation"]
    assert all(o["micro_batch_size"] * o["grad_accum_steps"] == 64 for o in data["options"])


def _detected(monkeypatch: pytest.MonkeyPatch, memory: int) -> None:
    import zerofit.commands.plan as command

    here = Hardware(1, memory, cpu_mem=128 * GIB, name="H200", gpu_from="detected")
    monkeypatch.setattr(command, "detect_hardware", lambda: here)


def test_a_smaller_gpu_mem_is_written_as_the_limit(tmp_path: Path, capsys, monkeypatch) -> None:
    _detected(monkeypatch, 141 * 10**9)
    out = tmp_path / "rehearse.yaml"
    assert main([*PLAN, "--gpu-mem", "24GB", "--write", str(out)]) == 0
    said = capsys.readouterr().out
    assert "train.gpu_memory_limit: 22.4 GiB since this machine's GPUs have 131.3 GiB" in said
    assert "faithful rehearsal" in said
    assert load_config(out).train.gpu_memory_limit == GB24
    _detected(monkeypatch, 16 * 10**9)  # the card here is smaller: nothing to cap
    assert main([*PLAN, "--gpu-mem", "24GB", "--write", str(out)]) == 0
    assert "gpu_memory_limit" not in capsys.readouterr().out
    assert load_config(out).train.gpu_memory_limit is None


def test_an_explicit_gpu_mem_replaces_the_configs_limit(
    tmp_path: Path, capsys, monkeypatch
) -> None:
    cfg, out = tmp_path / "c.yaml", tmp_path / "out.yaml"
    fields = {"model": {"preset": "llama3-1b"}, "train": {"gpu_memory_limit": "20GB"}}
    cfg.write_text(yaml.safe_dump(fields))
    args = ["plan", "-c", str(cfg), "--gpus", "1", "--cpu-mem", "128GiB", "--write", str(out)]
    assert main([*args, "--gpu-mem", "24GB"]) == 0  # no GPU here: the plan's figure travels
    assert "train.gpu_memory_limit: 22.4 GiB (--gpu-mem) replaces the config's 18.6 GiB" in (
        capsys.readouterr().out
    )
    assert load_config(out).train.gpu_memory_limit == GB24
    assert main(args) == 0  # without --gpu-mem the config's limit is planned for and kept
    assert load_config(out).train.gpu_memory_limit == 20 * 10**9
    _detected(monkeypatch, 22 * 10**9)  # a card here no larger than --gpu-mem: nothing to cap
    assert main([*args, "--gpu-mem", "24GB"]) == 0
    assert "train.gpu_memory_limit removed: the GPUs here have 20.5 GiB" in capsys.readouterr().out
    assert load_config(out).train.gpu_memory_limit is None


def test_a_limit_above_the_card_here_is_refused(tmp_path: Path, capsys, monkeypatch) -> None:
    _detected(monkeypatch, 16 * 10**9)
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump({"train": {"gpu_memory_limit": "24GB"}}))
    err = one_line_exit_2(capsys, "plan", "-c", str(cfg))
    assert "train.gpu_memory_limit is 22.4 GiB" in err and "more than the 14.9 GiB of H200" in err


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (("--global-batch", "0"), "--global-batch must be a whole number from 1"),
        (("--global-batch", "many"), "--global-batch must be a whole number"),
        (("--global-batch", "63", "--gpus", "2"), "63 sequences does not split over 2 GPUs"),
        (("--global-batch", "64", "--micro-batch", "3"), "micro-batch 3 does not make it"),
    ],
)
def test_bad_global_batches_are_one_line_and_exit_2(capsys, args: tuple, needle: str) -> None:
    assert needle in one_line_exit_2(capsys, *PLAN, "--gpu-mem", "24GB", *args)


# -- parallel.backend: auto -------------------------------------------------------------------


def test_auto_plans_for_the_limit_and_picks_the_batch(monkeypatch, capsys) -> None:
    import zerofit.planner.auto as auto

    here = Hardware(1, 80 * 10**9, cpu_mem=128 * GIB, name="H100 SXM", gpu_from="detected")
    monkeypatch.setattr(auto, "detect_hardware", lambda: here)
    fields = {
        "model": {"preset": "llama3-1b", "seq_len": SEQ},
        "train": {"global_batch_size": 64},
        "parallel": {"backend": "auto"},
    }
    whole = auto.resolve_auto(config_from_dict(fields), 1)
    fields["train"]["gpu_memory_limit"] = "24GB"
    capped = auto.resolve_auto(config_from_dict(fields), 1)
    said = capsys.readouterr().out
    for cfg in (whole, capped):
        assert cfg.train.micro_batch_size * cfg.train.grad_accum_steps == 64
        check_world(cfg, 1)
    p = capped.parallel
    assert p.fsdp.cpu_offload if p.backend == "fsdp" else p.deepspeed.offload_optimizer == "cpu"
    assert capped.train.micro_batch_size > 1  # offload: fewer, larger micro-batches
    assert whole.parallel.deepspeed.offload_optimizer == "none" or whole.parallel.backend != (
        "deepspeed"
    )
    assert "of the 22.4 GiB train.gpu_memory_limit" in said
    fields["train"]["gpu_memory_limit"] = "90GB"
    with pytest.raises(UserError, match="more than the 74.5 GiB of H100 SXM"):
        auto.resolve_auto(config_from_dict(fields), 1)


@pytest.mark.parametrize(
    "ac",
    [
        {"activation_checkpointing": "full"},
        {"activation_checkpointing": "first_k", "ac_blocks": 3},
        {"activation_checkpointing": "every_k", "ac_every": 4},
    ],
)
def test_auto_keeps_the_activation_checkpointing_the_user_wrote(monkeypatch, capsys, ac) -> None:
    """`parallel.backend: auto` picked its own recomputation over a written `full` (an H100 DPO
    run's "full AC" variant peaked at the recipe's 38.7 GiB): the planner picks the engine and
    keeps what the user wrote, k included; unwritten, it picks the checkpointing too."""
    here = Hardware(1, 80 * 10**9, cpu_mem=128 * GIB, name="H100 SXM", gpu_from="detected")
    monkeypatch.setattr(auto, "detect_hardware", lambda: here)
    fields = {"model": {"preset": "llama3-1b", "seq_len": SEQ}, "parallel": {"backend": "auto"}}
    free = auto.resolve_auto(config_from_dict(fields), 1)
    assert free.parallel.activation_checkpointing != "full"  # a roomy card: it recomputes less
    fields["parallel"].update(ac)
    cfg = config_from_dict(fields)
    for got in (auto.resolve_auto(cfg, 1), resolve(cfg, 1, "cuda")):
        assert got.parallel.backend != "auto"
        for key, value in ac.items():
            assert getattr(got.parallel, key) == value, key
    assert "activation checkpointing as configured" in capsys.readouterr().out


def test_kept_checkpointing_is_among_the_plans_own_strategies() -> None:
    """`full` kept under `auto`: the kept strategies are the plan's own `full` rows (the same
    ac_blocks and ac_every), so `plan -c` finds its pick among them and ranks it."""
    fields = {"backend": "auto", "activation_checkpointing": "full"}
    cfg = config_from_dict({"model": {"preset": "llama3-1b"}, "parallel": fields})
    hw = Hardware(1, 80 * 10**9, cpu_mem=128 * GIB)
    kept = candidates(hw, cfg, keep_ac=True)
    assert kept and {s.activation_checkpointing for s in kept} == {"full"}
    assert kept == [s for s in candidates(hw, cfg) if s.activation_checkpointing == "full"]


def test_the_launch_keeps_the_written_checkpointing_under_auto(monkeypatch, tmp_path) -> None:
    """The launcher's own path (`prepare_run`: `~` expanded in two paths, then resolved). The
    expansion replaced the config, dropping the keys the user wrote, so on every GPU `auto` took
    its own recomputation over a written `full`: an H100 8B DPO LoRA run asked for full AC ran
    FSDP without it at 38.7 GiB, its saved config.yaml saying `none`."""
    here = Hardware(1, 80 * 10**9, cpu_mem=128 * GIB, name="H100 SXM", gpu_from="detected")
    monkeypatch.setattr(auto, "detect_hardware", lambda: here)
    monkeypatch.chdir(tmp_path)
    base = ["parallel.backend=auto", "data.max_tokens=20000", "train.steps=2"]
    for ac, want in (([], "none"), (["parallel.activation_checkpointing=full"], "full")):
        run = tmp_path / want
        cfg = load_config(None, [*base, *ac, f"log.run_dir={run}"])
        try:
            prep = prepare_run(cfg, LaunchOptions(), 1, "cuda")
        finally:
            run_lock.release_all()
        assert prep.cfg.parallel.backend != "auto"
        assert prep.cfg.parallel.activation_checkpointing == want  # a roomy card: none unwritten
        assert load_config(run / "config.yaml").parallel.activation_checkpointing == want

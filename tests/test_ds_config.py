"""The zerofit <-> DeepSpeed JSON table, and merging a user's ds_config.json."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from zerofit.backends.deepspeed.ds_json import TABLE, to_ds_json
from zerofit.backends.deepspeed.merge import merge_user_json
from zerofit.backends.deepspeed.options import DeepSpeedOptions
from zerofit.config import get_field
from zerofit.errors import UserError
from zerofit.launch.resolve import resolve
from zerofit.launch.run_config import load_config

SEED = Path(__file__).resolve().parents[1] / "configs" / "deepspeed"
NOT_IN_JSON = {"config", "leaf_blocks", "torch_adam"}  # no JSON key (torch_adam: in zerofit's
# own optimizer block only, never added to a file's: test_ds_json_resolve)


@pytest.fixture(autouse=True)
def fp16_everywhere(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests translate configs; whether this CPU runs fp16 is test_deepspeed's business."""
    monkeypatch.setattr("zerofit.backends.deepspeed.spec.fp16_supported", lambda: True)


def prepared(overrides: list[str], world: int = 2):
    cfg = load_config(None, ["parallel.backend=deepspeed", *overrides])
    return resolve(cfg, world, "cpu")


def test_every_deepspeed_option_has_a_row() -> None:
    fields = {f"parallel.deepspeed.{f.name}" for f in dataclasses.fields(DeepSpeedOptions)} - {
        f"parallel.deepspeed.{n}" for n in NOT_IN_JSON
    }
    assert fields <= {row.field for row in TABLE}


@pytest.mark.parametrize(
    "overrides",
    [
        [],
        ["parallel.deepspeed.stage=1", "optim.grad_clip=null", "precision.mode=bf16"],
        [
            "parallel.deepspeed.offload_optimizer=cpu",
            "parallel.deepspeed.offload_param=cpu",
            "precision.mode=fp16",
        ],
        [
            "parallel.deepspeed.offload_optimizer=nvme",
            "parallel.deepspeed.nvme_path=/ssd",
            "train.grad_accum_steps=4",
        ],
        ["optim.lr=2e-4", "optim.betas=[0.8, 0.99]", "parallel.deepspeed.reduce_bucket_size=12345"],
        [
            "parallel.deepspeed.offload_optimizer=cpu",
            "parallel.deepspeed.offload_ratio=0.25",
            "parallel.deepspeed.sub_group_size=100000000",
        ],
    ],
)
def test_table_round_trips(tmp_path: Path, overrides: list[str]) -> None:
    """zerofit config -> DeepSpeed JSON -> (as a user's file) -> the same zerofit values."""
    cfg = prepared(overrides)
    ds = to_ds_json(cfg, 2)
    assert ds["train_batch_size"] == cfg.train.micro_batch_size * cfg.train.grad_accum_steps * 2
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(ds))
    back = prepared([f"parallel.deepspeed.config={path}"])
    for row in TABLE:
        if row.when(cfg):
            assert get_field(back, row.field) == get_field(cfg, row.field), row.path
    assert to_ds_json(back, 2) == to_ds_json(dataclasses.replace(cfg, parallel=back.parallel), 2)


def test_seed_example_3_1_is_adopted() -> None:
    cfg = prepared([f"parallel.deepspeed.config={SEED / 'seed_zero3_offload.json'}"])
    assert cfg.train.micro_batch_size == 32  # train_batch_size 64 / (accum 1 x world 2)
    assert (cfg.optim.lr, cfg.optim.weight_decay) == (6e-5, 0.01)
    assert cfg.precision.param_dtype == "fp16" and cfg.parallel.deepspeed.loss_scale_window == 100
    ds = cfg.parallel.deepspeed
    assert (ds.stage, ds.offload_optimizer, ds.pin_memory, ds.allgather_bucket_size) == (
        3,
        "cpu",
        True,
        500_000_000,
    )


def test_seed_example_3_2_and_passthrough(tmp_path: Path) -> None:
    user = json.loads((SEED / "seed_buckets.json").read_text())
    user["zero_optimization"]["round_robin_gradients"] = True  # not in the table: passes through
    user["zero_optimization"]["sub_group_size"] = 1e6  # in the table: adopted, as an int
    user["steps_per_print"] = 7
    path = tmp_path / "u.json"
    path.write_text(json.dumps(user))
    cfg = prepared([f"parallel.deepspeed.config={path}"])
    assert cfg.parallel.deepspeed.reduce_bucket_size == 200_000_000
    assert cfg.parallel.deepspeed.sub_group_size == 1_000_000
    ds = to_ds_json(cfg, 2)
    assert ds["zero_optimization"]["round_robin_gradients"] is True
    assert ds["zero_optimization"]["sub_group_size"] == 1_000_000
    assert ds["zero_optimization"]["allgather_bucket_size"] == 200_000_000
    assert ds["steps_per_print"] == 7  # the file's own: zerofit fills only what it leaves out


def test_sub_group_size_reaches_deepspeed_at_stage_3() -> None:
    """DeepSpeed's default (1e9 elements) unless set; written at stage 3 only, where ZeRO cuts
    the optimizer into sub-groups (and offload_ratio places them)."""
    zero = to_ds_json(prepared([]), 2)["zero_optimization"]
    assert zero["sub_group_size"] == 1_000_000_000
    fine = ["parallel.deepspeed.offload_optimizer=cpu", "parallel.deepspeed.offload_ratio=0.5"]
    cfg = prepared([*fine, "parallel.deepspeed.sub_group_size=100000000"])
    zero = to_ds_json(cfg, 2)["zero_optimization"]
    assert (zero["sub_group_size"], zero["offload_optimizer"]["ratio"]) == (100_000_000, 0.5)
    assert (
        "sub_group_size"
        not in to_ds_json(prepared(["parallel.deepspeed.stage=2"]), 2)["zero_optimization"]
    )
    with pytest.raises(UserError, match="sub_group_size"):
        prepared(["parallel.deepspeed.sub_group_size=-1"])  # 0: one per parameter (axolotl's)


@pytest.mark.parametrize(
    ("user", "overrides", "message"),
    [
        (
            {"optimizer": {"type": "AdamW", "params": {"lr": 6e-5}}},
            ["optim.lr=3e-4"],
            "optim.lr=0.0003 in the config but optimizer.params.lr=6e-05",
        ),
        (
            {"train_batch_size": 64},
            ["train.micro_batch_size=8", "train.grad_accum_steps=1"],  # else accum is derived
            "train_batch_size=64 in .* but micro_batch_size=8 x grad_accum_steps=1 x world size=2 = 16",
        ),
        (
            {"train_batch_size": 63},
            [],
            "train_batch_size=63 in .* is not divisible by grad_accum_steps=1 x world size=2",
        ),
        ({"optimizer": {"type": "Lamb"}}, [], 'optimizer.type="Lamb" in .*: zerofit trains'),
        ({"scheduler": {"type": "OneCycle"}}, [], 'scheduler.type="OneCycle" in .*: zerofit sets'),
        (
            {"bf16": {"enabled": True}},
            ["precision.param_dtype=fp16"],
            "precision.param_dtype='fp16' in the config but bf16.enabled=true in .*; set "
            'bf16.enabled to "auto"',
        ),
        (
            {"fp16": {"enabled": True}, "bf16": {"enabled": True}},
            [],
            "fp16.enabled=true and bf16.enabled=true in .*: DeepSpeed computes in one of them",
        ),
        (
            {"zero_optimization": {"stage": 2}},
            ["parallel.deepspeed.stage=3"],
            "parallel.deepspeed.stage=3 in the config but zero_optimization.stage=2",
        ),
        (
            {"zero_optimization": {"stage": "three"}},
            [],
            'zero_optimization.stage="three" in .* is not valid',
        ),
        (
            {"zero_optimization": {"sub_group_size": 100_000_000}},
            ["parallel.deepspeed.sub_group_size=200000000"],
            "parallel.deepspeed.sub_group_size=200000000 in the config but "
            "zero_optimization.sub_group_size=100000000 in",
        ),
        (
            {"zero_optimization": {"sub_group_size": "fine"}},
            [],
            'zero_optimization.sub_group_size="fine" in .* is not valid',
        ),
    ],
)
def test_conflicts_name_both_values(
    tmp_path: Path, user: dict, overrides: list[str], message: str
) -> None:
    path = tmp_path / "u.json"
    path.write_text(json.dumps(user))
    cfg = load_config(
        None, ["parallel.backend=deepspeed", f"parallel.deepspeed.config={path}", *overrides]
    )
    with pytest.raises(UserError, match=message):
        merge_user_json(cfg, 2)


def test_bad_json_and_missing_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"zero_optimization": {"stage": 3,}}')
    with pytest.raises(UserError, match="bad JSON in .* at line 1"):
        prepared([f"parallel.deepspeed.config={bad}"])
    with pytest.raises(UserError, match="file not found"):
        prepared([f"parallel.deepspeed.config={tmp_path / 'nope.json'}"])


def test_option_checks() -> None:
    with pytest.raises(UserError, match="offload_param needs stage 3"):
        prepared(["parallel.deepspeed.stage=2", "parallel.deepspeed.offload_param=cpu"])
    with pytest.raises(UserError, match="nvme offload needs parallel.deepspeed.nvme_path"):
        prepared(["parallel.deepspeed.offload_optimizer=nvme"])


def test_partial_offload_steps_with_deepspeeds_cpu_adam() -> None:
    """DeepSpeed's Twin-Flow steps its CPU share with DeepSpeedCPUAdam only (it asserts so in
    initialize): with offload_ratio < 1 a CPU run too leaves torch_adam off; asked for, it is
    refused before launch."""
    offload = ["parallel.deepspeed.offload_optimizer=cpu"]
    ratio = [*offload, "parallel.deepspeed.offload_ratio=0.5"]
    assert prepared(ratio).parallel.deepspeed.torch_adam is False
    assert prepared(offload).parallel.deepspeed.torch_adam is True  # CPU, whole offload
    assert to_ds_json(prepared(ratio), 2)["optimizer"]["params"]["torch_adam"] is False
    with pytest.raises(UserError, match="offload_ratio < 1 needs DeepSpeed's CPU Adam"):
        prepared([*ratio, "parallel.deepspeed.torch_adam=true"])


def test_deepspeeds_synchronising_throughput_timer_is_off_unless_a_file_turns_it_on(
    tmp_path: Path,
) -> None:
    """DeepSpeed's throughput timer, on by default, synchronises the device at every
    micro-batch's forward and step: zerofit's JSON turns it off, as DeepSpeed reads it
    (`get_timers_config`); a user's file that turns it on keeps it on."""
    timers = pytest.importorskip("deepspeed.utils.config").get_timers_config
    assert timers({}).enabled  # DeepSpeed's default: what zerofit must change
    assert not timers(to_ds_json(prepared([]), 2)).enabled
    path = tmp_path / "u.json"
    path.write_text(json.dumps({"timers": {"throughput": {"enabled": True}}}))
    cfg = prepared([f"parallel.deepspeed.config={path}"])
    assert timers(to_ds_json(cfg, 2)).enabled

"""A DeepSpeed JSON from another project, resolved: "auto" exactly as HF Trainer fills it, every
other value the file's own, nothing added to its optimizer, one spelling per ZeRO-3 key, and a
conflict with the zerofit config in one line naming the key, the file and the field.

Pure logic (no process starts): each fixture resolved against the config it runs with
(`ds_json_helpers.BASE`), key by key against `ds_json_helpers.hf_fill`.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from ds_json_helpers import BASE, FIXTURES, TINY_HIDDEN, WORLD, TrainerArgs, hf_fill, leaves
from ds_json_helpers import user_json as fixture_json

from zerofit.backends.deepspeed.ds_json import to_ds_json
from zerofit.backends.deepspeed.json_paths import ZERO3_ALIASES
from zerofit.config import Config
from zerofit.errors import UserError
from zerofit.launch.resolve import resolve
from zerofit.launch.run_config import load_config


@pytest.fixture(autouse=True)
def both_dtypes_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """Resolution, not hardware: whether this CPU runs fp16 is test_ds_json_launch's business."""
    monkeypatch.setattr("zerofit.backends.deepspeed.spec.fp16_supported", lambda: True)
    monkeypatch.setattr("zerofit.backends.deepspeed.spec.bf16_supported", lambda: True)


def resolved(path: Path, *overrides: str) -> tuple[Config, dict]:
    cfg = load_config(None, [*BASE, f"parallel.deepspeed.config={path}", *overrides])
    cfg = resolve(cfg, WORLD, "cpu")
    return cfg, to_ds_json(cfg, WORLD)


def trainer_args(cfg: Config) -> TrainerArgs:
    t, o, p = cfg.train, cfg.optim, cfg.precision
    return TrainerArgs(
        WORLD, t.micro_batch_size, t.grad_accum_steps, o.grad_clip or 0.0, o.lr, list(o.betas),
        o.eps, o.weight_decay, p.param_dtype == "fp16", p.param_dtype == "bf16", TINY_HIDDEN,
        t.steps, o.warmup_steps,
    )  # fmt: skip


@pytest.mark.parametrize("name", list(FIXTURES))
def test_auto_is_filled_as_hf_trainer_fills_it_and_nothing_else_changes(name: str) -> None:
    user = fixture_json(name)
    cfg, ds = resolved(FIXTURES[name])
    hf = leaves(hf_fill(user, trainer_args(cfg)))
    got, mine = leaves(ds), leaves(user)
    for path, value in mine.items():
        if path.startswith("scheduler."):
            assert "scheduler" not in ds  # zerofit's schedule stands in (test_ds_json_launch)
        elif value == "auto" and hf[path] != "auto":
            assert got[path] == hf[path] and type(got[path]) is type(hf[path]), path
        elif value == "auto":  # HF leaves it: a short ZeRO-3 spelling, or a stage-3 key below 3
            zero = ds["zero_optimization"]
            canonical = {v: k for k, v in ZERO3_ALIASES.items()}.get(path.split(".")[-1])
            if canonical and zero["stage"] == 3:  # one key to DeepSpeed, so HF's rule for it
                alias = hf_fill(
                    {"zero_optimization": {"stage": 3, canonical: "auto"}}, trainer_args(cfg)
                )
                assert got[path] == alias["zero_optimization"][canonical], path
            else:
                assert got[path] == "auto", path  # DeepSpeed drops it: its default
        else:
            assert got[path] == value, f"{path}: the file's {value!r} became {got[path]!r}"
    zero = ds.get("zero_optimization", {})
    assert not [(a, n) for a, n in ZERO3_ALIASES.items() if a in zero and n in zero]
    if "optimizer" in user:  # never renamed, never a key added
        assert ds["optimizer"]["type"] == user["optimizer"]["type"]
        assert set(ds["optimizer"].get("params", {})) == set(user["optimizer"].get("params", {}))
    else:  # zerofit's own block: its AdamW (torch's on CPU)
        assert ds["optimizer"]["type"] == "AdamW" and ds["optimizer"]["params"]["torch_adam"]
    assert (
        ds["train_batch_size"]
        == WORLD * ds["train_micro_batch_size_per_gpu"] * ds["gradient_accumulation_steps"]
    )


def test_the_config_holds_what_deepspeed_gets() -> None:
    """The file's values and HF's hidden-size rules become the saved config's (the planner and
    every check read the config): axolotl's zero3_bf16, short spellings and all."""
    cfg, ds = resolved(FIXTURES["axolotl_zero3_bf16"])
    d, zero = cfg.parallel.deepspeed, ds["zero_optimization"]
    assert (d.reduce_bucket_size, d.prefetch_bucket_size) == (256**2, int(0.9 * 256**2))
    assert d.param_persistence_threshold == zero["param_persistence_threshold"] == 2560
    assert (d.sub_group_size, d.max_live_parameters) == (0, 0)  # 0: one sub-group a parameter
    assert cfg.precision.param_dtype == "bf16" and ds["bf16"]["enabled"] is True
    assert "stage3_prefetch_bucket_size" not in zero and "stage3_max_live_parameters" not in zero


def test_megatron_adam_stays_adam_and_the_file_keeps_its_values() -> None:
    """The issue's Megatron case: Adam was renamed AdamW with zerofit's betas and weight decay,
    steps_per_print overwritten. Now: Adam as written, no param added, its batch's accumulation
    derived as DeepSpeed derives it, betas and eps DeepSpeed's defaults in the config."""
    user = fixture_json("megatron_zero2")
    cfg, ds = resolved(FIXTURES["megatron_zero2"])
    assert ds["optimizer"] == user["optimizer"]
    assert ds["steps_per_print"] == 10 and ds["fp16"]["initial_scale_power"] == 11
    assert (cfg.train.grad_accum_steps, ds["gradient_accumulation_steps"]) == (2, 2)
    assert cfg.optim.betas == (0.9, 0.999) and cfg.optim.eps == 1e-8 and cfg.optim.lr == 1.5e-4
    assert cfg.parallel.deepspeed.torch_adam is False  # DeepSpeed's own Adam, as the file asks
    assert ds["activation_checkpointing"] == user["activation_checkpointing"]


def test_fp16_and_bf16_auto_follow_the_precision_asked_for() -> None:
    """Both "auto": the issue's misleading 'precision.param_dtype=fp16 in the config' is gone,
    and precision.mode decides."""
    path = FIXTURES["transformers_zero2"]
    for mode, fp16, bf16 in (("fp32", False, False), ("bf16", False, True), ("fp16", True, False)):
        cfg, ds = resolved(path, f"precision.mode={mode}")
        assert (ds["fp16"]["enabled"], ds["bf16"]["enabled"]) == (fp16, bf16), mode


def test_warmup_lr_auto_maps_onto_zerofits_schedule() -> None:
    cfg, ds = resolved(FIXTURES["transformers_zero3"])
    assert "scheduler" not in ds
    assert cfg.optim.min_lr_ratio == 1.0  # WarmupLR holds the peak lr after warmup
    decay = json.loads(FIXTURES["transformers_zero3"].read_text())
    decay["scheduler"] = {"type": "WarmupDecayLR", "params": {"total_num_steps": 2}}
    assert resolved(_write(decay))[0].optim.min_lr_ratio == 0.0


def _write(data: dict, name: str = "ds.json") -> Path:
    import tempfile  # here: one small file per call

    path = Path(tempfile.mkdtemp()) / name
    path.write_text(json.dumps(data))
    return path


@pytest.mark.parametrize(
    ("change", "overrides", "line"),
    [
        (
            {"gradient_clipping": 0.5},
            ["optim.grad_clip=1.0"],
            r"^optim.grad_clip=1.0 in the config but gradient_clipping=0.5 in .*ds.json; set "
            r'gradient_clipping to "auto"',
        ),
        (
            {"optimizer": {"type": "AdamW", "params": {"lr": 6e-5}}},
            ["optim.lr=3e-4"],  # the issue: adopted in silence, explicit or not
            r"^optim.lr=0.0003 in the config but optimizer.params.lr=6e-05 in .*ds.json",
        ),
        (
            {"optimizer": {"type": "Adam", "params": {"lr": "auto"}}},
            ["optim.betas=[0.9,0.95]"],
            r"^optim.betas=\(0.9, 0.95\) in the config but optimizer.params in .*ds.json leaves "
            r"out betas, so DeepSpeed's default \[0.9, 0.999\] applies",
        ),
        (
            {"optimizer": {"type": "AdamW", "params": {}}},
            ["parallel.deepspeed.torch_adam=true"],
            r"^parallel.deepspeed.torch_adam=True in the config but the optimizer block in "
            r".*ds.json leaves out torch_adam, and zerofit adds no key",
        ),
        (
            {"scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": "auto"}}},
            ["optim.min_lr_ratio=0.1"],
            r"^optim.min_lr_ratio=0.1 in the config but scheduler.type=\"WarmupLR\" in .*ds.json",
        ),
        (
            {"optimizer": {"type": "OneBitAdam", "params": {}}},
            [],
            r'^optimizer.type="OneBitAdam" in .*ds.json: zerofit trains with DeepSpeed\'s Adam',
        ),
        (
            {
                "zero_optimization": {
                    "stage": 3,
                    "prefetch_bucket_size": 1,
                    "stage3_prefetch_bucket_size": 2,
                }
            },
            [],
            r"^zero_optimization.prefetch_bucket_size and zero_optimization.stage3_prefetch_"
            r"bucket_size in .*ds.json are one DeepSpeed setting written twice",
        ),
        (
            {"zero_optimization": {"stage": 3, "reduce_bucket_size": -5}},
            [],
            r"^zero_optimization.reduce_bucket_size=-5 in .*ds.json: parallel.deepspeed.reduce_b",
        ),
    ],
)
def test_a_conflict_is_one_line_naming_key_file_and_field(
    change: dict, overrides: list[str], line: str
) -> None:
    base = fixture_json("llamafactory_z3") | change
    with pytest.raises(UserError, match=line) as e:
        resolved(_write(base), *overrides)
    assert "\n" not in str(e.value)


def test_zerofits_aliases_are_deepspeeds() -> None:
    """json_paths.ZERO3_ALIASES against the installed DeepSpeed's ZeRO config model."""
    zero = pytest.importorskip("deepspeed.runtime.zero.config")
    fields = zero.DeepSpeedZeroConfig.model_fields
    aliases = {f.alias: name for name, f in fields.items() if f.alias}
    assert aliases == ZERO3_ALIASES

"""Config schema: loading, overrides, validation, round trip."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from zerofit.config import (
    check_world,
    parse_overrides,
    resolve_precision,
    save_config,
    to_dict,
)
from zerofit.errors import UserError
from zerofit.launch.resolve import resolve
from zerofit.launch.run_config import config_from_dict, default_config, load_config
from zerofit.train.lr_schedule import lr_at


def test_defaults_are_valid_and_round_trip(tmp_path: Path) -> None:
    cfg = load_config()
    assert cfg == default_config()
    save_config(cfg, tmp_path / "c.yaml")
    assert load_config(tmp_path / "c.yaml") == cfg


def test_dotted_overrides_are_typed() -> None:
    tree = parse_overrides(
        ["train.steps=7", "optim.lr=3e-4", "optim.betas=[0.8, 0.9]", "model.overrides.n_layers=3"]
    )
    assert tree == {
        "train": {"steps": 7},
        "optim": {"lr": "3e-4", "betas": [0.8, 0.9]},
        "model": {"overrides": {"n_layers": 3}},
    }
    cfg = load_config(
        None,
        [
            "train.steps=7",
            "optim.lr=3e-4",
            "optim.betas=[0.8, 0.9]",
            "data.source=[a.txt, b.jsonl]",
        ],
    )
    assert cfg.train.steps == 7 and cfg.optim.lr == 3e-4 and cfg.optim.betas == (0.8, 0.9)
    assert cfg.data.source == ["a.txt", "b.jsonl"]


def test_override_beats_file(tmp_path: Path) -> None:
    p = tmp_path / "c.yaml"
    p.write_text(yaml.safe_dump({"train": {"steps": 5, "micro_batch_size": 2}}))
    cfg = load_config(p, ["train.steps=9"])
    assert (cfg.train.steps, cfg.train.micro_batch_size) == (9, 2)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"model": {"preset": "tiny", "hf": "x"}}, "exactly one of model.preset and model.hf"),
        ({"optim": {"betas": [0.9]}}, "optim.betas: expected 2 values"),
        ({"optim": {"lr": -1}}, "optim.lr must be a finite number > 0"),
        ({"train": {"steps": True}}, "train.steps: expected an integer"),
        ({"data": {"val_fraction": 1.5}}, "data.val_fraction must be in [0, 1)"),
        (
            {"parallel": {"fsdp": {"wrap": "layer"}}},
            "parallel.fsdp.wrap: 'layer' is not one of block, size",
        ),
        (
            {"parallel": {"backend": "fsdp2"}},
            "parallel.backend: 'fsdp2' is not one of ddp, fsdp, deepspeed, auto (did you mean 'fsdp'?)",
        ),
        ({"precision": {"mode": "bf61"}}, "(did you mean 'bf16'?)"),
        (
            {"parallel": {"fsdp": {"cpu_ofload": True}}},
            "unknown config key 'parallel.fsdp.cpu_ofload' (did you mean 'parallel.fsdp.cpu_offload'?)",
        ),
        ({"data": {"source": ["a.txt", 3]}}, "data.source[1]: expected a string, got 3"),
        (
            {"parallel": {"deepspeed": {"stage": True}}},
            "parallel.deepspeed.stage: expected an integer, got True",
        ),
        ({"log": {"every": 0}}, "log.every must be >= 1"),
        ({"train": "fast"}, "train: expected a mapping"),
    ],
)
def test_validation_messages(data: dict, message: str) -> None:
    with pytest.raises(UserError, match=re.escape(message)):
        config_from_dict(data)


def test_batch_arithmetic() -> None:
    cfg = config_from_dict(
        {"train": {"micro_batch_size": 4, "grad_accum_steps": 2, "global_batch_size": 32}}
    )
    assert check_world(cfg, 4) == 4
    with pytest.raises(UserError, match="x data-parallel size=2 = 16"):
        check_world(cfg, 2)
    hybrid = config_from_dict({"parallel": {"fsdp": {"replicate_degree": 3}}})
    with pytest.raises(UserError, match="replicate_degree=3 does not divide the world size 4"):
        resolve(hybrid, 4, "cpu")


def test_resolve_makes_everything_explicit() -> None:
    """One resolve: precision filled for the device, the engine's own resolution, world checks."""
    cfg = resolve(config_from_dict({"parallel": {"backend": "deepspeed"}}), 2, "cpu")
    assert (cfg.precision.mode, cfg.precision.param_dtype) == ("fp32", "fp32")
    assert cfg.parallel.deepspeed.torch_adam is True  # DeepSpeed's CPU choice, made once
    gpu = resolve(config_from_dict({}), 8, "cuda")
    assert (gpu.precision.param_dtype, gpu.precision.master_dtype) == ("bf16", "fp32")
    assert resolve(gpu, 8, "cuda") == gpu  # resolving a resolved config changes nothing


def test_flat_fsdp_keys_still_load_with_a_note(tmp_path: Path, capsys) -> None:  # noqa: ANN001
    """Configs from before 0.2 had FSDP's options flat under parallel.*: they load, with one line."""
    p = tmp_path / "old.yaml"
    p.write_text("parallel: {backend: fsdp, cpu_offload: true, fsdp: {wrap: size}}\n")
    cfg = load_config(p, ["parallel.reshard_after_forward=false"])
    assert cfg.parallel.fsdp.cpu_offload and cfg.parallel.fsdp.wrap == "size"
    assert cfg.parallel.fsdp.reshard_after_forward is False
    err = capsys.readouterr().err
    assert "parallel.cpu_offload" in err and "is now parallel.fsdp.cpu_offload" in err
    assert "parallel.reshard_after_forward in the command line is now" in err


def test_precision_resolution_is_explicit() -> None:
    cpu = resolve_precision(default_config().precision, "cpu")
    gpu = resolve_precision(default_config().precision, "cuda")
    assert (cpu.mode, cpu.param_dtype, cpu.reduce_dtype, cpu.master_dtype) == (
        "fp32",
        "fp32",
        "fp32",
        "fp32",
    )
    assert (gpu.mode, gpu.param_dtype, gpu.reduce_dtype, gpu.master_dtype) == (
        "bf16",
        "bf16",
        "fp32",
        "fp32",
    )
    pure = resolve_precision(
        config_from_dict({"precision": {"mode": "bf16", "master_dtype": "bf16"}}).precision, "cuda"
    )
    assert pure.master_dtype == "bf16"
    assert to_dict(config_from_dict({}))["optim"]["betas"] == [0.9, 0.95]


def test_schedule_warmup_then_cosine() -> None:
    kw = {"lr": 1.0, "warmup_steps": 10, "total_steps": 110, "min_lr_ratio": 0.1}
    assert lr_at(0, **kw) == pytest.approx(0.1)
    assert lr_at(9, **kw) == pytest.approx(1.0)
    assert lr_at(60, **kw) == pytest.approx(0.55)
    assert lr_at(110, **kw) == pytest.approx(0.1)
    assert all(lr_at(s, **kw) >= lr_at(s + 1, **kw) for s in range(10, 120))


def test_integers_in_scientific_notation() -> None:
    """Bucket sizes are written 5e7 (a string to YAML 1.1); a non-integral value is still refused."""
    cfg = load_config(None, ["parallel.deepspeed.reduce_bucket_size=5e7"])
    assert cfg.parallel.deepspeed.reduce_bucket_size == 50_000_000
    with pytest.raises(UserError, match="expected an integer"):
        load_config(None, ["train.steps=2.5"])


def test_a_config_pickles() -> None:
    """Ranks under an external torchrun receive the prepared config by pickle (broadcast)."""
    import pickle

    cfg = load_config(None, ["parallel.fsdp.cpu_offload=true", "parallel.backend=deepspeed"])
    assert pickle.loads(pickle.dumps(cfg)) == cfg


def test_model_hf_alone_selects_the_folder_and_nothing_selects_tiny(tmp_path: Path) -> None:
    cfg = load_config(None, [f"model.hf={tmp_path}"])
    assert (cfg.model.hf, cfg.model.preset, cfg.data.tokenizer) == (str(tmp_path), None, "byte")
    (tmp_path / "tokenizer.json").write_text("{}")  # a tokenizer in the folder: 'auto' takes it
    assert load_config(None, [f"model.hf={tmp_path}"]).data.tokenizer == str(tmp_path)
    assert load_config(None, ["model.preset=null"]).model.preset == "tiny"


@pytest.mark.parametrize("action", ["show", "schema"])
def test_config_writes_to_its_out_file(tmp_path: Path, capsys, action: str) -> None:  # noqa: ANN001
    """`config show -o F` and `config schema -o F` write F (nothing on stdout), the same text
    they print without -o; a folder as F is one clear line."""
    from zerofit.cli import main

    extra = ["--train.steps", "7"] if action == "show" else []
    assert main(["config", action, *extra]) == 0
    printed = capsys.readouterr().out
    out = tmp_path / f"{action}.out"
    assert main(["config", action, "-o", str(out), *extra]) == 0
    captured = capsys.readouterr()
    assert captured.out == "" and f"wrote {out}" in captured.err
    assert out.read_text() == printed
    if action == "show":
        assert yaml.safe_load(out.read_text())["train"]["steps"] == 7
    assert main(["config", action, "-o", str(tmp_path)]) == 2
    assert "is a folder" in capsys.readouterr().err


def _noisy(fn):  # noqa: ANN001, ANN202
    """`fn` as a library that, on first use, makes a stdout log handler (DeepSpeed's logger at
    import: bound to the stdout of that moment) and logs a warning through it, and prints."""
    import logging
    import sys

    def wrapped(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        logger = logging.getLogger("zerofit-test-noisy-library")
        logger.addHandler(logging.StreamHandler(sys.stdout))
        logger.warning("[WARNING] Setting accelerator to CPU")
        print("a stray print")
        return fn(*args, **kwargs)

    return wrapped


@pytest.mark.parametrize(
    ("argv", "target"),
    [
        (["ds-config"], "zerofit.commands.engine_files.resolve"),
        (["config", "show"], "zerofit.commands.config.load_config"),
        (["plan", "--preset", "tiny", "--gpus", "2", "--gpu-mem", "24GB", "--json"],
         "zerofit.commands.plan.plan"),
    ],
    ids=["ds-config", "config-show", "plan-json"],
)  # fmt: skip
def test_data_commands_print_only_their_data(argv, target, monkeypatch, capsys) -> None:  # noqa: ANN001
    """Whatever a dependency prints or logs to stdout while a data command runs goes to stderr:
    stdout parses."""
    import json

    from zerofit.cli import main

    module, name = target.rsplit(".", 1)
    monkeypatch.setattr(
        f"{module}.{name}", _noisy(getattr(__import__(module, fromlist=[name]), name))
    )
    assert main(argv) == 0
    captured = capsys.readouterr()
    assert "Setting accelerator" in captured.err and "a stray print" in captured.err
    parse = json.loads if argv[0] != "config" else yaml.safe_load
    assert parse(captured.out)

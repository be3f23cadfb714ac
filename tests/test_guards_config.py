"""The config checks that need no hardware (`zerofit.config.validate`, `check_path`) and the batch
arithmetic against the world size (`check_world`), each on both sides of its rule: what a user
may write loads, the value next to it is refused with its one line."""

from __future__ import annotations

import getpass

import pytest

from zerofit.config import check_path, check_world
from zerofit.errors import UserError
from zerofit.launch.run_config import config_from_dict


def load(**sections: dict) -> object:
    return config_from_dict(sections)


def refused(match: str, **sections: dict) -> str:
    with pytest.raises(UserError, match=match) as err:
        config_from_dict(sections)
    return str(err.value)


# ----------------------------------------------------------------------------- validate


def test_exactly_one_of_preset_and_hf() -> None:
    assert load(model={"preset": "tiny"}).model.preset == "tiny"
    assert load(model={"preset": None}).model.preset == "tiny"  # neither: the default preset
    assert load(model={"preset": None, "hf": "some/folder"}).model.hf == "some/folder"
    refused(
        "model: give exactly one of model.preset and model.hf",
        model={"preset": "tiny", "hf": "some/folder"},
    )


def test_export_final_needs_save_final() -> None:
    refused(
        "checkpoint.export_final exports the final checkpoint: it needs save_final",
        checkpoint={"export_final": True, "save_final": False},
    )
    cfg = load(checkpoint={"export_final": True, "save_final": True})
    assert cfg.checkpoint.export_final
    assert not load(checkpoint={"export_final": False, "save_final": False}).checkpoint.save_final


@pytest.mark.parametrize("fraction", [0.0, 0.5, 0.999999])
def test_val_fraction_in_zero_to_one_loads(fraction: float) -> None:
    assert load(data={"val_fraction": fraction}).data.val_fraction == fraction


@pytest.mark.parametrize("fraction", [1.0, 1.5, -0.01, -1e-300])
def test_val_fraction_outside_zero_to_one_is_refused(fraction: float) -> None:
    refused(r"data\.val_fraction must be in \[0, 1\), got ", data={"val_fraction": fraction})


def test_steps_or_epochs() -> None:
    refused("train.steps is null: give a number of steps, or train.epochs", train={"steps": None})
    cfg = load(train={"steps": None, "epochs": 2})
    assert (cfg.train.steps, cfg.train.epochs) == (None, 2)
    assert load(train={"steps": 5}).train.steps == 5


def test_optimizer_values_are_checked() -> None:
    refused(r"optim\.lr must be a finite number > 0", optim={"lr": 0.0})


@pytest.mark.parametrize(
    ("section", "key"),
    [
        ("model", "hf"),
        ("data", "tokenizer"),
        ("log", "run_dir"),
        ("checkpoint", "dir"),
        ("data", "source"),
    ],
)
def test_every_path_field_is_checked(section: str, key: str) -> None:
    long = "d/" + "n" * 256  # a name over 255 bytes (the schema refuses NUL bytes itself)
    sections = {section: {key: long}}
    if key == "hf":
        sections = {"model": {"preset": None, "hf": long}}
    refused(rf"^{section}\.{key}: the path is too long \(258 characters", **sections)


def test_each_source_of_a_list_is_checked() -> None:
    refused(r"^data\.source: the path is too long", data={"source": ["ok.txt", "n" * 256]})
    assert load(data={"source": ["a.txt", "b.txt"]}).data.source == ["a.txt", "b.txt"]


def test_fp8_and_lora_do_not_mix() -> None:
    refused(
        r"precision\.fp8=tensorwise with LoRA \(model\.lora\.rank > 0\) is not supported",
        precision={"fp8": "tensorwise"},
        model={"lora": {"rank": 4}},
    )
    refused(
        r"precision\.fp8=rowwise with LoRA",
        precision={"fp8": "rowwise"},
        model={"lora": {"rank": 1}},
    )
    assert load(precision={"fp8": "rowwise"}).precision.fp8 == "rowwise"
    assert load(model={"lora": {"rank": 4}}).model.lora.rank == 4


def test_ac_blocks_goes_with_first_k_both_ways() -> None:
    line = "parallel.ac_blocks goes with parallel.activation_checkpointing: first_k"
    refused(line, parallel={"activation_checkpointing": "first_k"})
    refused(line, parallel={"activation_checkpointing": "full", "ac_blocks": 2})
    cfg = load(parallel={"activation_checkpointing": "first_k", "ac_blocks": 2})
    assert cfg.parallel.ac_blocks == 2
    assert load(parallel={"activation_checkpointing": "full"}).parallel.ac_blocks is None


def test_the_engines_own_checks_run() -> None:
    refused(
        r"precision\.fp8=tensorwise: DeepSpeed has no float8 path",
        parallel={"backend": "deepspeed"},
        precision={"fp8": "tensorwise"},
    )
    refused(
        r"parallel\.deepspeed\.nvme_path: the path is too long",
        parallel={"deepspeed": {"nvme_path": "n" * 256}},
    )


# ----------------------------------------------------------------------------- check_world


@pytest.mark.parametrize(("micro", "accum", "world"), [(1, 1, 1), (4, 2, 8), (3, 5, 2), (2, 1, 3)])
def test_check_world_returns_the_data_parallel_size(micro: int, accum: int, world: int) -> None:
    train = {"micro_batch_size": micro, "grad_accum_steps": accum}
    assert check_world(load(train=train), world) == world
    cfg = load(train={**train, "global_batch_size": micro * accum * world})
    assert check_world(cfg, world) == world


@pytest.mark.parametrize("off", [-1, 1])
def test_a_global_batch_that_is_not_the_product_is_refused(off: int) -> None:
    cfg = load(train={"micro_batch_size": 4, "grad_accum_steps": 2, "global_batch_size": 24 + off})
    with pytest.raises(UserError) as err:
        check_world(cfg, 3)
    assert str(err.value) == (
        f"train.global_batch_size={24 + off} but micro_batch_size=4 x grad_accum_steps=2 x "
        "data-parallel size=3 = 24"
    )


# ----------------------------------------------------------------------------- check_path


@pytest.mark.parametrize(
    "value",
    [
        "runs/x",
        "/abs/path",
        "",
        ".",
        "~/runs",
        f"~{getpass.getuser()}/runs",
        "n" * 255,
        "d/" + "é" * 127,  # 254 bytes
        "/".join(["a"] * 256),  # 256 levels
        ("x" * 200 + "/") * 20 + "y" * 76,  # 4096 bytes
        "ünï/cødé",
    ],
)
def test_paths_the_os_takes_pass(value: str) -> None:
    check_path("log.run_dir", value)


def test_values_that_are_not_strings_are_left_to_the_schema() -> None:
    check_path("x", None)
    check_path("x", 5)
    check_path("x", ["a\x00b"])


def test_a_nul_byte_is_refused() -> None:
    with pytest.raises(UserError, match=r"^log\.run_dir: the path contains a NUL byte: 'a\\x00b'$"):
        check_path("log.run_dir", "a\x00b")


@pytest.mark.parametrize(
    "value",
    [
        "n" * 256,
        "d/" + "n" * 256 + "/e",
        "é" * 128,  # 128 characters, 256 bytes
        ("x" * 200 + "/") * 20 + "y" * 77,  # 4097 bytes
        "/" * 4097,
    ],
)
def test_a_name_over_255_bytes_or_a_path_over_4096_is_refused(value: str) -> None:
    with pytest.raises(UserError, match=r"^checkpoint\.dir: the path is too long \("):
        check_path("checkpoint.dir", value)


def test_the_too_long_line_counts_characters() -> None:
    with pytest.raises(UserError, match=r"\(256 characters; a name may have 255 bytes"):
        check_path("x", "n" * 256)


def test_more_than_256_levels_are_refused() -> None:
    value = "/".join(["a"] * 257)
    with pytest.raises(UserError, match=r"^data\.source: the path has 257 levels \(at most 256\)"):
        check_path("data.source", value)


def test_a_home_of_no_user_is_refused() -> None:
    with pytest.raises(UserError, match=r"^model\.hf: no home directory for '~no-such-user-zf/x'$"):
        check_path("model.hf", "~no-such-user-zf/x")

"""The optional packages a config asks for are checked before any worker starts
(`zerofit.launch.requirements`): one line naming the setting and the install command."""

from __future__ import annotations

from pathlib import Path

import pytest

from zerofit.errors import UserError
from zerofit.launch import requirements
from zerofit.launch.requirements import check_installed, needs
from zerofit.launch.resolve import resolve
from zerofit.launch.run_config import load_config


def _resolved(*overrides: str):  # noqa: ANN202
    return resolve(load_config(None, list(overrides)), 2, "cpu")


def test_each_setting_names_its_package_and_extra() -> None:
    cfg = _resolved("parallel.backend=deepspeed", "log.tensorboard=true")
    got = [(n.module, n.setting, n.install) for n in needs(cfg)]
    assert got == [
        ("deepspeed", "parallel.backend: deepspeed", "pip install 'zerofit[deepspeed]'"),
        ("tensorboard", "log.tensorboard: true", "pip install 'zerofit[tensorboard]'"),
    ]
    fp8 = _resolved("parallel.backend=fsdp", "precision.fp8=tensorwise")
    assert [(n.module, n.setting, n.install) for n in needs(fp8)] == [
        ("torchao", "precision.fp8: tensorwise", "pip install 'zerofit[fp8]'")
    ]
    qlora = _resolved("parallel.backend=fsdp", "model.lora.rank=4", "model.lora.quantize=nf4")
    assert [(n.module, n.install) for n in needs(qlora)] == [
        ("torchao", "pip install 'zerofit[qlora]'")
    ]
    assert needs(_resolved("parallel.backend=fsdp")) == []


@pytest.mark.parametrize(
    ("override", "line"),
    [
        ("log.tensorboard=true", "log.tensorboard: true needs the tensorboard package"),
        ("parallel.backend=deepspeed", "parallel.backend: deepspeed needs the deepspeed package"),
        ("model.lora.quantize=nf4", "model.lora.quantize: nf4 needs the torchao package"),
    ],
)
def test_a_missing_package_is_one_line_with_its_install_command(
    override: str, line: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(requirements, "installed", lambda module: False)
    with pytest.raises(UserError, match="which is not installed here: pip install 'zerofit") as e:
        check_installed(_resolved(override, "model.lora.rank=4"))
    assert str(e.value).startswith(line) and "\n" not in str(e.value)
    monkeypatch.undo()
    check_installed(_resolved(override, "model.lora.rank=4"))  # installed here: no error


def test_a_real_lookup_finds_what_is_here_and_not_what_is_not() -> None:
    assert requirements.installed("yaml")
    assert not requirements.installed("zerofit_no_such_package")
    assert not requirements.installed("zerofit_no_such_package.child")


def test_train_stops_before_any_worker_with_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from zerofit.cli import main

    missing = {"tensorboard"}
    monkeypatch.setattr(requirements, "installed", lambda module: module not in missing)
    run_dir = tmp_path / "run"
    argv = ["train", "--log.tensorboard", "true", "--log.run_dir", str(run_dir)]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "error: log.tensorboard: true needs the tensorboard package, which is not installed "
        "here: pip install 'zerofit[tensorboard]'"
    ]
    assert not run_dir.exists()

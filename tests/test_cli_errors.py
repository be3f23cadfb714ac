"""Bad input of every kind: one line naming the problem, exit code 2, nothing written or overwritten."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from conftest import write_config, zerofit

from zerofit.cli import main


def run_main(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    code = main(["train", *args])
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert len(err.splitlines()) == 1 and err.startswith("error: "), err
    return err


def test_missing_config_file(capsys, tmp_path: Path) -> None:
    assert "config file not found" in run_main(capsys, "-c", str(tmp_path / "nope.yaml"))


def test_bad_yaml(capsys, tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("train:\n  steps: [1, 2\n")
    err = run_main(capsys, "-c", str(bad))
    assert "bad YAML" in err and "at line 3, column 1" in err, err


def test_unknown_keys_name_the_closest(capsys, tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("trian:\n  steps: 3\n")
    assert "unknown config key 'trian' (did you mean 'train'?)" in run_main(capsys, "-c", str(cfg))
    assert "'train.stpes' (did you mean 'train.steps'?)" in run_main(capsys, "--train.stpes", "3")
    # a mistyped value gets the closest value, not a key that looks alike
    err = run_main(capsys, "--parallel.backend", "fsdp2")
    assert "parallel.backend: 'fsdp2' is not one of ddp, fsdp, deepspeed, auto" in err
    assert err.endswith("(did you mean 'fsdp'?)"), err
    err = run_main(capsys, "--parallel.backend", "deepsped")
    assert err.endswith("(did you mean 'deepspeed'?)"), err
    assert "(did you mean 'bf16'?)" in run_main(capsys, "--precision.mode", "bf61")


def test_wrong_types_and_values(capsys) -> None:
    assert "train.steps: expected an integer, got 'abc'" in run_main(capsys, "--train.steps", "abc")
    assert "precision.mode: 'bf17' is not one of" in run_main(capsys, "--precision.mode", "bf17")
    assert "unrecognized argument 'steps'" in run_main(capsys, "steps")


def test_inconsistent_batch_sizes_name_all_four_numbers(capsys, tmp_path: Path) -> None:
    cfg = write_config(tmp_path / "c.yaml", {"train": {"global_batch_size": 10}})
    err = run_main(capsys, "-c", str(cfg), "--nproc", "2", "--train.grad_accum_steps", "2")
    assert "global_batch_size=10" in err and "micro_batch_size=4" in err
    assert "grad_accum_steps=2" in err and "data-parallel size=2" in err and "= 16" in err


def test_nproc_above_gpu_count(capsys, monkeypatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert "--nproc 4 but only 1 GPU(s) are visible" in run_main(capsys, "--nproc", "4")


def test_seq_len_above_model_maximum(capsys) -> None:
    err = run_main(capsys, "--model.seq_len", "4096", "--nproc", "1")
    assert "model.seq_len=4096 is above the model's maximum 1024" in err


def test_existing_run_dir_is_not_overwritten(capsys, tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("precious")
    err = run_main(capsys, "--log.run_dir", str(run), "--nproc", "1")
    assert "already holds a run" in err
    assert (run / "config.yaml").read_text() == "precious" and sorted(
        p.name for p in run.iterdir()
    ) == ["config.yaml"]


@pytest.mark.slow
@pytest.mark.dist
def test_checkpoint_from_another_model_is_refused(capsys, tmp_path: Path, shared_run) -> None:  # noqa: ANN001
    run = tmp_path / "run"
    shutil.copytree(shared_run("ddp@1"), run)  # 10 steps on 1 process
    before = sorted((p.relative_to(run), p.stat().st_mtime_ns) for p in run.rglob("*"))
    cfg = write_config(
        tmp_path / "other.yaml",
        {
            "train": {"steps": 12},
            "model": {"overrides": {"n_layers": 3}},
            "log": {"run_dir": str(run)},
        },
    )
    err = run_main(capsys, "-c", str(cfg), "--nproc", "1", "--resume")
    assert "is for a different run: model.args.n_layers is 2 there, 3 here" in err, err
    cfg = write_config(
        tmp_path / "other.yaml",
        {"train": {"steps": 12}, "model": {"seq_len": 32}, "log": {"run_dir": str(run)}},
    )
    err = run_main(capsys, "-c", str(cfg), "--nproc", "1", "--resume")
    assert "model.seq_len is 64 there, 32 here" in err, (
        err
    )  # another engine is fine (test_resume_anywhere)
    assert sorted((p.relative_to(run), p.stat().st_mtime_ns) for p in run.rglob("*")) == before


def test_end_to_end_error_has_no_traceback(tmp_path: Path) -> None:
    proc = zerofit("train", "--train.micro_batch_size", "0", cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.strip() == "error: train.micro_batch_size must be >= 1, got 0"
    assert not list(tmp_path.iterdir())  # no run directory created


def test_help_documents_every_option(capsys) -> None:
    from zerofit.launch.run_config import field_help

    with pytest.raises(SystemExit):
        main(["train", "--help"])
    out = capsys.readouterr().out
    for key, _, text in field_help():
        assert text and f"--{key} " in out and text in out, key
    assert "--nproc" in out and "--resume" in out and "--rdzv-endpoint" in out


@pytest.mark.parametrize(
    ("override", "needle"),
    [
        ("optim.lr=inf", "optim.lr must be a finite number > 0, got inf"),
        ("optim.lr=.nan", "optim.lr must be a finite number > 0, got nan"),
        ("optim.eps=0", "optim.eps must be a finite number > 0, got 0"),
        ("optim.eps=-1", "optim.eps must be a finite number > 0"),
        ("optim.weight_decay=.nan", "optim.weight_decay must be finite"),
        ("optim.grad_clip=.nan", "optim.grad_clip must be a finite number > 0, or null, got nan"),
        ("optim.min_lr_ratio=2", "optim.min_lr_ratio must be in [0, 1], got 2"),
    ],
)
def test_optimizer_values_that_cannot_train(capsys, override: str, needle: str) -> None:
    err = run_main(capsys, "--nproc", "1", f"--{override}")
    assert needle in err, err


def test_run_and_checkpoint_dirs_are_checked_before_training(capsys, tmp_path: Path) -> None:
    a_file = tmp_path / "file"
    a_file.write_text("x")
    cases = [
        (["--log.run_dir", str(a_file)], "log.run_dir: "),
        (["--log.run_dir", str(a_file / "sub")], "is not a writable directory"),
        (["--log.run_dir", "/proc/zerofit-run"], "is not a writable directory"),
        (
            ["--log.run_dir", str(tmp_path / "r"), "--checkpoint.dir", str(a_file)],
            "checkpoint.dir: ",
        ),
        (["--log.run_dir", "a\x00b"], "log.run_dir: contains a NUL byte"),
        (["--log.run_dir", "x" * 5000], "log.run_dir: the path is too long (5000 characters"),
        (["--log.run_dir", "x" * 100_000], "log.run_dir: too long (100000 characters"),
    ]
    for args, needle in cases:
        err = run_main(capsys, "--nproc", "1", *args)
        assert needle in err and len(err) < 600, err

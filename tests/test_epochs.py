"""train.epochs: steps computed by the launcher from the packed training rows and the global batch,
saved in the run's config; a run that repeats its data says so; small data fails in one line that
names every fix (and the settings it names do fit)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml
from conftest import losses, zerofit
from sft_helpers import make_tokenizer, write_chat_jsonl

from zerofit.cli import main
from zerofit.data import epoch_steps
from zerofit.errors import UserError
from zerofit.launch.prepare import LaunchOptions, prepare_run
from zerofit.launch.run_config import config_from_dict, load_config
from zerofit.train.inputs import checkpoint_meta

# 799 bytes + EOS = 800 byte tokens = 50 rows of 16 (seq_len 15); no validation hold-out
ROWS = 50


def _text_config(tmp: Path, train: dict, name: str = "r") -> dict:
    src = tmp / "doc.txt"
    src.write_text("x" * 799)
    return {
        "model": {"preset": "tiny", "seq_len": 15, "overrides": {"n_layers": 2}},
        "data": {"source": str(src), "tokenizer": "byte", "val_fraction": 0, "max_tokens": None},
        "train": {"micro_batch_size": 2, "grad_accum_steps": 2, "eval_every": 0, **train},
        "precision": {"mode": "fp32"},
        "log": {"run_dir": str(tmp / name), "progress": False},
    }


def _prepare(data: dict, world_size: int = 2):
    return prepare_run(config_from_dict(data), LaunchOptions(), world_size, "cpu")


def test_epoch_arithmetic() -> None:
    assert epoch_steps(1, 50, 8) == 7  # 6.25 batches: the last one partly into the next pass
    assert epoch_steps(2.5, 50, 8) == 16  # 15.625
    assert epoch_steps(0.1, 30, 3) == 1  # exactly 1, not 1.0000000000000002 -> 2
    assert epoch_steps(0.5, 10, 4) == 2  # 1.25
    assert epoch_steps(3, 16, 8) == 6  # exact


@pytest.mark.parametrize("epochs, steps", [(1, 7), (2.5, 16), (0.25, 2)])
def test_epochs_set_the_steps_and_are_saved(
    tmp_path: Path, epochs: float, steps: int, capsys
) -> None:
    prep = _prepare(_text_config(tmp_path, {"epochs": epochs}))  # global batch 2 x 2 x 2 = 8
    assert prep.cfg.train.steps == steps and prep.cfg.train.epochs == epochs
    saved = yaml.safe_load((prep.run_dir / "config.yaml").read_text())["train"]
    assert saved["steps"] == steps and saved["epochs"] == epochs
    assert checkpoint_meta(prep.cfg, _spec(prep), 2)["train_steps"] == steps
    err = capsys.readouterr().err
    assert f"note: train.epochs={epochs:g}: {steps} steps x 8 rows over {ROWS} packed" in err
    again = load_config(prep.run_dir / "config.yaml")  # the saved config states both: they agree
    assert prepare_run(again, LaunchOptions(), 2, "cpu", create=False).cfg.train.steps == steps


def _spec(prep):
    from zerofit.models import build_model

    m = prep.cfg.model
    return build_model(m.preset, m.hf, m.overrides, m.loss_chunk, m.trust_remote_code)


def test_epochs_follow_the_world_size(tmp_path: Path) -> None:
    one = _prepare(_text_config(tmp_path, {"epochs": 1}, "one"), world_size=1)  # batch 4
    assert one.cfg.train.steps == 13  # ceil(50 / 4)


def test_steps_and_epochs_that_disagree_are_an_error(tmp_path: Path) -> None:
    with pytest.raises(UserError, match=r"train\.steps=10 and train\.epochs=1 \(7 steps on 50 "):
        _prepare(_text_config(tmp_path, {"epochs": 1, "steps": 10}))
    assert not (tmp_path / "r").exists()
    unset = _prepare(_text_config(tmp_path, {"epochs": 1, "steps": None}))  # --train.steps null
    assert unset.cfg.train.steps == 7
    with pytest.raises(UserError, match=r"^train\.steps is null: give a number of steps, or"):
        config_from_dict({"train": {"steps": None}})


def test_default_run_is_100_steps() -> None:
    cfg = config_from_dict({})
    assert cfg.train.steps == 100 and cfg.train.epochs is None


def test_a_run_that_repeats_its_data_says_so(tmp_path: Path, capsys) -> None:
    prep = _prepare(_text_config(tmp_path, {"steps": 10}))
    assert prep.cfg.train.steps == 10
    err = capsys.readouterr().err.strip()
    assert err == (
        "note: 10 steps x 8 rows = 80 rows from 50 packed training rows: 1.6 epochs (the data "
        "repeats); set train.epochs to choose by epochs"
    )
    _prepare(_text_config(tmp_path, {"steps": 6}, "short"))  # 48 rows of 50: no note
    assert capsys.readouterr().err == ""


def _fits(err: str) -> list[str]:
    """The settings the error line says fit, as overrides."""
    found = re.search(r"this fits: ([^;]*);", err)
    assert found, err
    return found.group(1).split()


def test_small_data_is_one_line_with_every_fix(tmp_path: Path, capsys) -> None:
    """3 conversations, the defaults (val_fraction 0.02, micro batch 8), 2 ranks: once three
    errors in turn (validation, the batch of 16, then the batch of 2); now one line."""
    tok = make_tokenizer(tmp_path / "tok")
    src = write_chat_jsonl(tmp_path / "chat.jsonl", 3)
    cfg = {
        "model": {"preset": "tiny", "overrides": {"n_layers": 2}},
        "data": {"source": str(src), "format": "chat", "tokenizer": str(tok)},
        "log": {"run_dir": str(tmp_path / "r")},
    }
    path = tmp_path / "c.yaml"
    path.write_text(json.dumps(cfg))
    code = main(["train", "-c", str(path), "--nproc", "2"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and err.startswith("error: data: "), err
    assert "1 packed row (3 samples) is too few to hold out 1 for validation" in err
    assert "fill a global batch of 16 rows (train.micro_batch_size=8 x" in err
    for key in ("data.val_fraction=0", "train.grad_accum_steps", "data.packing=false"):
        assert key in err, key
    assert (
        "model.seq_len" in err and "this fits: data.packing=false train.micro_batch_size=1" in err
    )
    assert not (tmp_path / "r").exists()
    prep = prepare_run(load_config(path, _fits(err)), LaunchOptions(), 2, "cpu")  # it does fit
    assert prep.cfg.data.packing is False and prep.cfg.train.micro_batch_size == 1


def test_small_text_data_names_max_tokens(tmp_path: Path) -> None:
    data = _text_config(tmp_path, {"steps": 1, "micro_batch_size": 16})
    data["data"]["max_tokens"] = 400  # 25 rows; a global batch of 16 x 2 x 2
    with pytest.raises(UserError) as e:
        _prepare(data)
    line = str(e.value)
    assert line.startswith("data: 25 rows of text are too few to fill a global batch of 64 rows")
    assert "this fits: train.micro_batch_size=6" in line
    assert "a higher data.max_tokens (now 400)" in line and "a lower model.seq_len" in line


@pytest.mark.slow
@pytest.mark.dist
def test_a_sharegpt_run_by_epochs_end_to_end(tmp_path: Path) -> None:
    """2 processes: the workers train the launcher's computed steps (their saved config states
    train.steps and train.epochs both), on ShareGPT records."""
    tok = make_tokenizer(tmp_path / "tok")
    src = write_chat_jsonl(tmp_path / "chat.jsonl", 60)
    to = {"system": "system", "user": "human", "assistant": "gpt"}
    records = [json.loads(line)["messages"] for line in src.read_text().splitlines()]
    share = tmp_path / "share.jsonl"
    share.write_text(
        "".join(
            json.dumps(
                {"conversations": [{"from": to[m["role"]], "value": m["content"]} for m in r]}
            )
            + "\n"
            for r in records
        )
    )
    cfg = {
        "model": {"preset": "tiny", "seq_len": 64, "overrides": {"n_layers": 2}},
        "data": {
            "source": str(share),
            "format": "sharegpt",
            "tokenizer": str(tok),
            "val_fraction": 0,
        },
        "train": {"epochs": 1.5, "micro_batch_size": 2, "eval_every": 0},
        "precision": {"mode": "fp32"},
        "log": {"run_dir": str(tmp_path / "r"), "every": 1, "progress": False},
    }
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(cfg))
    proc = zerofit("train", "-c", str(path), "--nproc", "2", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    steps = yaml.safe_load((tmp_path / "r" / "config.yaml").read_text())["train"]["steps"]
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert summary["step"] == steps == max(losses(tmp_path / "r"))
    rows = summary["data"]["rows"]
    assert steps == epoch_steps(1.5, rows, 4)
    assert f"note: train.epochs=1.5: {steps} steps x 4 rows over {rows} packed" in proc.stderr
    assert "data (sharegpt): 60 samples" in proc.stdout

"""`zerofit plan` takes the config as the user writes it: `--section.key VALUE` overrides as
`zerofit train` takes them, the run as configured beside the plan (every activation checkpointing
mode, fitting or not), what would fit when it does not, `--write` of the fields that differ from
the defaults, and tables within 100 columns.

Nothing here depends on this machine: GPU detection and host RAM are fixed answers.
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest
import yaml

import zerofit.commands.plan_write as plan_write
from zerofit.cli import main
from zerofit.config import to_dict
from zerofit.launch.run_config import load_config

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
GIB = 2**30
H100X8 = ("--gpus", "8", "--gpu", "H100", "--cpu-mem", "1TiB")
RTX = ("--gpus", "1", "--gpu", "RTX 4090", "--cpu-mem", "64GiB")
# Llama-3.2-1B-Instruct's config.json (the README's fine-tune), without its weights
LLAMA_1B = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 2048,
    "intermediate_size": 8192,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "num_hidden_layers": 16,
    "vocab_size": 128256,
    "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-05,
    "rope_theta": 500000.0,
    "tie_word_embeddings": True,
    "hidden_act": "silu",
    "torch_dtype": "bfloat16",
}


@pytest.fixture(autouse=True)
def fixed_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    import zerofit.commands.plan as command

    monkeypatch.setattr(command, "detect_hardware", lambda: None)
    monkeypatch.setattr(command, "host_ram", lambda: 64 * GIB)


@pytest.fixture
def hf_folder(tmp_path: Path) -> Path:
    folder = tmp_path / "Llama-3.2-1B-Instruct"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(LLAMA_1B))
    return folder


def plan_json(capsys: pytest.CaptureFixture[str], *args: str) -> dict:
    assert main(["plan", *args, "--json"]) == 0, capsys.readouterr().err
    return json.loads(capsys.readouterr().out)


def plan_out(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    assert main(["plan", *args]) == 0, capsys.readouterr().err
    return capsys.readouterr().out


def one_line_error(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    assert main(["plan", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("error: "), err
    return err


def config(tmp_path: Path, fields: dict, name: str = "c.yaml") -> str:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(fields))
    return str(path)


# -- the override grammar ---------------------------------------------------------------------


def test_overrides_apply_as_train_applies_them(capsys) -> None:
    data = plan_json(
        capsys, "--preset", "llama3-1b", *H100X8, "--model.seq_len", "4096",
        "--train.micro_batch_size=2", "--parallel.activation_checkpointing", "full",
    )  # fmt: skip
    assert data["workload"]["seq_len"] == 4096 and data["workload"]["micro_batch_size"] == 2
    assert data["as_configured"]["strategy"].endswith(" + AC")


@pytest.mark.parametrize(
    ("flag", "needle"),
    [
        ("--model.hff", "unknown config key 'model.hff' (did you mean 'model.hf'?)"),
        ("--modle.hf", "unknown config key 'modle' (did you mean 'model'?)"),
        (
            "--model.lora.rnk",
            "unknown config key 'model.lora.rnk' (did you mean 'model.lora.rank'?)",
        ),
    ],
)
def test_an_unknown_key_is_the_usual_closest_name_line(capsys, flag: str, needle: str) -> None:
    assert needle in one_line_error(capsys, "--preset", "tiny", *H100X8, flag, "2")


def test_two_models_are_one_line(capsys, hf_folder: Path) -> None:
    err = one_line_error(capsys, "--preset", "tiny", "--model.hf", str(hf_folder), *H100X8)
    assert "give one model" in err and "--preset with --model.hf" in err


def test_the_readme_fine_tune_plans_as_lora(capsys, hf_folder: Path) -> None:
    """README: `zerofit train -c configs/finetune-lora.yaml --model.hf ~/models/Llama-3.2-1B-Instruct`
    planned as it will run: LoRA r=16 on the folder's shape."""
    readme = (CONFIGS.parent / "README.md").read_text()
    line = next(x for x in readme.splitlines() if x.startswith("zerofit plan -c configs/finetune"))
    words = shlex.split(line.split("#")[0])[2:]  # as a user types it, the folder replaced
    words = [str(hf_folder) if w.endswith("Llama-3.2-1B-Instruct") else w for w in words]
    words = [str(CONFIGS.parent / w) if w.startswith("configs/") else w for w in words]
    assert words[0] == "-c" and "--model.hf" in words
    lora = CONFIGS / "finetune-lora.yaml"
    data = plan_json(capsys, *words, *RTX)
    assert data["model"]["layers"] == 16 and data["model"]["dim"] == 2048
    assert data["workload"]["lora"]["rank"] == 16 and data["workload"]["lora"]["quantized"] == 0
    assert data["workload"]["micro_batch_size"] == 4  # the config's own
    assert data["as_configured"]["auto"]  # parallel.backend auto: the planner's pick
    qlora = plan_json(capsys, "-c", str(CONFIGS / "finetune-qlora.yaml"), "--model.hf",
                      str(hf_folder), *RTX)  # fmt: skip
    assert qlora["workload"]["lora"]["quantized"] > 0
    text = " ".join(plan_out(capsys, "-c", str(lora), "--model.hf", str(hf_folder), *RTX).split())
    assert "LoRA r=16: 11.3M adapter params train" in text


def test_hf_config_with_c_takes_the_shape_from_hf_and_the_rest_from_yaml(
    capsys, hf_folder: Path
) -> None:
    full = str(CONFIGS / "finetune-full.yaml")
    data = plan_json(capsys, "-c", full, "--hf-config", str(hf_folder / "config.json"), *RTX)
    assert data["model"]["layers"] == 16 and data["workload"]["lora"] is None
    assert (data["workload"]["micro_batch_size"], data["workload"]["grad_accum_steps"]) == (8, 2)
    adapters = plan_json(capsys, "-c", full, "--model.hf", str(hf_folder), *RTX,
                         "--model.lora.rank", "8")  # fmt: skip
    assert adapters["workload"]["lora"]["rank"] == 8


# -- the run as configured --------------------------------------------------------------------

AC = [
    ({"activation_checkpointing": "none"}, "ZeRO-3"),
    ({"activation_checkpointing": "full"}, "ZeRO-3 + AC"),
    ({"activation_checkpointing": "selective"}, "ZeRO-3 + SAC"),
    ({"activation_checkpointing": "first_k", "ac_blocks": 8}, "ZeRO-3 + AC first 8"),
    ({"activation_checkpointing": "first_k", "ac_blocks": 31}, "ZeRO-3 + AC first 31"),
    ({"activation_checkpointing": "every_k", "ac_every": 4}, "ZeRO-3 + AC every 4"),
    ({"activation_checkpointing": "every_k", "ac_every": 3}, "ZeRO-3 + AC every 3"),
]


@pytest.mark.parametrize(("ac", "label"), AC, ids=[a[1] for a in AC])
@pytest.mark.parametrize("machine", [H100X8, RTX], ids=["fits", "does-not-fit"])
def test_the_configured_row_is_always_there(
    tmp_path: Path, capsys, ac: dict, label: str, machine: tuple[str, ...]
) -> None:
    parallel = {"backend": "deepspeed", "deepspeed": {"stage": 3}, **ac}
    cfg = config(tmp_path, {"model": {"preset": "llama3-8b", "seq_len": 2048},
                            "train": {"micro_batch_size": 1}, "parallel": parallel})  # fmt: skip
    data = plan_json(capsys, "-c", cfg, *machine)
    c = data["as_configured"]
    assert c["strategy"] == label and not c["auto"]
    assert c["config"]["parallel.activation_checkpointing"] == ac["activation_checkpointing"]
    assert c["fits"] == (machine == H100X8) and c["peak_reserved_gib"] > 0
    assert c["tokens_per_s"] > 0
    marked = [o for o in data["options"] if o["as_configured"]]
    assert marked == ([] if c["listed"] is None else [data["options"][c["listed"]]])
    if "every" in label or "first 8" in label:
        assert c["listed"] is None  # not a strategy the planner lists
    text = plan_out(capsys, "-c", cfg, *machine)
    row = next(line for line in text.splitlines() if re.search(r"│ *\d*\* │", line))
    assert f" {label} " in row  # the marked row is the configured strategy
    assert f"* as configured: micro-batch 1 x accumulation 1, {label}," in " ".join(text.split())


def test_auto_is_the_planners_pick(tmp_path: Path, capsys) -> None:
    cfg = config(tmp_path, {"model": {"preset": "llama3-8b"}, "parallel": {"backend": "auto"}})
    data = plan_json(capsys, "-c", cfg, *H100X8)
    c = data["as_configured"]
    assert c["auto"] and c["listed"] == 0 and c["strategy"] == data["recommendation"]
    assert data["options"][0]["as_configured"]


def test_with_a_fixed_global_batch_the_configured_row_makes_it(tmp_path: Path, capsys) -> None:
    fields = {"model": {"preset": "llama3-1b"}, "parallel": {"backend": "fsdp"}}
    data = plan_json(capsys, "-c", config(tmp_path, fields), *RTX, "--global-batch", "64")
    c = data["as_configured"]
    assert c["micro_batch_size"] * c["grad_accum_steps"] == 64 and c["listed"] is not None


# -- what would fit ---------------------------------------------------------------------------


def _changes(data: dict) -> dict[str, dict]:
    return {
        s["change"].split(" r=")[0].split(" ")[0]: s for s in data["as_configured"]["suggestions"]
    }


def test_a_configured_run_that_does_not_fit_gets_forecast_changes(tmp_path: Path, capsys) -> None:
    fields = {
        "model": {"preset": "llama3-8b", "seq_len": 4096},
        "train": {"micro_batch_size": 1},
        "parallel": {"backend": "deepspeed", "deepspeed": {"stage": 3}},
    }
    data = plan_json(capsys, "-c", config(tmp_path, fields), *RTX, "--nvme", "2TB")
    changes = _changes(data)
    assert {"LoRA", "QLoRA", "CPU", "NVMe", "seq_len", "full"} <= set(changes)
    assert "micro-batch" not in changes  # the micro-batch is already 1
    for s in changes.values():
        assert {"fits", "peak_reserved_gib", "tokens_per_s", "strategy", "overrides"} <= set(s)
    assert changes["NVMe"]["overrides"]["parallel.deepspeed.offload_optimizer"] == "nvme"
    assert changes["CPU"]["nvme_gib_per_gpu"] == 0 and changes["CPU"]["host_gib_per_gpu"] > 0
    assert changes["QLoRA"]["fits"]  # DeepSpeed holds no 4-bit base: another engine does
    assert changes["QLoRA"]["overrides"]["parallel.backend"] != "deepspeed"
    assert changes["seq_len"]["overrides"]["model.seq_len"] < 4096
    text = " ".join(plan_out(capsys, "-c", config(tmp_path, fields), *RTX).split())
    assert "it does not fit; the same run with one change:" in text
    assert "- LoRA r=16 (--model.lora.rank 16): ZeRO-3," in text
    assert "Lower the micro-batch" not in text and "micro-batch 1 x accumulation 1 (" not in text


def test_a_larger_micro_batch_is_suggested_smaller(tmp_path: Path, capsys) -> None:
    fields = {"model": {"preset": "llama3-8b"}, "train": {"micro_batch_size": 4},
              "parallel": {"backend": "ddp"}}  # fmt: skip
    changes = _changes(plan_json(capsys, "-c", config(tmp_path, fields), *RTX))
    assert changes["micro-batch"]["overrides"] == {
        "train.micro_batch_size": 1,
        "train.grad_accum_steps": 4,
    }
    assert "CPU" not in changes and "NVMe" not in changes  # DDP does not offload


def test_a_lora_run_is_offered_qlora_only(tmp_path: Path, capsys) -> None:
    fields = {"model": {"preset": "13b", "lora": {"rank": 8}}, "parallel": {"backend": "fsdp"}}
    changes = _changes(plan_json(capsys, "-c", config(tmp_path, fields), *RTX))
    assert "LoRA" not in changes and changes["QLoRA"]["overrides"] == {
        "model.lora.rank": 8,
        "model.lora.quantize": "nf4",
    }


def test_a_fitting_run_gets_no_changes(tmp_path: Path, capsys) -> None:
    data = plan_json(capsys, "--preset", "llama3-1b", *H100X8)
    assert data["as_configured"]["fits"] and data["as_configured"]["suggestions"] == []


# -- --write ----------------------------------------------------------------------------------


WRITES = {
    "lora": ("-c", str(CONFIGS / "finetune-lora.yaml"), "--model.hf", "{hf}", *RTX),
    "first_k": (
        "--preset", "llama3-8b", *H100X8, "--parallel.activation_checkpointing", "first_k",
        "--parallel.ac_blocks", "8", "--train.epochs", "2", "--train.steps", "null",
    ),
    "global batch": ("--preset", "llama3-1b", *RTX, "--global-batch", "64", "--gpu-mem", "20GB"),
}  # fmt: skip


@pytest.mark.parametrize("case", list(WRITES))
def test_write_keeps_what_differs_and_resolves_the_same(
    tmp_path: Path, capsys, monkeypatch, hf_folder: Path, case: str
) -> None:
    args = [a.replace("{hf}", str(hf_folder)) for a in WRITES[case]]
    small, whole = tmp_path / "small.yaml", tmp_path / "whole.yaml"
    assert main(["plan", *args, "--write", str(small)]) == 0
    capsys.readouterr()
    monkeypatch.setattr(plan_write, "differing", lambda cfg, stated: to_dict(cfg))  # every field
    assert main(["plan", *args, "--write", str(whole)]) == 0
    capsys.readouterr()
    text = small.read_text()
    assert to_dict(load_config(small)) == to_dict(load_config(whole))  # as `train -c` loads it
    assert 2 * len(text.splitlines()) < len(whole.read_text().splitlines())
    comment = " ".join(line[2:] for line in text.splitlines() if line.startswith("# "))
    data = plan_json(capsys, *args)
    best = next(o for o in data["options"] if o["strategy"] == data["recommendation"])
    assert f"strategy: {best['strategy']}, micro-batch {best['micro_batch_size']} x" in comment
    assert f"forecast: {best['peak_reserved_gib']:.1f} GiB per GPU" in comment
    assert f"~{best['tokens_per_s']:,.0f} tokens/s" in comment
    assert re.search(r"planned \d{4}-\d\d-\d\d by: zerofit plan ", comment)
    assert f"--write {small}" in comment and ("RTX 4090" in comment or "H100 SXM" in comment)
    written = yaml.safe_load(text)
    assert written["parallel"]["backend"] == best["config"]["parallel.backend"]
    assert "optim" not in written or set(written["optim"]) <= {"lr", "warmup_steps",
                                                                "weight_decay", "min_lr_ratio"}  # fmt: skip


# -- the table's width ------------------------------------------------------------------------


def test_tables_fit_100_columns_and_nothing_is_cut(tmp_path: Path, capsys) -> None:
    folder = tmp_path / "hf"
    folder.mkdir()
    name = (
        "an-organisation-with-a-long-name/Llama-3.1-8B-Instruct-abliterated-uncensored-v2-GGUF-bf16"
    )
    shape = {**LLAMA_1B, "num_hidden_layers": 32, "_name_or_path": name}
    (folder / "config.json").write_text(json.dumps(shape))
    args = ("--hf-config", str(folder), "--gpus", "2", "--gpu", "RTX 4090", "--cpu-mem", "256GiB",
            "--nvme", "2TB", "--global-batch", "64", "--all")  # fmt: skip
    text = plan_out(capsys, *args)
    lines = text.splitlines()
    assert max(len(line.rstrip()) for line in lines) <= 100, max(lines, key=len)
    assert "…" not in text
    assert name in "".join(lines)  # the title wraps (a word too long folds), never cut
    data = plan_json(capsys, *args)
    for o in data["options"]:  # every row whole, on its line
        assert f" {o['strategy']} " in text, o["strategy"]
    assert sum(line.startswith(("┃  #", "┃   #")) for line in lines) >= 2  # the columns carried on


def test_groups_carry_the_columns_that_do_not_fit() -> None:
    from zerofit.commands.plan_table import COLUMNS, groups  # fails alone on the old table

    widths = {c: len(c) for c in COLUMNS} | {"strategy": 60, "tok/s": 9}
    tables = groups(widths, 100)
    assert [c for cols in tables for c in cols if c != "#"] == list(COLUMNS[1:])
    assert all(cols[0] == "#" for cols in tables) and tables[0][1] == "strategy"
    assert all(sum(widths[c] + 3 for c in cols) + 1 <= 100 for cols in tables)
    assert len(groups(widths, 400)) == 1

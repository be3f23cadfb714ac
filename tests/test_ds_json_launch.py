"""Other projects' DeepSpeed JSON through zerofit's launcher: each fixture trains or is refused
in one line before any rank starts, what zerofit made of it said in notes, the JSON DeepSpeed
gets kept in the run folder, and DeepSpeed's own config models run on it first.

Every fixture goes through the launcher's whole pre-launch path in-process (`prepare_run`: resolve,
DeepSpeed's validation, the run folder), fast; two of them (the README's LLaMA-Factory z3, and
axolotl's zero3_bf16 with its short ZeRO-3 spellings and bf16) really train 2 steps on 2 CPU
ranks (`dist`, `slow`).
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path

import pytest
import yaml
from conftest import POOL, losses, wait_all, write_config, zerofit
from ds_json_helpers import BASE, FIXTURES, ROOT, WORLD, leaves, user_json

from zerofit.backends.deepspeed.ds_json import to_ds_json
from zerofit.errors import UserError
from zerofit.launch import run_lock
from zerofit.launch.options import LaunchOptions
from zerofit.launch.prepare import prepare_run
from zerofit.launch.run_config import load_config

pytest.importorskip("deepspeed")

# None: trains. Otherwise the one line it is refused with, on a CPU whose DeepSpeed runs no fp16
# (the usual case; forced below so every machine gives the same outcome).
REFUSED = {
    "megatron_zero2": r"^fp16 compute \(fp16.enabled=true in .*megatron_zero2.json\) is not "
    r'supported by DeepSpeed on this CPU; use bf16 or fp32 \(set it to "auto" or false\)$',
}


@pytest.fixture
def cpu_without_fp16(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("zerofit.backends.deepspeed.spec.fp16_supported", lambda: False)
    monkeypatch.setattr("zerofit.backends.deepspeed.spec.bf16_supported", lambda: True)


def _notes(err: str) -> list[str]:
    return [line[len("note: ") :] for line in err.splitlines() if line.startswith("note: ")]


@pytest.mark.parametrize("name", list(FIXTURES))
def test_every_fixture_trains_or_is_refused_before_any_rank(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys, cpu_without_fp16
) -> None:  # noqa: ANN001
    monkeypatch.chdir(tmp_path)
    path, run = FIXTURES[name], tmp_path / "run"
    cfg = load_config(None, [*BASE, f"parallel.deepspeed.config={path}", f"log.run_dir={run}"])
    try:
        prep = prepare_run(cfg, LaunchOptions(), WORLD, "cpu")
    except UserError as e:
        assert name in REFUSED, f"{name} refused: {e}"
        assert re.match(REFUSED[name], str(e)) and "\n" not in str(e), str(e)
        assert not run.exists()  # refused before the run folder
        return
    finally:
        run_lock.release_all()
    assert name not in REFUSED
    saved = json.loads((run / "ds_config.json").read_text())
    assert saved == to_ds_json(prep.cfg, WORLD)  # what the ranks build from the saved config
    assert saved == to_ds_json(load_config(run / "config.yaml"), WORLD)
    user, got = leaves(user_json(name)), leaves(saved)
    notes = _notes(capsys.readouterr().err)
    autos = [p for p, v in user.items() if v == "auto"]
    if autos:  # one line says what every "auto" became
        line = next(n for n in notes if '"auto" became' in n)
        assert all(f"{p}=" in line or f'{p} stays "auto"' in line for p in autos), (autos, line)
    added = [p for p in got if p not in user]
    if added:  # one line lists every key the file leaves out that zerofit fills
        line = next(n for n in notes if "leaves out" in n and "filled from the config" in n)
        assert all(f"{p}=" in line for p in added), (added, line)


def test_what_zerofit_stands_in_for_is_said(tmp_path: Path, monkeypatch, capsys) -> None:  # noqa: ANN001
    """The Megatron file where fp16 runs: DeepSpeed builds its Adam as written (lr from zerofit's
    schedule, weight decay from its groups, betas and eps DeepSpeed's), and its activation_
    checkpointing block loses to zerofit's parallel.activation_checkpointing; the transformers
    file's WarmupLR becomes zerofit's schedule."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("zerofit.backends.deepspeed.spec.fp16_supported", lambda: True)
    said = {}
    for name in ("megatron_zero2", "transformers_zero3"):
        run = tmp_path / name
        over = [*BASE, f"parallel.deepspeed.config={FIXTURES[name]}", f"log.run_dir={run}"]
        try:
            prepare_run(load_config(None, over), LaunchOptions(), WORLD, "cpu")
        finally:
            run_lock.release_all()
        said[name] = "\n".join(_notes(capsys.readouterr().err))
    assert "optimizer Adam is built by DeepSpeed as written" in said["megatron_zero2"]
    assert "betas DeepSpeed's default ([0.9, 0.999])" in said["megatron_zero2"]
    assert (
        "activation_checkpointing (partition_activations=true, contiguous_memory_optimization="
        "true) configures deepspeed.checkpointing, which zerofit's models do not call: "
        "parallel.activation_checkpointing=none wins" in said["megatron_zero2"]
    )
    assert (
        "scheduler WarmupLR is left out of the JSON DeepSpeed gets; zerofit's schedule stands "
        "in: linear warmup over 20 steps to lr 0.001, then constant" in said["transformers_zero3"]
    )


@pytest.mark.parametrize(
    ("change", "line"),
    [
        (
            {"stage3_param_persitence_threshold": 1e4},
            r"^error: zero_optimization.stage3_param_persitence_threshold=10000.0 in .*typo.json: "
            r"DeepSpeed \S+ has no such key \(did you mean stage3_param_persistence_threshold\?\)$",
        ),
        (
            {"offload_optimizer": {"device": "cpu", "pin_memroy": True}},
            r"^error: zero_optimization.offload_optimizer.pin_memroy=true in .*typo.json: "
            r"DeepSpeed \S+ has no such key \(did you mean pin_memory\?\)$",
        ),
        (  # DeepSpeed's models drop "auto" values before they check names
            {"stage3_param_persitence_threshold": "auto"},
            r'^error: zero_optimization.stage3_param_persitence_threshold="auto" in .*typo.json: '
            r"DeepSpeed \S+ has no such key \(did you mean stage3_param_persistence_threshold\?\)$",
        ),
    ],
)
def test_a_misspelled_key_stops_the_launcher_in_one_line(
    tmp_path: Path, monkeypatch, capsys, change: dict, line: str
) -> None:  # noqa: ANN001
    """The issue: it printed fine from ds-config and failed once the ranks had started."""
    from zerofit.cli import main

    monkeypatch.chdir(tmp_path)
    data = user_json("llamafactory_z3")
    data["zero_optimization"] |= change
    (tmp_path / "typo.json").write_text(json.dumps(data))
    cfg = write_config(tmp_path / "c.yaml", {"parallel": {"backend": "deepspeed"}})
    code = main(
        ["train", "-c", str(cfg), "--nproc", "2", "--parallel.deepspeed.config", "typo.json"]
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and re.match(line, err[0]), err
    assert not (tmp_path / "runs").exists()


def test_ds_config_prints_only_json(tmp_path: Path) -> None:
    """stdout: the JSON alone (DeepSpeed's import-time log and warnings go to stderr); stderr:
    the notes, DeepSpeed's deprecation warning among them."""
    data = user_json("llamafactory_z3")
    zero = data["zero_optimization"]
    zero["stage3_gather_fp16_weights_on_model_save"] = zero.pop(
        "stage3_gather_16bit_weights_on_model_save"
    )
    (tmp_path / "old.json").write_text(json.dumps(data))
    cfg = write_config(tmp_path / "c.yaml", {"parallel": {"deepspeed": {"config": "old.json"}}})
    proc = zerofit("ds-config", "-c", str(cfg), "--nproc", "2", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ds = json.loads(proc.stdout)
    assert ds["zero_optimization"]["reduce_bucket_size"] == 256 * 256
    notes = _notes(proc.stderr)
    assert any(n.startswith('old.json: "auto" became train_batch_size=8') for n in notes), notes
    assert any(
        "DeepSpeed says: Config parameter stage3_gather_fp16_weights_on_model_save is "
        "deprecated" in n
        for n in notes
    ), notes


def test_the_readme_shows_what_the_launcher_says(monkeypatch, cpu_without_fp16) -> None:  # noqa: ANN001
    """README's "Bring your DeepSpeed JSON": its file is the one that trains below, and its note
    lines are the launcher's, cut short (`...`), for the embedded config on 2 CPU processes."""
    from zerofit.backends import engine_of
    from zerofit.launch.resolve import resolve

    monkeypatch.chdir(ROOT)
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Bring your DeepSpeed JSON")[1].split("\n## ")[0]
    rel = FIXTURES["llamafactory_z3"].relative_to(ROOT)
    assert f"--parallel.deepspeed.config {rel}" in section
    cfg = load_config(None, ["parallel.backend=deepspeed", f"parallel.deepspeed.config={rel}"])
    cfg = resolve(cfg, WORLD, "cpu")
    said = engine_of(cfg).launch_check(cfg, WORLD).notes
    shown = [line[len("note: ") :] for line in section.splitlines() if line.startswith("note: ")]
    assert len(shown) == 2, shown
    for line in shown:
        assert any(n.startswith(line.removesuffix(", ...")) for n in said), (line, said)


# ------------------------------------------------------------------ two real runs

RUNS = ("llamafactory_z3", "axolotl_zero3_bf16")  # the README's file; short spellings + bf16


def _train(root: Path, name: str) -> tuple[Path, subprocess.CompletedProcess]:
    run = root / name
    extra = {
        "parallel": {"backend": "deepspeed", "deepspeed": {"config": str(FIXTURES[name])}},
        "train": {"steps": 2},
        "precision": {"mode": "auto"},  # the file decides (axolotl's asks for bf16)
        "log": {"run_dir": str(run)},
    }
    cfg = write_config(root / f"{name}.yaml", extra)
    proc = zerofit("train", "-c", str(cfg), "--nproc", "2", cwd=root, env={"OMP_NUM_THREADS": "1"})
    return run, proc


@pytest.fixture(scope="module")
def real_runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Future]]:
    root = tmp_path_factory.mktemp("ds-json-runs")
    futures = {name: POOL.submit(_train, root, name) for name in RUNS}
    yield futures
    wait_all(futures.values())


@pytest.mark.dist
@pytest.mark.slow
@pytest.mark.parametrize("name", RUNS)
def test_a_file_from_another_project_trains_unchanged(name: str, real_runs) -> None:  # noqa: ANN001
    run, proc = real_runs[name].result()
    assert proc.returncode == 0, f"{name}:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    got = losses(run)
    assert sorted(got) == [1, 2] and all(v == v for v in got.values()), got
    saved = json.loads((run / "ds_config.json").read_text())
    zero = saved["zero_optimization"]
    assert "auto" not in json.dumps(saved)  # every "auto" resolved (stage 3: HF fills them all)
    assert zero["reduce_bucket_size"] == 256 * 256
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    assert cfg["parallel"]["deepspeed"]["reduce_bucket_size"] == 256 * 256
    precision = json.loads((run / "precision.json").read_text())["effective"]["compute"]
    assert precision == ("bf16" if name == "axolotl_zero3_bf16" else "fp32")
    assert '"auto" became' in proc.stderr


def test_a_top_level_key_deepspeed_never_reads_is_refused_when_misspelled_else_noted(
    tmp_path: Path, capsys
) -> None:  # noqa: ANN001
    """DeepSpeed has no model of the top level: a misspelled key there would be ignored."""
    from zerofit.cli import main

    data = user_json("llamafactory_z3")
    data["gradient_clippping"] = data.pop("gradient_clipping")
    (tmp_path / "typo.json").write_text(json.dumps(data))
    args = ["ds-config", "--parallel.backend", "deepspeed", "--parallel.deepspeed.config"]
    assert main([*args, str(tmp_path / "typo.json")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].endswith("(did you mean gradient_clipping?)"), err
    data["gradient_clipping"] = data.pop("gradient_clippping")
    data["my_launcher_tag"] = "run-7"
    (tmp_path / "extra.json").write_text(json.dumps(data))
    assert main([*args, str(tmp_path / "extra.json")]) == 0
    err = capsys.readouterr().err
    assert "my_launcher_tag is no key DeepSpeed" in err and "it is ignored" in err

"""The host's speed as an input (`zerofit plan --host-probe`, `--host-us`): the probe
(`zerofit.planner.host_probe`) times kernel launches and FSDP2's hooks where it runs, and the
planner's host term (`zerofit.planner.speed.host_seconds`) charges those rates instead of the
constants fitted on the H200 machine's host."""

from __future__ import annotations

import json
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from zerofit.backends import engines
from zerofit.backends.terms import BLOCK_LAYERS, Workload
from zerofit.cli import main
from zerofit.models.shape import shape_from_preset
from zerofit.planner import host_probe, speed
from zerofit.planner.memory import Strategy
from zerofit.planner.shape import Hardware

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
import planner_corpus  # noqa: E402
from conftest import zerofit  # noqa: E402

H100 = Hardware(gpus_per_node=1, gpu_mem=80 * 10**9, cpu_mem=125 * 2**30)
DELAY = 0.05  # host seconds added to every FSDP2 unit's forward


def fsdp_eager_short() -> tuple[object, ...]:
    m = shape_from_preset("llama3-1b")
    w = Workload(1, 1024, 1, grad_accum_steps=2, master_dtype="bf16")
    return m, w, Strategy.of("fsdp", compile=False)


def test_the_host_term_charges_the_machines_rates_when_given() -> None:
    m, w, s = fsdp_eager_short()
    assumed = speed.host_seconds(m, w, s, H100)[0]  # type: ignore[arg-type]
    assert assumed == speed.host_seconds(m, w, s)[0]  # type: ignore[arg-type]
    launch, hook = speed.LAUNCH_SECONDS, speed.HOOK_SECONDS
    slower = replace(H100, host_launch_s=2 * launch, host_hook_s=2 * hook)
    assert speed.host_seconds(m, w, s, slower)[0] == pytest.approx(2 * assumed)  # type: ignore[arg-type]
    hooks_free = replace(H100, host_launch_s=launch, host_hook_s=0.0)
    assert speed.host_seconds(m, w, s, hooks_free)[0] < assumed  # type: ignore[arg-type]
    assert speed.predict(m, w, s, slower).step_time > speed.predict(m, w, s, H100).step_time  # type: ignore[arg-type]


def test_the_probe_measures_host_time_added_to_each_unit(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every FSDP2 unit made DELAY slower on the host (a forward pre-hook that sleeps): the
    probe's unit time rises by about DELAY, and its hook rate is that over the calls a unit
    counts as. Sleep cannot be shorter than asked, so the lower bound holds on a busy host."""
    monkeypatch.setattr(host_probe, "WARMUP", 1)
    monkeypatch.setattr(host_probe, "STEPS", 3)
    monkeypatch.setattr(host_probe, "REPEATS", 3)
    fsdp = engines()["fsdp"]

    class Slowed:
        def hook_for_probe(self, model: torch.nn.Module, blocks: torch.nn.ModuleList) -> tuple:
            step, calls = fsdp.hook_for_probe(model, blocks)  # type: ignore[misc]
            for block in blocks:
                block.register_forward_pre_hook(lambda *_: time.sleep(DELAY))
            return step, calls

    monkeypatch.setattr(host_probe, "engines", lambda: {"fsdp": Slowed(), "ddp": engines()["ddp"]})
    found = host_probe.probe()
    assert list(found.units) == ["fsdp"]  # DDP has no Python hooks to time
    # loose above: a busy host stretches every sleep and hook (1.9x seen beside a suite run)
    assert 0.8 * DELAY < found.units["fsdp"] < 3 * DELAY, found
    assert found.hooks["fsdp"] == pytest.approx(found.units["fsdp"] / (4 * BLOCK_LAYERS))
    assert found.launch_s == pytest.approx(found.block_s / speed.BLOCK_KERNELS)
    assert found.launch_s > 0 and "CPU" in found.where
    assert not torch.distributed.is_initialized()  # its fake process group is gone


def test_an_engine_whose_probe_fails_keeps_the_fitted_rate(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(host_probe, "WARMUP", 1)
    monkeypatch.setattr(host_probe, "STEPS", 2)
    monkeypatch.setattr(host_probe, "REPEATS", 1)

    class Broken:
        def hook_for_probe(self, model: torch.nn.Module, blocks: torch.nn.ModuleList) -> tuple:
            raise RuntimeError("no such collective\nsecond line")

    monkeypatch.setattr(
        host_probe, "engines", lambda: {"broken": Broken(), "fsdp": engines()["fsdp"]}
    )
    found = host_probe.probe()
    assert found.failed == {"broken": "RuntimeError: no such collective"}
    assert "broken" not in found.hooks and "fsdp" in found.hooks
    assert not torch.distributed.is_initialized()
    hw = replace(H100, host_hooks=tuple(found.hooks.items()))
    assert speed.host_rates(hw, engine="broken")[1] == speed.HOOK_SECONDS


def test_each_engine_is_probed_for_its_own_hooks(tmp_path: Path) -> None:
    """ZeRO-3's hooks are timed under DeepSpeed itself (fake process group, CPU accelerator
    here), not charged at FSDP2's rate; a forecast charges each engine its own. In a process of
    its own: DeepSpeed patches torch for the rest of the process it initializes in."""
    args = ["plan", "--preset", "llama3-1b", "--gpus", "1", "--gpu", "H100", "--json"]
    out = zerofit(*args, "--host-probe", cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    found = json.loads(out.stdout)["hardware"]
    assert set(found["host_hooks_us"]) == {"fsdp", "deepspeed"}
    assert all(rate > 0 for rate in found["host_hooks_us"].values())
    assert found["host_from"].startswith("probed: ") and found["host_launch_us"] > 0
    hooks = tuple((k, v * 1e-6) for k, v in found["host_hooks_us"].items())
    hw = replace(H100, host_launch_s=found["host_launch_us"] * 1e-6, host_hooks=hooks)
    assert speed.host_rates(hw, engine="deepspeed")[1] == dict(hooks)["deepspeed"]
    assert speed.host_rates(hw, engine="fsdp")[1] == dict(hooks)["fsdp"]


def plan(capsys: pytest.CaptureFixture[str], *flags: str) -> str:
    assert main(["plan", "--preset", "llama3-1b", "--gpus", "1", "--gpu", "H100", *flags]) == 0
    return capsys.readouterr().out


def test_plan_takes_the_host_rates_and_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    slow = json.loads(plan(capsys, "--json", "--host-us", "100,1000"))
    fast = json.loads(plan(capsys, "--json", "--host-us", "1,1"))
    assert slow["hardware"]["host_from"] == "--host-us"
    assert slow["hardware"]["host_launch_us"] == pytest.approx(100)
    assert slow["hardware"]["host_hook_us"] == pytest.approx(1000)
    by_label = {o["strategy"]: o["step_time_s"] for o in fast["options"]}
    slower = [o for o in slow["options"] if o["step_time_s"] > by_label[o["strategy"]] * 1.5]
    assert slower, "a host 100x slower moved no forecast"
    text = " ".join(plan(capsys, "--host-us", "100,1000").split())
    assert "100.0 us a kernel launch, a hook call 1000.0 us (--host-us)" in text


@pytest.mark.parametrize(
    "flags, said",
    [
        (["--host-us", "5"], "--host-us takes LAUNCH,HOOK[,COMPILED] in microseconds, got '5'"),
        (["--host-us", "5,-1"], "--host-us must be a finite number > 0, got '-1'"),
        (["--host-us", "5,6", "--host-probe"], "--host-us and --host-probe both give"),
    ],
)
def test_bad_host_flags_are_one_line(
    capsys: pytest.CaptureFixture[str], flags: list[str], said: str
) -> None:
    args = ["plan", "--preset", "llama3-1b", "--gpus", "1", "--gpu", "H100", *flags]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and said in err, err


def test_the_residuals_forecast_a_folder_with_its_probed_host(tmp_path: Path) -> None:
    """A device call's probe (`host-probe.json`, written by `plan --host-probe --json`) is the
    host its runs are forecast on, from any folder under the call's."""
    call = tmp_path / "call"
    (call / "run" / "logs").mkdir(parents=True)
    probe = {"hardware": {"host_launch_us": 7.0, "host_hook_us": 40.0, "host_from": "probed: X"}}
    (call / planner_corpus.PROBE_FILE).write_text(json.dumps(probe))
    hw = planner_corpus.probed_host(H100, call / "run" / "results.json", tmp_path)
    assert (hw.host_launch_s, hw.host_hook_s) == pytest.approx((7e-6, 40e-6))
    assert hw.host_from == "probed: X"
    elsewhere = tmp_path / "other" / "results.json"
    assert planner_corpus.probed_host(H100, elsewhere, tmp_path) == H100


def test_compiled_kernels_launch_at_their_own_rate_where_known(
    capsys: pytest.CaptureFixture[str],
) -> None:
    m, w, s = fsdp_eager_short()
    compiled = replace(s, compile=True)  # type: ignore[type-var]
    given = replace(H100, host_launch_s=10e-6, host_hook_s=50e-6)
    triton = replace(given, host_compiled_launch_s=40e-6)
    assert speed.host_rates(triton, compiled=True) == (40e-6, 50e-6)
    assert speed.host_rates(triton) == speed.host_rates(given, compiled=True) == (10e-6, 50e-6)
    assert (
        speed.host_seconds(m, w, compiled, triton)[0] > speed.host_seconds(m, w, compiled, given)[0]
    )  # type: ignore[arg-type]
    assert speed.host_seconds(m, w, s, triton) == speed.host_seconds(m, w, s, given)  # type: ignore[arg-type]
    found = json.loads(plan(capsys, "--json", "--host-us", "10,50,40"))["hardware"]
    assert found["host_compiled_launch_us"] == pytest.approx(40)
    assert "(40.0 compiled)" in " ".join(plan(capsys, "--host-us", "10,50,40").split())

"""What the planner's host term charges for hooks whose cost depends on where in the step a
micro-batch falls (`HostCalls.accumulating`: ZeRO-1 off the accumulation boundary), and what
the host probe times as an offloaded optimizer's step (`torch_common.adamw_for_probe`)."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest
import torch

from zerofit.backends import torch_common
from zerofit.backends.terms import Workload
from zerofit.cli import main
from zerofit.models.shape import shape_from_preset
from zerofit.planner import host_probe, speed
from zerofit.planner.memory import Strategy
from zerofit.planner.shape import Hardware

H100 = Hardware(gpus_per_node=1, gpu_mem=80 * 10**9, cpu_mem=125 * 2**30)
BOUNDARY, OFF = 200e-6, 50e-6  # seconds a ZeRO-1/2 gradient hook, on and off the boundary


def hooks_charged(stage: int, accum: int, hw: Hardware) -> float:
    """Host seconds a step's hooks add for a ZeRO `stage` run of `accum` micro-batches on `hw`
    (its forecast less the same with every probed hook rate at 0)."""
    m = shape_from_preset("llama3-1b")
    w = Workload(1, 512, 1, grad_accum_steps=accum, master_dtype="bf16")
    s = Strategy.of("deepspeed", stage=stage, compile=False)
    free = replace(hw, host_hooks=tuple((k, 0.0) for k, _ in hw.host_hooks))
    return sum(speed.host_seconds(m, w, s, hw)) - sum(speed.host_seconds(m, w, s, free))  # type: ignore[arg-type]


def test_zero1_hooks_off_the_boundary_are_charged_their_own_probed_rate() -> None:
    """ZeRO-1's gradient hooks run on every micro-batch, reducing only on the step's last: the
    earlier ones at the rate the probe times off the boundary, the last at ZeRO-1/2's. ZeRO-2's
    reduce on every one. A probe file without the off-boundary rate charges ZeRO-1/2's."""
    rates = (("deepspeed/zero12@1", BOUNDARY), ("deepspeed/zero1-accumulating@1", OFF))
    hw = replace(H100, host_hooks=rates)
    trained = 16 * 9 + 3  # llama3-1b's trained tensors, each with its gradient hook
    walks = 2 * trained * BOUNDARY  # ZERO12_STEP_PASSES walks after backward
    for accum in (1, 4):
        zero1, zero2 = hooks_charged(1, accum, hw), hooks_charged(2, accum, hw)
        assert zero1 == pytest.approx(trained * (BOUNDARY + (accum - 1) * OFF) + walks)
        assert zero2 == pytest.approx(trained * accum * BOUNDARY + walks)
    older = replace(H100, host_hooks=rates[:1])
    assert hooks_charged(1, 4, older) == pytest.approx(hooks_charged(2, 4, older))


def test_only_zero1_has_an_off_boundary_kind_of_run() -> None:
    """The variant a ZeRO-1 micro-batch before the boundary is charged at, and the probe's
    list of variants to time holds it; ZeRO-2 and ZeRO-3 hooks do the same work on every
    micro-batch."""
    variants = {}
    for stage in (1, 2, 3):
        s = Strategy.of("deepspeed", stage=stage, compile=False)
        variants[stage] = s.engine.hook_variant(s.options, False, accumulating=True)  # type: ignore[attr-defined]
    assert variants == {1: "zero1-accumulating", 2: "zero12", 3: ""}
    assert "zero1-accumulating" in s.engine.hook_variants()  # type: ignore[attr-defined]


def test_the_offloaded_adamw_probe_times_the_clipping_the_run_does(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """FSDP2's offloaded step on the host is the gradients' norm and clipping, then AdamW
    (`TorchBackend.step`): the probe times both, clipping every parameter at no limit (the same
    passes as at any limit, gradients unchanged)."""
    clipped: list[tuple[int, float]] = []
    real = torch.nn.utils.clip_grad_norm_

    def spy(params, max_norm, **kw):  # noqa: ANN001, ANN003, ANN202
        params = list(params)
        clipped.append((sum(p.numel() for p in params), max_norm))
        return real(params, max_norm, **kw)

    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", spy)
    step, stepped = torch_common.adamw_for_probe(True)(4096, torch.device("cpu"))
    assert step() > 0 and step() > 0
    assert clipped == [(stepped, math.inf)] * 2


def test_a_probed_pcie_rate_is_what_the_plan_forecasts_offload_with(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """On a GPU the probe times pinned copies to the GPU and back; the plan then forecasts the
    offloading engines' copies at that rate, not the card table's 25 GB/s."""

    def found(pcie: float | None) -> host_probe.HostSpeed:
        return host_probe.HostSpeed(20e-6, None, {}, 1e-3, {}, {}, {}, "a CPU, a GPU", pcie)

    def offload_step(pcie: float | None) -> tuple[float, float]:
        monkeypatch.setattr(host_probe, "probe", lambda: found(pcie))
        args = ["plan", "--preset", "llama3-1b", "--gpus", "1", "--gpu", "H100", "--json"]
        assert main([*args, "--host-probe"]) == 0
        out = json.loads(capsys.readouterr().out)
        steps = [o["step_time_s"] for o in out["options"] if "offload" in o["strategy"]]
        return out["hardware"]["pcie_bw_gbs"], min(steps)

    table, at_table = offload_step(None)
    probed, at_probed = offload_step(50e9)
    assert (table, probed) == (25.0, 50.0)
    assert at_probed < at_table


def test_pcie_copies_that_cannot_run_keep_the_card_rate() -> None:
    """No copy to time on a CPU; on a device where pinned copies fail (here: CUDA named on a
    machine without it), the probe names the failure and gives no rate, so the plan keeps the
    card table's."""
    assert host_probe._pcie_rate(torch.device("cpu")) == (None, {})
    if torch.cuda.is_available():
        pytest.skip("a GPU here: its copies would be timed")
    rate, failed = host_probe._pcie_rate(torch.device("cuda", 0))
    assert rate is None and list(failed) == ["PCIe copies"]
    assert failed["PCIe copies"] and "\n" not in failed["PCIe copies"]

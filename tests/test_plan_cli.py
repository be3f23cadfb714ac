"""`zerofit plan` as a user drives it: bad numbers, host RAM, the "fits" rule, the GPU as an input.

Nothing here depends on this machine: the GPU detection and the host RAM detection are replaced by
fixed answers (or every size is given).
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch
from conftest import zerofit

from zerofit.backends.terms import Workload
from zerofit.cli import main
from zerofit.models.shape import shape_from_preset
from zerofit.planner import shape as hardware
from zerofit.planner.gpus import GPUS, find_gpu, gpu_named
from zerofit.planner.memory import Strategy
from zerofit.planner.plan import HEADROOM, evaluate, plan
from zerofit.planner.shape import Hardware, detect_hardware, host_ram, with_gpu
from zerofit.planner.speed import predict
from zerofit.report.metrics import PEAK_BF16_FLOPS

GIB = 2**30
DETECTED_RAM = 64 * GIB


@pytest.fixture(autouse=True)
def fixed_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    """No local GPU and 64 GiB of host RAM, whatever runs the tests."""
    import zerofit.commands.plan as command

    monkeypatch.setattr(command, "detect_hardware", lambda: None)
    monkeypatch.setattr(command, "host_ram", lambda: DETECTED_RAM)


def plan_error(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    """The one `error:` line of a `zerofit plan` refused with exit status 2."""
    try:
        code = main(["plan", *args])
    except SystemExit as e:  # argparse's own errors, turned into one line by the command
        code = e.code
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert len(err.splitlines()) == 1 and err.startswith("error: "), err
    return err


def plan_json(capsys: pytest.CaptureFixture[str], *args: str) -> dict:
    assert main(["plan", *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def plan_text(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    assert main(["plan", *args]) == 0
    return " ".join(capsys.readouterr().out.split())  # rich wraps the title: compare words


BASE = ("--preset", "llama3-8b", "--gpus", "2", "--gpu-mem", "24GB", "--cpu-mem", "256GiB")
PLAIN = ("--layers", "2", "--dim", "64", "--heads", "4", "--ffn", "128", "--vocab", "100")


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (("--gpus", "0"), "--gpus must be a whole number from 1 to"),
        (("--gpus", "two"), "--gpus must be a whole number from 1 to 1,000,000,000, got 'two'"),
        (("--gpus", "1.5"), "--gpus must be a whole number"),
        (("--gpus", "9" * 40), "--gpus must be a whole number"),
        (("--micro-batch", "-1"), "--micro-batch must be a whole number from 1 to"),
        (("--micro-batch", "0"), "--micro-batch must be a whole number"),
        (("--seq-len", "0"), "--seq-len must be a whole number"),
        (("--seq-len", "1e3"), "--seq-len must be a whole number"),
        (("--seq-len", "nan"), "--seq-len must be a whole number"),
        (("--grad-accum", "-2"), "--grad-accum must be a whole number"),
        (("--nodes", "0"), "--nodes must be a whole number"),
        (("--measure", "-1"), "--measure must be a whole number from 0 to"),
        (("--gpu-mem=-5GB",), "--gpu-mem: a size cannot be negative: '-5GB'"),
        (("--gpu-mem", "0GB"), "--gpu-mem must be more than 0, got '0GB'"),
        (("--gpu-mem", "nan"), "--gpu-mem: cannot read: 'nan'"),
        (("--gpu-mem", "infGB"), "--gpu-mem: cannot read"),
        (("--gpu-mem", "1.2.3GB"), "--gpu-mem: cannot read"),
        (("--gpu-mem", "9" * 400 + "GB"), "--gpu-mem: cannot read"),
        (("--cpu-mem=-1GiB",), "--cpu-mem: a size cannot be negative"),
        (("--nvme", "lots"), "--nvme: cannot read: 'lots'"),
        (("--peak-tflops", "nan"), "--peak-tflops must be a finite number > 0, got 'nan'"),
        (("--peak-tflops", "inf"), "--peak-tflops must be a finite number > 0, got 'inf'"),
        (("--peak-tflops", "0"), "--peak-tflops must be a finite number > 0"),
        (("--peak-tflops=-3",), "--peak-tflops must be a finite number > 0, got '-3'"),
        (("--gpu-mem", "-5GB"), "argument --gpu-mem: expected one argument"),
        (("--gpus",), "argument --gpus: expected one argument"),
    ],
)
def test_bad_numbers_are_one_line_and_exit_2(capsys, args: tuple[str, ...], needle: str) -> None:
    assert needle in plan_error(capsys, *BASE, *args)


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        (("--layers", "0"), "--layers must be a whole number"),
        (("--dim", "-64"), "--dim must be a whole number"),
        (("--heads", "0"), "--heads must be a whole number"),
        (("--ffn", "x"), "--ffn must be a whole number"),
        (("--vocab", "inf"), "--vocab must be a whole number"),
        (("--kv-heads", "0"), "--kv-heads must be a whole number"),
        (("--heads", "3"), "--dim 64 is not divisible by --heads 3"),
        (("--kv-heads", "3"), "--heads 4 is not divisible by --kv-heads 3"),
    ],
)
def test_bad_model_numbers(capsys, change: tuple[str, str], needle: str) -> None:
    args = list(PLAIN) + ["--gpus", "1", "--gpu-mem", "24GB"]
    if change[0] in args:
        args[args.index(change[0]) + 1] = change[1]
    else:
        args += change
    assert needle in plan_error(capsys, *args)


def test_bad_number_end_to_end_has_no_traceback(tmp_path) -> None:
    proc = zerofit("plan", "--preset", "tiny", "--gpus", "0", "--gpu-mem", "24GB", cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.strip() == (
        "error: --gpus must be a whole number from 1 to 1,000,000,000, got '0'"
    )


def test_unknown_and_ambiguous_gpu_names(capsys) -> None:
    err = plan_error(capsys, *BASE, "--gpu", "rtx4080")
    assert "unknown GPU 'rtx4080' (did you mean 'RTX 4090'?)" in err and "RTX A6000" in err
    assert "could be A100 40GB or A100 80GB" in plan_error(capsys, *BASE, "--gpu", "a100")


# -- host RAM ---------------------------------------------------------------------------------


def _offloads(option: dict) -> bool:
    return option["host_gib_per_gpu"] > 0


def test_zero_host_ram_is_allowed_and_nothing_offloads(capsys) -> None:
    """The issue's case: 70B on 8 x 141 GB, `--cpu-mem 0GiB`, once recommended ~1 TB of offload."""
    data = plan_json(capsys, "--preset", "70b", "--gpus", "8", "--gpu", "H200", "--cpu-mem", "0GiB")
    offloading = [o for o in data["options"] if _offloads(o)]
    assert offloading and not any(o["fits"] for o in offloading)
    assert all("host RAM per node, over the 0 GiB usable of 0" in o["why_not"] for o in offloading)
    assert data["recommendation"] is None
    assert data["hardware"]["cpu_mem_gib"] == 0 and data["hardware"]["cpu_mem_from"] == "given"


def test_offload_fits_only_within_the_host_ram(capsys) -> None:
    args = ("--preset", "70b", "--gpus", "8", "--gpu", "H200")
    small = plan_json(capsys, *args, "--cpu-mem", "512GiB")
    large = plan_json(capsys, *args, "--cpu-mem", "2TiB")
    for data, ram in ((small, 512), (large, 2048)):
        for o in data["options"]:
            if _offloads(o) and o["peak_reserved_gib"] < 100:  # fits the GPU: host decides
                assert o["fits"] == (o["host_gib_per_gpu"] * 8 <= 0.85 * ram), o["strategy"]
    assert small["recommendation"] is None and "optim->cpu" in large["recommendation"]


def test_host_ram_is_detected_when_not_given(capsys) -> None:
    args = ("--preset", "llama3-8b", "--gpus", "2", "--gpu", "RTX 4090")
    data = plan_json(capsys, *args)
    assert data["hardware"]["cpu_mem_gib"] == 64 and data["hardware"]["cpu_mem_from"] == "detected"
    need = [o["host_gib_per_gpu"] * 2 for o in data["options"] if _offloads(o)]
    fits = [o["fits"] for o in data["options"] if _offloads(o)]
    assert all(n > 0.85 * 64 for n in need) and not any(fits)  # 8B offload needs > 54 GiB
    text = plan_text(capsys, *args)
    assert "host RAM 64 GiB per node (detected here)" in text
    assert "host RAM 256 GiB per node (given)" in plan_text(capsys, *args, "--cpu-mem", "256GiB")


def test_unknown_host_ram_fits_no_offload(capsys, monkeypatch) -> None:
    import zerofit.commands.plan as command

    monkeypatch.setattr(command, "host_ram", lambda: None)
    args = ("--preset", "llama3-1b", "--gpus", "1", "--gpu-mem", "8GB")
    data = plan_json(capsys, *args)
    assert data["hardware"]["cpu_mem_gib"] is None
    offloading = [o for o in data["options"] if _offloads(o)]
    assert offloading and not any(o["fits"] for o in offloading)
    assert all("host RAM is unknown" in o["why_not"] for o in offloading)
    assert "host RAM unknown (give --cpu-mem): offload cannot fit" in plan_text(capsys, *args)


def test_host_ram_detection_and_its_fallback(monkeypatch) -> None:
    ram = host_ram()
    assert ram is None or ram > 0

    def no_sysconf(name: str) -> int:
        raise ValueError(name)

    monkeypatch.setattr(hardware.os, "sysconf", no_sysconf)
    assert host_ram() is None


# -- the "fits" rule --------------------------------------------------------------------------


def test_fits_keeps_headroom_and_says_so(capsys) -> None:
    text = plan_text(capsys, *BASE)
    assert (
        "fits: GPU total (peak allocated + 0.59 GiB CUDA context + 8% allocator fragmentation) "
        "within 90% of 22.4 GiB = 20.1 GiB; the other 2.2 GiB stay free" in text
    )
    assert "within 85% of 256 GiB RAM per node = 218 GiB" in text
    h = plan_json(capsys, *BASE)["headroom"]
    assert h["gpu_kept_share"] == HEADROOM
    assert h["gpu_usable_gib"] == pytest.approx(24e9 * (1 - HEADROOM) / GIB)
    assert h["host_usable_gib"] == pytest.approx(0.85 * 256)


def test_just_under_the_card_is_not_a_fit() -> None:
    """ "needs 20.5 GiB of 22.4 GiB": over the 90% line, so not a fit, and the reason says why."""
    m, w, s = shape_from_preset("llama3-1b"), Workload(1, 2048, 1), Strategy.of("fsdp")
    need = evaluate(m, w, Hardware(1, 100 * GIB, cpu_mem=0), s).memory.peak_reserved
    tight = Hardware(1, int(need / 0.95), cpu_mem=0)  # needs 95% of the card
    o = evaluate(m, w, tight, s)
    assert not o.fits and "usable of" in o.why_not
    assert "within the card" in o.why_not  # inside the margin kept free, not over the card
    over = evaluate(m, w, Hardware(1, int(need / 1.05), cpu_mem=0), s)
    assert not over.fits and "within the card" not in over.why_not
    assert evaluate(m, w, Hardware(1, int(need / 0.89), cpu_mem=0), s).fits


# -- the GPU as an input ----------------------------------------------------------------------


REQUIRED = ("H100 SXM", "H100 PCIe", "H200", "A100 40GB", "A100 80GB", "L40S", "L4", "A10")
REQUIRED += ("RTX 4090", "RTX 3090", "RTX A6000")


def test_the_table_has_the_cards_with_plausible_figures() -> None:
    names = {g.name for g in GPUS}
    assert set(REQUIRED) <= names
    for g in GPUS:
        assert 20 * GIB < g.memory < 150 * GIB and 50 < g.bf16_tflops < 1000, g.name
        assert 0.2e12 < g.mem_bw < 5e12 and g.link_bw >= 32e9 and g.pcie_gen in (4, 5), g.name


def test_table_peaks_agree_with_the_trainers_mfu_table() -> None:
    """Two tables of dense bf16 peaks must not disagree (metrics.PEAK_BF16_FLOPS gives MFU)."""
    device_names = {"H100 SXM": "NVIDIA H100 80GB HBM3", "A100 40GB": "NVIDIA A100-SXM4-40GB"}
    for g in GPUS:
        device = device_names.get(g.name, f"NVIDIA {g.name}")
        peak = next((f for key, f in PEAK_BF16_FLOPS if key in device), None)
        if peak is not None:
            assert peak == pytest.approx(g.peak_flops, rel=0.01), g.name


@pytest.mark.parametrize(
    ("typed", "name"),
    [("rtx 4090", "RTX 4090"), ("RTX-4090", "RTX 4090"), ("Rtx4090", "RTX 4090")]
    + [("h100", "H100 SXM"), ("H100 pcie", "H100 PCIe"), ("a100_80gb", "A100 80GB")]
    + [("l4", "L4"), ("L40s", "L40S"), ("a6000", "RTX A6000"), ("H200", "H200")],
)
def test_names_match_case_insensitively(typed: str, name: str) -> None:
    assert find_gpu(typed).name == name


@pytest.mark.parametrize(
    ("device", "name"),
    [
        ("NVIDIA H100 80GB HBM3", "H100 SXM"),
        ("NVIDIA H100 PCIe", "H100 PCIe"),
        ("NVIDIA H200", "H200"),
        ("NVIDIA A100-SXM4-40GB", "A100 40GB"),
        ("NVIDIA A100 80GB PCIe", "A100 80GB"),
        ("NVIDIA L40S", "L40S"),
        ("NVIDIA L4", "L4"),
        ("NVIDIA A10", "A10"),
        ("NVIDIA GeForce RTX 4090", "RTX 4090"),
        ("NVIDIA GeForce RTX 3090", "RTX 3090"),
        ("NVIDIA RTX A6000", "RTX A6000"),
        ("NVIDIA A10G", None),
        ("NVIDIA L40", None),
        ("NVIDIA GH200 480GB", None),
        ("NVIDIA H100 NVL", None),
        ("NVIDIA GeForce RTX 3090 Ti", None),
    ],
)
def test_device_names_find_their_card(device: str, name: str | None) -> None:
    found = gpu_named(device)
    assert (found.name if found else None) == name


def _fake_cuda(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
    monkeypatch.setattr(
        torch.cuda,
        "get_device_properties",
        lambda device=None: SimpleNamespace(total_memory=23 * GIB),
    )
    monkeypatch.setattr(hardware, "host_ram", lambda: 128 * GIB)
    monkeypatch.setattr(hardware, "visible_gpus", lambda: 2)


def test_visible_gpus_reads_the_driver_and_cuda_visible_devices(monkeypatch, tmp_path) -> None:
    """The count `plan` and `ds-config` use without importing torch."""
    gpus = tmp_path / "gpus"
    for bus in ("0000:01:00.0", "0000:02:00.0", "0000:03:00.0"):
        (gpus / bus).mkdir(parents=True)
    monkeypatch.setattr(hardware, "Path", lambda p: gpus if p == "/proc/driver/nvidia/gpus" else p)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert hardware.visible_gpus() == 3
    for value, count in [("1", 1), ("0,2", 2), ("", 0), ("-1", 0), ("0,-1,2", 1), ("0,1,2,3", 3)]:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", value)
        assert hardware.visible_gpus() == count, value
    monkeypatch.setattr(hardware, "Path", lambda p: tmp_path / "none")
    assert hardware.visible_gpus() == 0  # no driver: no GPU, whatever the variable says


def test_a_local_card_is_detected_by_name(monkeypatch) -> None:
    _fake_cuda(monkeypatch, "NVIDIA GeForce RTX 4090")
    hw = detect_hardware()
    assert hw is not None and (hw.name, hw.gpu_from, hw.gpus_per_node) == (
        "RTX 4090",
        "detected",
        2,
    )
    assert hw.peak_flops == 165.2e12 and hw.mem_bw == 1.008e12
    assert hw.gpu_mem == 23 * GIB and hw.cpu_mem == 128 * GIB  # the card's own memory
    _fake_cuda(monkeypatch, "NVIDIA Mystery X1")
    hw = detect_hardware()
    assert hw is not None and hw.gpu_from == "detected, peak assumed"


def test_the_forecast_uses_the_cards_peak_and_bandwidth() -> None:
    m, w, s = shape_from_preset("llama3-1b"), Workload(4, 2048, 2), Strategy.of("fsdp")
    base = Hardware(2, 80 * GIB, cpu_mem=0)
    h200 = with_gpu(base, find_gpu("H200"))
    assert predict(m, w, s, h200).tokens_per_s == pytest.approx(
        predict(m, w, s, base).tokens_per_s
    )  # the constants were fitted on the H200: its forecast is the default one
    rtx = with_gpu(base, find_gpu("RTX 4090"))
    assert (rtx.intra_bw, rtx.pcie_bw) == (pytest.approx(32e9 * 2 / 3), 12.5e9)
    slow, fast = predict(m, w, s, rtx), predict(m, w, s, h200)
    assert 4 < fast.tokens_per_s / slow.tokens_per_s < 10  # peak 6x apart, slower links too
    half_bw = predict(m, w, s, Hardware(2, 80 * GIB, mem_bw=2.4e12))
    assert half_bw.compute > predict(m, w, s, base).compute  # memory-bound share takes longer


def test_gpu_flags_in_the_cli(capsys) -> None:
    args = ("--preset", "llama3-1b", "--gpus", "1", "--cpu-mem", "64GiB")
    rtx = plan_json(capsys, *args, "--gpu", "rtx 4090")["hardware"]
    assert (rtx["gpu"], rtx["gpu_from"], rtx["peak_tflops"]) == ("RTX 4090", "--gpu", 165.2)
    assert rtx["gpu_mem_gib"] == pytest.approx(24564 / 1024)
    both = plan_json(
        capsys, *args, "--gpu", "rtx 4090", "--gpu-mem", "22GiB", "--peak-tflops", "100"
    )
    assert both["hardware"]["gpu_mem_gib"] == 22 and both["hardware"]["peak_tflops"] == 100
    # at 8,192 tokens a micro-batch the GPU's work decides every step (2,048: the host's
    # launches and hooks decide some of the H200's, whatever the card: planner.speed)
    fast = plan_json(capsys, *args, "--seq-len", "8192", "--gpu", "H200")["options"]
    slow = plan_json(capsys, *args, "--seq-len", "8192", "--gpu", "RTX 4090")["options"]
    by_name = {o["strategy"]: o["tokens_per_s"] for o in slow}
    on_gpu = [  # offload: the CPU's pace; first_k: its block count follows the card's memory
        o for o in fast if o["fits"] and not _offloads(o) and "first" not in o["strategy"]
    ]
    assert on_gpu and all(o["tokens_per_s"] > 3 * by_name[o["strategy"]] for o in on_gpu)
    text = plan_text(capsys, *args, "--gpu", "RTX 4090")
    assert "RTX 4090 (--gpu): 165 TFLOP/s bf16, 1,008 GB/s memory" in text
    assert "GPU not named: speed assumes an H200's" in plan_text(capsys, *args, "--gpu-mem", "24GB")


def test_a_24gb_card_offloads_within_the_host_ram() -> None:
    """The seed's users: the 1.5B shape on one 24 GB card fits only by offloading, and only with
    the host RAM the offload needs."""
    m, w = shape_from_preset("llama3-1b"), Workload(1, 2048, 1)
    hw = with_gpu(Hardware(1, 0, cpu_mem=64 * GIB), find_gpu("RTX 4090"))
    best = plan(m, w, hw)[0]
    assert best.fits and 0 < best.memory.host <= 0.85 * 64 * GIB
    assert not any(
        o.fits for o in plan(m, w, with_gpu(Hardware(1, 0, cpu_mem=8 * GIB), find_gpu("RTX 4090")))
    )

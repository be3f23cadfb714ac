"""The planner against a published run it was never fitted on: torchtitan's Llama 3.1 8B, FSDP2 on
8 H100s, eager and with torch.compile.

The published figures: torchtitan `docs/performance.md` (github.com/pytorch/torchtitan, commit
eaea6f6a2fa940f03a10906be1df3489cf30af85), Table 1, "1D Parallelism (FSDP). Llama 3.1 8B model.
8 GPUs. Local batch size 2, global batch size 16. Selective activation checkpointing": FSDP 5,762
TPS/GPU (82.4 GiB), FSDP + torch.compile 6,667 (77.0 GiB), FSDP + torch.compile + Float8 8,532
(76.8 GiB); torch 1963fc8 (2024-12-23), torchtitan 9dec370 (2024-12-26); the benchmarks of the
TorchTitan paper (Liang et al., arXiv 2410.06511). TPS/GPU read at the 90th iteration.
The run's settings are torchtitan's llama3_8b.toml: seq_len 8192, activation_checkpoint mode
'selective' with selective_ac_option 'op'; FSDP2 with mixed_precision_param bfloat16 and
mixed_precision_reduce float32 over fp32 parameters (fp32 master weights and AdamW states).
Their H100s (same page): Grand Teton hosts, 96 GB HBM2e at 2.4 TB/s, a 500 W power limit, "the
actual peak TFLOPs number is between SXM and NVL".

The planner's forecast (its catalog H100 SXM, 8 GPUs on one node, the llama3-8b preset with a
plain head as torchtitan's, selective AC) is 18% (eager) and 38% (compiled) over the published
figures: `test_forecast_within_10_percent_of_the_published_figure` is a strict xfail until that
changes. docs/benchmarks/2026-12-02-planner-calibration-h200.md gives the numbers and what drives
them; `test_the_doc_states_todays_forecast` keeps its tables equal to what is computed here.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from zerofit.backends.terms import GIB, Workload
from zerofit.models.shape import ModelShape, shape_from_preset
from zerofit.planner.gpus import find_gpu
from zerofit.planner.memory import Strategy, estimate
from zerofit.planner.shape import Hardware, with_gpu
from zerofit.planner.speed import bandwidth_factor, flops_per_token, predict

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "benchmarks" / "2026-12-02-planner-calibration-h200.md"

PUBLISHED_TPS_PER_GPU = {"eager": 5_762, "compiled": 6_667}  # torchtitan Table 1 (above)
PUBLISHED_MEMORY_GIB = {"eager": 82.4, "compiled": 77.0}
TORCHTITAN_MEM_BW = 2.4e12  # their H100s' HBM2e
H100_NVL_TFLOPS = 835.5  # NVIDIA H100 NVL datasheet: 1,671 TFLOP/s bf16 with sparsity, halved
ZEROFIT_SAC = 1.03  # zerofit/planner/speed.py: selective AC re-runs the elementwise ops only
TOLERANCE = 0.10
MODES = ("eager", "compiled")

MODEL = shape_from_preset("llama3-8b", loss_chunk=0)  # torchtitan's output head is not fused
WORK = Workload(2, 8192, 8, 1, "bf16", "fp32", "fp32", loss_chunk=0)


def h100(peak_tflops: float | None = None, mem_bw: float | None = None) -> Hardware:
    """8 GPUs on one node: the catalog's H100 SXM, or with another peak / memory bandwidth."""
    hw = with_gpu(Hardware(gpus_per_node=8, gpu_mem=0, cpu_mem=2 * 2**40), find_gpu("H100"))
    if peak_tflops is not None:
        hw = replace(hw, peak_flops=peak_tflops * 1e12)
    return replace(hw, mem_bw=mem_bw) if mem_bw is not None else hw


def torchtitan_recompute(m: ModelShape) -> float:
    """torchtitan's op-level SAC saves every op's output except every second matmul of a block,
    counted per block: wq, *wk*, wv, *wo*, w1, *w3*, w2. The recomputed FLOPs per token, over the
    model's, on top of zerofit's elementwise recompute."""
    kv = m.n_kv_heads * m.head_dim
    recomputed = 2 * m.n_layers * m.dim * (kv + m.dim + m.ffn_dim)
    return ZEROFIT_SAC + recomputed / flops_per_token(m, WORK)


def forecast(mode: str, hw: Hardware | None = None) -> float:
    """The planner's tokens/s per GPU for torchtitan's run."""
    s = Strategy.of("fsdp", activation_checkpointing="selective", compile=mode == "compiled")
    return predict(MODEL, WORK, s, hw or h100()).tokens_per_s / WORK.world_size


def reserved_gib(mode: str) -> float:
    s = Strategy.of("fsdp", activation_checkpointing="selective", compile=mode == "compiled")
    return estimate(MODEL, WORK, s).peak_reserved / GIB


def error(mode: str, tps: float) -> float:
    return tps / PUBLISHED_TPS_PER_GPU[mode] - 1


@pytest.mark.xfail(
    strict=True,
    reason="forecast +18.3% (eager) and +38.0% (compiled) over torchtitan's figures on the "
    "catalog H100 SXM: see docs/benchmarks/2026-12-02-planner-calibration-h200.md",
)
@pytest.mark.parametrize("mode", MODES)
def test_forecast_within_10_percent_of_the_published_figure(mode: str) -> None:
    got = error(mode, forecast(mode))
    assert abs(got) <= TOLERANCE, f"{mode}: forecast {forecast(mode):,.0f} ({got:+.1%})"


def test_the_published_figures_are_the_run_described() -> None:
    """torchtitan's MFU note (33% and 39% at the SXM peak) follows from its TPS/GPU at seq 8192
    with the same FLOPs per token as the planner's: the figures are of the run modelled here."""
    peak = find_gpu("H100 SXM").peak_flops
    mfu = {m: PUBLISHED_TPS_PER_GPU[m] * flops_per_token(MODEL, WORK) / peak for m in MODES}
    assert mfu["eager"] == pytest.approx(0.337, abs=0.005)
    assert mfu["compiled"] == pytest.approx(0.390, abs=0.005)


def _what_ifs() -> dict[str, dict[str, float]]:
    """Tokens/s per GPU: the card as torchtitan describes it, and its SAC policy's recompute."""
    tt = ZEROFIT_SAC / torchtitan_recompute(MODEL)
    out = {}
    for peak in (989.4, H100_NVL_TFLOPS):
        hw = h100(peak, TORCHTITAN_MEM_BW)
        out[f"{peak}"] = {m: forecast(m, hw) for m in MODES}
        out[f"{peak} sac"] = {m: forecast(m, hw) * tt for m in MODES}
    return out


def test_on_torchtitans_card_the_eager_figure_is_within_10_percent_but_not_the_compiled() -> None:
    """With the card's own bandwidth and a peak anywhere from the NVL's to the SXM's, the eager
    figure is within 10% of the forecast; the compiled one is not anywhere in that range (the
    planner's compile gain, 1.35 for FSDP, against torchtitan's 6,667 / 5,762 = 1.157)."""
    ifs = _what_ifs()
    for key in ("989.4", f"{H100_NVL_TFLOPS}"):
        assert abs(error("eager", ifs[key]["eager"])) <= TOLERANCE, key
        assert error("compiled", ifs[key]["compiled"]) > TOLERANCE, key
    assert PUBLISHED_TPS_PER_GPU["compiled"] / PUBLISHED_TPS_PER_GPU["eager"] < 1.16


def _pct(x: float) -> str:
    return f"{100 * x:+.1f}%".replace("-", "−")


def doc_rows() -> list[str]:
    """The table rows the doc's torchtitan section states, from today's planner."""
    rows = []
    for mode, label in zip(MODES, ("FSDP", "FSDP + torch.compile"), strict=True):
        tps = forecast(mode)
        rows.append(
            f"| {label} | {PUBLISHED_TPS_PER_GPU[mode]:,} | {tps:,.0f} | {_pct(error(mode, tps))} "
            f"| {PUBLISHED_MEMORY_GIB[mode]:.1f} | {reserved_gib(mode):.1f} |"
        )
    ifs = _what_ifs()
    cases = {
        "catalog H100 SXM: 989.4 TFLOP/s, 3.35 TB/s; zerofit's SAC": {
            m: forecast(m) for m in MODES
        },
        "2.4 TB/s, 989.4 TFLOP/s": ifs["989.4"],
        f"2.4 TB/s, {H100_NVL_TFLOPS} TFLOP/s (the NVL's)": ifs[f"{H100_NVL_TFLOPS}"],
        "2.4 TB/s, 989.4 TFLOP/s; torchtitan's SAC": ifs["989.4 sac"],
        f"2.4 TB/s, {H100_NVL_TFLOPS} TFLOP/s; torchtitan's SAC": ifs[f"{H100_NVL_TFLOPS} sac"],
    }
    for label, tps in cases.items():
        cells = [f"{tps[m]:,.0f} ({_pct(error(m, tps[m]))})" for m in MODES]
        rows.append(f"| {label} | {' | '.join(cells)} |")
    return rows


def doc_figures() -> list[str]:
    """The figures the doc's paragraphs state, from today's planner."""
    kv = MODEL.n_kv_heads * MODEL.head_dim
    extra = 2 * MODEL.n_layers * MODEL.dim * (kv + MODEL.dim + MODEL.ffn_dim)
    unsaved = WORK.tokens * MODEL.n_layers * (kv + MODEL.dim + MODEL.ffn_dim) * WORK.e_c
    s = Strategy.of("fsdp")
    traffic = s.engine.traffic(MODEL, WORK, s.options).per_rank
    over = {m: reserved_gib(m) - PUBLISHED_MEMORY_GIB[m] for m in MODES}
    factors = (bandwidth_factor(h100(mem_bw=TORCHTITAN_MEM_BW)), bandwidth_factor(h100()))
    return [
        f"x{torchtitan_recompute(MODEL):.3f} of the model FLOPs",
        f"{extra / 1e9:.1f} GFLOP per token more",
        f"6,667 / 5,762 = {PUBLISHED_TPS_PER_GPU['compiled'] / PUBLISHED_TPS_PER_GPU['eager']:.3f}",
        f"about {unsaved / GIB:.0f} GiB",
        f"{over['eager']:.1f} (eager) and {over['compiled']:.1f} GiB (compiled) over",
        f"{traffic / 1e9:.0f} GB per rank and step at {h100().intra_bw / 1e9:.0f} GB/s",
        f"`speed.bandwidth_factor`: {factors[0]:.2f} against {factors[1]:.2f}",
    ]


def test_the_doc_states_todays_forecast() -> None:
    text = " ".join(DOC.read_text().split())  # paragraphs wrap: compare words
    missing = [figure for figure in doc_figures() if figure not in text]
    assert not missing, f"the doc's torchtitan paragraphs differ from today's planner: {missing}"
    text = DOC.read_text()
    missing = [row for row in doc_rows() if row not in text]
    assert not missing, "the doc's torchtitan tables differ from today's planner:\n" + "\n".join(
        missing
    )

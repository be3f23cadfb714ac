"""What only a GPU can check: torch.compile against eager (FSDP2 and ZeRO-3), the fused attention
kernels against each other, the CUDA-event step timer against the wall clock, and a Hugging Face
Llama's peak memory against the built-in one of the same shape.

Every test is marked `gpu`; tests/conftest.py skips them where torch.cuda.is_available() is false,
so on a CPU they cost nothing. One GPU is enough (every run is `zerofit train --nproc 1`), and
nothing beyond PyTorch is assumed except DeepSpeed for the ZeRO-3 test, transformers for the HF
one and torchao for the fp8 one (each skipped without it; fp8 also below compute capability 8.9), and
the fused head compiled on CUDA against plain cross-entropy. On one H200 the module took about 3 minutes before the HF memory
test was added, mostly process start-up and Inductor compiling.
"""

from __future__ import annotations

import copy
import json
import sys
import time
from pathlib import Path

import pytest
from conftest import deep_update, losses, train_run

pytestmark = pytest.mark.gpu

# The in-process checks import zerofit from this checkout, as the CLI runs do (no install needed).
SRC = str(Path(__file__).resolve().parents[1] / "src")
if SRC not in sys.path:
    sys.path.insert(0, SRC)

# conftest's TINY (preset tiny, 2 layers, fp32, 10 steps, log every step) at a GPU-sized batch.
GPU = {
    "model": {"seq_len": 256},
    "train": {"micro_batch_size": 8},
    "checkpoint": {"save_final": False},
}

# fp32 without TF32 (zerofit leaves torch's default, "highest"), so Inductor's fused kernels differ
# from eager only in summation order: ~1e-7 relative per op, amplified by AdamW over 10 steps
# (observed on an H200, torch 2.11: 4.6e-7 FSDP, 3.5e-7 ZeRO-3). A wrong graph, a stale (ungathered)
# ZeRO-3 parameter or a missed update moves the loss by > 1e-2.
COMPILE_RTOL = 1e-5


def _metrics(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def _worst(got: dict[int, float], ref: dict[int, float]) -> float:
    assert sorted(got) == sorted(ref)
    return max(abs(got[s] - ref[s]) / abs(ref[s]) for s in ref)


def _inductor_outputs(cache: Path) -> list[Path]:
    """Python modules Inductor generated under its cache dir (there are none unless it compiled)."""
    return sorted(cache.rglob("*.py")) if cache.is_dir() else []


def _compile_pair(tmp: Path, monkeypatch: pytest.MonkeyPatch, parallel: dict) -> float:
    """Train eager and compiled, each with its own empty Inductor cache; return the worst relative
    loss difference after checking that Inductor compiled the second run and not the first."""
    runs = {}
    for compiled in (False, True):
        name = "compiled" if compiled else "eager"
        cache = tmp / f"inductor_{name}"
        monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(cache))  # the workers inherit it
        extra = deep_update(GPU, {"parallel": {**parallel, "compile": compiled}})
        runs[name] = train_run(tmp, name, extra, "--nproc", "1")
        made = _inductor_outputs(cache)
        assert bool(made) == compiled, (name, made[:5])
    eager, compiled_losses = losses(runs["eager"]), losses(runs["compiled"])
    assert len(eager) == 10 and eager[10] < eager[1] - 0.5, eager  # it learns
    return _worst(compiled_losses, eager)


def test_fsdp_compile_matches_eager(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    worst = _compile_pair(tmp_path, monkeypatch, {"backend": "fsdp"})
    print(f"FSDP compile vs eager: max relative loss difference over 10 steps = {worst:.2e}")
    assert worst <= COMPILE_RTOL


def test_zero3_compiled_forward_matches_eager(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ZeRO-3 compiles each block's forward inside DeepSpeed's gather hooks. Every parameter is
    partitioned (no persistence threshold), so the compiled forward must see gathered weights."""
    pytest.importorskip("deepspeed")
    ds = {"stage": 3, "param_persistence_threshold": 0, "torch_adam": True}  # no JIT-built ops
    worst = _compile_pair(tmp_path, monkeypatch, {"backend": "deepspeed", "deepspeed": ds})
    print(f"ZeRO-3 compile vs eager: max relative loss difference over 10 steps = {worst:.2e}")
    assert worst <= COMPILE_RTOL


# fp32 host AdamW (fused, on the CPU) against CUDA's: the same update to ~1e-6 per step (observed
# on the CPU suite: 8.8e-7 over 10 steps); a missed or doubled update moves the loss by > 1e-2.
OFFLOAD_RTOL = 1e-4


def test_fsdp_cpu_offload_trains_like_fsdp(tmp_path: Path) -> None:
    """FSDP2 CPU offload on a GPU: its gradient norm is computed on the host, its loss on the GPU
    (a step once stacked them for one sync and failed on the H200, 2026-12-04)."""
    fsdp = {"parallel": {"backend": "fsdp"}}
    plain = train_run(tmp_path, "plain", deep_update(GPU, fsdp), "--nproc", "1")
    off = {"parallel": {"backend": "fsdp", "fsdp": {"cpu_offload": True}}}
    offload = train_run(tmp_path, "offload", deep_update(GPU, off), "--nproc", "1")
    ref, got = losses(plain), losses(offload)
    assert len(ref) == 10 and ref[10] < ref[1] - 0.5, ref
    worst = _worst(got, ref)
    print(f"FSDP CPU offload vs FSDP: max relative loss difference over 10 steps = {worst:.2e}")
    assert worst <= OFFLOAD_RTOL


def test_zero3_compiled_forward_under_activation_checkpointing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ZeRO-3 compiles each block's forward inside the AC wrapper: with torch 2.11 and CUDA
    allocation history recorded, that failed with pytorch/pytorch#179536's SystemError; the run
    now records none in that case (2026-12-04: 24 GB plans ran compiled under AC)."""
    pytest.importorskip("deepspeed")
    ds = {"stage": 3, "param_persistence_threshold": 0, "torch_adam": True}
    parallel = {"backend": "deepspeed", "deepspeed": ds, "activation_checkpointing": "full"}
    worst = _compile_pair(tmp_path, monkeypatch, parallel)
    print(f"ZeRO-3 + AC compile vs eager: max relative loss difference = {worst:.2e}")
    assert worst <= COMPILE_RTOL


# --------------------------------------------------------------------------- attention kernels

KERNELS = {
    "flash": "FLASH_ATTENTION",
    "cudnn": "CUDNN_ATTENTION",
    "efficient": "EFFICIENT_ATTENTION",
}
# bf16 compute: each kernel rounds its bf16 output differently (~4e-3 relative per element), which
# averages out in the loss (observed on an H200 over 6 steps: cudnn 1.6e-4, efficient 2.7e-4, math
# 7.9e-4 from flash). A broken mask (non-causal: the model sees the next token) or a wrong kv-head
# mapping moves it by > 0.1.
ATTENTION_RTOL = 5e-3
ATTENTION_STEPS = 6
_attention_runs: dict[str, Path] = {}


def _attention_run(tmp: Path, name: str) -> Path:
    if name not in _attention_runs:
        extra = deep_update(
            GPU,
            {
                "model": {"attention": name},
                "precision": {"mode": "bf16"},
                "train": {"steps": ATTENTION_STEPS},
            },
        )
        _attention_runs[name] = train_run(tmp, f"attention_{name}", extra, "--nproc", "1")
    return _attention_runs[name]


@pytest.fixture(scope="module")
def attention_tmp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("attention")


@pytest.mark.parametrize("name", list(KERNELS))
def test_attention_kernel_is_the_one_that_runs(name: str, attention_tmp: Path) -> None:
    """zerofit only enables the named kernel (math stays as PyTorch's fallback). Called with the
    model's shapes and dtype under `sdpa_kernel([that kernel])`, which has no fallback, attention
    forward and backward must succeed: then the dispatcher picks it over math in the run too."""
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from zerofit.models import llama

    args = llama.PRESETS["tiny"]
    b, t = GPU["train"]["micro_batch_size"], GPU["model"]["seq_len"]
    gen = torch.Generator(device="cuda").manual_seed(0)

    def rand(heads: int) -> torch.Tensor:
        shape = (b, heads, t, args.head_dim)
        x = torch.randn(shape, device="cuda", dtype=torch.bfloat16, generator=gen)
        return x.requires_grad_()

    q, k, v = rand(args.n_heads), rand(args.n_kv_heads), rand(args.n_kv_heads)
    llama.set_attention_backend(name)
    try:
        with sdpa_kernel([getattr(SDPBackend, KERNELS[name])]):
            llama.grouped_attention(q, k, v).float().square().mean().backward()
    finally:
        llama.set_attention_backend("auto")
    assert q.grad is not None and torch.isfinite(q.grad).all()

    got = losses(_attention_run(attention_tmp, name))
    assert len(got) == ATTENTION_STEPS and got[ATTENTION_STEPS] < got[1], got  # it learns


def test_attention_kernels_agree(attention_tmp: Path) -> None:
    runs = {name: losses(_attention_run(attention_tmp, name)) for name in KERNELS}
    ref = runs["flash"]
    for name, got in runs.items():
        worst = _worst(got, ref)
        print(f"attention {name} vs flash: max relative loss difference = {worst:.2e}")
        assert worst <= ATTENTION_RTOL, (name, {s: (ref[s], got[s]) for s in ref})


# --------------------------------------------------------------------------- step timer


def test_step_timer_times_the_gpu_without_waiting_for_it() -> None:
    """zerofit.report.metrics.StepTimer records CUDA events and never synchronizes in the step. On a
    workload whose duration the wall clock measured (host waiting for the GPU), the events agree
    with it, while the host got past both marks long before the GPU finished."""
    import torch

    from zerofit.report.metrics import StepTimer

    dev = torch.device("cuda")
    a = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
    out = torch.empty_like(a)

    def work() -> None:  # 100 products of 1.1 TFLOP each: ~0.15 s on an H200
        for _ in range(100):
            torch.mm(a, a, out=out)

    for _ in range(2):  # warm-up: cuBLAS handles, clocks
        work()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    work()
    torch.cuda.synchronize()
    wall = time.perf_counter() - t0

    timer = StepTimer(dev)
    timer.mark()
    h0 = time.perf_counter()
    work()
    timer.mark()
    host = time.perf_counter() - h0
    (timed,) = timer.durations()
    print(
        f"StepTimer {timed * 1e3:.1f} ms, wall clock {wall * 1e3:.1f} ms, host {host * 1e3:.1f} ms"
    )
    assert wall > 0.02, wall  # long enough for a 5% comparison
    assert abs(timed - wall) <= 0.05 * wall, (timed, wall)
    assert host < 0.5 * timed, (host, timed)  # mark() did not wait for the GPU


def test_logged_step_times_match_the_wall_clock(tmp_path: Path) -> None:
    """A training run whose steps are long (fp32 matmuls, ~0.12 s on an H200): the per-step CUDA-event
    times in summary.json (what `zerofit bench` reads) against the wall-clock step_time_s logged
    after a synchronize at every step, and their sum against the run's wall time."""
    steps = 8
    extra = deep_update(
        GPU,
        {
            "model": {"preset": "small", "seq_len": 1024, "overrides": {"n_layers": 4}},
            "data": {"max_tokens": 1_000_000},
            "train": {"steps": steps, "micro_batch_size": 32},
        },
    )
    run = train_run(tmp_path, "timer", extra, "--nproc", "1")
    summary = json.loads((run / "summary.json").read_text())
    events = summary["step_times_s"]
    wall = {r["step"]: r["step_time_s"] for r in _metrics(run) if "step_time_s" in r}
    assert len(events) == steps and sorted(wall) == list(range(1, steps + 1)), (events, wall)
    steady = range(3, steps + 1)  # the first steps include cuBLAS/allocator warm-up
    pairs = {s: (events[s - 1], wall[s]) for s in steady}
    print("step: (CUDA events s, wall clock s)", pairs)
    assert min(wall[s] for s in steady) > 0.03, pairs  # host overheads (a few ms) are < 10% of that
    for s, (timed, clock) in pairs.items():
        assert abs(timed - clock) <= 0.1 * clock, (s, timed, clock)
    total = summary["wall_time_s"]
    assert abs(sum(events) - total) <= 0.05 * total, (sum(events), total)


# --------------------------------------------------------------------------- HF vs built-in memory

# Llama-3.2-1B's shape (config only, random weights): the built-in preset llama3-1b has the same
# blocks but an untied output layer.
LLAMA_32_1B = {
    "hidden_size": 2048, "num_hidden_layers": 16, "num_attention_heads": 32,
    "num_key_value_heads": 8, "head_dim": 64, "intermediate_size": 8192, "vocab_size": 128256,
    "tie_word_embeddings": True, "max_position_embeddings": 131072, "rms_norm_eps": 1e-5,
}  # fmt: skip
# Bytes a parameter holds for the whole run under fsdp bf16 with fp32 masters: the fp32 weight and
# gradient and AdamW's two fp32 states. The built-in's untied head holds this on top.
STATE_BYTES_PER_PARAM = 16
MEMORY_RTOL = 0.05


def test_hf_llama_1b_peak_memory_matches_the_builtin(tmp_path: Path) -> None:
    """A Hugging Face Llama-3.2-1B-shaped folder and the built-in llama3-1b, each 4 steps at micro
    batch 8 x 2048 tokens under FSDP bf16 on one GPU: the HF model's peak allocated memory, plus
    the model state of the output layer only the built-in holds (tied in HF: 128256 x 2048 x 16 B =
    3.9 GiB), is at most 5% above the built-in's.

    One-sided on purpose: HF Llama saves less than the built-in per token (its RoPE runs in bf16,
    the built-in's in fp32: 242 vs 263 KB per token over two layers, measured on CPU), so its peak
    is lower. Full logits instead of the fused head (8 x 2048 x 128256 in bf16 and fp32, and their
    gradient: > 12 GiB) break the bound, as would any activation the adapter added per token."""
    transformers = pytest.importorskip("transformers")
    folder = tmp_path / "llama-3.2-1b"
    transformers.LlamaConfig(**LLAMA_32_1B).save_pretrained(folder)
    base = deep_update(
        GPU,
        {
            "model": {"seq_len": 2048, "overrides": {}},
            "data": {"max_tokens": 1_000_000},
            "train": {"steps": 4, "micro_batch_size": 8},
            "precision": {"mode": "bf16"},
            "parallel": {"backend": "fsdp"},
        },
    )
    models = {
        "builtin": {"preset": "llama3-1b"},
        "hf": {"preset": None, "hf": str(folder), "random_init": True},  # config.json alone
    }
    peak = {}
    for name, model in models.items():
        run = train_run(
            tmp_path, f"memory_{name}", deep_update(base, {"model": model}), "--nproc", "1"
        )
        records = [r for r in _metrics(run) if "mem_alloc_gib" in r]
        assert len(records) == 4, records
        peak[name] = max(r["mem_alloc_gib"] for r in records)
    head_state = LLAMA_32_1B["vocab_size"] * LLAMA_32_1B["hidden_size"] * STATE_BYTES_PER_PARAM
    hf_untied = peak["hf"] + head_state / 2**30
    print(
        f"peak allocated: built-in {peak['builtin']:.2f} GiB, HF {peak['hf']:.2f} GiB "
        f"({hf_untied:.2f} GiB with the untied head's state)"
    )
    assert hf_untied <= (1 + MEMORY_RTOL) * peak["builtin"], peak


def test_hf_varlen_kernel_matches_masked_sdpa() -> None:
    """A tiny HF Llama in bf16 on the GPU with three packed documents per row: zerofit_varlen's
    FlashAttention varlen kernel against transformers' own SDPA with its block-diagonal mask
    (``zerofit.models.hf_attention``; the CPU tests check the plumbing around the kernel). Both
    run in bf16, so they agree to bf16 rounding (~1e-2 relative on gradients); attention across a
    document boundary or a lost causal mask changes the loss by far more than the 1e-2 allowed."""
    import torch
    import torch.nn.functional as F

    transformers = pytest.importorskip("transformers")
    from zerofit.models import doc_attention
    from zerofit.models import hf_attention as va
    from zerofit.models.hf_head import HFCausalLM

    cfg = transformers.LlamaConfig(
        hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=8,
        num_key_value_heads=2, vocab_size=512, max_position_embeddings=1024,
    )  # fmt: skip
    torch.manual_seed(0)
    va.register()
    models = {}
    for impl in (va.NAME, "sdpa"):
        torch.manual_seed(0)
        # a config each: the attention chosen is kept on the config object, shared otherwise
        own = copy.deepcopy(cfg)
        hf = transformers.AutoModelForCausalLM.from_config(own, attn_implementation=impl)
        models[impl] = HFCausalLM(hf.to("cuda", torch.bfloat16), loss_chunk=128, fused=True)
    assert models[va.NAME].varlen and not models["sdpa"].varlen
    gen = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, 512, (4, 384), generator=gen).cuda()
    targets = torch.randint(0, 512, (4, 384), generator=gen).cuda()
    lengths = [200, 120, 64]
    positions = torch.cat([torch.arange(n) for n in lengths]).repeat(4, 1).cuda()
    out = {}
    for impl, model in models.items():
        loss = model(tokens, targets, positions)
        loss.backward()
        grads = {n: p.grad.float() for n, p in model.named_parameters()}
        out[impl] = (loss.item(), grads)
    # torch 2.11's varlen_attn has no enable_gqa; its FlashAttention kernels take the 2 key/value
    # heads as they are (prime's probe), so they are not repeated 4x and kept so for backward
    assert va._GQA.get(tokens.device) is True, va._GQA
    (ours, g_ours), (theirs, g_theirs) = out[va.NAME], out["sdpa"]
    assert ours == pytest.approx(theirs, rel=1e-2)
    for name, g in g_ours.items():
        rel = ((g - g_theirs[name]).norm() / g_theirs[name].norm()).item()
        assert rel < 2e-2, (name, rel)
    # The kernel alone, on random q/k/v (GQA 8:2): each document against SDPA on it alone (fp32),
    # and far from plain causal attention over the whole row.
    q = torch.randn(4, 8, 384, 32, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(4, 2, 384, 32, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    cu, longest = va.doc_bounds(positions, 4, 384, q.device)
    got = va.varlen_attention(torch.nn.Module(), q, k, v, None, scaling=32**-0.5, **{
        va.CU_KEY: cu, va.MAX_KEY: longest})[0].float()  # fmt: skip
    kr, vr = (x.float().repeat_interleave(4, dim=1) for x in (k, v))
    want, lo = torch.empty_like(got), 0
    for n in lengths:
        part = slice(lo, lo + n)
        o = F.scaled_dot_product_attention(
            q.float()[:, :, part], kr[:, :, part], vr[:, :, part], is_causal=True
        )
        want[:, part] = o.transpose(1, 2)
        lo += n
    plain = F.scaled_dot_product_attention(q.float(), kr, vr, is_causal=True).transpose(1, 2)
    assert (got - want).abs().max().item() < 2e-2
    assert (plain - want).abs().max().item() > 0.2
    # The bounds padded with empty documents at the end (as the trainer passes them): the same.
    padded = doc_attention.document_bounds(positions.cpu(), 64).cuda()
    assert padded.numel() == 64 > cu.numel()
    again = va.varlen_attention(torch.nn.Module(), q, k, v, None, scaling=32**-0.5, **{
        va.CU_KEY: padded, va.MAX_KEY: longest})[0].float()  # fmt: skip
    assert torch.equal(again, got)


# --------------------------------------------------------------------------- fp8 (torchao float8)

# The small preset (dim 512, ffn 1536: every block Linear a multiple of 16) in bf16 under FSDP2,
# 30 steps. float8 Linear layers (torchao, precision.fp8) must learn as bf16 does: the loss falls
# by more than 1.5 and stays within FP8_RTOL of bf16's at every step. Not yet run on a GPU: the
# bound is a loose one, above what the CPU runs showed (tests/test_fp8.py: <= 9.5% on gloo in
# fp32, at the step where the loss jumps); the printed worst difference is the figure to tighten
# it with. A float8 path that does not learn fails the fall.
FP8_STEPS = 30
FP8_RTOL = 0.15


def test_fp8_trains_like_bf16(tmp_path: Path) -> None:
    import torch

    pytest.importorskip("torchao")
    if torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("float8 tensor cores need compute capability 8.9 (Ada, Hopper) or newer")
    base = deep_update(
        GPU,
        {
            "model": {"preset": "small", "overrides": {"n_layers": 4}},
            "data": {"max_tokens": 1_000_000},
            "train": {"steps": FP8_STEPS},
            "precision": {"mode": "bf16"},
            "parallel": {"backend": "fsdp"},
        },
    )
    runs = {}
    # name: (recipe, compiled); torch.compile fuses float8's casts, the path torchao recommends
    variants = {"tensorwise": ("tensorwise", False), "rowwise": ("rowwise", False)}
    variants["tensorwise_compiled"] = ("tensorwise", True)
    for name, (recipe, compiled) in {"none": ("none", False), **variants}.items():
        extra = {"precision": {"fp8": recipe}, "parallel": {"compile": compiled}}
        runs[name] = train_run(tmp_path, f"fp8_{name}", deep_update(base, extra), "--nproc", "1")
    ref = losses(runs["none"])
    assert len(ref) == FP8_STEPS and ref[FP8_STEPS] < ref[1] - 1.5, ref
    for name, (recipe, _) in variants.items():
        got = losses(runs[name])
        rep = json.loads((runs[name] / "precision.json").read_text())
        assert rep["warnings"] == [] and rep["fp8"]["recipe"] == recipe, rep
        assert rep["fp8"]["high_precision_linears"] == {"output": 1}, rep
        assert rep["fp8"]["float8_all_gather"] == (recipe == "tensorwise"), rep
        worst = _worst(got, ref)
        print(
            f"fp8 {name} vs bf16: max relative loss difference over {FP8_STEPS} steps = {worst:.3f}"
        )
        assert got[FP8_STEPS] < got[1] - 1.5, got
        assert 0 < worst <= FP8_RTOL, {s: (ref[s], got[s]) for s in ref}


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_compiled_fused_head_matches_plain_loss(
    dtype: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fused head as `parallel.compile` runs it on CUDA (each chunk one compiled kernel, the
    weight gradient accumulated in fp32 by `addmm` with an fp32 output) against fp32
    cross-entropy on materialised logits: same loss and gradients, to the compute dtype's
    precision. A dropped chunk, a wrong onehot or a bf16 accumulation moves them by far more."""
    import torch
    import torch.nn.functional as F

    from zerofit.models import loss as loss_mod

    monkeypatch.setattr(loss_mod, "COMPILE_CHUNKS", True)
    monkeypatch.setattr(loss_mod, "_compiled", {})
    dt = getattr(torch, dtype)
    gen = torch.Generator(device="cuda").manual_seed(0)
    h = torch.randn(4, 1000, 256, device="cuda", generator=gen).to(dt).requires_grad_()
    w = (0.05 * torch.randn(32000, 256, device="cuda", generator=gen)).to(dt).requires_grad_()
    targets = torch.randint(0, 32000, (4, 1000), device="cuda", generator=gen)
    targets[0, :100] = loss_mod.IGNORE_INDEX
    got = loss_mod.linear_cross_entropy(h, w, targets, chunk=1024)  # 3 full chunks + a tail
    got.backward()
    gh, gw = h.grad.float(), w.grad.float()
    hf, wf = h.detach().float().requires_grad_(), w.detach().float().requires_grad_()
    ref = F.cross_entropy((hf @ wf.t()).flatten(0, 1), targets.flatten(), ignore_index=-100)
    ref.backward()
    tol = {"bfloat16": 2e-2, "float32": 1e-4}[dtype]
    torch.testing.assert_close(got.float(), ref, rtol=tol / 10, atol=0)
    torch.testing.assert_close(gh, hf.grad, rtol=tol, atol=tol * hf.grad.abs().max().item())
    torch.testing.assert_close(gw, wf.grad, rtol=tol, atol=tol * wf.grad.abs().max().item())


def test_qlora_trains_compiled_under_first_k_checkpointing(tmp_path: Path) -> None:
    """A 4-bit base on one GPU as the QLoRA recipe runs it (FSDP2, bf16, compiled blocks, the first
    block recomputed): it trains. Two failures only a GPU run showed: torch
    2.11's FSDP2 could not shard integer NF4 pieces, and Dynamo refused the attention's memo
    written for the first time inside a checkpointed compiled block."""
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("torchao")
    folder = tmp_path / "tiny-llama"
    shape = {"hidden_size": 256, "intermediate_size": 768, "num_hidden_layers": 2}
    heads = {"num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 512}
    transformers.LlamaConfig(**shape, **heads).save_pretrained(folder)
    extra = deep_update(
        GPU,
        {
            "model": {
                "preset": None,
                "hf": str(folder),
                "random_init": True,
                "overrides": {},
                "lora": {"rank": 8, "alpha": 16.0, "quantize": "nf4"},
            },
            "precision": {"mode": "bf16"},
            "parallel": {
                "backend": "fsdp",
                "compile": True,
                "activation_checkpointing": "first_k",
                "ac_blocks": 1,
            },
            "optim": {"lr": 1e-2},
        },
    )
    run = train_run(tmp_path, "qlora", extra, "--nproc", "1")
    got = losses(run)
    assert len(got) == 10 and got[10] < got[1] - 0.3, got


@pytest.mark.parametrize("p", [0.25, 0.5])
def test_lean_lora_drops_and_rescales_the_same_inputs_in_backward_on_cuda(p: float) -> None:
    """On CUDA the lean update runs as compiled kernels that pack the mask in bits: with A = B = I
    the update is ``scale * mask * x / (1 - p)``, so the mask reads back, and backward must unpack
    the same one."""
    import torch

    from zerofit.models.lora_delta import lora_delta

    n, scale = 128, 1.5
    torch.manual_seed(0)
    x = (torch.rand(8, 37, n, device="cuda") + 1.0).requires_grad_()
    eye = torch.eye(n, device="cuda")
    out = lora_delta(x, eye, eye, p, scale, training=True)
    kept = out.detach() / (scale * x.detach() / (1 - p))
    assert set(kept.round(decimals=3).unique().tolist()) == {0.0, 1.0}
    assert 0.5 * p < (kept < 0.5).float().mean().item() < 1.5 * p
    out.sum().backward()
    torch.testing.assert_close(x.grad, scale * kept / (1 - p), atol=1e-5, rtol=0)


def test_a_gated_down_projection_matches_the_plain_one_on_cuda() -> None:
    """``forward_gated`` (gate and up kept, the input rebuilt in backward) against ``forward``,
    with the compiled kernels CUDA runs, no dropout: the same values and gradients."""
    import torch

    from zerofit.models.lean_ops import swiglu
    from zerofit.models.lora import LoRALinear

    torch.manual_seed(6)
    layer = LoRALinear(torch.nn.Linear(96, 64, bias=False), 8, 16.0, 0.0).cuda()
    layer.weight.requires_grad_(False)
    with torch.no_grad():  # the factors start uninitialised (torch.empty): fill both
        layer.lora_A.weight.normal_(0, 0.1)
        layer.lora_B.weight.normal_()
    gate0 = torch.randn(2, 33, 96, device="cuda")
    up0 = torch.randn(2, 33, 96, device="cuda")
    results = []
    for gated in (False, True):
        layer.zero_grad()
        gate, up = gate0.clone().requires_grad_(), up0.clone().requires_grad_()
        act = swiglu(gate, up)
        out = layer.forward_gated(act, gate, up) if gated else layer(act)
        out.square().sum().backward()
        grads = (gate.grad, up.grad, layer.lora_A.weight.grad, layer.lora_B.weight.grad)
        results.append((out.detach(), *grads))
    torch.testing.assert_close(results[0], results[1], rtol=1e-4, atol=1e-4)

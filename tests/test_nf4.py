"""QLoRA's NF4 base (``zerofit.models.nf4``, ``model.lora.quantize: nf4``): the pieces rebuild
torchao's weight bit for bit and within NF4's error bound; the 4-bit linear's forward and
backward are the dequantised weight's; a QLoRA model trains its adapters and leaves the 4-bit base
bitwise unchanged; the base quantises the LoRA run's weights; DeepSpeed and a QLoRA without
adapters are refused in one line. Training under FSDP2 and DDP on 2 processes:
tests/test_qlora_dist.py."""

from __future__ import annotations

import json

import pytest
import torch
import torch._inductor.metrics as inductor_metrics
import torch.nn.functional as F
from conftest import nf4_layer, same_bits, write_config

from zerofit.backends.base import materialize_from_spec
from zerofit.backends.torch_common import cast_frozen_
from zerofit.config.schema import LoRAConfig
from zerofit.errors import UserError
from zerofit.launch.run_config import load_config
from zerofit.models import ModelSpec, build_model
from zerofit.models.lora import LoRALinear, apply_lora
from zerofit.models.nf4 import (
    BLOCK,
    LEVELS,
    STORAGE,
    _bf16,
    as_bits,
    dequantize,
    nf4_linear,
    piece_of,
    quantizable,
    quantize,
)

torchao = pytest.importorskip("torchao.quantization")

SHAPES = [(128, 128), (256, 512), (96, 1024)]


def gaussian(shape: tuple[int, int], seed: int = 0, std: float = 0.02) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=gen) * std).to(torch.bfloat16)


@pytest.mark.parametrize("shape", SHAPES)
def test_the_pieces_rebuild_torchaos_weight_bit_for_bit(shape: tuple[int, int]) -> None:
    w = gaussian(shape)
    want = torchao.to_nf4(w, 64, 256).get_original_weight()
    got = dequantize(quantize(w), shape, torch.bfloat16)
    assert got.dtype == torch.bfloat16 and got.shape == shape
    assert torch.equal(got, want)


def test_compiled_the_pieces_rebuild_the_same_bits() -> None:
    """Under torch.compile (on by default on a GPU) too: Inductor computes fused bf16 arithmetic
    in fp32 and drops a bf16 round trip, so dequantize rounds on the bits (before: 20% of the
    weights one bf16 step off torchao's)."""
    shape = SHAPES[0]
    stored = quantize(gaussian(shape))
    compiled = torch.compile(dequantize)
    for dtype in (torch.bfloat16, torch.float32):  # fp32: no bf16 store to round at
        want = dequantize(stored, shape, dtype)
        assert torch.equal(compiled(stored, shape, dtype), want), dtype
    x = torch.randn(10_000) * torch.logspace(-30, 30, 10_000)
    assert torch.equal(_bf16(x), x.to(torch.bfloat16).float())  # round to nearest, ties to even


def test_compiled_the_bf16_weight_is_written_once() -> None:
    """Compiled, a bf16 rebuild is two kernels: one for the per-block scales (N/64 values), one
    that reads the codes and writes each weight once in bf16 (2.5 bytes a weight). Before, the
    weights were stored in fp32 and read back by a second kernel that rounded them (10.5 bytes a
    weight: a third of the device time an H100 spent rebuilding 8B's base)."""
    shape = SHAPES[1]
    stored = quantize(gaussian(shape))
    torch._dynamo.reset()
    inductor_metrics.reset()
    compiled = torch.compile(dequantize)
    assert torch.equal(
        compiled(stored, shape, torch.bfloat16), dequantize(stored, shape, torch.bfloat16)
    )
    assert inductor_metrics.generated_kernel_count == 2


@pytest.mark.parametrize("shape", SHAPES)
def test_the_error_stays_within_nf4s_bound(shape: tuple[int, int]) -> None:
    """Each weight lands on the nearest of 16 levels times its block's scale: off by at most half
    the widest gap between levels times the scale, plus what the int8 scale itself lost."""
    w = gaussian(shape, seed=1).float()
    got = dequantize(quantize(w), shape, torch.float32)
    blocks, approx = w.reshape(-1, BLOCK), got.reshape(-1, BLOCK)
    scale = blocks.abs().amax(dim=1, keepdim=True)
    levels = torch.tensor(LEVELS)
    half_gap = float((levels[1:] - levels[:-1]).max()) / 2
    scale_err = (approx.abs().amax(dim=1, keepdim=True) - scale).abs()
    bound = half_gap * scale + scale_err + 2**-8 * scale  # + bf16's rounding (seen: 0.0024 s)
    assert ((blocks - approx).abs() <= bound).all()
    rel = float((got - w).norm() / w.norm())
    assert 0.05 < rel < 0.12, rel  # NF4 on Gaussian weights: ~9% (it does quantise)


def test_only_2d_weights_of_a_multiple_of_16384_elements_are_quantizable() -> None:
    assert quantizable((128, 128)) and quantizable((64, 256)) and quantizable((4096, 14336))
    assert not quantizable((64, 64)) and not quantizable((16384,)) and not quantizable((3, 8, 1024))


def test_piece_names() -> None:
    assert piece_of("layers.0.attention.wq.nf4.codes") == ("layers.0.attention.wq.weight", "codes")
    assert piece_of("a.nf4.mean") == ("a.weight", "mean")
    assert piece_of("a.nf4.other") is None and piece_of("a.weight") is None
    assert piece_of("nf4.codes") is None


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_4bit_linear_is_the_dequantised_weights(dtype: torch.dtype) -> None:
    store = nf4_layer(gaussian((128, 256), seed=2))
    w = store.weight(dtype)
    x = torch.randn(3, 5, 256, dtype=dtype, requires_grad=True)
    bias = torch.randn(128, dtype=dtype, requires_grad=True)
    out = nf4_linear(x, store, bias)
    torch.testing.assert_close(out, F.linear(x, w) + bias, rtol=0, atol=0)
    grad = torch.randn_like(out)
    out.backward(grad)
    torch.testing.assert_close(x.grad, grad @ w, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(bias.grad, grad.sum((0, 1)))
    assert all(p.grad is None and not p.requires_grad for p in store.parameters())


def test_under_autocast_the_weight_is_rebuilt_once_in_autocasts_dtype(monkeypatch) -> None:  # noqa: ANN001
    """DDP's mixed precision: an fp32 input under bf16 autocast. The weight is rebuilt in bf16 at
    once, forward and backward, and the output is autocast's F.linear bit for bit. Before, it was
    rebuilt in the input's fp32 (4 bytes a weight written) and autocast cast all of it again."""
    from zerofit.models import nf4

    store = nf4_layer(gaussian((128, 256), seed=3))
    real, asked = nf4.dequantize, []
    monkeypatch.setattr(
        nf4, "dequantize", lambda p, s, d, backward=False: asked.append(d) or real(p, s, d)
    )
    x = torch.randn(3, 5, 256, requires_grad=True)
    bias = torch.randn(128, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = nf4_linear(x, store)
        want = F.linear(x, real(store.pieces(), store.shape, torch.float32))
        with_bias = nf4_linear(x, store, bias)
    assert out.dtype == want.dtype == with_bias.dtype == torch.bfloat16
    assert torch.equal(out, want)
    torch.testing.assert_close(with_bias, (want.float() + bias).bfloat16(), rtol=1e-2, atol=1e-2)
    out.float().sum().backward()
    assert x.grad is not None and x.grad.dtype == torch.float32
    assert asked == [torch.bfloat16] * 3  # two forwards, one backward


def _materialized(spec: ModelSpec) -> torch.nn.Module:
    materialize_from_spec(spec.module, torch.device("cpu"), spec, init_seed=0)
    return spec.module


def _qlora(quantize: str = "nf4") -> ModelSpec:
    spec = build_model("tiny", overrides={"n_layers": 2})
    return apply_lora(spec, LoRAConfig(rank=4, alpha=8.0, quantize=quantize))


def test_the_base_quantises_the_weights_the_lora_run_starts_from() -> None:
    qlora, lora = _materialized(_qlora()), _materialized(_qlora("none"))
    layers = [n for n, m in qlora.named_modules() if isinstance(m, LoRALinear)]
    assert len(layers) == 14  # 7 linears a block: all NF4
    for name in layers:
        q, plain = qlora.get_submodule(name), lora.get_submodule(name)
        assert not hasattr(q, "weight") and q.nf4.codes.dtype == torch.bfloat16
        want = dequantize(quantize(plain.weight), plain.weight.shape, torch.float32)
        assert torch.equal(q.nf4.weight(torch.float32), want), name
        for factor in ("lora_A", "lora_B"):  # the same adapters' init
            assert torch.equal(getattr(q, factor).weight, getattr(plain, factor).weight)


def test_every_piece_is_a_bf16_word_the_engines_never_cast() -> None:
    """FSDP2 before torch 2.12 cannot shard an integer parameter, so the pieces are bf16 words.
    The engines' dtype steps (the module to its master dtype, then frozen weights to the compute
    dtype) put them back in their words, and dequantising gives the same weight either way."""
    spec = _qlora()
    pieces = {n: p for n, p in spec.module.named_parameters() if piece_of(n) is not None}
    assert len(pieces) == 14 * 4 and all(p.dtype == STORAGE for p in pieces.values())
    for compute in (torch.float32, torch.bfloat16):
        module = spec.module.to(torch.float32)  # on meta, as the engines do
        cast_frozen_(module, compute)
        for name, p in module.named_parameters():
            want = STORAGE if piece_of(name) is not None else None
            assert p.dtype == (want or (torch.float32 if p.requires_grad else compute)), name
    w = torch.randn(64, 256)
    stored = quantize(w)
    assert all(t.dtype == STORAGE for t in stored.values())
    torch.testing.assert_close(
        dequantize(stored, w.shape, torch.float32),
        dequantize(as_bits(stored), w.shape, torch.float32),
        rtol=0,
        atol=0,
    )


def test_qlora_trains_the_adapters_and_leaves_the_4bit_base_bitwise() -> None:
    model = _materialized(_qlora()).train()
    frozen = {n: p.clone() for n, p in model.named_parameters() if ".nf4." in n}
    trainable = [p for p in model.parameters() if p.requires_grad]
    assert frozen and all(".lora_" in n for n, p in model.named_parameters() if p.requires_grad)
    opt = torch.optim.AdamW(trainable, lr=1e-2)
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, 512, (4, 33), generator=gen)
    seen = []
    for _ in range(8):
        loss = model(tokens[:, :-1], tokens[:, 1:])
        loss.backward()
        opt.step()
        opt.zero_grad()
        seen.append(loss.item())
    assert seen[-1] < seen[0] - 0.5, seen
    for name, p in model.named_parameters():
        if name in frozen:
            assert same_bits(p, frozen[name]) and p.grad is None, name


def test_quantize_needs_adapters_and_an_engine_that_holds_4_bits(tmp_path) -> None:  # noqa: ANN001
    cfg = write_config(tmp_path / "c.yaml", {"model": {"lora": {"quantize": "nf4"}}})
    with pytest.raises(UserError, match=r"model.lora.quantize=nf4 .*model.lora.rank > 0"):
        load_config(cfg)
    qlora = {"model": {"lora": {"rank": 4, "quantize": "nf4"}}}
    for backend in ("fsdp", "ddp"):
        load_config(write_config(tmp_path / "ok.yaml", qlora), [f"parallel.backend={backend}"])
    cfg = write_config(tmp_path / "ds.yaml", qlora)
    with pytest.raises(UserError, match=r"DeepSpeed cannot hold a 4-bit base.*backend=fsdp"):
        load_config(cfg, ["parallel.backend=deepspeed"])
    with pytest.raises(UserError, match="nf4"):
        load_config(cfg, ["model.lora.quantize=nf5"])
    for mode in ("bf16", "fp32", "auto"):
        load_config(cfg, [f"precision.mode={mode}"])
    with pytest.raises(UserError, match=r"quantize=nf4 computes in bf16 or fp32.*precision.mode"):
        load_config(cfg, ["precision.mode=fp16"])


def test_a_qlora_model_counts_its_parameters_as_the_lora_model_does() -> None:
    from zerofit.models.build import param_counts

    qlora, lora = _qlora(), _qlora("none")
    assert param_counts(qlora.module) == param_counts(lora.module)
    assert qlora.shape.measured == lora.shape.measured


def test_without_torchao_quantising_is_one_clear_line(monkeypatch) -> None:  # noqa: ANN001
    import sys

    monkeypatch.setitem(sys.modules, "torchao.quantization", None)  # import fails
    with pytest.raises(UserError, match=r"torchao, which is not installed.*zerofit\[qlora\]"):
        quantize(gaussian((128, 128)))


def test_the_planner_counts_nf4_bytes_by_hand(tmp_path) -> None:  # noqa: ANN001
    """Llama-3-8B, QLoRA r=16 on every linear of the blocks, DDP on one GPU in bf16: the base's
    224 block linears take 0.5 + 1/64 + 2/16384 bytes a weight, the rest (embedding, head,
    norms) 2; a 4-bit layer is rebuilt in bf16 while it runs (the widest: 14336 x 4096)."""
    from zerofit.backends.terms import NF4_BYTES
    from zerofit.models.shape import shape_from_config
    from zerofit.planner.memory import estimate, strategy_for, workload_for
    from zerofit.planner.speed import dequant_seconds

    extra = {
        "model": {
            "preset": "llama3-8b",
            "seq_len": 2048,
            "overrides": {},
            "lora": {"rank": 16, "quantize": "nf4"},
        }
    }
    cfg = load_config(
        write_config(tmp_path / "c.yaml", extra), ["parallel.backend=ddp", "precision.mode=bf16"]
    )
    m, w = shape_from_config(cfg), workload_for(cfg, 1)
    d, f, kv = 4096, 14336, 1024
    per_block = 2 * d * d + 2 * kv * d + 3 * f * d
    assert w.lora.quantized == 32 * per_block == 6_979_321_856
    assert w.lora.block_quantized == per_block and w.lora.largest_quantized == f * d
    assert NF4_BYTES == 0.5 + 1 / 64 + 2 / 16384
    P, A = m.num_params, w.lora.params
    assert 32 * 16 * (2 * (d + d) + 2 * (d + kv) + 3 * (d + f)) == A  # r x (in + out) per layer
    mem = estimate(m, w, strategy_for(cfg))
    assert mem.parameters == pytest.approx(
        A * 4 + (P - w.lora.quantized) * 2 + w.lora.quantized * NF4_BYTES
    )
    assert mem.parameters / 2**30 == pytest.approx(5.5, abs=0.2)  # against ~15 GiB in bf16
    assert mem.buffers == pytest.approx(A * 2 + f * d * 2)  # autocast's adapter copies + 1 rebuilt

    from dataclasses import replace

    from zerofit.planner.shape import Hardware

    hw = Hardware(1, 24 * 2**30, peak_flops=165e12, mem_bw=1.008e12)
    s = strategy_for(cfg)
    moved = w.lora.quantized * (NF4_BYTES + 2) * 2  # read the pieces, write bf16; fwd + bwd
    assert s.compile  # the planner plans a compiled run: 21% of the bandwidth (an H100's trace)
    assert dequant_seconds(m, w, s, hw) == pytest.approx(moved / (1.008e12 * 0.21))
    eager = replace(s, compile=False)
    assert dequant_seconds(m, w, eager, hw) == pytest.approx(moved / (1.008e12 * 0.1))


def test_plan_proposes_lora_and_qlora_when_full_fine_tuning_fits_nowhere(
    tmp_path, capsys: pytest.CaptureFixture[str]
) -> None:  # noqa: ANN001
    """Llama-3-8B on one 24 GB card: no full fine-tune fits; QLoRA does, with less memory than
    LoRA needs. Where the full fine-tune fits, nothing more is said."""
    import json

    from zerofit.cli import main

    full = {
        "model": {"preset": "llama3-8b", "seq_len": 2048, "overrides": {}},
        "train": {"micro_batch_size": 1},
        "precision": {"mode": "bf16"},
    }
    cfg = write_config(tmp_path / "full.yaml", full)
    assert main(["plan", "-c", str(cfg), "--gpu", "rtx-4090", "--gpus", "1", "--json"]) == 0
    out = capsys.readouterr().out
    ways = {x["way"]: x for x in json.loads(out[: out.rindex("}") + 1])["with_adapters"]}
    assert ways["QLoRA"]["fits"] and ways["QLoRA"]["overrides"] == {
        "model.lora.rank": 16,
        "model.lora.quantize": "nf4",
    }
    assert ways["LoRA"]["overrides"] == {"model.lora.rank": 16}
    assert 5.0 < ways["QLoRA"]["gpu_gib"]["parameters"] < 6.0  # 4-bit base: ~5.5 GiB, not ~15
    assert main(["plan", "-c", str(cfg), "--gpu", "rtx-4090", "--gpus", "1"]) == 0
    text = capsys.readouterr().out
    assert "full fine-tuning fits nowhere here" in text and "--model.lora.quantize nf4" in text
    assert main(["plan", "-c", str(cfg), "--gpu", "h200", "--gpus", "8"]) == 0
    assert "with adapters" not in capsys.readouterr().out


def test_the_planners_estimate_of_adapters_is_what_the_built_model_counts(tmp_path) -> None:  # noqa: ANN001
    """`zerofit plan` proposes LoRA/QLoRA without building the model (torch-free): its counts
    are those of the model built with ``model.lora`` set."""
    from zerofit.models.shape import shape_from_config
    from zerofit.planner.adapters import estimated_adapters
    from zerofit.planner.memory import workload_for

    for preset in ("llama3-8b", "13b", "tiny"):
        extra = {
            "model": {"preset": preset, "overrides": {}, "lora": {"rank": 16, "quantize": "nf4"}}
        }
        cfg = load_config(write_config(tmp_path / "c.yaml", extra))
        built = workload_for(cfg, 1).lora
        assert estimated_adapters(shape_from_config(cfg), 16, True) == built, preset


def test_the_compiled_rebuild_efficiency_is_the_h100_measurement() -> None:
    """planner.speed.DEQUANT_EFFICIENCY is what an H100's 8B QLoRA trace measured: the 3,072
    rebuilds of 4096 x 14336 weights in a step (two Inductor kernels each), counted as NF4_BYTES
    read and 2 written a weight, over the H100's 3.35 TB/s."""
    from doc_checks_qlora_rebuild import rebuild  # the benchmark page's kernel table (call 1)

    from zerofit.backends.terms import NF4_BYTES
    from zerofit.planner.gpus import find_gpu
    from zerofit.planner.speed import DEQUANT_EFFICIENCY

    rows = rebuild()
    pair = [rows["rebuild, MLP weights"], rows["view + cast, MLP weights"]]
    assert [calls for calls, *_ in pair] == [3072, 3072]
    seconds = sum(ms for _, ms, *_ in pair) / 1e3
    moved = 3072 * 4096 * 14336 * (NF4_BYTES + 2)
    measured = moved / seconds / find_gpu("H100").mem_bw
    assert abs(DEQUANT_EFFICIENCY - measured) < 0.005, measured


def test_the_rebuild_time_enters_the_step_time(tmp_path) -> None:  # noqa: ANN001
    """The same workload with and without its NF4 weights: the forecast step differs by exactly
    the rebuild time (it is compute: no communication hides it)."""
    from dataclasses import replace

    from zerofit.models.shape import shape_from_config
    from zerofit.planner.memory import strategy_for, workload_for
    from zerofit.planner.shape import Hardware
    from zerofit.planner.speed import dequant_seconds, predict

    extra = {
        "model": {"preset": "llama3-8b", "overrides": {}, "lora": {"rank": 16, "quantize": "nf4"}}
    }
    cfg = load_config(write_config(tmp_path / "c.yaml", extra), ["parallel.backend=ddp"])
    m, w, s = shape_from_config(cfg), workload_for(cfg, 1), strategy_for(cfg)
    hw = Hardware(1, 24 * 2**30, peak_flops=165e12, mem_bw=1.008e12)
    plain = replace(w, lora=replace(w.lora, quantized=0, block_quantized=0, largest_quantized=0))
    rebuild = dequant_seconds(m, w, s, hw)
    assert rebuild > 0 and dequant_seconds(m, plain, s, hw) == 0
    got = predict(m, w, s, hw).compute - predict(m, plain, s, hw).compute
    assert got == pytest.approx(rebuild)
    assert predict(m, w, s, hw).step_time > predict(m, plain, s, hw).step_time


def test_fsdp_gathers_the_4bit_share_of_a_block_in_4_bits(tmp_path) -> None:  # noqa: ANN001
    """FSDP2 full-shard holds two gathered blocks: QLoRA's are smaller than LoRA's by the NF4
    share (2 - 0.516 bytes a weight), plus one layer rebuilt in bf16; its all-gathers carry the
    base's 4-bit weights at 0.516 bytes."""
    from dataclasses import replace

    from zerofit.backends.terms import NF4_BYTES
    from zerofit.models.shape import shape_from_config
    from zerofit.planner.memory import strategy_for, workload_for

    extra = {
        "model": {"preset": "llama3-8b", "overrides": {}, "lora": {"rank": 16, "quantize": "nf4"}}
    }
    cfg = load_config(
        write_config(tmp_path / "c.yaml", extra), ["parallel.backend=fsdp", "precision.mode=bf16"]
    )
    m, w, s = shape_from_config(cfg), workload_for(cfg, 2), strategy_for(cfg)
    plain = replace(w, lora=replace(w.lora, quantized=0, block_quantized=0, largest_quantized=0))
    q = w.lora.block_quantized
    got, ref = s.engine.memory(m, w, s.options), s.engine.memory(m, plain, s.options)
    assert ref.buffers - got.buffers == pytest.approx(
        2 * q * (2 - NF4_BYTES) - w.lora.largest_quantized * 2
    )
    moved, ref_moved = s.engine.traffic(m, w, s.options), s.engine.traffic(m, plain, s.options)
    # two passes (forward, backward) of every block's all-gather a step, 1 micro-batch
    assert ref_moved.volume - moved.volume == pytest.approx(2 * m.n_layers * q * (2 - NF4_BYTES))


def test_the_rebuild_repeats_for_recomputed_blocks_and_each_micro_batch(tmp_path) -> None:  # noqa: ANN001
    """Full AC recomputes every block's forward (a third rebuild), and each micro-batch of an
    accumulated step rebuilds them all again; half the blocks recomputing add half a pass."""
    from dataclasses import replace

    from zerofit.models.shape import shape_from_config
    from zerofit.planner.memory import strategy_for, workload_for
    from zerofit.planner.shape import Hardware
    from zerofit.planner.speed import dequant_seconds

    extra = {
        "model": {"preset": "llama3-8b", "overrides": {}, "lora": {"rank": 16, "quantize": "nf4"}}
    }
    cfg = load_config(write_config(tmp_path / "c.yaml", extra), ["parallel.backend=ddp"])
    m, w, s = shape_from_config(cfg), workload_for(cfg, 1), strategy_for(cfg)
    hw = Hardware(1, 24 * 2**30, peak_flops=165e12, mem_bw=1.008e12)
    once = dequant_seconds(m, w, replace(s, activation_checkpointing="none"), hw)
    full = dequant_seconds(
        m, replace(w, grad_accum_steps=3), replace(s, activation_checkpointing="full"), hw
    )
    assert full == pytest.approx(once * 3 / 2 * 3)
    half = dequant_seconds(m, w, replace(s, activation_checkpointing="every_k", ac_every=2), hw)
    assert half == pytest.approx(once * 2.5 / 2)


def test_the_planner_counts_a_gated_down_projections_input_as_rebuilt(tmp_path) -> None:  # noqa: ANN001
    """A Hugging Face Llama under model.lean_ops: the built model's adapted down projection
    (ffn inputs) keeps no input, and the torch-free estimate says the same; off without lean
    ops."""
    from zerofit.models.shape import shape_from_config
    from zerofit.planner.adapters import estimated_adapters
    from zerofit.planner.memory import workload_for

    folder = tmp_path / "hf"
    folder.mkdir()
    (folder / "config.json").write_text(
        json.dumps(
            {
                "model_type": "llama",
                "hidden_size": 64,
                "intermediate_size": 160,
                "num_hidden_layers": 2,
                "num_attention_heads": 4,
                "num_key_value_heads": 2,
                "vocab_size": 256,
            }
        )
    )
    for lean, want in ((True, 160), (False, 0)):
        extra = {
            "model": {
                "preset": None,
                "overrides": {},
                "hf": str(folder),
                "random_init": True,
                "lean_ops": lean,
                "lora": {"rank": 8, "dropout": 0.0},
            }
        }
        cfg = load_config(write_config(tmp_path / "c.yaml", extra))
        built = workload_for(cfg, 1).lora
        assert built.rebuilt_inputs == want
        assert estimated_adapters(shape_from_config(cfg), 8, False, lean) == built

"""The planner's terms by hand (`zerofit.planner.memory`, `zerofit.planner.speed`,
`zerofit.backends.terms`), on the branches the calibrated cases do not reach: compiled activation
counts, the fused head's chunk edges, LoRA's adapters, the peak's phases, selective and every-k
checkpointing, fp8, the width clip, inter-node links and the reference card. Each value is worked
from the formula the module's docstring states, on a toy shape."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from zerofit.backends import get_engine
from zerofit.backends.terms import (
    BYTES,
    GIB,
    Adapters,
    EngineMemory,
    OffloadTime,
    Traffic,
    Workload,
)
from zerofit.launch.run_config import config_from_dict
from zerofit.models.shape import ModelShape, shape_from_config, shape_from_preset
from zerofit.planner.memory import (
    CUDA_CONTEXT,
    FRAGMENTATION,
    Memory,
    Strategy,
    activation_bytes,
    activation_parts,
    adapters_for,
    block_activation_bytes,
    block_saved,
    estimate,
    inflight_bytes,
    logits_bytes,
    predicted_peak,
    saved_after,
    strategy_for,
    workload_for,
)
from zerofit.planner.shape import Hardware
from zerofit.planner.speed import (
    FP8_EAGER_GAIN,
    FP8_GAIN,
    OVERLAP,
    bandwidth_factor,
    efficiency,
    flops_per_token,
    forward_share,
    fp8_share,
    fp8_time_factor,
    predict,
)

# dim 8, 2 heads (head 4), 1 kv head, ffn 16, vocab 10: small enough to work by hand
TOY = ModelShape("toy", 3, 8, 2, 1, 16, 10)
FUSED = replace(TOY, fused_head=True)
H200 = Hardware(8, 141 * 10**9)


# ----------------------------------------------------------------------------- terms


def test_dtype_bytes_and_gib() -> None:
    assert BYTES == {"bf16": 2, "fp16": 2, "fp32": 4} and GIB == 1024**3
    w = Workload(2, 5, 4, compute_dtype="fp16", master_dtype="bf16", reduce_dtype="fp32")
    assert (w.tokens, w.e_c, w.e_m, w.e_r, w.e_g) == (10, 2, 2, 4, 2)


def test_workload_defaults() -> None:
    w = Workload(1, 1, 1)
    assert (w.grad_accum_steps, w.compute_dtype, w.master_dtype, w.reduce_dtype) == (
        1, "bf16", "fp32", "fp32",
    )  # fmt: skip
    assert (w.reduce_bucket_size, w.allgather_bucket_size) == (500_000_000, 500_000_000)
    assert (w.loss_chunk, w.lora, w.fp8, w.fused_optim) == (4096, None, "none", True)


@pytest.mark.parametrize(("fp8", "e_g"), [("tensorwise", 1), ("rowwise", 4), ("none", 4)])
def test_fsdp_gathers_one_byte_per_block_parameter_only_under_tensorwise_fp8(
    fp8: str, e_g: int
) -> None:
    assert Workload(1, 1, 1, compute_dtype="fp32", fp8=fp8).e_g == e_g


def test_trained_and_frozen_parameters() -> None:
    plain = Workload(1, 1, 1)
    lora = Workload(1, 1, 1, lora=Adapters(params=70, rank=4, per_block=7))
    assert (plain.trained(1000), plain.frozen(1000)) == (1000, 0)
    assert (lora.trained(1000), lora.frozen(1000)) == (70, 1000)


def test_adapter_activations_by_hand() -> None:
    """Per adapted layer A's output (rank values); with dropout a mask bit per input element."""
    a = Adapters(params=1, rank=4, per_block=7)
    assert a.block_inputs == 0
    assert a.activation_bytes(3, 2) == 3 * 7 * 4 * 2
    b = Adapters(params=1, rank=4, per_block=7, block_inputs=100)
    assert b.activation_bytes(3, 2) == 3 * (7 * 4 * 2 + 100 / 8)


def test_traffic_per_rank_is_the_ring_share() -> None:
    assert Traffic(1000.0, 4).per_rank == 750.0
    assert Traffic(1000.0, 2).per_rank == 500.0
    assert Traffic(1000.0, 1).per_rank == 0.0


def test_engine_memory_and_offload_defaults() -> None:
    e = EngineMemory()
    assert (e.parameters, e.gradients, e.optimizer_states, e.buffers, e.host, e.nvme) == (0,) * 6
    assert (e.held_grads, e.persistent_grads, e.end_buffers, e.buffers_at_end) == (
        None, False, 0.0, True,
    )  # fmt: skip
    assert (e.backward, e.step_buffers, e.notes) == ((), 0.0, [])
    assert EngineMemory().notes is not EngineMemory().notes
    assert (OffloadTime().micro_batch, OffloadTime().step) == (0.0, 0.0)


# ----------------------------------------------------------------------------- strategy


def test_strategy_defaults_and_labels() -> None:
    s = Strategy.of("fsdp")
    assert (s.activation_checkpointing, s.compile, s.ac_blocks, s.ac_every) == (
        "none", False, None, 2,
    )  # fmt: skip
    base = s.label
    assert Strategy.of("fsdp", activation_checkpointing="full").label == base + " + AC"
    assert Strategy.of("fsdp", activation_checkpointing="selective").label == base + " + SAC"
    assert Strategy.of("fsdp", activation_checkpointing="every_k").label == base + " + AC every 2"
    first = Strategy.of("fsdp", activation_checkpointing="first_k")
    assert first.label == base + " + AC first k"
    assert replace(first, ac_blocks=3).label == base + " + AC first 3"
    assert Strategy.of("fsdp", compile=True).compile is True


def test_which_blocks_recompute() -> None:
    of = Strategy.of
    assert of("fsdp").recomputed(6) == []
    assert of("fsdp", activation_checkpointing="selective").recomputed(6) == []
    assert of("fsdp", activation_checkpointing="full").recomputed(6) == list(range(6))
    assert of("fsdp", activation_checkpointing="every_k").recomputed(6) == [0, 2, 4]
    first = replace(of("fsdp", activation_checkpointing="first_k"), ac_blocks=2)
    assert first.recomputed(6) == [0, 1]


def test_overrides_name_the_strategy() -> None:
    s = replace(Strategy.of("fsdp", activation_checkpointing="every_k"), ac_every=3)
    out = s.overrides()
    assert out["parallel.backend"] == "fsdp"
    assert out["parallel.activation_checkpointing"] == "every_k"
    assert out["parallel.ac_every"] == 3 and out["parallel.ac_blocks"] is None
    first = replace(Strategy.of("fsdp", activation_checkpointing="first_k"), ac_blocks=2)
    assert first.overrides()["parallel.ac_blocks"] == 2
    assert "parallel.ac_every" not in first.overrides()


def test_a_config_gives_its_strategy_and_workload() -> None:
    cfg = config_from_dict(
        {
            "parallel": {"activation_checkpointing": "every_k", "ac_every": 3, "compile": True},
            "train": {"micro_batch_size": 2, "grad_accum_steps": 5},
            "model": {"seq_len": 64, "loss_chunk": 32},
        }
    )
    s = strategy_for(cfg)
    assert (s.backend, s.activation_checkpointing, s.compile, s.ac_every) == (
        "fsdp", "every_k", True, 3,
    )  # fmt: skip
    w = workload_for(cfg, 4)  # auto precision on the GPU the planner plans: bf16
    assert (w.micro_batch_size, w.seq_len, w.world_size, w.grad_accum_steps) == (2, 64, 4, 5)
    assert (w.compute_dtype, w.master_dtype, w.reduce_dtype) == ("bf16", "fp32", "fp32")
    assert (w.loss_chunk, w.lora, w.fp8, w.fused_optim) == (32, None, "none", True)


@pytest.mark.parametrize(
    ("precision", "want"),
    [
        ({"mode": "fp32"}, ("fp32", "fp32", "fp32")),
        ({"mode": "bf16", "master_dtype": "bf16"}, ("bf16", "bf16", "fp32")),
        ({"mode": "bf16", "reduce_dtype": "bf16"}, ("bf16", "fp32", "bf16")),
        ({"mode": "fp16"}, ("fp16", "fp32", "fp32")),
    ],
)
def test_the_workload_takes_the_configs_dtypes(precision: dict, want: tuple) -> None:
    w = workload_for(config_from_dict({"precision": precision}), 1)
    assert (w.compute_dtype, w.master_dtype, w.reduce_dtype) == want


@pytest.mark.parametrize(("fused", "want"), [(None, True), (True, True), (False, False)])
def test_the_workload_knows_a_fused_optimizer(fused: bool | None, want: bool) -> None:
    assert workload_for(config_from_dict({"optim": {"fused": fused}}), 1).fused_optim is want


# ----------------------------------------------------------------------------- activations


def test_compiled_block_activations_by_hand() -> None:
    """Compiled: e_c x (7 dim + 2 kv + 3 ffn) + 8 + 4 heads bytes per token:
    2 x (56 + 8 + 48) + 8 + 8 = 240."""
    assert block_activation_bytes(TOY, 3, 2, compiled=True) == 3 * 240
    assert block_activation_bytes(TOY, 3, 2) == 3 * 368  # eager (as test_planner)
    assert block_activation_bytes(TOY, 3, 4, compiled=True) == 3 * (4 * 112 + 16)


def test_activations_add_the_tail_exactly() -> None:
    """No checkpointing: every block all it saves, plus the final norm (8 dim + 4) and the
    output layer's input (e_c dim) per token, nothing in flight."""
    w = Workload(1, 3, 1)
    s = Strategy.of("fsdp")
    blocks, inflight, tail = activation_parts(TOY, w, s)
    assert (blocks, inflight, tail) == (3 * 3 * 368, 0, 3 * (8 * 8 + 4 + 2 * 8))
    assert activation_bytes(TOY, w, s) == blocks + tail
    assert inflight_bytes(TOY, w, s) == 0


def test_full_checkpointing_keeps_block_inputs_plus_one_in_flight() -> None:
    w = Workload(1, 3, 1)
    s = Strategy.of("fsdp", activation_checkpointing="full")
    assert block_saved(TOY, w, s) == [3 * 8 * 2] * 3  # the residual stream, e_c per value
    assert inflight_bytes(TOY, w, s) == 3 * 368


def test_ddp_keeps_an_fp32_residual_stream_but_not_for_lora() -> None:
    w = Workload(1, 3, 1)
    s = Strategy.of("ddp", activation_checkpointing="full")
    assert block_saved(TOY, w, s) == [3 * 8 * 4] * 3  # autocast: fp32 block inputs
    lora = replace(w, lora=Adapters(100, 2, 7))
    assert block_saved(TOY, lora, s) == [3 * 8 * 2] * 3  # a LoRA base is stored in e_c


def test_selective_checkpointing_keeps_matmul_and_attention_outputs() -> None:
    """e_c x (5 dim + 2 kv + 2 ffn) + 4 heads per token: 2 x (40 + 8 + 32) + 8 = 168."""
    w = Workload(1, 3, 1)
    s = Strategy.of("fsdp", activation_checkpointing="selective")
    assert block_saved(TOY, w, s) == [3 * 168] * 3
    assert inflight_bytes(TOY, w, s) == 3 * 368


def test_lora_adds_its_adapter_activations_to_each_block() -> None:
    lora = Adapters(100, rank=2, per_block=7, block_inputs=40)
    w = Workload(1, 3, 1, lora=lora)
    s = Strategy.of("fsdp")
    extra = lora.activation_bytes(3, 2)
    assert block_saved(TOY, w, s) == [3 * 368 + extra] * 3
    full = Strategy.of("fsdp", activation_checkpointing="full")
    assert inflight_bytes(TOY, w, full) == 3 * 368 + extra


def test_backward_frees_blocks_from_the_output_side() -> None:
    w = Workload(1, 3, 1)
    s = Strategy.of("fsdp")
    block = 3 * 368
    head = TOY.vocab_size * TOY.dim + TOY.dim
    assert saved_after(TOY, w, s, 0) == 3 * block  # nothing reduced: all saved
    assert saved_after(TOY, w, s, head) == 3 * block  # the head reduced: blocks intact
    per = TOY.block_params
    assert saved_after(TOY, w, s, head + per) == 2 * block
    assert saved_after(TOY, w, s, head + 1.5 * per) == pytest.approx(1.5 * block)
    assert saved_after(TOY, w, s, head + 3 * per) == 0
    assert saved_after(TOY, w, s, head + 4.5 * per) == 0  # the embedding's too: still none
    assert saved_after(TOY, w, s, 10**12) == 0
    full = Strategy.of("fsdp", activation_checkpointing="full")
    assert saved_after(TOY, w, full, 10**12) == block  # the block being recomputed


# ----------------------------------------------------------------------------- logits


def test_plain_logits_by_hand() -> None:
    """fp32 log-softmax, its fp32 gradient and the low-precision logits: T x V x (8 + e_c)."""
    w = Workload(1, 6, 1, loss_chunk=0)
    assert logits_bytes(TOY, w) == 6 * 10 * 10
    assert logits_bytes(FUSED, w) == 6 * 10 * 10  # loss_chunk 0: not fused
    assert logits_bytes(TOY, replace(w, loss_chunk=4)) == 6 * 10 * 10  # no fused head


def test_fused_logits_by_hand() -> None:
    """One chunk of logits (4 + 2 e_c per value), the fp32 head gradient, the input gradient."""
    w = Workload(1, 6, 1, loss_chunk=4)
    assert logits_bytes(FUSED, w) == 4 * 10 * 8 + 4 * 10 * 8 + 6 * 8 * 2
    assert logits_bytes(FUSED, replace(w, loss_chunk=100)) == 6 * 10 * 8 + 320 + 96
    one = replace(w, loss_chunk=1)  # one token a chunk: still fused
    assert logits_bytes(FUSED, one) == 1 * 10 * 8 + 320 + 96
    lora = replace(w, lora=Adapters(1, 1, 1))  # a LoRA head is frozen: no head gradient
    assert logits_bytes(FUSED, lora) == 4 * 10 * 8 + 6 * 8 * 2


def test_compiled_fused_logits_keep_the_previous_chunks_gradient_only_past_one_chunk() -> None:
    w = Workload(1, 6, 1, loss_chunk=4)
    assert logits_bytes(FUSED, w, compiled=True) == 4 * 10 * 6 + 320 + 96  # 2 e_c + e_c
    one = replace(w, loss_chunk=6)  # a single chunk: no previous one
    assert logits_bytes(FUSED, one, compiled=True) == 6 * 10 * 4 + 320 + 96
    assert logits_bytes(FUSED, one) == 6 * 10 * 8 + 320 + 96  # default: eager


# ----------------------------------------------------------------------------- the peak


def fake_engine(monkeypatch: pytest.MonkeyPatch, em: EngineMemory) -> Strategy:
    s = Strategy.of("fsdp")
    monkeypatch.setattr(get_engine("fsdp"), "memory", lambda m, w, opts: em)
    return s


W3 = Workload(1, 3, 1, loss_chunk=0)
ACTS = 3 * 3 * 368 + 3 * (64 + 4 + 16)  # three blocks and the tail
LOGITS = 3 * 10 * 10


def test_the_peak_at_the_start_of_backward(monkeypatch: pytest.MonkeyPatch) -> None:
    em = EngineMemory(parameters=1000, gradients=50, optimizer_states=300, buffers=7)
    mem = estimate(TOY, W3, fake_engine(monkeypatch, em))
    assert mem.peak_allocated == 1000 + 300 + 7 + ACTS + LOGITS  # gradients not yet produced
    assert (mem.activations, mem.logits) == (ACTS, LOGITS)
    held = estimate(TOY, W3, fake_engine(monkeypatch, replace(em, held_grads=11)))
    assert held.peak_allocated == 1000 + 300 + 7 + ACTS + LOGITS + 11
    kept = estimate(TOY, W3, fake_engine(monkeypatch, replace(em, persistent_grads=True)))
    assert kept.peak_allocated == 1000 + 300 + 7 + ACTS + LOGITS + 50


def test_the_peak_at_the_end_of_backward(monkeypatch: pytest.MonkeyPatch) -> None:
    big = 10**7
    em = EngineMemory(
        parameters=1000, gradients=big, optimizer_states=300, buffers=7, end_buffers=5
    )
    mem = estimate(TOY, W3, fake_engine(monkeypatch, em))
    assert mem.peak_allocated == 1000 + 300 + big + 5 + 7
    gone = replace(em, buffers_at_end=False)
    assert estimate(TOY, W3, fake_engine(monkeypatch, gone)).peak_allocated == 1300 + big + 5


def test_the_peak_in_the_optimizer_step(monkeypatch: pytest.MonkeyPatch) -> None:
    big = 10**7
    em = EngineMemory(
        parameters=1000, gradients=20, optimizer_states=300, buffers=7, step_buffers=big
    )
    mem = estimate(TOY, W3, fake_engine(monkeypatch, em))
    assert mem.peak_allocated == 1000 + 300 + 20 + 7 + big
    gone = replace(em, buffers_at_end=False)
    assert estimate(TOY, W3, fake_engine(monkeypatch, gone)).peak_allocated == 1320 + big


def test_the_peak_inside_backward(monkeypatch: pytest.MonkeyPatch) -> None:
    head = TOY.vocab_size * TOY.dim + TOY.dim
    big = 10**7
    em = EngineMemory(parameters=1000, gradients=20, optimizer_states=300, backward=((head, big),))
    mem = estimate(TOY, W3, fake_engine(monkeypatch, em))
    assert mem.peak_allocated == 1000 + 300 + 20 + big + 3 * 3 * 368


def test_overhead_is_the_context_plus_fragmentation() -> None:
    mem = Memory(peak_allocated=1000.0)
    assert CUDA_CONTEXT == 600 * 2**20 and FRAGMENTATION == 0.08
    assert mem.overhead == CUDA_CONTEXT + 80.0
    assert mem.peak_reserved == 1000.0 + CUDA_CONTEXT + 80.0
    assert list(mem.components()) == [
        "parameters", "gradients", "optimizer_states", "activations", "logits", "buffers",
        "overhead",
    ]  # fmt: skip


def test_loading_needs_the_widest_matrix_in_fp32() -> None:
    narrow_vocab = ModelShape("v", 2, 8, 2, 1, 1000, 10)  # ffn x dim > vocab x dim
    assert estimate(narrow_vocab, W3, Strategy.of("fsdp")).loading_host == 4 * 8 * 1000


def test_the_predicted_peak_of_a_config_is_in_gib() -> None:
    cfg = config_from_dict({"model": {"preset": "tiny"}})
    gib, parts = predicted_peak(cfg, 2)
    mem = estimate(shape_from_config(cfg), workload_for(cfg, 2), strategy_for(cfg))
    assert gib == mem.peak_allocated / GIB
    assert parts == {k: v / GIB for k, v in mem.components().items()}


# ----------------------------------------------------------------------------- speed


def test_the_h200_is_the_reference_card() -> None:
    assert bandwidth_factor(H200) == 1.0
    slow = replace(H200, mem_bw=H200.mem_bw / 2)  # twice the FLOP per byte
    assert bandwidth_factor(slow) == pytest.approx(1.2)


@pytest.mark.parametrize(
    ("dim", "width"), [(2048, 1.0), (4096, 1.24), (64, 0.6), (2048 * 2**8, 1.35)]
)
def test_efficiency_scales_with_width_within_its_clip(dim: int, width: float) -> None:
    s = Strategy.of("fsdp")
    eng = get_engine("fsdp")
    assert efficiency(s, dim) == pytest.approx(eng.efficiency * width)
    compiled = Strategy.of("fsdp", compile=True)
    assert efficiency(compiled, dim) == pytest.approx(eng.efficiency * eng.compile_gain * width)


def test_lora_flops_drop_the_frozen_weight_gradients() -> None:
    w = Workload(1, 64, 1, lora=Adapters(params=1000, rank=4, per_block=7))
    plain = TOY.flops_per_token(64)
    assert flops_per_token(TOY, Workload(1, 64, 1)) == plain
    assert flops_per_token(TOY, w) == plain + 6.0 * 1000 - 2.0 * TOY.flops_params


def test_fp8_share_and_time_by_hand() -> None:
    m = shape_from_preset("llama3-1b")
    w = Workload(1, 2048, 8, fp8="tensorwise")
    assert fp8_share(m, replace(w, fp8="none")) == 0.0
    linear = 6.0 * m.n_layers * (m.block_params - 2 * m.dim)
    share = linear / m.flops_per_token(2048)
    assert fp8_share(m, w) == pytest.approx(share)
    assert 0.5 < share < 1.0
    assert fp8_time_factor(m, w, True) == pytest.approx(1 - share + share / FP8_GAIN)
    assert fp8_time_factor(m, w, False) == pytest.approx(1 - share + share / FP8_EAGER_GAIN)
    assert fp8_time_factor(m, replace(w, fp8="none"), True) == 1.0
    assert (FP8_GAIN, FP8_EAGER_GAIN) == (1.4, 1.1)


def test_fp8_share_is_at_most_one() -> None:
    # a model whose float8 Linear FLOPs exceed its counted FLOPs (LoRA's drop of the frozen
    # weight gradients): the share stops at 1
    m = shape_from_preset("llama3-1b")
    w = Workload(1, 16, 8, fp8="rowwise", lora=Adapters(params=1, rank=1, per_block=1))
    assert fp8_share(m, w) == 1.0


def test_fp8_makes_compute_faster_by_its_time_factor() -> None:
    m = shape_from_preset("llama3-1b")
    s = Strategy.of("fsdp", compile=True)
    w = Workload(2, 2048, 8)
    bf16 = predict(m, w, s, H200)
    fp8 = predict(m, replace(w, fp8="tensorwise"), s, H200)
    assert fp8.compute == pytest.approx(
        bf16.compute * fp8_time_factor(m, replace(w, fp8="tensorwise"), True)
    )
    assert fp8.compute < bf16.compute


def test_a_step_is_compute_plus_exposed_communication_plus_offload() -> None:
    m = shape_from_preset("llama3-8b")
    s = Strategy.of("fsdp")
    w = Workload(1, 512, 16)
    two_nodes = Hardware(8, 141 * 10**9, nodes=2, inter_bw=5e9)
    sp = predict(m, w, s, two_nodes)
    comm = s.engine.traffic(m, w, s.options).per_rank / two_nodes.inter_bw  # across nodes
    assert sp.comm_exposed == pytest.approx(comm - OVERLAP * sp.compute)
    assert sp.comm_exposed > 0
    assert sp.step_time == pytest.approx(sp.compute + sp.comm_exposed + sp.offload)
    tokens = w.tokens * w.grad_accum_steps * w.world_size
    assert sp.tokens_per_s == pytest.approx(tokens / sp.step_time)
    peak = w.world_size * two_nodes.peak_flops
    assert sp.mfu == pytest.approx(flops_per_token(m, w) * sp.tokens_per_s / peak)
    one_node = predict(m, replace(w, world_size=8), s, replace(two_nodes, nodes=1))
    assert one_node.comm_exposed < sp.comm_exposed  # NVLink inside a node


def test_compute_time_by_hand() -> None:
    m = shape_from_preset("llama3-1b")
    s = Strategy.of("fsdp")
    w = Workload(2, 1024, 8, grad_accum_steps=3)
    sp = predict(m, w, s, H200)
    flops = m.flops_per_token(1024) * 2 * 1024 * 3 * 8
    want = flops / (8 * H200.peak_flops * efficiency(s, m.dim))
    assert sp.compute == pytest.approx(want)
    full = predict(m, w, Strategy.of("fsdp", activation_checkpointing="full"), H200)
    assert full.compute == pytest.approx(want * (1 + 1 / 3))
    sel = predict(m, w, Strategy.of("fsdp", activation_checkpointing="selective"), H200)
    assert sel.compute == pytest.approx(want * 1.03)
    assert math.isclose(sp.mfu * sp.step_time, sp.mfu * sp.step_time)


# ----------------------------------------------------------------------------- LoRA (builds a model: last)


@pytest.mark.parametrize("dropout", [0.0, 0.05])
def test_lora_adapters_are_counted_on_the_built_model(dropout: float) -> None:
    cfg = config_from_dict(
        {
            "model": {
                "preset": "tiny",
                "overrides": {"n_layers": 2},
                "lora": {"rank": 4, "dropout": dropout},
            }
        }
    )
    a = adapters_for(cfg)
    m = shape_from_config(cfg)
    d, ffn, kv = m.dim, m.ffn_dim, m.n_kv_heads * m.head_dim
    # q, k, v, o, w1, w3 (in: dim) and w2 (in: ffn); A [4, in] + B [out, 4] each
    per_block = 4 * (d + d) + 4 * (d + kv) * 2 + 4 * (d + d) + 2 * 4 * (d + ffn) + 4 * (ffn + d)
    assert a == Adapters(2 * per_block, 4, 7, 6 * d + ffn if dropout else 0)
    assert workload_for(cfg, 1).lora == a
    assert adapters_for(config_from_dict({})) is None


def test_one_recomputed_block_of_one_costs_a_third() -> None:
    m = ModelShape("one-layer", 1, 2048, 16, 8, 8192, 32000)
    w = Workload(1, 1024, 8)
    plain = predict(m, w, Strategy.of("fsdp"), H200)
    full = predict(m, w, Strategy.of("fsdp", activation_checkpointing="full"), H200)
    assert full.compute == pytest.approx(plain.compute * 4 / 3)


def test_a_recomputed_lora_block_costs_its_forward_share_near_a_half() -> None:
    """With LoRA the frozen base does 4 FLOPs a weight, so re-running a block's forward (2 a
    weight) adds about half, not a third."""
    m = ModelShape("one-layer", 1, 2048, 16, 8, 8192, 32000)
    lora = Adapters(params=1000, rank=4, per_block=7)
    w = Workload(1, 1024, 8, lora=lora)
    f = m.flops_per_token(1024)
    share = (f / 3 + 2 * 1000) / (f + 6 * 1000 - 2 * m.flops_params)
    assert forward_share(m, w) == pytest.approx(share)
    assert 0.45 < share < 0.55
    assert forward_share(m, Workload(1, 1024, 8)) == pytest.approx(1 / 3)
    plain = predict(m, w, Strategy.of("fsdp"), H200)
    full = predict(m, w, Strategy.of("fsdp", activation_checkpointing="full"), H200)
    assert full.compute == pytest.approx(plain.compute * (1 + share))


def test_a_gated_down_projection_keeps_no_input() -> None:
    """An adapted down projection of a lean gated MLP: its input (ffn wide) is not kept."""
    b = Adapters(params=1, rank=4, per_block=7, block_inputs=100, rebuilt_inputs=30)
    assert b.activation_bytes(3, 2) == 3 * (7 * 4 * 2 + 100 / 8 - 30 * 2)
    assert b.activation_bytes(3, 2, compiled=True) == b.activation_bytes(3, 2)
    # compiled without dropout the compiler keeps the down projection's input after all
    c = Adapters(params=1, rank=4, per_block=7, rebuilt_inputs=30)
    assert c.activation_bytes(3, 2) == 3 * (7 * 4 * 2 - 30 * 2)
    assert c.activation_bytes(3, 2, compiled=True) == 3 * 7 * 4 * 2

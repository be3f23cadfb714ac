"""Per-rank memory of one training step, component by component, for every strategy.

Conventions (bytes; P = parameters, T = micro_batch x seq_len tokens, S = ranks a model is sharded
over, e_c / e_m / e_o / e_r = bytes of the compute, master, optimizer-state and reduction dtypes):

- parameters: what stays resident as the model's weights on the GPU (DDP/FSDP: master weights;
  DeepSpeed: the bf16/fp16 working copy, P x e_c, partitioned at stage 3);
- gradients: sharded/partitioned gradient storage (plus DDP's all-reduce buckets);
- optimizer states: AdamW's two moments, plus DeepSpeed's separate fp32 master copy (the ZeRO
  paper's K = 12 bytes/param);
- activations: what autograd saves per block, counted from zerofit's Llama ops (Korthikanti et
  al.'s per-layer count adjusted: GQA k/v, SwiGLU's three ffn tensors, fused SDPA saving only its
  output and log-sum-exp (no s^2 term), RMSNorm's fp32 intermediates); full activation
  checkpointing keeps each block's input plus one block being recomputed;
- logits and loss: with the fused head (model.loss_chunk > 0) one chunk of logits plus the saved
  fp32 head-weight gradient; plain, the fp32 log-softmax saved for backward, its fp32 gradient and
  the low-precision cast (T x V x (8 + e_c)): large for 128K vocabularies;
- buffers: engine working memory (FSDP units gathered in flight with prefetch and the root's
  unsharded head gradient; DeepSpeed buckets and gathered ZeRO-3 params; DDP autocast weight casts);
  with `precision.fp8: tensorwise` FSDP gathers the blocks' Linear weights in float8, 1 byte per
  parameter instead of e_c (`Workload.e_g`), and with any fp8 recipe DDP's autocast caches no copy
  of them; float8 leaves the saved activations as they are (torchao saves each Linear's
  high-precision input and weight and casts them again in backward);
- overhead (reserved, not allocated): CUDA context and the caching allocator's fragmentation;
- host RAM: offloaded states and staging buffers, and while loading, one full fp32 tensor per rank.

With LoRA (``model.lora``, ``Workload.lora``) the frozen base counts as parameters in the compute
dtype; gradients, AdamW states and DeepSpeed's fp32 masters are the adapters' alone, the output
head's gradient buffers go, and each adapted layer adds its rank-r activations (with dropout, its
mask, a bit per input element).

With DPO's frozen reference copy (``train.dpo.reference: copy``, ``Workload.reference_copy``) its
weights count as parameters, in the compute dtype, sharded as the engine shards the policy's. Any
reference forward (the copy's, or the base's with the adapters off) runs before the policy's and
is one more phase: what is resident, the engine's working bytes for it and a forward's transient
intermediates (`reference_phase`).

The peak is the largest of the start of backward (activations + logits alive, gradients not yet
produced unless they persist), the end of backward (all gradients, no activations), the
optimizer step (gradients and the step's temporaries) and, where an engine names them, points
inside backward (its working buffers beside the activations not yet freed: `saved_after`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from zerofit.backends import engine_of, get_engine
from zerofit.backends.catalog import EngineOptions
from zerofit.backends.engine import Engine
from zerofit.backends.terms import BYTES, GIB, Adapters, EngineMemory, Workload
from zerofit.config import resolve_precision
from zerofit.config.schema import Config
from zerofit.distributed.ac_blocks import checkpointed_blocks
from zerofit.models.shape import ModelShape, shape_from_config

CUDA_CONTEXT = 600 * 2**20  # measured order of the CUDA context + cuBLAS workspace on Hopper
FRAGMENTATION = 0.08  # reserved / allocated - 1 seen on steady training loops
BLOCK_AC = ("full", "every_k", "first_k")  # modes that recompute whole blocks


@dataclass(frozen=True)
class Strategy:
    """An engine with its options, plus what every engine does alike."""

    backend: str
    options: EngineOptions  # the engine's `parallel.<backend>` section
    activation_checkpointing: str = "none"  # none | full | every_k | first_k | selective
    compile: bool = False
    # first_k: how many blocks recompute (None: the fewest that fit, found by the planner)
    ac_blocks: int | None = None
    ac_every: int = 2  # every_k: every k-th block recomputes

    @classmethod
    def of(
        cls,
        backend: str,
        activation_checkpointing: str = "none",
        compile: bool = False,
        **fields: Any,
    ) -> Strategy:
        """`Strategy.of("deepspeed", stage=3, offload_optimizer="cpu")`: engine defaults + these."""
        return cls(
            backend, get_engine(backend).options(**fields), activation_checkpointing, compile
        )

    @property
    def engine(self) -> Engine:
        return get_engine(self.backend)

    @property
    def label(self) -> str:
        suffix = {
            "full": " + AC",
            "selective": " + SAC",
            "first_k": f" + AC first {'k' if self.ac_blocks is None else self.ac_blocks}",
            "every_k": f" + AC every {self.ac_every}",
        }.get(self.activation_checkpointing, "")
        return self.engine.label(self.options) + suffix

    def recomputed(self, n_blocks: int) -> list[int]:
        """The indices of the `n_blocks` blocks that recompute whole in backward (none for none
        and selective)."""
        mode = self.activation_checkpointing
        if mode not in BLOCK_AC:
            return []
        return checkpointed_blocks(mode, n_blocks, self.ac_every, self.ac_blocks)

    def overrides(self) -> dict[str, object]:
        """The zerofit config fields that select this strategy."""
        out: dict[str, object] = {
            "parallel.backend": self.backend,
            "parallel.activation_checkpointing": self.activation_checkpointing,
            "parallel.compile": self.compile,
            "parallel.ac_blocks": self.ac_blocks
            if self.activation_checkpointing == "first_k"
            else None,
        }
        if self.activation_checkpointing == "every_k":
            out["parallel.ac_every"] = self.ac_every
        for key in self.engine.plan_keys:
            out[f"parallel.{self.backend}.{key}"] = getattr(self.options, key)
        return out


def strategy_for(cfg: Config) -> Strategy:
    """The strategy a (not `auto`) zerofit config selects."""
    p, eng = cfg.parallel, engine_of(cfg)
    opts = eng.opts(cfg)
    compiled = eng.compiles(opts, p.compile, "cuda")  # as a run on a GPU resolves it
    return Strategy(p.backend, opts, p.activation_checkpointing, compiled, p.ac_blocks, p.ac_every)


def workload_for(cfg: Config, world_size: int, device_type: str = "cuda") -> Workload:
    """The workload of a zerofit config on `world_size` ranks, its precision resolved as a run on
    `device_type` would resolve it (the planner plans GPUs: `auto` is bf16 there)."""
    p = resolve_precision(cfg.precision, device_type)
    return Workload(
        cfg.train.micro_batch_size,
        cfg.model.seq_len,
        world_size,
        cfg.train.grad_accum_steps,
        p.param_dtype or "bf16",
        p.master_dtype or "fp32",
        p.reduce_dtype or "fp32",
        loss_chunk=cfg.model.loss_chunk,
        lora=adapters_for(cfg),
        fp8=p.fp8,
        fused_optim=cfg.optim.fused is not False,
        reference_forward=reference_forward(cfg),
        reference_copy=reference_way(cfg) == "copy",
    )


def reference_way(cfg: Config) -> str | None:
    """DPO's reference (`DPOConfig.resolved`), None for another objective."""
    if cfg.train.objective != "dpo":
        return None
    return cfg.train.dpo.resolved(cfg.model.lora.rank > 0)


def reference_forward(cfg: Config) -> bool:
    """Whether each micro-batch runs DPO's reference forward too (train.dpo.reference
    adapters_off, or auto with LoRA, or copy); a precomputed reference runs once, before the
    first step."""
    return reference_way(cfg) in ("adapters_off", "copy")


def adapters_for(cfg: Config) -> Adapters | None:
    """LoRA's adapters (``model.lora``, rank > 0), counted on the model built on the meta device
    (its targets checked: UserError for one that matches no layer); None without LoRA."""
    lora = cfg.model.lora
    if lora.rank == 0:
        return None
    # torch-free path: `zerofit plan` imports this module; LoRA is counted on a meta-device model
    from zerofit.models import build_model
    from zerofit.models.lora import (  # torch-free path
        adapter_count,
        apply_lora,
        block_adapters,
        gated_inputs,
        quantized_counts,
    )

    m = cfg.model
    base = build_model(  # shapes only: the weights are not read
        m.preset,
        m.hf,
        m.overrides,
        m.loss_chunk,
        trust_remote_code=m.trust_remote_code,
        random_init=True,
    )
    spec = apply_lora(base, lora)
    layers = block_adapters(spec)
    inputs = sum(layer.in_features for layer in layers) if lora.dropout > 0 else 0
    q = quantized_counts(spec)
    rebuilt = gated_inputs(spec) if m.lean_ops else 0
    return Adapters(adapter_count(spec.module), lora.rank, len(layers), inputs, *q, rebuilt)


@dataclass
class Memory:
    """Bytes per rank. GPU components add up to predicted peak *allocated* memory."""

    parameters: float = 0.0
    gradients: float = 0.0
    optimizer_states: float = 0.0
    activations: float = 0.0
    logits: float = 0.0
    buffers: float = 0.0
    host: float = 0.0  # host RAM per rank (offload, pinned buffers)
    nvme: float = 0.0  # NVMe per rank
    loading_host: float = 0.0  # host RAM per rank while the model is built (one full fp32 tensor)
    notes: list[str] = field(default_factory=list)
    peak_allocated: float = 0.0

    @property
    def overhead(self) -> float:
        return CUDA_CONTEXT + FRAGMENTATION * self.peak_allocated

    @property
    def peak_reserved(self) -> float:
        return self.peak_allocated + self.overhead

    def components(self) -> dict[str, float]:
        return {
            "parameters": self.parameters,
            "gradients": self.gradients,
            "optimizer_states": self.optimizer_states,
            "activations": self.activations,
            "logits": self.logits,
            "buffers": self.buffers,
            "overhead": self.overhead,
        }


def block_activation_bytes(m: ModelShape, tokens: int, e_c: int, compiled: bool = False) -> float:
    """Saved-for-backward bytes of one block (flash/efficient SDPA). See module docstring.

    Compiled (inductor), the norms, RoPE and SiLU are fused and recomputed in backward: what stays
    is the matmul inputs and outputs in the compute dtype (block input, both norm outputs, q, k, v,
    attention output, w1, w3 and w2's input) plus the fp32 per-token rsqrt and SDPA's log-sum-exp.
    Calibrated on the H200 (docs/benchmarks/2026-12-02-speed-h200.md): within 6% at 1B and 8B.
    """
    kv = m.n_kv_heads * m.head_dim
    if compiled:
        return tokens * (e_c * (7 * m.dim + 2 * kv + 3 * m.ffn_dim) + 8 + 4 * m.n_heads)
    norms = 2 * (8 * m.dim + 4)  # each RMSNorm: fp32 x and x*rsqrt (4 B each), fp32 rsqrt per token
    low = e_c * (
        5 * m.dim + 2 * kv + 4 * m.ffn_dim
    )  # linear inputs, q/k rotated, v, attn out, SwiGLU
    lse = 4 * m.n_heads  # SDPA's fp32 log-sum-exp per head
    return tokens * (norms + low + lse)


def activation_parts(m: ModelShape, w: Workload, s: Strategy) -> tuple[float, float, float]:
    """Saved activations as (what every block keeps, all blocks; the one block being recomputed
    under activation checkpointing; the tail: final norm and output-layer input)."""
    tail = w.tokens * (8 * m.dim + 4 + BYTES[w.compute_dtype] * m.dim)  # final norm + output input
    return sum(block_saved(m, w, s)), inflight_bytes(m, w, s), tail


def lora_block_bytes(m: ModelShape, tokens: int, e_c: int) -> float:
    """What one compiled block of a frozen base with LoRA dropout keeps, the adapters' rank-r
    outputs and masks apart: its input, the residual after attention, the rotated q and the
    attention output, k and v, the gate and up outputs (the down projection's input is rebuilt
    from them), SDPA's log-sum-exp and two fp32 rsqrt. No weight gradient needs the norms'
    outputs: the compiler rebuilds them from the input and the rsqrt. Listed tensor by tensor
    on CPU (24.45 bytes a token and hidden unit with the adapters) and measured on an H100 at
    8B (24.43: docs/benchmarks/2026-12-08-qlora-recompute.md)."""
    kv = m.n_kv_heads * m.head_dim  # (q is dim wide: ModelShape's n_heads * head_dim == dim)
    return tokens * (e_c * (4 * m.dim + 2 * kv + 2 * m.ffn_dim) + 8 + 4 * m.n_heads)


def _block_bytes(m: ModelShape, w: Workload, s: Strategy) -> float:
    """All one block saves for backward (with LoRA, its adapters' activations too)."""
    e_c = BYTES[w.compute_dtype]
    if w.lora and s.compile and w.lora.block_inputs:  # compiled, with dropout
        return lora_block_bytes(m, w.tokens, e_c) + w.tokens * w.lora.kept_bytes(e_c)
    per_block = block_activation_bytes(m, w.tokens, e_c, s.compile)
    adapters = w.lora.activation_bytes(w.tokens, e_c, s.compile) if w.lora else 0.0
    return per_block + adapters


def inflight_bytes(m: ModelShape, w: Workload, s: Strategy) -> float:
    """The block being recomputed in backward (none without checkpointing)."""
    recomputes = s.activation_checkpointing == "selective" or s.recomputed(m.n_layers)
    return _block_bytes(m, w, s) if recomputes else 0.0


def block_saved(m: ModelShape, w: Workload, s: Strategy) -> list[float]:
    """What each block keeps saved for backward, from the input side: a recomputed block (full,
    every_k, first_k: `Strategy.recomputed`) only its input, the residual stream; selective AC
    the matmul and attention outputs; any other block all it saves."""
    e_c = BYTES[w.compute_dtype]
    if s.activation_checkpointing == "selective":  # matmul + attention outputs, and block inputs
        kv = m.n_kv_heads * m.head_dim
        saved = e_c * (5 * m.dim + 2 * kv + 2 * m.ffn_dim) + 4 * m.n_heads
        return [w.tokens * saved] * m.n_layers
    # (a LoRA base is stored in e_c, its embedding output too: the residual stream follows)
    residual = 4 if s.engine.fp32_checkpoints and not w.lora else e_c
    kept, per_block = w.tokens * m.dim * residual, _block_bytes(m, w, s)
    recomputed = set(s.recomputed(m.n_layers))
    return [kept if i in recomputed else per_block for i in range(m.n_layers)]


def activation_bytes(m: ModelShape, w: Workload, s: Strategy) -> float:
    return sum(activation_parts(m, w, s))


def saved_after(m: ModelShape, w: Workload, s: Strategy, reduced: float) -> float:
    """Activations still saved once backward has produced the gradients of `reduced` parameters:
    it runs from the output layer down, freeing each block's saved tensors as it passes (the
    tail's go with the output layer), so the blocks left are those nearest the input."""
    blocks = block_saved(m, w, s)
    head = m.vocab_size * m.dim + m.dim  # output layer + final norm, reduced first
    left = min(1.0, max(0.0, 1.0 - (reduced - head) / (m.n_layers * m.block_params)))
    whole, part = divmod(left * len(blocks), 1.0)
    n = int(whole)
    partial = part * blocks[n] if n < len(blocks) else 0.0
    return sum(blocks[:n]) + partial + inflight_bytes(m, w, s)


def logits_bytes(m: ModelShape, w: Workload, compiled: bool = False) -> float:
    """The output layer + loss. Plain: fp32 log-softmax, its fp32 gradient and the low-precision
    logits, all [tokens, V]. Fused (zerofit.models.loss): one chunk's logits (low precision, fp32
    and the low-precision gradient; compiled, one Inductor kernel: the logits and their gradient,
    and from the second chunk on the previous chunk's gradient) plus the saved fp32 weight
    gradient and the input gradient."""
    e_c = BYTES[w.compute_dtype]
    if w.loss_chunk <= 0 or not m.fused_head:  # no fused head: models.shape.hf_head_fallback
        return w.tokens * m.vocab_size * (8 + e_c)
    chunk = min(w.tokens, w.loss_chunk)
    per = 4 + 2 * e_c
    if compiled:  # one fused kernel: the logits, their gradient, and the previous chunk's
        per = 2 * e_c + (e_c if w.tokens > w.loss_chunk else 0)
    head_grad = 0 if w.lora else 4 * m.vocab_size * m.dim  # a LoRA head is frozen
    return chunk * m.vocab_size * per + head_grad + w.tokens * m.dim * e_c


def estimate(m: ModelShape, w: Workload, s: Strategy) -> Memory:
    """Predicted per-rank memory for one strategy: the engine's components, plus activations and
    logits; the peak is the largest of the phases in the module docstring."""
    e: EngineMemory = s.engine.memory(m, w, s.options)
    mem = Memory(
        parameters=e.parameters,
        gradients=e.gradients,
        optimizer_states=e.optimizer_states,
        activations=activation_bytes(m, w, s),
        logits=logits_bytes(m, w, s.compile),
        buffers=e.buffers,
        host=e.host,
        nvme=e.nvme,
        notes=list(e.notes),
        # zerofit materializes (or reads from safetensors) one full parameter at a time, in fp32;
        # the largest is the embedding or the widest FFN matrix.
        loading_host=4 * max(m.vocab_size * m.dim, m.dim * m.ffn_dim),
    )
    held = (
        e.held_grads if e.held_grads is not None else (e.gradients if e.persistent_grads else 0.0)
    )
    resident = e.parameters + e.optimizer_states
    start = resident + e.buffers + mem.activations + mem.logits + held
    end = resident + e.gradients + e.end_buffers + (e.buffers if e.buffers_at_end else 0.0)
    kept = resident + e.gradients + (e.buffers if e.buffers_at_end else 0.0)
    step = kept + e.step_buffers
    inside = [kept + b + saved_after(m, w, s, at) for at, b in e.backward]
    mem.peak_allocated = max(start, end, step, *inside, reference_phase(m, w, e) + resident + held)
    return mem


def reference_phase(m: ModelShape, w: Workload, e: EngineMemory) -> float:
    """DPO's reference forward (no gradients), beside what is resident: it runs before the
    policy's forward, so no activations are saved yet; the engine's working bytes for it (a
    frozen copy's gathered units, or the policy's own buffers) and `reference_forward_bytes`.
    0 without a reference forward."""
    if not w.reference_forward:
        return 0.0
    working = e.reference_buffers if e.reference_buffers is not None else e.buffers
    return working + reference_forward_bytes(m, w)


def reference_forward_bytes(m: ModelShape, w: Workload) -> float:
    """What a forward without gradients holds at once: the residual stream (fp32 at most) and
    the largest of one block's intermediates (bounded by what a training forward of it saves)
    and the output layer's logits (one chunk with the fused head), in e_c and fp32."""
    block = block_activation_bytes(m, w.tokens, w.e_c)
    rows = min(w.tokens, w.loss_chunk) if w.loss_chunk > 0 and m.fused_head else w.tokens
    return w.tokens * m.dim * 4 + max(block, rows * m.vocab_size * (w.e_c + 4))


def predicted_peak(cfg: Config, world: int) -> tuple[float, dict[str, float]]:
    """The planner's peak allocated GiB for a run's (resolved) config, and its components."""
    mem = estimate(shape_from_config(cfg), workload_for(cfg, world), strategy_for(cfg))
    return mem.peak_allocated / GIB, {k: v / GIB for k, v in mem.components().items()}

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
- overhead (reserved, not allocated): CUDA context and the caching allocator's fragmentation;
- host RAM: offloaded states and staging buffers, and while loading, one full fp32 tensor per rank.

The peak is the larger of the start of backward (activations + logits alive, gradients not yet
produced unless they persist) and the end of backward (all gradients, no activations).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from zerofit.config import Config
from zerofit.planner.shape import ModelShape

BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}
CUDA_CONTEXT = 600 * 2**20  # measured order of the CUDA context + cuBLAS workspace on Hopper
FRAGMENTATION = 0.08  # reserved / allocated - 1 seen on steady training loops


@dataclass(frozen=True)
class Strategy:
    backend: str  # ddp | fsdp | deepspeed
    reshard_after_forward: bool = True  # fsdp: FULL_SHARD (True) or SHARD_GRAD_OP
    replicate_degree: int = 1  # fsdp hybrid: replicas; sharding within groups of world/replicas
    cpu_offload: bool = False  # fsdp
    stage: int = 3  # deepspeed
    offload_optimizer: str = "none"  # deepspeed: none | cpu | nvme
    offload_param: str = "none"  # deepspeed stage 3: none | cpu | nvme
    activation_checkpointing: str = "none"  # none | full | selective
    compile: bool = False
    offload_ratio: float = 1.0  # deepspeed stage 3 + cpu: share of the optimizer on the host

    @property
    def label(self) -> str:
        if self.backend == "ddp":
            name = "DDP"
        elif self.backend == "fsdp":
            name = "FSDP " + ("full-shard" if self.reshard_after_forward else "grad-op")
            name += f" hybrid x{self.replicate_degree}" if self.replicate_degree > 1 else ""
            name += " + CPU offload" if self.cpu_offload else ""
        else:
            name = f"ZeRO-{self.stage}"
            if self.offload_optimizer != "none":
                share = f" {self.offload_ratio:.0%}" if self.offload_ratio < 1 else ""
                name += f" + optim{share}->{self.offload_optimizer}"
            if self.offload_param != "none":
                name += f" + params->{self.offload_param}"
        suffix = {"full": " + AC", "selective": " + SAC"}.get(self.activation_checkpointing, "")
        return name + suffix

    def overrides(self) -> dict[str, object]:
        """The zerofit config fields that select this strategy."""
        out: dict[str, object] = {
            "parallel.backend": self.backend,
            "parallel.activation_checkpointing": self.activation_checkpointing,
            "parallel.compile": self.compile,
        }
        if self.backend == "fsdp":
            out |= {
                "parallel.reshard_after_forward": self.reshard_after_forward,
                "parallel.replicate_degree": self.replicate_degree,
                "parallel.cpu_offload": self.cpu_offload,
            }
        if self.backend == "deepspeed":
            out |= {
                "parallel.deepspeed.stage": self.stage,
                "parallel.deepspeed.offload_optimizer": self.offload_optimizer,
                "parallel.deepspeed.offload_param": self.offload_param,
            }
            if self.offload_ratio < 1:
                out["parallel.deepspeed.offload_ratio"] = self.offload_ratio
        return out


@dataclass(frozen=True)
class Workload:
    micro_batch_size: int
    seq_len: int
    world_size: int
    grad_accum_steps: int = 1
    compute_dtype: str = "bf16"
    master_dtype: str = "fp32"
    reduce_dtype: str = "fp32"
    reduce_bucket_size: int = 500_000_000  # deepspeed defaults, elements
    allgather_bucket_size: int = 500_000_000
    loss_chunk: int = 4096  # tokens per chunk of the fused head + loss (0: full logits)

    @property
    def tokens(self) -> int:
        return self.micro_batch_size * self.seq_len

    @property
    def deepspeed_grad_bytes(self) -> int:
        """DeepSpeed's gradient partitions: bf16 with bf16 master weights
        (bf16_master_weights_and_grads), else the reduce dtype."""
        return BYTES[self.master_dtype] if self.master_dtype == "bf16" else BYTES[self.reduce_dtype]


def strategy_for(cfg: Config) -> Strategy:
    """The strategy a zerofit config selects (every_k checkpointing counts as full)."""
    p, ds = cfg.parallel, cfg.parallel.deepspeed
    ac = {"none": "none", "selective": "selective"}.get(p.activation_checkpointing, "full")
    return Strategy(
        p.backend,
        p.reshard_after_forward,
        p.replicate_degree,
        p.cpu_offload,
        ds.stage,
        ds.offload_optimizer,
        ds.offload_param,
        ac,
        p.compile,
        ds.offload_ratio,
    )


def workload_for(cfg: Config, world_size: int) -> Workload:
    """The workload of a zerofit config on `world_size` ranks (unresolved dtypes: bf16/fp32/fp32)."""
    p, ds = cfg.precision, cfg.parallel.deepspeed
    return Workload(
        cfg.train.micro_batch_size,
        cfg.model.seq_len,
        world_size,
        cfg.train.grad_accum_steps,
        p.param_dtype or "bf16",
        p.master_dtype or "fp32",
        p.reduce_dtype or "fp32",
        ds.reduce_bucket_size,
        ds.allgather_bucket_size,
        cfg.model.loss_chunk,
    )


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


def activation_bytes(m: ModelShape, w: Workload, s: Strategy) -> float:
    e_c = BYTES[w.compute_dtype]
    per_block = block_activation_bytes(m, w.tokens, e_c, s.compile)
    tail = w.tokens * (8 * m.dim + 4 + e_c * m.dim)  # final norm + output-layer input
    if s.activation_checkpointing == "selective":  # matmul + attention outputs, and block inputs
        kv = m.n_kv_heads * m.head_dim
        saved = e_c * (5 * m.dim + 2 * kv + 2 * m.ffn_dim) + 4 * m.n_heads
        return m.n_layers * w.tokens * saved + per_block + tail  # + one block being recomputed
    if s.activation_checkpointing == "full":
        residual = 4 if s.backend == "ddp" else e_c  # DDP autocast keeps an fp32 residual stream
        return m.n_layers * w.tokens * m.dim * residual + per_block + tail
    return m.n_layers * per_block + tail


def logits_bytes(m: ModelShape, w: Workload) -> float:
    """The output layer + loss. Plain: fp32 log-softmax, its fp32 gradient and the low-precision
    logits, all [tokens, V]. Fused (zerofit.models.loss): one chunk's logits (low precision, fp32
    and the low-precision gradient) plus the saved fp32 weight gradient and the input gradient."""
    e_c = BYTES[w.compute_dtype]
    if w.loss_chunk <= 0:
        return w.tokens * m.vocab_size * (8 + e_c)
    chunk = min(w.tokens, w.loss_chunk)
    return chunk * m.vocab_size * (4 + 2 * e_c) + 4 * m.vocab_size * m.dim + w.tokens * m.dim * e_c


def estimate(m: ModelShape, w: Workload, s: Strategy) -> Memory:
    """Predicted per-rank memory for one strategy."""
    P, Pb, Pr = m.num_params, m.block_params, m.root_params
    head = m.vocab_size * m.dim
    e_c, e_m, e_o, e_r = (
        BYTES[w.compute_dtype],
        BYTES[w.master_dtype],
        BYTES[w.master_dtype],
        BYTES[w.reduce_dtype],
    )
    W = w.world_size
    mem = Memory(activations=activation_bytes(m, w, s), logits=logits_bytes(m, w))
    # zerofit materializes (or reads from safetensors) one full parameter at a time, in fp32; the
    # largest is the embedding or the widest FFN matrix.
    mem.loading_host = 4 * max(head, m.dim * m.ffn_dim)
    persistent_grads = w.grad_accum_steps > 1
    held_grads: float | None = None  # gradients alive during forward, when not `grads`
    mixed = e_c != e_m

    if s.backend == "ddp":
        mem.parameters = P * e_m
        mem.optimizer_states = 2 * P * e_o
        grads = P * e_m
        mem.buffers = (P - m.embedding_params) * e_c if mixed else 0.0  # autocast's cached casts
        if W > 1:
            mem.buffers += P * e_m  # reducer buckets (gradients are copied into them)
            mem.notes.append("DDP keeps a second copy of the gradients in its all-reduce buckets")
    elif s.backend == "fsdp":
        S = W // s.replicate_degree
        grads = P * e_m / S
        gathered = (2 * Pb + Pr) * e_c if s.reshard_after_forward else P * e_c
        mem.buffers = gathered + head * e_c  # + the root's unsharded output-head gradient
        end_buffers = Pr * (e_c + e_r)  # root reduce-scatter: unsharded grads + reduce-dtype copy
        if s.cpu_offload:
            mem.host = P * e_m / S * 2 + 2 * P * e_o / S
            mem.notes.append("parameters, gradients and AdamW states live in host RAM")
        else:
            mem.parameters = P * e_m / S
            mem.optimizer_states = 2 * P * e_o / S
        if s.cpu_offload:
            grads = 0.0
        elif persistent_grads:
            # Between syncs FSDP2 accumulates *unsharded* gradients (reduce dtype) on every rank.
            held_grads = P * e_r
    else:  # deepspeed
        stage = s.stage
        part = W if stage >= 1 else 1
        mem.parameters = P * e_c / (W if stage == 3 else 1)
        opt = (P * e_m + 2 * P * e_o) / part  # fp32 master + two moments
        grads = P * (w.deepspeed_grad_bytes if stage >= 2 else e_c) / (W if stage >= 2 else 1)
        persistent_grads = True  # DeepSpeed allocates its gradient partitions up front
        mem.buffers = w.reduce_bucket_size * e_c
        if stage == 3:
            mem.buffers += (2 * Pb + head) * e_c  # blocks gathered in flight + the head
        elif stage in (1, 2):
            mem.buffers += w.allgather_bucket_size * e_c if W > 1 else 0.0
        end_buffers = 0.0
        if s.offload_optimizer == "cpu":  # offload_ratio < 1: the rest stays on the GPU (Twin-Flow)
            r = s.offload_ratio
            mem.host += r * (opt + grads)
            opt, grads = (1 - r) * opt, (1 - r) * grads
        elif s.offload_optimizer == "nvme":
            mem.nvme += opt
            mem.host += grads + P * e_m / part  # staging buffers for the swapped states
            opt, grads = 0.0, 0.0
        if stage == 3 and s.offload_param != "none":
            where = "host" if s.offload_param == "cpu" else "nvme"
            setattr(mem, where, getattr(mem, where) + mem.parameters)
            mem.parameters = 0.0
        mem.optimizer_states = opt
    if s.backend != "fsdp":
        end_buffers = 0.0
    mem.gradients = grads
    if held_grads is None:
        held_grads = grads if persistent_grads else 0.0
    resident = mem.parameters + mem.optimizer_states
    start = resident + mem.buffers + mem.activations + mem.logits + held_grads
    end = resident + grads + end_buffers + (mem.buffers if s.backend != "fsdp" else 0.0)
    mem.peak_allocated = max(start, end)
    return mem

"""The quantities every engine's planner terms are written in (no config, no torch).

Conventions (bytes; P = parameters, T = micro_batch x seq_len tokens, e_c / e_m / e_r = bytes of
the compute, master (and optimizer-state) and reduction dtypes, e_g of a block parameter FSDP
all-gathers: e_c, or 1 under tensorwise float8 all-gather). See `zerofit.planner.memory` for
how the components add up to a peak, and `zerofit.planner.speed` for the roofline.
"""

from __future__ import annotations

from dataclasses import dataclass, field

BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}
# NF4 (QLoRA) per weight: two 4-bit codes a byte, an int8 scale per 64, a bf16 factor per 16384
NF4_BYTES = 0.5 + 1 / 64 + 2 / 16384
GIB = 2**30


@dataclass(frozen=True)
class Adapters:
    """LoRA (``model.lora``): only the adapters train; the base is frozen, stored in the compute
    dtype, with no gradients, no optimizer states and no master copy. QLoRA
    (``model.lora.quantize: nf4``): the adapted layers' weights are stored in NF4 instead
    (NF4_BYTES a weight), each rebuilt in the compute dtype while its layer runs."""

    params: int  # adapter parameters in all
    rank: int
    per_block: int  # adapted linear layers in the largest decoder block
    block_inputs: int = 0  # with dropout: input features of those layers (a mask bit each)
    quantized: int = 0  # QLoRA: base weights stored in NF4, in all
    block_quantized: int = 0  # of which in the largest decoder block
    largest_quantized: int = 0  # elements of the largest NF4 weight (rebuilt while it runs)
    rebuilt_inputs: int = 0  # input features of those layers whose input is rebuilt, not kept

    def activation_bytes(self, tokens: int, e_c: int, compiled: bool = False) -> float:
        """What the adapters change in one block's saved activations: A's output (B's input) per
        adapted layer, and with dropout its mask, eight to a byte (``zerofit.models.lora_delta``
        keeps the input itself, which the block keeps anyway, and drops it again in backward).
        A gated MLP's adapted down projection keeps the gate and up outputs instead of its input
        (``rebuilt_inputs``), and its frozen base keeps nothing: that input is not kept at all;
        compiled without dropout the compiler keeps it all the same
        (benchmarks/lora_block_bytes.py)."""
        rebuilt = 0 if compiled and not self.block_inputs else self.rebuilt_inputs
        return tokens * (self.kept_bytes(e_c) - rebuilt * e_c)

    def kept_bytes(self, e_c: int) -> float:
        """Per token, in one block: A's outputs (rank r each) and the dropout masks in bits."""
        return self.per_block * self.rank * e_c + self.block_inputs / 8


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
    lora: Adapters | None = None  # LoRA: what trains instead of the whole model
    fp8: str = "none"  # precision.fp8: none | tensorwise | rowwise (block Linear layers in float8)
    fused_optim: bool = True  # optim.fused not false: a host-resident AdamW steps fused
    # DPO with the adapters-off reference or a frozen copy: one more forward per micro-batch,
    # without gradients, before the policy's (nothing kept for backward)
    reference_forward: bool = False
    # DPO's frozen copy of the model (train.dpo.reference: copy): its weights in the compute
    # dtype, sharded like the policy's (`Engine.memory` counts them), and its forward's transient
    # working memory (`zerofit.planner.memory.estimate`); only without LoRA
    reference_copy: bool = False

    def trained(self, params: int) -> int:
        """Parameters that train, of a base of ``params``: all, or with LoRA the adapters."""
        return self.lora.params if self.lora else params

    def frozen(self, params: int) -> int:
        """Parameters kept frozen: with LoRA the whole base, else none."""
        return params if self.lora else 0

    def frozen_bytes(self, params: int) -> float:
        """Bytes of the frozen base: in the compute dtype, but QLoRA's NF4 weights."""
        q = self.lora.quantized if self.lora else 0
        return self.frozen(params) * self.e_c - q * (self.e_c - NF4_BYTES)

    def gathered_block_bytes(self, block_params: int) -> float:
        """Bytes of one decoder block as FSDP all-gathers it: e_g a weight (the compute dtype,
        or float8), but QLoRA's NF4 weights as they are stored."""
        q = self.lora.block_quantized if self.lora else 0
        return block_params * self.e_g - q * (self.e_g - NF4_BYTES)

    def copy_bytes(self, params: int, shards: int = 1, autocast_kept: int = 0) -> float:
        """DPO's frozen reference copy (``reference_copy``), per rank: ``params`` weights in the
        compute dtype over ``shards`` ranks; ``autocast_kept`` of them (DDP: embeddings and
        norms, which autocast does not cast) in the master dtype. 0 without the copy."""
        if not self.reference_copy:
            return 0.0
        return (params * self.e_c + autocast_kept * (self.e_m - self.e_c)) / shards

    @property
    def dequantized_bytes(self) -> float:
        """QLoRA: the largest NF4 weight rebuilt in the compute dtype while its layer runs."""
        return self.lora.largest_quantized * self.e_c if self.lora else 0.0

    @property
    def tokens(self) -> int:
        return self.micro_batch_size * self.seq_len

    @property
    def e_c(self) -> int:
        return BYTES[self.compute_dtype]

    @property
    def e_m(self) -> int:
        return BYTES[self.master_dtype]

    @property
    def e_r(self) -> int:
        return BYTES[self.reduce_dtype]

    @property
    def e_g(self) -> int:
        """Bytes per decoder-block parameter all-gathered (FSDP): 1 where tensorwise float8 casts
        the Linear weights before the all-gather (their scales and the norms are negligible),
        else the compute dtype's. The root (embedding, output layer) gathers in e_c."""
        return 1 if self.fp8 == "tensorwise" else self.e_c


@dataclass
class EngineMemory:
    """What one engine keeps per rank besides activations and logits (bytes).

    `gradients` is the gradient storage at the end of backward; `held_grads` what is alive during
    forward (None: `gradients` if they persist between steps, else nothing); `end_buffers` what
    exists only at the end of backward; `buffers_at_end` whether `buffers` are still alive then.
    `backward`: points inside backward, (parameters whose gradients are reduced by then, working
    bytes alive then beside `gradients`); the activations still saved at each point count too.
    `step_buffers`: temporaries of the optimizer step beside `gradients` (activations freed).
    Both phases keep `buffers` when `buffers_at_end`.
    """

    parameters: float = 0.0
    gradients: float = 0.0
    optimizer_states: float = 0.0
    buffers: float = 0.0
    host: float = 0.0
    nvme: float = 0.0
    held_grads: float | None = None
    persistent_grads: bool = False
    end_buffers: float = 0.0
    buffers_at_end: bool = True
    backward: tuple[tuple[float, float], ...] = ()
    step_buffers: float = 0.0
    # DPO's reference forward (before the policy's): the engine's working bytes for it (a
    # frozen copy's gathered units; without a copy the policy's own `buffers`)
    reference_buffers: float | None = None
    notes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class OffloadTime:
    """Seconds one rank spends on offload, split by how often it happens (see
    `zerofit.planner.speed`): `micro_batch`, every micro-batch (PCIe copies of gradients and of
    offloaded parameters, on a side stream that compute can hide), and `step`, once per optimizer
    step after backward (the CPU optimizer and the copies around it, which nothing hides)."""

    micro_batch: float = 0.0
    step: float = 0.0
    disk_read: float = 0.0  # bytes a rank reads from NVMe per optimizer step (micro-batches too)
    disk_write: float = 0.0  # bytes a rank writes to NVMe per optimizer step


@dataclass(frozen=True)
class Traffic:
    """Bytes each rank moves per optimizer step through collectives, over a group of `group`."""

    volume: float
    group: int

    @property
    def per_rank(self) -> float:
        return self.volume * (self.group - 1) / self.group if self.group > 1 else 0.0


# A Llama decoder block's parameter tensors, each in a module of its own: q, k, v, o, the three
# SwiGLU matrices and the two norms (LoRA adds each adapted layer's A and B)
BLOCK_LAYERS = 9


@dataclass(frozen=True)
class HostCalls:
    """Python hook calls one rank's engine makes (see `zerofit.planner.speed.host_seconds`), by
    how often: `micro_batch`, in every forward and backward (FSDP2's unit hooks, DeepSpeed's
    module and gradient hooks), which the GPU's work hides while it is the longer; `step`, once
    per optimizer step after backward, which nothing hides."""

    micro_batch: float = 0.0
    step: float = 0.0
    # in each micro-batch before the step's last (gradient accumulation), in place of
    # `micro_batch`'s calls, where an engine's hooks take a cheaper path off the accumulation
    # boundary (ZeRO-1): charged at the rate of `Engine.hook_variant(..., accumulating=True)`
    accumulating: float | None = None


def block_tensors(w: Workload) -> int:
    """Parameter tensors (each in its own module) of one decoder block, adapters included."""
    return BLOCK_LAYERS + (2 * w.lora.per_block if w.lora else 0)


def trained_tensors(n_layers: int, root: int, w: Workload) -> int:
    """Parameter tensors that train: every block's and the `root` ones (embedding, final norm,
    output layer), or with LoRA the adapters' A and B."""
    if w.lora:
        return 2 * w.lora.per_block * n_layers
    return n_layers * BLOCK_LAYERS + root

"""The run configuration's schema: one dataclass per section, each field typed and documented.

`Annotated[type, "help"]` carries each option's help text into `zerofit train --help`.
Loading, overrides and validation live in `zerofit.config`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated as A
from typing import Any, Literal

Dtype = Literal["bf16", "fp16", "fp32"]


@dataclass
class ModelConfig:
    """Which network to train."""

    preset: A[str | None, "a built-in preset: tiny, small, llama3-1b, llama3-8b, 13b, 70b"] = "tiny"
    hf: A[str | None, "or a local Hugging Face model directory (config.json, *.safetensors)"] = None
    seq_len: A[int, "tokens per training sequence"] = 256
    init_seed: A[int, "seed of the parameter initialisation"] = 0
    attention: A[
        Literal["auto", "flash", "cudnn", "efficient"], "SDPA kernel on GPU (auto: PyTorch's pick)"
    ] = "auto"
    loss_chunk: A[
        int, "tokens per chunk of the fused output layer + cross-entropy (0: full logits)"
    ] = 4096
    overrides: A[dict[str, Any], "change preset/HF config fields, e.g. {n_layers: 2}"] = field(
        default_factory=dict
    )


@dataclass
class DataConfig:
    """What to read and how to tokenize it."""

    source: A[
        str | list[str], "'stdlib' (this Python's own sources), or .txt/.jsonl files or dirs"
    ] = "stdlib"
    field: A[str, "JSONL field holding the document text"] = "text"
    tokenizer: A[str, "'byte', or a path to a local tokenizer.json"] = "byte"
    val_fraction: A[float, "share of packed sequences held out for eval loss"] = 0.02
    max_tokens: A[int | None, "read at most this many tokens (null: everything)"] = 4_000_000
    seed: A[int, "shuffling and split seed"] = 0


@dataclass
class TrainConfig:
    """Steps and batch arithmetic."""

    steps: A[int, "optimizer steps"] = 100
    micro_batch_size: A[int, "sequences per rank per forward pass"] = 8
    grad_accum_steps: A[int, "micro-batches per optimizer step"] = 1
    global_batch_size: A[int | None, "if given, must equal micro x accum x data-parallel size"] = (
        None
    )
    eval_every: A[int, "eval loss every N steps (0: never)"] = 50
    eval_batches: A[int, "micro-batches per rank in one eval"] = 4
    seed: A[int, "seed of the per-rank torch RNG"] = 0
    on_nonfinite: A[
        Literal["stop", "skip"],
        "a NaN/inf loss or gradient norm: stop the run, or skip that update",
    ] = "stop"
    max_skipped_steps: A[int, "skip: stop after this many non-finite steps in a row"] = 10
    max_restarts: A[
        int, "restart the workers after a failure, resuming from the last good checkpoint"
    ] = 0


@dataclass
class OptimConfig:
    """AdamW with linear warmup and cosine decay."""

    lr: A[float, "peak learning rate"] = 1e-3
    weight_decay: A[float, "AdamW decoupled weight decay (matrices only)"] = 0.1
    betas: A[tuple[float, float], "AdamW betas"] = (0.9, 0.95)
    eps: A[float, "AdamW epsilon"] = 1e-8
    fused: A[bool | None, "fused AdamW (null: on GPU, foreach on CPU)"] = None
    warmup_steps: A[int, "linear warmup steps"] = 20
    min_lr_ratio: A[float, "cosine decays to lr x this"] = 0.1
    grad_clip: A[float | None, "max global grad norm (null: no clipping)"] = 1.0


@dataclass
class PrecisionConfig:
    """Mixed precision. `mode` sets defaults for the three dtypes; each may be given explicitly."""

    mode: A[Literal["auto", "bf16", "fp16", "fp32"], "auto: bf16 on GPU, fp32 on CPU"] = "auto"
    param_dtype: A[Dtype | None, "compute dtype of forward/backward (default: mode)"] = None
    reduce_dtype: A[Dtype | None, "gradient reduction dtype (default: fp32)"] = None
    master_dtype: A[Dtype | None, "stored weights and AdamW states (default: fp32)"] = None


@dataclass
class DeepSpeedConfig:
    """DeepSpeed ZeRO. Each field maps to one DeepSpeed JSON path (zerofit.ds_config.TABLE)."""

    config: A[str | None, "a ds_config.json merged with this config (conflicts are errors)"] = None
    stage: A[
        Literal[0, 1, 2, 3], "ZeRO stage: 1 optimizer states, 2 + gradients, 3 + parameters"
    ] = 3
    offload_optimizer: A[Literal["none", "cpu", "nvme"], "where optimizer states live"] = "none"
    offload_ratio: A[
        float, "stage 3: share of optimizer states offloaded; the rest are updated on the GPU"
    ] = 1.0
    offload_param: A[Literal["none", "cpu", "nvme"], "stage 3: where parameters live"] = "none"
    nvme_path: A[str | None, "directory on a fast SSD for nvme offload"] = None
    pin_memory: A[bool, "page-locked host buffers for offload"] = True
    overlap_comm: A[bool, "overlap gradient reduction with backward"] = True
    contiguous_gradients: A[bool, "copy gradients into one buffer as they are produced"] = True
    reduce_scatter: A[bool, "reduce gradients with reduce-scatter instead of all-reduce"] = True
    allgather_bucket_size: A[int, "elements per all-gather bucket (stages 1-2)"] = 500_000_000
    reduce_bucket_size: A[int, "elements per gradient-reduction bucket"] = 500_000_000
    prefetch_bucket_size: A[int, "stage 3: elements prefetched ahead of use"] = 50_000_000
    param_persistence_threshold: A[int, "stage 3: params smaller than this stay unpartitioned"] = (
        100_000
    )
    max_live_parameters: A[int, "stage 3: max gathered elements alive at once"] = 1_000_000_000
    leaf_blocks: A[bool, "stage 3: gather each decoder block's params in one go (ZeRO-3 leaf)"] = (
        True
    )
    torch_adam: A[
        bool | None, "torch AdamW instead of DeepSpeed's fused/CPU Adam (null: on CPU)"
    ] = None
    loss_scale_window: A[int, "fp16: steps without overflow before the loss scale grows"] = 1000
    initial_scale_power: A[int, "fp16: initial loss scale is 2**this"] = 16
    hysteresis: A[int, "fp16: overflows tolerated before the scale shrinks"] = 2
    min_loss_scale: A[float, "fp16: floor of the dynamic loss scale"] = 1.0


@dataclass
class ParallelConfig:
    """How the model is spread over the ranks."""

    backend: A[str, "ddp | fsdp | deepspeed | auto (the planner's pick for this machine)"] = "fsdp"
    reshard_after_forward: A[bool, "FSDP: true = FULL_SHARD, false = SHARD_GRAD_OP"] = True
    replicate_degree: A[
        int, "FSDP hybrid sharding: replicas on the outer mesh dim (HSDP if > 1)"
    ] = 1
    prefetch: A[
        int,
        "FSDP: blocks whose all-gather is issued ahead (0: FSDP2's implicit one-block prefetch)",
    ] = 0
    wrap: A[Literal["block", "size"], "FSDP unit: each transformer block, or size-based"] = "block"
    min_num_params: A[int, "size policy: a module becomes a unit at this many params"] = 100_000_000
    cpu_offload: A[bool, "FSDP: sharded params, grads and AdamW states live in host RAM"] = False
    activation_checkpointing: A[
        Literal["none", "full", "every_k", "selective"],
        "recompute in backward: whole blocks, every k-th, or all but matmul/attention outputs",
    ] = "none"
    ac_every: A[int, "every_k: checkpoint every k-th block"] = 2
    compile: A[bool, "torch.compile each transformer block"] = False
    deepspeed: DeepSpeedConfig = field(default_factory=DeepSpeedConfig)


@dataclass
class CheckpointConfig:
    dir: A[str | None, "default: <run_dir>/checkpoints"] = None
    every: A[int, "save every N steps (0: only at the end)"] = 0
    keep_last: A[int, "complete checkpoints kept; older ones are deleted"] = 2
    save_final: A[bool, "save when the run ends (benchmarks turn it off)"] = True
    export_final: A[
        bool, "after training, write a Hugging Face folder to <run_dir>/export/step_N"
    ] = False
    export_dtype: A[Literal["bf16", "fp32"], "dtype of the exported weights"] = "bf16"


@dataclass
class LogConfig:
    run_dir: A[str | None, "default: runs/<timestamp>"] = None
    every: A[int, "log metrics every N steps"] = 10
    jsonl: A[bool, "write <run_dir>/metrics.jsonl"] = True
    tensorboard: A[bool, "write <run_dir>/tb (needs the tensorboard package)"] = False
    progress: A[bool, "progress bar (or log lines) on rank 0"] = True


@dataclass
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    precision: PrecisionConfig = field(default_factory=PrecisionConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    log: LogConfig = field(default_factory=LogConfig)

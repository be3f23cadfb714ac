"""The run configuration's schema: one pydantic dataclass per section, each field typed, bounded
and documented (`doc(help, ge=, le=)` feeds `zerofit train --help` and `zerofit config schema`).

Engines own their sections: this module never names an engine. `assemble` builds a run's full
schema from the engines' sections (`zerofit.backends.catalog` calls it); loading, overrides and
error lines live in `zerofit.config`.
The integer bounds are far above any real run; they keep arithmetic, seeds and allocations sane
when a value comes from a typo or a fuzzer.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import field, make_dataclass
from pathlib import Path
from typing import Annotated as A
from typing import Any, ClassVar, Literal

from pydantic import Field
from pydantic.dataclasses import dataclass

from zerofit.config.fields import SECTION, Bool, Float, Int, Positive, Str, doc
from zerofit.config.objectives import DPOConfig
from zerofit.config.sizes import Size

Dtype = Literal["bf16", "fp16", "fp32"]
SEED = {"ge": 0, "le": 2**32 - 1}  # what numpy accepts; torch adds rank and step offsets
STEPS = {"ge": 1, "le": 10**12}
COUNT = {"ge": 0, "le": 10**12}  # "every N steps", 0: never
BATCH = {"ge": 1, "le": 2**20}


@dataclass(config=SECTION)
class LoRAConfig:
    """Low-rank adapters: train rank-r updates of the chosen linear layers, the base frozen."""

    rank: A[Int, doc("adapter rank (0: off, every weight trains)", ge=0, le=65536)] = 0
    alpha: A[Positive, doc("scale: the update is (alpha / rank) * B @ A")] = 16.0
    dropout: A[Float, doc("dropout on the adapters' input, in [0, 1)", ge=0, lt=1)] = 0.0
    targets: A[
        Str | list[Str],
        doc("'all-linear' (every linear layer but the output head), or module names to adapt"),
    ] = "all-linear"
    quantize: A[
        Literal["none", "nf4"],
        doc(
            "the frozen base of the adapted layers: none (as trained), or nf4 (QLoRA: 4-bit "
            "NormalFloat with double-quantised scales, computed in the run's compute dtype)"
        ),
    ] = "none"


@dataclass(config=SECTION)
class ModelConfig:
    """Which network to train: a built-in preset, or a local Hugging Face folder."""

    preset: A[
        Str | None,
        doc("a built-in preset: tiny, small, llama3-1b, llama3-8b, 13b, 70b (default: tiny)"),
    ] = None
    hf: A[
        Str | None, doc("or a local Hugging Face model directory (config.json, *.safetensors)")
    ] = None
    trust_remote_code: A[
        Bool, doc("run the model folder's own Python code (model.hf; off: transformers' code)")
    ] = False
    random_init: A[
        Bool,
        doc(
            "start from random weights: model.hf's weight files are not read (benchmarks; false: "
            "a model.hf folder must hold its weights)"
        ),
    ] = False
    seq_len: A[Int, doc("tokens per training sequence", ge=1, le=2**24)] = 256
    init_seed: A[Int, doc("seed of the parameter initialisation", **SEED)] = 0
    attention: A[
        Literal["auto", "flash", "cudnn", "efficient"],
        doc("SDPA kernel on GPU (auto: PyTorch's pick)"),
    ] = "auto"
    loss_chunk: A[
        Int,
        doc(
            "tokens per chunk of the fused output layer + cross-entropy (0: full logits)",
            ge=0,
            le=2**31 - 1,
        ),
    ] = 4096
    lean_ops: A[
        Bool,
        doc(
            "memory-lean RMSNorm, SwiGLU (Hugging Face models) and LoRA update: keep inputs, "
            "recompute the rest in backward (same values)"
        ),
    ] = True
    overrides: A[dict[str, Any], doc("change preset/HF config fields, e.g. {n_layers: 2}")] = field(
        default_factory=dict
    )
    lora: LoRAConfig = field(default_factory=LoRAConfig)

    def __post_init__(self) -> None:
        if self.preset is None and self.hf is None:
            self.preset = "tiny"


@dataclass(config=SECTION)
class DataConfig:
    """What to read, how to tokenize it, and which tokens the loss falls on."""

    source: A[
        Str | list[Str],
        doc("'stdlib' (this Python's own sources), or .txt/.jsonl/.json/.parquet files or dirs"),
    ] = "stdlib"
    format: A[
        Literal["text", "prompt_completion", "chat", "sharegpt", "alpaca", "preference"],
        doc(
            "text: documents packed end to end; prompt_completion, chat ({messages: [{role, "
            "content}]}), sharegpt ({conversations: [{from, value}]}) or alpaca ({instruction, "
            "input, output}): fine-tuning samples; preference ({prompt, chosen, rejected}, as "
            "strings or chat turns): pairs for train.objective dpo"
        ),
    ] = "text"
    field: A[Str, doc("text: the field holding the document text")] = "text"
    prompt_field: A[Str, doc("prompt_completion: the prompt's field")] = "prompt"
    completion_field: A[Str, doc("prompt_completion: the completion's field")] = "completion"
    chosen_field: A[Str, doc("preference: the preferred response's field")] = "chosen"
    rejected_field: A[Str, doc("preference: the dispreferred response's field")] = "rejected"
    messages_field: A[
        Str | None,
        doc("chat / sharegpt: the list of turns (null: messages / conversations)"),
    ] = None
    columns: A[
        dict[Str, Str],
        doc(
            "rename a record's fields: {the format's field name: yours}, e.g. {conversations: "
            "dialog, from: speaker, value: text} or {instruction: q, output: answer}"
        ),
    ] = Field(default_factory=dict)  # `field` is data.field in this class
    roles: A[
        dict[Str, Str],
        doc(
            "chat / sharegpt: a role's name in the data -> the chat template's, e.g. {bot: "
            "assistant}; sharegpt maps human, gpt, system, user, assistant; others are errors"
        ),
    ] = Field(default_factory=dict)
    train_on: A[
        Literal["completion", "all"],
        doc("the loss falls on completion / assistant tokens only, or on every token"),
    ] = "completion"
    overlong: A[
        Literal["truncate", "drop", "error"],
        doc("a sample longer than model.seq_len: cut it, skip it, or stop with its line number"),
    ] = "truncate"
    packing: A[
        Bool, doc("put several samples in one sequence, kept apart (false: one per sequence)")
    ] = True
    tokenizer: A[
        Str,
        doc(
            "'auto' (model.hf's folder, else byte), 'byte', a tokenizer.json, or a tokenizer folder"
        ),
    ] = "auto"
    val_fraction: A[Float, doc("share of packed sequences held out for eval loss")] = 0.02
    max_tokens: A[
        Int | None, doc("read at most this many tokens (null: everything)", ge=1, le=10**13)
    ] = 4_000_000
    seed: A[Int, doc("shuffling and split seed", **SEED)] = 0


@dataclass(config=SECTION)
class TrainConfig:
    """Steps and batch arithmetic."""

    objective: A[
        Literal["next_token", "dpo"],
        doc(
            "next_token: the mean next-token loss (pretraining, supervised fine-tuning); dpo: "
            "preference pairs (data.format preference), see train.dpo"
        ),
    ] = "next_token"
    dpo: DPOConfig = field(default_factory=DPOConfig)

    steps: A[
        Int | None, doc("optimizer steps (null with train.epochs: computed from the data)", **STEPS)
    ] = 100
    epochs: A[
        Positive | None,
        doc(
            "passes over the training rows, may be fractional: train.steps becomes ceil(epochs x "
            "rows / global batch rows) (null: train.steps decides)",
            le=10**6,
        ),
    ] = None
    micro_batch_size: A[Int, doc("sequences per rank per forward pass", **BATCH)] = 8
    grad_accum_steps: A[Int, doc("micro-batches per optimizer step", **BATCH)] = 1
    global_batch_size: A[
        Int | None,
        doc("if given, must equal micro x accum x data-parallel size", ge=1, le=2**40),
    ] = None
    gpu_memory_limit: A[
        Size | None,
        doc(
            "cap each GPU's memory at this size, e.g. 24GB, 22GiB (rehearse a smaller card on a "
            "bigger one; null: the whole card)",
            ge=1,
            le=2**50,
        ),
    ] = None
    eval_every: A[Int, doc("eval loss every N steps (0: never)", **COUNT)] = 50
    eval_batches: A[Int, doc("micro-batches per rank in one eval", **BATCH)] = 4
    seed: A[Int, doc("seed of the per-rank torch RNG", **SEED)] = 0
    on_nonfinite: A[
        Literal["stop", "skip"],
        doc("a NaN/inf loss or gradient norm: stop the run, or skip that update"),
    ] = "stop"
    max_skipped_steps: A[
        Int, doc("skip: stop after this many non-finite steps in a row", ge=1, le=10**6)
    ] = 10
    max_restarts: A[
        Int,
        doc(
            "restart the workers after a failure, resuming from the last good checkpoint",
            ge=0,
            le=1000,
        ),
    ] = 0


@dataclass(config=SECTION)
class OptimConfig:
    """AdamW with linear warmup and cosine decay."""

    lr: A[Float, doc("peak learning rate")] = 1e-3
    weight_decay: A[Float, doc("AdamW decoupled weight decay (matrices only)")] = 0.1
    betas: A[tuple[Float, Float], doc("AdamW betas")] = (0.9, 0.95)
    eps: A[Float, doc("AdamW epsilon")] = 1e-8
    fused: A[
        Bool | None, doc("fused AdamW (null: on GPU and for CPU-offloaded states, else foreach)")
    ] = None
    warmup_steps: A[Int, doc("linear warmup steps", **COUNT)] = 20
    min_lr_ratio: A[Float, doc("cosine decays to lr x this")] = 0.1
    grad_clip: A[Float | None, doc("max global grad norm (null: no clipping)")] = 1.0


@dataclass(config=SECTION)
class PrecisionConfig:
    """Mixed precision. `mode` sets defaults for the three dtypes; each may be given explicitly."""

    mode: A[Literal["auto", "bf16", "fp16", "fp32"], doc("auto: bf16 on GPU, fp32 on CPU")] = "auto"
    param_dtype: A[Dtype | None, doc("compute dtype of forward/backward (default: mode)")] = None
    reduce_dtype: A[Dtype | None, doc("gradient reduction dtype (default: fp32)")] = None
    master_dtype: A[Dtype | None, doc("stored weights and AdamW states (default: fp32)")] = None
    fp8: A[
        Literal["none", "tensorwise", "rowwise"],
        doc(
            "float8 matmuls in the blocks' Linears (torchao; CUDA capability 8.9+; `zerofit plan` names the engines without it)"
        ),
    ] = "none"


@dataclass(config=SECTION)
class ParallelCommon:
    """How the model is spread over the ranks: the engine, and what every engine does alike.
    `assemble` types `backend` (the engines' names, or `auto`) and adds the engines' sections."""

    backend: A[Str, doc("the engine")] = "auto"
    activation_checkpointing: A[
        Literal["none", "full", "every_k", "first_k", "selective"],
        doc(
            "recompute in backward: whole blocks, every k-th, the first k (the rest keep their "
            "activations), or all but matmul/attention outputs"
        ),
    ] = "none"
    ac_every: A[Int, doc("every_k: checkpoint every k-th block", ge=1, le=2**20)] = 2
    ac_blocks: A[
        Int | None,
        doc(
            "first_k: how many blocks, from the input side, recompute; the later ones, whose "
            "activations backward frees first, keep theirs (`zerofit plan` picks the fewest that fit)",
            ge=0,
            le=2**20,
        ),
    ] = None
    compile: A[
        Literal["auto"] | Bool,
        doc("torch.compile each transformer block (auto: on a CUDA GPU, off on CPU)"),
    ] = "auto"


@dataclass(config=SECTION)
class CheckpointConfig:
    """Where and how often the run saves."""

    dir: A[Str | None, doc("default: <run_dir>/checkpoints")] = None
    every: A[Int, doc("save every N steps (0: only at the end)", **COUNT)] = 0
    keep_last: A[Int, doc("complete checkpoints kept; older ones are deleted", ge=1, le=10**6)] = 2
    save_final: A[Bool, doc("save when the run ends (benchmarks turn it off)")] = True
    export_final: A[
        Bool, doc("after training, write a Hugging Face folder to <run_dir>/export/step_N")
    ] = False
    export_dtype: A[Literal["bf16", "fp32"], doc("dtype of the exported weights")] = "bf16"


@dataclass(config=SECTION)
class LogConfig:
    """What the run writes as it goes."""

    run_dir: A[Str | None, doc("default: runs/<timestamp>")] = None
    every: A[Int, doc("log metrics every N steps", **STEPS)] = 10
    jsonl: A[Bool, doc("write <run_dir>/metrics.jsonl")] = True
    tensorboard: A[Bool, doc("write <run_dir>/tb (needs the tensorboard package)")] = False
    progress: A[Bool, doc("progress bar (or log lines) on rank 0")] = True
    profile_steps: A[
        Int,
        doc(
            "profile the run's last N steps (torch profiler, after one warm-up step): a trace and"
            " a step-time breakdown in <run_dir>/profile (0: off)",
            ge=0,
            le=10**4,
        ),
    ] = 0


@dataclass(config=SECTION)
class Config:
    """A zerofit run."""

    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    precision: PrecisionConfig = field(default_factory=PrecisionConfig)
    parallel: ParallelCommon = field(default_factory=ParallelCommon)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    log: LogConfig = field(default_factory=LogConfig)

    # Set by `assemble` on a run's schema: each engine's options class, by name, and the check
    # that runs the named engine's own validation.
    engine_sections: ClassVar[dict[str, type]] = {}
    engine_check: ClassVar[Callable[[Config], None] | None] = None

    def __post_init__(self) -> None:
        if self.data.tokenizer == "auto":  # saved resolved: the run states which tokenizer it used
            self.data.tokenizer = _model_tokenizer(self.model.hf) or "byte"


_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")


def _model_tokenizer(folder: str | None) -> str | None:
    """The model folder, if it holds a tokenizer."""
    if folder is None:
        return None
    root = Path(folder).expanduser()
    return folder if any((root / name).is_file() for name in _TOKENIZER_FILES) else None


def assemble(
    sections: dict[str, type], default: str, check: Callable[[Config], None], module: str
) -> tuple[type, type[Config]]:
    """A run's schema: `parallel` gains `backend` (an engine's name, or `auto`) and one section per
    engine. Both classes are named in `module`, which must bind them under these names (ranks
    unpickle a config by reference)."""
    backend = Literal[tuple([*sections, "auto"])]  # type: ignore[misc]
    parallel = dataclass(
        make_dataclass(
            "ParallelConfig",
            [
                (
                    "backend",
                    A[
                        backend,
                        doc(f"{' | '.join(sections)} | auto (the planner's pick for this machine)"),
                    ],
                    field(default=default),
                ),
                *[
                    (name, options, Field(default_factory=options, description=options.__doc__))
                    for name, options in sections.items()
                ],
            ],
            bases=(ParallelCommon,),
        ),
        config=SECTION,
    )
    run = dataclass(
        make_dataclass(
            "RunConfig", [("parallel", parallel, Field(default_factory=parallel))], bases=(Config,)
        ),
        config=SECTION,
    )
    parallel.__doc__ = ParallelCommon.__doc__.split("\n")[0]
    run.__doc__ = Config.__doc__
    run.engine_sections = dict(sections)
    run.engine_check = staticmethod(check)  # type: ignore[assignment]
    for cls in (parallel, run):
        cls.__module__ = module
    return parallel, run

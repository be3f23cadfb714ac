"""DeepSpeed JSON fixtures in the shape of other projects' files, and HF Trainer's "auto" rules.

The fixtures (tests/data/ds_json/, and configs/deepspeed/llamafactory-z3.json, the README's) are
written for these tests, each covering the keys and "auto" uses of one project's file: LLaMA-
Factory's examples/deepspeed (z0, z2, z2 offload, z3, z3 offload), axolotl's deepspeed_configs
(zero1, zero2, zero3, zero3_bf16 with the short ZeRO-3 spellings, zero3_bf16_cpuoffload_all),
transformers' tests/deepspeed (zero2, zero3: optimizer and WarmupLR all "auto"), FastChat's
playground s3 (ZeRO-3 values written out) and a Megatron-DeepSpeed zero2 (Adam, fp16, a batch
written out, an activation_checkpointing block).

`hf_fill` is HF Trainer's rule book written out here, independently of zerofit:
`HfTrainerDeepSpeedConfig.trainer_config_process` and `trainer_config_finalize` (transformers'
integrations/deepspeed.py). It replaces "auto" at the paths HF knows, spelled as HF spells them.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data" / "ds_json"
README_JSON = ROOT / "configs" / "deepspeed" / "llamafactory-z3.json"
FIXTURES = {p.stem: p for p in sorted(DATA.glob("*.json"))} | {"llamafactory_z3": README_JSON}
TINY_HIDDEN = 256  # the tiny preset's model dim

# The run every fixture is tried with: TINY's model and batch (micro 4, accum 1) on 2 ranks.
BASE = [
    "parallel.backend=deepspeed",
    "model.preset=tiny",
    "model.seq_len=64",
    "model.overrides.n_layers=2",
    "train.micro_batch_size=4",
    "train.steps=2",
    "data.max_tokens=20000",
    "log.progress=false",
]
WORLD = 2


def user_json(name: str) -> dict[str, Any]:
    return json.loads(FIXTURES[name].read_text())


@dataclass
class TrainerArgs:
    """The TrainingArguments HF's rules read, as a zerofit config gives them."""

    world: int
    micro: int
    accum: int
    max_grad_norm: float
    lr: float
    betas: list[float]
    eps: float
    weight_decay: float
    fp16: bool
    bf16: bool
    hidden: int
    steps: int
    warmup: int


def _node(tree: dict[str, Any], dotted: str) -> tuple[dict[str, Any] | None, str]:
    *parents, leaf = dotted.split(".")
    node: Any = tree
    for part in parents:
        node = node.get(part) if isinstance(node, dict) else None
    return (node if isinstance(node, dict) else None), leaf


def hf_fill(ds: dict[str, Any], a: TrainerArgs) -> dict[str, Any]:
    """`ds` with every "auto" HF Trainer fills, filled as HF fills it (fill_match / fill_only
    replace "auto" only; a missing path stays missing)."""
    out = copy.deepcopy(ds)

    def fill(dotted: str, value: Any) -> None:
        node, leaf = _node(out, dotted)
        if node is not None and node.get(leaf) == "auto":
            node[leaf] = value

    fill("train_micro_batch_size_per_gpu", a.micro)
    fill("gradient_accumulation_steps", a.accum)
    fill("train_batch_size", a.world * a.micro * a.accum)
    fill("gradient_clipping", a.max_grad_norm)
    fill("optimizer.params.lr", a.lr)
    fill("optimizer.params.betas", a.betas)
    fill("optimizer.params.eps", a.eps)
    fill("optimizer.params.weight_decay", a.weight_decay)
    fill("scheduler.params.warmup_min_lr", 0)
    fill("scheduler.params.warmup_max_lr", a.lr)
    fill("fp16.enabled", a.fp16)
    fill("bf16.enabled", a.bf16)
    hidden_keys = [
        "zero_optimization.reduce_bucket_size",
        "zero_optimization.stage3_prefetch_bucket_size",
        "zero_optimization.stage3_param_persistence_threshold",
    ]
    if any(_is_auto(out, k) for k in hidden_keys):
        h = a.hidden
        fill("zero_optimization.reduce_bucket_size", h * h)
        if out.get("zero_optimization", {}).get("stage") == 3:
            # int(): DeepSpeed's pydantic field takes no fraction (transformers and TRL write
            # int(0.9 * h * h) where they fill it)
            fill("zero_optimization.stage3_prefetch_bucket_size", int(0.9 * h * h))
            fill("zero_optimization.stage3_param_persistence_threshold", 10 * h)
    fill("scheduler.params.total_num_steps", a.steps)
    fill("scheduler.params.warmup_num_steps", a.warmup)
    return out


def _is_auto(tree: dict[str, Any], dotted: str) -> bool:
    node, leaf = _node(tree, dotted)
    return node is not None and node.get(leaf) == "auto"


def leaves(tree: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(tree, dict):
        return {prefix: tree}
    out: dict[str, Any] = {}
    for key, value in tree.items():
        out |= leaves(value, f"{prefix}.{key}" if prefix else key)
    return out

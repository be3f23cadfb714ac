"""What a run is built from (model spec, data, loader) and what its checkpoints record about it.

Used by the launcher to check input before any worker starts, and by the trainer in each worker.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from zerofit.config import Config
from zerofit.data import DataBundle, PackedLoader, build_data
from zerofit.errors import UserError
from zerofit.models import ModelSpec, build_model


@dataclass
class RunInputs:
    """What a run is built from; also used by the launcher to check input before starting workers."""

    spec: ModelSpec
    data: DataBundle


def build_inputs(cfg: Config) -> RunInputs:
    spec = build_model(cfg.model.preset, cfg.model.hf, cfg.model.overrides, cfg.model.loss_chunk)
    if cfg.model.seq_len > spec.max_seq_len:
        raise UserError(
            f"model.seq_len={cfg.model.seq_len} is above the model's maximum {spec.max_seq_len}"
        )
    d = cfg.data
    data = build_data(
        d.source, d.tokenizer, d.field, cfg.model.seq_len, d.val_fraction, d.max_tokens, d.seed
    )
    if data.tokenizer.vocab_size > spec.vocab_size:
        raise UserError(
            f"tokenizer has {data.tokenizer.vocab_size} tokens but the model's vocabulary is {spec.vocab_size}"
        )
    return RunInputs(spec, data)


def make_loader(cfg: Config, data: DataBundle, dp_rank: int, dp_size: int) -> PackedLoader:
    t = cfg.train
    return PackedLoader(
        data.train,
        micro_batch_size=t.micro_batch_size,
        grad_accum_steps=t.grad_accum_steps,
        dp_rank=dp_rank,
        dp_size=dp_size,
        seed=cfg.data.seed,
    )


def checkpoint_meta(cfg: Config, spec: ModelSpec, world_size: int) -> dict[str, Any]:
    """What a checkpoint records about the run that wrote it (see zerofit.checkpoint.compat)."""
    t = cfg.train
    return {
        "backend": cfg.parallel.backend,
        "world_size": world_size,
        "model": spec.fingerprint,
        "optimizer": "adamw",
        "seq_len": cfg.model.seq_len,
        "master_dtype": cfg.precision.master_dtype,
        "micro_batch_size": t.micro_batch_size,
        "grad_accum_steps": t.grad_accum_steps,
        "global_batch": t.micro_batch_size * t.grad_accum_steps * world_size,
        "train_steps": t.steps,
        "data": {"source": cfg.data.source, "tokenizer": cfg.data.tokenizer},
    }

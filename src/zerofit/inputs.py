"""What a run is built from (model spec, data, loader) and what its checkpoints record about it.

Used by the launcher to check input before any worker starts, and by the trainer in each worker.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from zerofit.config import Config
from zerofit.data import DataBundle, PackedLoader, SampleOptions, build_data
from zerofit.errors import UserError
from zerofit.models import ModelSpec, build_model
from zerofit.models.lora import apply_lora


@dataclass
class RunInputs:
    """What a run is built from; also used by the launcher to check input before starting workers."""

    spec: ModelSpec
    data: DataBundle


def build_inputs(cfg: Config) -> RunInputs:
    m = cfg.model
    spec = build_model(m.preset, m.hf, m.overrides, m.loss_chunk, m.trust_remote_code)
    spec = apply_lora(spec, cfg.model.lora)  # rank 0: unchanged
    if cfg.model.seq_len > spec.max_seq_len:
        raise UserError(
            f"model.seq_len={cfg.model.seq_len} is above the model's maximum {spec.max_seq_len}"
        )
    d = cfg.data
    data = build_data(
        d.source,
        d.tokenizer,
        d.field,
        cfg.model.seq_len,
        d.val_fraction,
        d.max_tokens,
        d.seed,
        samples=sample_options(cfg),
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
        "data": data_meta(cfg),
    }


def sample_options(cfg: Config) -> SampleOptions | None:
    """How fine-tuning records become rows; None for data.format text."""
    d = cfg.data
    if d.format == "text":
        return None
    return SampleOptions(
        format=d.format,
        prompt_field=d.prompt_field,
        completion_field=d.completion_field,
        messages_field=d.messages_field,
        train_on=d.train_on,
        overlong=d.overlong,
        packing=d.packing,
    )


def data_meta(cfg: Config) -> dict[str, Any]:
    """The data a checkpoint was trained on. The text format records source and tokenizer only
    (as checkpoints always did, so they stay resumable); fine-tuning formats add the format and
    what decides the rows."""
    d = cfg.data
    meta: dict[str, Any] = {"source": d.source, "tokenizer": d.tokenizer}
    if d.format != "text":
        meta.update(format=d.format, train_on=d.train_on, packing=d.packing, overlong=d.overlong)
    return meta

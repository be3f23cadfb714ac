"""What a run is built from (model spec, data, loader) and what its checkpoints record about it.

Used by the launcher to check input before any worker starts, and by the trainer in each worker.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from zerofit.config import Config
from zerofit.config.replacing import replace_config
from zerofit.data import DataBundle, GlobalBatch, PackedLoader, SampleOptions, build_data
from zerofit.data.sizing import epoch_steps, passes
from zerofit.errors import UserError
from zerofit.models import ModelSpec, build_model
from zerofit.models.build import param_counts
from zerofit.models.lean_ops import with_lean_ops
from zerofit.models.lora import apply_lora


@dataclass
class RunInputs:
    """What a run is built from; also used by the launcher to check input before starting workers."""

    spec: ModelSpec
    data: DataBundle


def global_batch(cfg: Config, dp_size: int) -> GlobalBatch:
    t = cfg.train
    return GlobalBatch(t.micro_batch_size, t.grad_accum_steps, dp_size)


def build_inputs(cfg: Config, dp_size: int | None = None) -> RunInputs:
    """The model spec and the data; with ``dp_size``, the data must also fill one global batch
    (checked with the validation hold-out, in one error line)."""
    m = cfg.model
    spec = build_model(
        m.preset, m.hf, m.overrides, m.loss_chunk, m.trust_remote_code, m.random_init
    )
    if cfg.model.lean_ops:  # before LoRA: the probes see the plain layers
        spec = with_lean_ops(spec)
    spec = apply_lora(
        spec, cfg.model.lora, cfg.model.lean_ops, cfg.model.init_seed
    )  # rank 0: as is
    spec = replace(spec, trainable_params=param_counts(spec.module)[1])  # before any sharding
    if cfg.model.seq_len > spec.max_seq_len:
        raise UserError(
            f"model.seq_len={cfg.model.seq_len} is above the model's maximum {spec.max_seq_len}"
        )
    data = run_data(cfg, dp_size)
    if data.tokenizer.vocab_size > spec.vocab_size:
        raise UserError(
            f"tokenizer has {data.tokenizer.vocab_size} tokens but the model's vocabulary is {spec.vocab_size}"
        )
    return RunInputs(spec, data)


def run_data(cfg: Config, dp_size: int | None = None) -> DataBundle:
    """The data of a run of ``cfg`` (what `zerofit data preview` shows too); with ``dp_size``, it
    must also fill one global batch beside the validation hold-out (one error line)."""
    d = cfg.data
    return build_data(
        d.source,
        d.tokenizer,
        d.field,
        cfg.model.seq_len,
        d.val_fraction,
        d.max_tokens,
        d.seed,
        samples=sample_options(cfg),
        global_batch=None if dp_size is None else global_batch(cfg, dp_size),
    )


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
        chosen_field=d.chosen_field,
        rejected_field=d.rejected_field,
        messages_field=d.messages_field,
        train_on=d.train_on,
        overlong=d.overlong,
        packing=d.packing,
        columns=tuple(sorted(d.columns.items())),
        roles=tuple(sorted(d.roles.items())),
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


def resolve_steps(
    cfg: Config, data: DataBundle, dp_size: int, steps_given: bool
) -> tuple[Config, str | None]:
    """``train.epochs`` set: the config with the steps it takes on this data (zerofit.data.sizing).
    Also a note line: how many passes over the data the run makes, when it repeats the data."""
    t, rows = cfg.train, len(data.train)
    batch = global_batch(cfg, dp_size).rows
    if t.epochs is None:
        assert t.steps is not None  # zerofit.config.validate
        if t.steps * batch <= rows:
            return cfg, None
        return cfg, (
            f"{t.steps} steps x {batch} rows = {t.steps * batch} rows from {rows} packed "
            f"training rows: {passes(t.steps, batch, rows)} epochs (the data repeats); set "
            "train.epochs to choose by epochs"
        )
    steps = epoch_steps(t.epochs, rows, batch)
    if steps_given and t.steps is not None and steps != t.steps:
        raise UserError(
            f"train.steps={t.steps} and train.epochs={t.epochs:g} ({steps} steps on {rows} "
            f"training rows in global batches of {batch}): give one of them (train.steps: null, "
            "or --train.steps null, unsets the steps a config file gives)"
        )
    if steps > 10**12:
        raise UserError(f"train.epochs={t.epochs:g} makes {steps} steps: at most 10**12")
    note = (
        f"train.epochs={t.epochs:g}: {steps} steps x {batch} rows over {rows} packed training "
        f"rows ({passes(steps, batch, rows)} epochs)"
    )
    return replace_config(cfg, train=replace(t, steps=steps)), note

"""What may change between a checkpoint and the run that resumes it, and what may not.

Refused, by name: another model (any architecture field), another optimizer, another sequence
length or data source. Allowed, each with one line saying what it means: another engine or world
size (converted through the neutral view), another micro-batch / accumulation split of the same
global batch (the same training), another global batch, another master dtype, and another
``train.steps`` (the cosine schedule is re-stretched: the line gives the lr before and after).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from zerofit.errors import UserError
from zerofit.train.lr_schedule import lr_at


def first_difference(a: Any, b: Any, path: str = "") -> str | None:
    """Dotted path of the first place two JSON-like values differ, or None."""
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b), key=str):
            found = first_difference(a.get(key), b.get(key), f"{path}.{key}" if path else str(key))
            if found is not None:
                return found
        return None
    return None if a == b else path or "(value)"


def _lookup(d: Any, path: str) -> Any:
    for part in path.split("."):
        d = d.get(part) if isinstance(d, dict) else None
    return d


def check(ckpt: Path, saved: dict[str, Any], current: dict[str, Any], optim: Any) -> list[str]:
    """UserError if ``saved`` (meta.json) cannot continue as ``current``; else notes to print."""
    for key, label in (
        ("model", "model"),
        ("optimizer", "optimizer"),
        ("seq_len", "model.seq_len"),
        ("data", "data"),
    ):
        where = first_difference(saved.get(key), current.get(key))
        if where is not None:
            inner = "" if where == "(value)" else where
            name = f"{label}.{inner}" if inner else label
            raise UserError(
                f"checkpoint {ckpt} is for a different run: {name} is "
                f"{_lookup(saved.get(key), inner) if inner else saved.get(key)!r} there, "
                f"{_lookup(current.get(key), inner) if inner else current.get(key)!r} here"
            )
    notes = []
    src = f"{saved['backend']} on {saved['world_size']} rank(s)"
    dst = f"{current['backend']} on {current['world_size']} rank(s)"
    if src != dst:
        notes.append(
            f"resuming a {src} checkpoint with {dst}: converted through the engine-neutral form"
        )
    if saved.get("global_batch") != current["global_batch"]:
        notes.append(
            f"global batch {saved.get('global_batch')} -> {current['global_batch']} sequences: data "
            "continues at the same sample, but the training is no longer the one the checkpoint began"
        )
    elif (saved.get("micro_batch_size"), saved.get("grad_accum_steps")) != (
        current["micro_batch_size"],
        current["grad_accum_steps"],
    ):
        notes.append(
            f"micro-batch {saved.get('micro_batch_size')} x accumulation {saved.get('grad_accum_steps')} -> "
            f"{current['micro_batch_size']} x {current['grad_accum_steps']}: same global batch, same training"
        )
    if saved.get("master_dtype") != current["master_dtype"]:
        notes.append(
            f"master weights {saved.get('master_dtype')} -> {current['master_dtype']}: converted on load"
        )
    if saved.get("train_steps") not in (None, current["train_steps"]):
        notes.append(
            schedule_note(saved["step"], saved["train_steps"], current["train_steps"], optim)
        )
    return notes


def schedule_note(step: int, before: int, after: int, optim: Any) -> str:
    kw = {"lr": optim.lr, "warmup_steps": optim.warmup_steps, "min_lr_ratio": optim.min_lr_ratio}
    old, new = lr_at(step, total_steps=before, **kw), lr_at(step, total_steps=after, **kw)
    return (
        f"train.steps {before} -> {after}: the cosine schedule is re-stretched to end at step {after}; "
        f"the next step's lr is {new:.3g} (it would have been {old:.3g})"
    )

"""`zerofit plan --write FILE`: the recommended configuration as a zerofit config.

The file holds the fields that differ from zerofit's defaults, plus those that state the plan
(the model, seq_len, micro-batch x accumulation, precision and every field of the strategy), under
a YAML comment that gives the forecast and the command that made it. Loaded (`zerofit train -c
FILE`), it resolves to the same config as the whole recommended config would.
"""

from __future__ import annotations

import argparse
import shlex
import textwrap
from datetime import date
from pathlib import Path
from typing import Any

import yaml

from zerofit.backends.terms import GIB, Workload
from zerofit.config import Config, leaf_fields, to_dict, with_fields
from zerofit.config.sizes import gib
from zerofit.errors import UserError
from zerofit.launch.run_config import default_config
from zerofit.planner.plan import HEADROOM, Option, option_fields
from zerofit.planner.shape import Hardware

# Fields written even where they equal the defaults: what the plan is for, and what it chose.
STATED = ("model.seq_len", "train.micro_batch_size", "train.grad_accum_steps")
STATED += ("precision.mode", "precision.master_dtype")


def recommended_config(
    base: Config, w: Workload, option: Option, extra: dict[str, object] | None = None
) -> Config:
    """`base` with the option's strategy, micro-batch x accumulation, seq_len and dtypes (and
    `extra` fields: a fixed global batch, a GPU memory cap)."""
    fields: dict[str, object] = {
        "model.seq_len": w.seq_len,
        "train.micro_batch_size": w.micro_batch_size,
        "train.grad_accum_steps": w.grad_accum_steps,
    }
    fields |= {"precision.mode": w.compute_dtype, "precision.master_dtype": w.master_dtype}
    return with_fields(base, fields | option_fields(option) | (extra or {}))


def written_cap(
    args: argparse.Namespace, found: Hardware | None, base: Config
) -> tuple[dict[str, object], str]:
    """`train.gpu_memory_limit` of the written config, and what to say about it: --gpu-mem X on
    a machine whose GPUs are larger carries X, so that a run here rehearses the card planned
    for; an explicit --gpu-mem replaces the config's own limit (dropped where the GPUs here are
    no larger: nothing to cap)."""
    planned, here = args.gpu_mem, found.gpu_mem if found is not None else None
    if planned is None:
        return {}, ""
    key = "train.gpu_memory_limit"
    if here is not None and planned < here:
        return {key: planned}, (
            f"; {key}: {gib(planned)} since this machine's GPUs have {gib(here)}: a run here is "
            "capped at the memory planned for, a faithful rehearsal"
        )
    old = base.train.gpu_memory_limit
    if old is None or old == planned:
        return {}, ""
    if here is None:
        note = f"; {key}: {gib(planned)} (--gpu-mem) replaces the config's {gib(old)}"
        return {key: planned}, note
    return {key: None}, f"; {key} removed: the GPUs here have {gib(here)}, no more than --gpu-mem"


def _at(data: dict[str, Any], dotted: str) -> Any:
    for part in dotted.split("."):
        data = data[part]
    return data


def differing(cfg: Config, stated: set[str]) -> dict[str, Any]:
    """The sections of `cfg` (YAML-safe) holding only the fields that differ from the defaults,
    and those in `stated`; the model's source (preset or folder) always."""
    full, defaults = to_dict(cfg), to_dict(default_config())
    stated = stated | {"model.hf" if cfg.model.hf else "model.preset"}
    if cfg.train.epochs is not None:  # a run checks steps given beside epochs: as the full file
        stated.add("train.steps")
    out: dict[str, Any] = {}
    for key, _ in leaf_fields(type(cfg)):
        value = _at(full, key)
        if key in stated or value != _at(defaults, key):
            *parents, leaf = key.split(".")
            node = out
            for part in parents:
                node = node.setdefault(part, {})
            node[leaf] = value
    return out


def header(args: argparse.Namespace, o: Option, hw: Hardware) -> str:
    """The YAML comment over a written config: the strategy, the forecast, the date, the command."""
    at = o.workload
    batch = (
        f", micro-batch {at.micro_batch_size} x accumulation {at.grad_accum_steps}" if at else ""
    )
    command = shlex.join(["zerofit", *getattr(args, "argv", ["plan", "..."])])
    usable = hw.gpu_mem * (1 - HEADROOM) / GIB
    named = hw.gpu_from != "assumed"
    cards = f"{hw.world_size} x {hw.name}" if named else f"{hw.world_size} GPUs"
    said = [
        "Written by `zerofit plan --write`: only the fields that differ from zerofit's defaults, "
        "and those that state the plan (`zerofit config show -c FILE` prints every field).",
        f"strategy: {o.strategy.label}{batch}",
        f"forecast: {o.memory.peak_reserved / GIB:.1f} GiB per GPU (peak allocated "
        f"{o.memory.peak_allocated / GIB:.1f} + CUDA context and fragmentation), fits "
        f"{cards} of {hw.gpu_mem / GIB:.1f} GiB ({usable:.1f} usable); "
        f"~{o.speed.tokens_per_s:,.0f} tokens/s, {o.speed.step_time:.2f} s a step (roofline)",
        f"planned {date.today().isoformat()} by: {command}",
    ]
    wrap = textwrap.TextWrapper(width=98, break_long_words=False, break_on_hyphens=False)
    return "".join(f"# {line}\n" for text in said for line in wrap.wrap(text))


def write(
    args: argparse.Namespace,
    base: Config,
    w: Workload,
    best: Option | None,
    hw: Hardware,
    found: Hardware | None,
    global_batch: int | None,
) -> None:
    """--write: the recommended configuration, and one line saying what was written."""
    if best is None:
        raise UserError("nothing fits, so there is no configuration to write")
    extra, note = written_cap(args, found, base)
    if global_batch is not None and best.workload is not None:
        extra["train.global_batch_size"] = global_batch
        note = (
            f"; micro-batch {best.workload.micro_batch_size} x accumulation "
            f"{best.workload.grad_accum_steps} x {w.world_size} GPUs = global batch "
            f"{global_batch}{note}"
        )
    cfg = recommended_config(base, w, best, extra)
    fields = differing(cfg, {*STATED, *option_fields(best), *extra})
    text = yaml.safe_dump(fields, sort_keys=False)
    Path(args.write).write_text(header(args, best, hw) + text)
    print(f"wrote {args.write}{note}")

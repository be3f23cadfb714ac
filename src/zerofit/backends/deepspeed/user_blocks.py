"""A user's optimizer and scheduler blocks: honoured as written, or refused in one line.

Optimizer. DeepSpeed builds the optimizer a file names, from its params (`_configure_basic_
optimizer` in runtime/engine.py): zerofit never renames it (a Megatron-style "Adam" stays Adam,
which DeepSpeed runs in AdamW mode unless `adam_w_mode` is false) and never adds a key to its
params (they are the optimizer's constructor arguments). zerofit runs Adam and AdamW only: it
sets their learning rate every step and checkpoints their moments. What the block leaves out:
- lr: zerofit's schedule sets it every step (optim.lr);
- weight_decay: zerofit's parameter groups carry it (optim.weight_decay on matrices, 0 on norms
  and biases), as they do for its own block;
- betas, eps: DeepSpeed's defaults (every Adam it builds: (0.9, 0.999), 1e-8) become the config's;
- torch_adam: false unless the block says so (DeepSpeed's fused or CPU Adam).

Scheduler. zerofit computes the learning rate of every step itself (linear warmup, then cosine to
lr x optim.min_lr_ratio). It stands in for DeepSpeed's WarmupLR (warmup, then constant: min_lr_ratio
1.0) and WarmupDecayLR (warmup, then down to 0: min_lr_ratio 0.0, cosine rather than linear); their
params, "auto" as HF fills them (warmup_min_lr 0, warmup_max_lr = lr, warmup_num_steps, total_num_
steps = the run's steps) or values adopted. Any other scheduler is refused; the block is left out
of the JSON DeepSpeed gets (`fill.DROPPED`) and the launcher says what runs instead (`notes`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from zerofit.backends.deepspeed.json_paths import shown
from zerofit.backends.deepspeed.user_json import Adoption, is_auto
from zerofit.errors import UserError

ADAMS = ("adam", "adamw")  # DeepSpeed's names, compared lower-case as DeepSpeed does
DS_ADAM_DEFAULTS: tuple[tuple[str, str, Any], ...] = (
    ("betas", "optim.betas", (0.9, 0.999)),
    ("eps", "optim.eps", 1e-8),
)
SCHEDULES = {"WarmupLR": 1.0, "WarmupDecayLR": 0.0}  # type -> optim.min_lr_ratio
SCHEDULE_PARAMS: tuple[tuple[str, str, Callable[[Any], Any]], ...] = (
    ("warmup_max_lr", "optim.lr", float),
    ("warmup_num_steps", "optim.warmup_steps", int),
    ("total_num_steps", "train.steps", int),
)
SCHEDULE_KNOWN = {"warmup_min_lr", "warmup_type", "last_batch_iteration"} | {
    key for key, _, _ in SCHEDULE_PARAMS
}


def _block(a: Adoption, name: str) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """The file's `name` block and its params (None: no block)."""
    block = a.user.get(name)
    if block is None:
        return None
    params = block.get("params") if isinstance(block, dict) else None
    if not isinstance(block, dict) or not isinstance(params, dict | None):
        raise UserError(f"{name} in {a.file} must be an object with an object of params")
    return block, params or {}


def adopt_optimizer(a: Adoption) -> None:
    found = _block(a, "optimizer")
    if found is None:
        return  # zerofit writes its own (AdamW)
    block, params = found
    kind = block.get("type")
    if not isinstance(kind, str) or kind.lower() not in ADAMS:
        raise UserError(
            f"optimizer.type={shown(kind)} in {a.file}: zerofit trains with DeepSpeed's Adam or "
            "AdamW only (it sets their learning rate every step and checkpoints their moments); "
            'use "Adam" or "AdamW", or remove the optimizer block for zerofit\'s AdamW'
        )
    for key, name, value in DS_ADAM_DEFAULTS:
        if key not in params:
            a.default(
                name,
                value,
                f"optimizer.params in {a.file} leaves out {key}, so DeepSpeed's default "
                f'{shown(value)} applies; add "{key}": "auto" there to take the config\'s',
            )
    _adopt_torch_adam(a, params)


def _adopt_torch_adam(a: Adoption, params: dict[str, Any]) -> None:
    raw = params.get("torch_adam", False)
    if not isinstance(raw, bool):
        raise UserError(f"optimizer.params.torch_adam={shown(raw)} in {a.file} is not valid")
    name = "parallel.deepspeed.torch_adam"
    current = a.current(name)
    if name in a.explicit and current is not None and current != raw:
        said = "sets" if "torch_adam" in params else "leaves out"
        raise UserError(
            f"{name}={current} in the config but the optimizer block in {a.file} {said} "
            f"torch_adam, and zerofit adds no key to a file's optimizer; set "
            f'"torch_adam": {shown(current)} in its params, or remove the block'
        )
    a.updates[name] = raw


def adopt_scheduler(a: Adoption) -> None:
    found = _block(a, "scheduler")
    if found is None:
        return
    block, params = found
    kind = block.get("type")
    if kind not in SCHEDULES:
        raise UserError(
            f"scheduler.type={shown(kind)} in {a.file}: zerofit sets the learning rate of every "
            "step itself (linear warmup, then cosine: optim.lr, optim.warmup_steps, "
            "optim.min_lr_ratio) and stands in for WarmupLR and WarmupDecayLR only; remove the "
            "scheduler block"
        )
    _check_schedule_params(a, params)
    for key, name, convert in SCHEDULE_PARAMS:
        raw = params.get(key)
        if raw is None or is_auto(raw):
            continue
        try:
            value = convert(raw)
        except (TypeError, ValueError, OverflowError):
            raise UserError(
                f"scheduler.params.{key}={shown(raw)} in {a.file} is not valid"
            ) from None
        a.adopt(name, value, f"scheduler.params.{key}", raw)
    after = "keeps the peak learning rate" if SCHEDULES[kind] else "decays to 0"
    a.adopt(
        "optim.min_lr_ratio",
        SCHEDULES[kind],
        "scheduler.type",
        kind,
        f" ({kind} {after} after warmup: min_lr_ratio {SCHEDULES[kind]})",
    )


def _check_schedule_params(a: Adoption, params: dict[str, Any]) -> None:
    """Settings zerofit's schedule has no counterpart for are refused, not dropped."""
    for key, raw in params.items():
        where = f"scheduler.params.{key}={shown(raw)} in {a.file}"
        if key not in SCHEDULE_KNOWN:
            raise UserError(
                f"{where}: zerofit's schedule stands in for the block and has no such setting; remove it"
            )
        if is_auto(raw):
            continue
        if key == "warmup_min_lr" and raw != 0:
            raise UserError(f'{where}: zerofit\'s warmup starts from 0; set it to 0 or "auto"')
        if key == "warmup_type" and raw not in ("linear", "log"):
            raise UserError(f'{where} is not valid (DeepSpeed takes "linear" or "log")')
        if key == "last_batch_iteration" and raw != -1:
            raise UserError(
                f"{where}: zerofit resumes its schedule from the checkpoint's step; remove it"
            )

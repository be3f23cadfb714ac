"""Bounds of the config's numbers and strings, their checks, and `shown`: a user value, short.

`INT_RANGES` holds the inclusive [min, max] of every integer field of the schema (a test checks
that none is missing). The maxima are far above any real run; they keep arithmetic, seeds and
allocations sane when a value comes from a typo or a fuzzer. The float fields have their own
checks (`check_optim`, `check_deepspeed`; `zerofit.config.validate` runs them all).
"""

from __future__ import annotations

import functools
import math
import reprlib
from typing import Any

from zerofit.errors import UserError

SHOWN_CHARS = 200  # at most this many characters of a user value in one message
MAX_STRING = 10_000  # characters in one config string (paths have their own, OS limits)
MAX_PATH_LEVELS = 256  # directories in one path (the OS allows 4096 bytes in all)

_SEED = (0, 2**32 - 1)  # what numpy accepts; torch adds rank and step offsets to train.seed
_STEPS = (1, 10**12)
_COUNT = (0, 10**12)  # "every N steps", 0: never
_BATCH = (1, 2**20)
_ELEMENTS = (1, 2**40)  # DeepSpeed bucket sizes, in elements

INT_RANGES: dict[str, tuple[int, int]] = {
    "model.seq_len": (1, 2**24),
    "model.init_seed": _SEED,
    "model.loss_chunk": (0, 2**31 - 1),
    "data.max_tokens": (1, 10**13),
    "data.seed": _SEED,
    "train.steps": _STEPS,
    "train.micro_batch_size": _BATCH,
    "train.grad_accum_steps": _BATCH,
    "train.global_batch_size": (1, 2**40),
    "train.eval_every": _COUNT,
    "train.eval_batches": _BATCH,
    "train.seed": _SEED,
    "train.max_skipped_steps": (1, 10**6),
    "train.max_restarts": (0, 1000),
    "optim.warmup_steps": _COUNT,
    "parallel.replicate_degree": (1, 2**20),
    "parallel.prefetch": (0, 1024),
    "parallel.min_num_params": (1, 2**50),
    "parallel.ac_every": (1, 2**20),
    "parallel.deepspeed.allgather_bucket_size": _ELEMENTS,
    "parallel.deepspeed.reduce_bucket_size": _ELEMENTS,
    "parallel.deepspeed.prefetch_bucket_size": (0, 2**40),
    "parallel.deepspeed.param_persistence_threshold": (0, 2**40),
    "parallel.deepspeed.max_live_parameters": (0, 2**40),
    "parallel.deepspeed.loss_scale_window": (1, 2**31 - 1),
    "parallel.deepspeed.initial_scale_power": (0, 64),
    "parallel.deepspeed.hysteresis": (1, 2**31 - 1),
    "checkpoint.every": _COUNT,
    "checkpoint.keep_last": (1, 10**6),
    "log.every": _STEPS,
}

_repr = reprlib.Repr()
_repr.maxstring = _repr.maxother = SHOWN_CHARS
_repr.maxlong = 60
_repr.maxlist = _repr.maxtuple = _repr.maxdict = _repr.maxset = 8
_repr.maxlevel = 3


def check_optim(o: Any) -> None:
    """Values AdamW cannot train with (NaN and inf fail every comparison, so each test is a
    positive one): refused before anything starts."""
    finite = math.isfinite
    if not (finite(o.lr) and o.lr > 0):
        raise UserError(f"optim.lr must be a finite number > 0, got {o.lr}")
    if not all(finite(b) and 0.0 <= b < 1.0 for b in o.betas):
        raise UserError(f"optim.betas must be in [0, 1), got {list(o.betas)}")
    if not (finite(o.eps) and o.eps > 0):
        raise UserError(f"optim.eps must be a finite number > 0, got {o.eps}")
    if not (finite(o.weight_decay) and 0 <= o.weight_decay < 1 / o.lr):
        raise UserError(
            f"optim.weight_decay must be finite, >= 0 and below 1/lr (AdamW multiplies weights by "
            f"1 - lr x weight_decay each step), got {o.weight_decay}"
        )
    if not (finite(o.min_lr_ratio) and 0 <= o.min_lr_ratio <= 1):
        raise UserError(f"optim.min_lr_ratio must be in [0, 1], got {o.min_lr_ratio}")
    if o.grad_clip is not None and not (finite(o.grad_clip) and o.grad_clip > 0):
        raise UserError(f"optim.grad_clip must be a finite number > 0, or null, got {o.grad_clip}")


def check_ranges(cfg: Any) -> None:
    """Every integer field within its INT_RANGES bounds (None: unset, where the schema allows)."""
    for name, (low, high) in INT_RANGES.items():
        value = functools.reduce(getattr, name.split("."), cfg)
        if value is None:
            continue
        if value < low:
            raise UserError(f"{name} must be >= {low}, got {shown(value)}")
        if value > high:
            raise UserError(f"{name} must be <= {high}, got {shown(value)}")


def check_deepspeed(ds: Any) -> None:
    """DeepSpeed's float fields: a share of the optimizer states, and a loss-scale floor."""
    if not (math.isfinite(ds.offload_ratio) and 0.0 <= ds.offload_ratio <= 1.0):
        raise UserError(
            f"parallel.deepspeed.offload_ratio must be in [0, 1], got {ds.offload_ratio}"
        )
    if not (math.isfinite(ds.min_loss_scale) and ds.min_loss_scale > 0):
        raise UserError(
            f"parallel.deepspeed.min_loss_scale must be a finite number > 0, got {ds.min_loss_scale}"
        )


def shown(value: Any, quote: bool = True, limit: int = SHOWN_CHARS) -> str:
    """`value` for an error line: repr'd (str() when quote is False, still on one line) and
    cut to about `limit` characters with '...'. Safe on huge ints, strings and containers."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 256:
        return f"<a {value.bit_length() * 30103 // 100000 + 1}-digit number>"
    if quote:
        raw = text = _repr.repr(value)
    else:
        raw = str(value)
        words = raw[: limit * 2].split()  # line breaks of any kind become one space
        text = "".join(c if c.isprintable() else "?" for c in " ".join(words))
    cut = len(text) > limit or len(raw) > limit * 2
    return text[:limit] + "..." if cut else text

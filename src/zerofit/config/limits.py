"""Limits of config strings and paths, AdamW's value checks, and `shown`: a user value, short.

The integer fields' bounds live on the fields themselves (`zerofit.config.schema`, `doc(ge=, le=)`).
"""

from __future__ import annotations

import math
import reprlib
from typing import TYPE_CHECKING, Any

from zerofit.errors import UserError

if TYPE_CHECKING:
    from zerofit.config.schema import OptimConfig

SHOWN_CHARS = 200  # at most this many characters of a user value in one message
MAX_STRING = 10_000  # characters in one config string (paths have their own, OS limits)
MAX_PATH_LEVELS = 256  # directories in one path (the OS allows 4096 bytes in all)

_repr = reprlib.Repr()
_repr.maxstring = _repr.maxother = SHOWN_CHARS
_repr.maxlong = 60
_repr.maxlist = _repr.maxtuple = _repr.maxdict = _repr.maxset = 8
_repr.maxlevel = 3


def check_optim(o: OptimConfig) -> None:
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

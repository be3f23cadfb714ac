"""Sizes in bytes as people write them ('24GB', '22GiB', '512G', '24e9'), and the GPU memory cap.

One reader for every size a user gives: `zerofit plan --gpu-mem/--cpu-mem/--nvme`, `zerofit export
--max-shard-size` and the config's `train.gpu_memory_limit` (`Size`). No torch here: the config
imports this module.
"""

from __future__ import annotations

import math
import re
from typing import Annotated, Any

from pydantic import BeforeValidator, Strict

from zerofit.config.limits import shown
from zerofit.errors import UserError

_NUMBER = r"(?:\d+(?:\.\d*)?|\.\d+)(?:e[+-]?\d+)?"
_SIZE = re.compile(rf"^\s*({_NUMBER})\s*([KMGTP]?)(i?)(B?)\s*$", re.IGNORECASE)
EXAMPLES = "examples: 24GB, 22GiB, 512G, 24e9"


def parse_size(text: str, minimum: int = 0) -> int:
    """Bytes of a size: '40GiB' binary, '80GB' decimal, '512G' (no B) binary, '24e9' and '1000'
    plain bytes. UserError (one line) for words, NaN, inf, negative sizes and sizes under
    `minimum`."""
    m = _SIZE.match(text)
    value = float(m.group(1)) if m else math.nan
    if not math.isfinite(value):
        problem = "a size cannot be negative" if text.strip().startswith("-") else "cannot read"
        raise UserError(f"{problem}: {shown(text)} ({EXAMPLES})")
    unit, binary, b = m.group(2).upper(), m.group(3), m.group(4)
    if binary and not unit:  # 'iB' alone
        raise UserError(f"cannot read: {shown(text)} ({EXAMPLES})")
    power = " KMGTP".index(unit) if unit else 0
    base = 1024 if (binary or (unit and not b)) else 1000
    size = value * base**power
    if not math.isfinite(size):
        raise UserError(f"cannot read: {shown(text)} (too large; {EXAMPLES})")
    if size < minimum:
        raise UserError(f"a size must be at least {minimum:,} byte(s), got {shown(text)}")
    return int(size)


def gib(size: float) -> str:
    """Bytes as 'X.Y GiB' for a message."""
    return f"{size / 2**30:,.1f} GiB"


def human_bytes(size: float) -> str:
    """Bytes in binary units for a message: '812 B', '3.0 MiB', '1.25 TiB'."""
    for power, unit in ((4, "TiB"), (3, "GiB"), (2, "MiB"), (1, "KiB")):
        if size >= 1024**power:
            value = size / 1024**power
            return f"{value:,.2f} {unit}" if value < 10 else f"{value:,.1f} {unit}"
    return f"{size:,.0f} B"


def memory_fraction(limit: int, total: int, card: str = "this GPU") -> float:
    """The share of a card's memory that `train.gpu_memory_limit` leaves to the caching allocator
    (torch.cuda.set_per_process_memory_fraction); UserError when the limit is above the card."""
    if total <= 0:
        raise UserError(f"{card} reports no memory ({total} bytes): cannot apply a memory limit")
    if limit > total:
        raise UserError(
            f"train.gpu_memory_limit is {gib(limit)} ({limit:,} bytes), more than the "
            f"{gib(total)} of {card}: lower it, or set it to null to use the whole card"
        )
    return limit / total


def _size_like(value: Any) -> Any:
    """A config value as bytes: a size string read by `parse_size`, an integral float (YAML's
    2.4e+10) as an int; anything else as given, for the strict int check (and its line)."""
    if isinstance(value, str):
        try:
            return parse_size(value)
        except UserError as e:
            raise ValueError(str(e)) from None
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


# A config field of bytes that reads '24GB', '22GiB', '24e9' or a plain integer.
Size = Annotated[int, Strict(), BeforeValidator(_size_like)]

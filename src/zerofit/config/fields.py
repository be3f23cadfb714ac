"""The typed building blocks of zerofit's config schema, on pydantic v2.

Pydantic's lax mode would turn `"yes"` into True and `1.5` into an error only sometimes; a training
config wants the opposite: a bool is `true`/`false`, an int is an int (or an integral float such as
`5e7`, the way bucket sizes are written), a float is any number (YAML 1.1 reads `3e-4` as a string,
so numeric strings count), and a string is printable and bounded. Each field states its help text
and bounds with `doc(...)`; the JSON Schema and `--help` are generated from them.
"""

from __future__ import annotations

import contextlib
import math
from typing import Annotated, Any

from pydantic import AfterValidator, BeforeValidator, ConfigDict, Field, Strict

from zerofit.config.limits import MAX_STRING, shown

# Every section rejects unknown keys; `zerofit.config` turns pydantic's errors into one line.
SECTION = ConfigDict(extra="forbid", validate_assignment=False)


def _int_like(value: Any) -> Any:
    if isinstance(value, bool):
        return value  # refused by the strict int below
    if isinstance(value, str):  # '5e7' (YAML 1.1 reads it as a string): bucket sizes
        with contextlib.suppress(ValueError):
            number = float(value)
            value = number if math.isfinite(number) else value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def as_number(value: Any) -> Any:
    """A value as the int fields read it (for error lines: '1e30' is shown as the number)."""
    return _int_like(value)


def _float_like(value: Any) -> Any:
    if isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, str):  # YAML reads 3e-4 (no dot) as a string
        with contextlib.suppress(ValueError):
            return float(value)
    return value


def _no_bool(value: Any) -> Any:
    """For int literals (ZeRO stage): `True == 1` must not pass as stage 1."""
    if isinstance(value, bool):
        raise ValueError(f"expected an integer, got {value}")
    return value


def _printable(value: str) -> str:
    """A config string: at most MAX_STRING characters, all printable (a path or a name never
    needs a control, format or line-break character, and each would break an error line)."""
    if len(value) > MAX_STRING:
        raise ValueError(f"too long ({len(value)} characters; at most {MAX_STRING})")
    if not value.isprintable():
        i, ch = next((i, c) for i, c in enumerate(value) if not c.isprintable())
        what = "a NUL byte" if ch == "\x00" else f"the non-printable character {ch!r}"
        raise ValueError(f"contains {what} at position {i}: {shown(value)}")
    return value


Int = Annotated[int, Strict(), BeforeValidator(_int_like)]
Float = Annotated[float, Strict(), BeforeValidator(_float_like)]
Bool = Annotated[bool, Strict()]
Str = Annotated[str, Strict(), AfterValidator(_printable)]
NoBool = BeforeValidator(_no_bool)


def _share(value: float) -> float:
    if not (0.0 <= value <= 1.0):  # NaN fails too
        raise ValueError(f"must be in [0, 1], got {value}")
    return value


def _positive(value: float) -> float:
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"must be a finite number > 0, got {value}")
    return value


Share = Annotated[Float, AfterValidator(_share)]
Positive = Annotated[Float, AfterValidator(_positive)]


def doc(text: str, **bounds: Any) -> Any:
    """A field's help text (shown by `--help` and in the JSON Schema) and its bounds (ge, le)."""
    return Field(description=text, **bounds)

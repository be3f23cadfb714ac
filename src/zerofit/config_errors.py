"""One line for the first problem pydantic finds in a config: the dotted key, what was expected,
what was given, and for an unknown key or value the closest valid one ("did you mean")."""

from __future__ import annotations

import dataclasses
import difflib
import typing
from typing import Any

from zerofit.limits import shown

_EXPECTED = {
    "int_type": "an integer",
    "int_from_float": "an integer",
    "int_parsing": "an integer",
    "float_type": "a number",
    "float_parsing": "a number",
    "bool_type": "true or false",
    "string_type": "a string",
    "list_type": "a list",
    "tuple_type": "a list",
    "dict_type": "a mapping",
    "dataclass_type": "a mapping",
    "dataclass_exact_type": "a mapping",
}


def suggest(word: str, choices: list[str], prefix: str = "") -> str:
    """' (did you mean 'x'?)' for the closest choice, or the list of choices."""
    close = difflib.get_close_matches(word, choices, n=1, cutoff=0.5)
    if close:
        return f" (did you mean '{prefix}{close[0]}'?)"
    return f"; valid: {', '.join(choices)}"


def _walk(loc: tuple[Any, ...], data: Any) -> tuple[str, Any, list[str]]:
    """The dotted path of an error's location (without pydantic's union-member tags), the value
    found there, and the key names valid at the parent level."""
    from zerofit.schema import Config

    path, node, cls = "", data, Config
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
            node = node[part] if isinstance(node, list | tuple) and part < len(node) else None
            continue
        if not (isinstance(node, dict) and part in node) and (
            cls is None or part not in {f.name for f in dataclasses.fields(cls)}
        ):
            continue  # 'str', 'list[str]', 'function-after[...]': a member of a union
        path = f"{path}.{part}" if path else str(part)
        node = node.get(part) if isinstance(node, dict) else None
        cls = _field_class(cls, part)
    return path, node, [f.name for f in dataclasses.fields(cls)] if cls is not None else []


def _field_class(cls: type | None, name: str) -> type | None:
    if cls is None or not dataclasses.is_dataclass(cls):
        return None
    tp = typing.get_type_hints(cls).get(name)
    return tp if isinstance(tp, type) and dataclasses.is_dataclass(tp) else None


def _tuple_length(loc: tuple[Any, ...]) -> int | None:
    """The length a fixed-length tuple field at `loc` (ending in an index) must have."""
    from zerofit.schema import Config

    cls: type | None = Config
    names = [p for p in loc if isinstance(p, str)]
    for part in names[:-1]:
        cls = _field_class(cls, part)
    if cls is None:
        return None
    tp = typing.get_type_hints(cls).get(names[-1])
    return len(typing.get_args(tp)) if typing.get_origin(tp) is tuple else None


def pick(errors: list[dict[str, Any]], data: dict[str, Any]) -> str:
    """The line for the first error. A union (`str | list[str]`) fails once per member: when one
    member's error lies deeper (an item of the list), that one is meant; else say both."""
    first = errors[0]
    path = _walk(first["loc"], data)[0]
    same = [e for e in errors if _walk(e["loc"], data)[0] == path]
    deeper = [e for e in errors if _walk(e["loc"], data)[0].startswith(path + "[")]
    if deeper:
        return error_line(deeper[0], data)
    kinds = [_EXPECTED[e["type"]] for e in same if e["type"] in _EXPECTED]
    if len(same) > 1 and len(kinds) == len(same):
        value = first.get("input")
        return (
            f"{path or 'config'}: expected {' or '.join(dict.fromkeys(kinds))}, got {shown(value)}"
        )
    return error_line(first, data)


def error_line(err: dict[str, Any], data: dict[str, Any]) -> str:
    from zerofit.fields import as_number

    kind, ctx = err["type"], err.get("ctx") or {}
    if kind == "unexpected_keyword_argument":
        path, _, names = _walk(err["loc"][:-1], data)
        key = str(err["loc"][-1])
        dotted = f"{path}.{key}" if path else key
        return (
            f"unknown config key {shown(dotted)}{suggest(key, names, f'{path}.' if path else '')}"
        )
    path, value, _ = _walk(err["loc"], data)
    value = err.get("input", value)
    where = path or "config"
    if kind == "literal_error":
        expected = str(ctx.get("expected", "")).replace(" or ", ", ")
        choices = [c.strip().strip("'") for c in expected.split(",")]
        close = isinstance(value, str) and value not in choices
        hint = suggest(value, choices) if close else ""
        hint = hint if hint.startswith(" (") else ""
        return f"{where}: {shown(value)} is not one of {', '.join(choices)}{hint}"
    if kind in ("greater_than_equal", "greater_than"):
        bound = ctx.get("ge", ctx.get("gt"))
        return (
            f"{where} must be {'>=' if 'ge' in ctx else '>'} {bound}, got {shown(as_number(value))}"
        )
    if kind in ("less_than_equal", "less_than"):
        bound = ctx.get("le", ctx.get("lt"))
        return (
            f"{where} must be {'<=' if 'le' in ctx else '<'} {bound}, got {shown(as_number(value))}"
        )
    if kind in ("too_short", "too_long") or (kind == "missing" and isinstance(err["loc"][-1], int)):
        loc = err["loc"][:-1] if isinstance(err["loc"][-1], int) else err["loc"]
        where, given, _ = _walk(loc, data)
        count = len(given) if isinstance(given, list | tuple) else ctx.get("actual_length")
        return f"{where}: expected {_tuple_length(err['loc'])} values, got {count}"
    if kind in _EXPECTED:
        return f"{where}: expected {_EXPECTED[kind]}, got {shown(value)}"
    if kind == "value_error":
        message = str(ctx.get("error", err["msg"]))
        return f"{where} {message}" if message.startswith("must") else f"{where}: {message}"
    return f"{where}: {shown(value)} is not valid ({err['msg']})"

"""One line for the first problem pydantic finds in a config: the dotted key, what was expected,
what was given, and for an unknown key or value the closest valid one ("did you mean")."""

from __future__ import annotations

import dataclasses
import difflib
import typing
from typing import Any

from zerofit.config.fields import as_number
from zerofit.config.limits import shown

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


# Pydantic's bound errors: the comparison as the line writes it, and its key in the error's ctx.
_BOUNDS = {
    "greater_than_equal": (">=", "ge"),
    "greater_than": (">", "gt"),
    "less_than_equal": ("<=", "le"),
    "less_than": ("<", "lt"),
}


KEY_CHARS = 80  # an unknown key as an error line quotes it: room left for the valid keys


def _closest(word: str, choices: list[str]) -> str | None:
    close = difflib.get_close_matches(word, choices, n=1, cutoff=0.5)
    return close[0] if close else None


def suggest(key: str, names: list[str], prefix: str = "") -> str:
    """' (did you mean 'x'?)' for the closest key name, or the list of valid keys."""
    close = _closest(key, names)
    return f" (did you mean '{prefix}{close}'?)" if close else f"; valid keys: {', '.join(names)}"


def _walk(loc: tuple[Any, ...], data: Any, schema: type) -> tuple[str, Any, list[str]]:
    """The dotted path of an error's location (without pydantic's union-member tags), the value
    found there, and the key names valid at the parent level."""
    path, node, cls = "", data, schema
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


def _tuple_length(loc: tuple[Any, ...], schema: type) -> int | None:
    """The length a fixed-length tuple field at `loc` (ending in an index) must have."""
    cls: type | None = schema
    names = [p for p in loc if isinstance(p, str)]
    for part in names[:-1]:
        cls = _field_class(cls, part)
    if cls is None:
        return None
    tp = typing.get_type_hints(cls).get(names[-1])
    return len(typing.get_args(tp)) if typing.get_origin(tp) is tuple else None


def pick(errors: list[dict[str, Any]], data: dict[str, Any], schema: type) -> str:
    """The line for the first error. A union (`str | list[str]`) fails once per member: when one
    member's error lies deeper (an item of the list), that one is meant; else say both."""
    first = errors[0]
    paths = [_walk(e["loc"], data, schema)[0] for e in errors]
    path = paths[0]
    same = [e for e, p in zip(errors, paths, strict=True) if p == path]
    deeper = [e for e, p in zip(errors, paths, strict=True) if p.startswith(path + "[")]
    if deeper:
        return error_line(deeper[0], data, schema)
    kinds = [_EXPECTED[e["type"]] for e in same if e["type"] in _EXPECTED]
    if len(same) > 1 and len(kinds) == len(same):
        value = first.get("input")
        return (
            f"{path or 'config'}: expected {' or '.join(dict.fromkeys(kinds))}, got {shown(value)}"
        )
    return error_line(first, data, schema)


def error_line(err: dict[str, Any], data: dict[str, Any], schema: type) -> str:
    kind, ctx = err["type"], err.get("ctx") or {}
    if kind == "unexpected_keyword_argument":
        path, _, names = _walk(err["loc"][:-1], data, schema)
        key = str(err["loc"][-1])
        dotted = f"{path}.{key}" if path else key
        hint = suggest(key, names, f"{path}." if path else "")
        return f"unknown config key {shown(dotted, limit=KEY_CHARS)}{hint}"
    path, value, _ = _walk(err["loc"], data, schema)
    value = err.get("input", value)
    where = path or "config"
    if kind == "literal_error":
        expected = str(ctx.get("expected", "")).replace(" or ", ", ")
        choices = [c.strip().strip("'") for c in expected.split(",")]
        close = (
            _closest(value, choices) if isinstance(value, str) and value not in choices else None
        )
        hint = f" (did you mean '{close}'?)" if close else ""
        return f"{where}: {shown(value)} is not one of {', '.join(choices)}{hint}"
    if kind in _BOUNDS:
        sign, name = _BOUNDS[kind]
        return f"{where} must be {sign} {ctx[name]}, got {shown(as_number(value))}"
    if kind in ("too_short", "too_long") or (kind == "missing" and isinstance(err["loc"][-1], int)):
        loc = err["loc"][:-1] if isinstance(err["loc"][-1], int) else err["loc"]
        where, given, _ = _walk(loc, data, schema)
        count = len(given) if isinstance(given, list | tuple) else ctx.get("actual_length")
        return f"{where}: expected {_tuple_length(err['loc'], schema)} values, got {count}"
    if kind in _EXPECTED:
        return f"{where}: expected {_EXPECTED[kind]}, got {shown(value)}"
    if kind == "value_error":
        message = str(ctx.get("error", err["msg"]))
        return f"{where} {message}" if message.startswith("must") else f"{where}: {message}"
    return f"{where}: {shown(value)} is not valid ({err['msg']})"

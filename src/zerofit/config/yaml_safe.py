"""YAML for untrusted config files: bounded in size, depth and node count, one error line each.

`load_yaml_file` reads bytes (at most `MAX_BYTES`), insists on UTF-8, and parses with a loader that
refuses what a run config never needs and a hostile file could abuse: anchors and aliases (the
"billion laughs" expansion), nesting deeper than `MAX_DEPTH`, more than `MAX_NODES` nodes,
scalars longer than `MAX_SCALAR` characters, duplicate keys, keys that are not strings, and tags
other than the core ones. Timestamps, `=` and `!`-style implicit scalars stay plain strings.
Every failure is a `UserError` with one line; the parser is libyaml's when installed (its events
are composed here in Python, so every limit holds while reading, not after).
"""

from __future__ import annotations

import codecs
from pathlib import Path
from typing import Any

import yaml
from yaml.composer import Composer
from yaml.constructor import SafeConstructor
from yaml.events import AliasEvent, MappingStartEvent, ScalarEvent, SequenceStartEvent
from yaml.nodes import MappingNode, Node, ScalarNode
from yaml.resolver import Resolver

from zerofit.config.limits import shown
from zerofit.errors import UserError

MAX_BYTES = 256 << 10  # a config file; real ones are a few KB
MAX_DEPTH = 32  # nested mappings/sequences
MAX_NODES = 10_000  # scalars + collections in one document
MAX_SCALAR = 10_000  # characters in one scalar (keys included)
MAX_NUMBER = 100  # characters in one integer or float literal (int() is quadratic)

_CORE = "tag:yaml.org,2002:"
_TAGS = frozenset(_CORE + t for t in ("str", "int", "float", "bool", "null", "seq", "map"))
_IMPLICIT_DROPPED = frozenset(_CORE + t for t in ("timestamp", "value", "yaml"))
_BOMS = [
    (codecs.BOM_UTF32_LE, "UTF-32"),  # before UTF-16 LE: it starts with the same two bytes
    (codecs.BOM_UTF32_BE, "UTF-32"),
    (codecs.BOM_UTF16_LE, "UTF-16"),
    (codecs.BOM_UTF16_BE, "UTF-16"),
]

try:
    from yaml.cyaml import CParser as _Parser  # type: ignore[attr-defined]
except ImportError:  # no libyaml: the pure-Python reader, scanner and parser
    from yaml.parser import Parser as _PyParser
    from yaml.reader import Reader
    from yaml.scanner import Scanner

    class _Parser(Reader, Scanner, _PyParser):  # type: ignore[no-redef]
        def __init__(self, stream: str) -> None:
            Reader.__init__(self, stream)
            Scanner.__init__(self)
            _PyParser.__init__(self)


class _Refused(yaml.MarkedYAMLError):
    """A limit of this loader (not a YAML syntax error), with the place it was hit."""


class _Resolver(Resolver):
    yaml_implicit_resolvers = {
        first: [(tag, rx) for tag, rx in rules if tag not in _IMPLICIT_DROPPED]
        for first, rules in Resolver.yaml_implicit_resolvers.items()
    }


class _Composer(Composer):
    """PyYAML's composer with this module's limits, checked as each event arrives."""

    def __init__(self) -> None:
        super().__init__()
        self._depth = 0
        self._nodes = 0

    def compose_node(self, parent: Node | None, index: Any) -> Node:
        event = self.peek_event()
        if isinstance(event, AliasEvent) or getattr(event, "anchor", None) is not None:
            raise _Refused(
                problem="YAML anchors and aliases (&name, *name) are not supported in configs",
                problem_mark=event.start_mark,
            )
        self._nodes += 1
        if self._nodes > MAX_NODES:
            raise _Refused(problem=f"more than {MAX_NODES} values", problem_mark=event.start_mark)
        tag = getattr(event, "tag", None)
        if tag not in (None, "!") and tag not in _TAGS:
            raise _Refused(
                problem=f"the YAML tag {shown(tag)} is not supported in configs",
                problem_mark=event.start_mark,
            )
        if not isinstance(event, MappingStartEvent | SequenceStartEvent):
            return super().compose_node(parent, index)
        self._depth += 1
        if self._depth > MAX_DEPTH:
            raise _Refused(
                problem=f"nested deeper than {MAX_DEPTH} levels", problem_mark=event.start_mark
            )
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def compose_scalar_node(self, anchor: str | None) -> ScalarNode:
        event: ScalarEvent = self.peek_event()
        node = super().compose_scalar_node(anchor)
        limit = MAX_NUMBER if node.tag in (_CORE + "int", _CORE + "float") else MAX_SCALAR
        if len(node.value) > limit:
            raise _Refused(
                problem=f"a value of {len(node.value)} characters (at most {limit}): "
                f"{shown(node.value)}",
                problem_mark=event.start_mark,
            )
        return node

    def compose_mapping_node(self, anchor: str | None) -> MappingNode:
        node = super().compose_mapping_node(anchor)
        seen: dict[str, Any] = {}
        for key, _ in node.value:
            if not (isinstance(key, ScalarNode) and key.tag == _CORE + "str"):
                what = (
                    "a merge key (<<)" if key.tag == _CORE + "merge" else "a key that is not text"
                )
                raise _Refused(
                    problem=f"{what}: config keys are plain names", problem_mark=key.start_mark
                )
            if key.value in seen:
                raise _Refused(
                    problem=f"duplicate key {shown(key.value)} "
                    f"(first at line {seen[key.value].line + 1})",
                    problem_mark=key.start_mark,
                )
            seen[key.value] = key.start_mark
        return node


class _Loader(_Composer, _Parser, SafeConstructor, _Resolver):  # type: ignore[misc,valid-type]
    def __init__(self, stream: str) -> None:
        _Parser.__init__(self, stream)
        _Composer.__init__(self)
        SafeConstructor.__init__(self)
        _Resolver.__init__(self)


def _describe(e: BaseException) -> tuple[str, str]:
    """(where, what) for anything the parser raised, each on one line."""
    where, what = "", f"{type(e).__name__}: {e}"
    if isinstance(e, yaml.MarkedYAMLError):
        mark = e.problem_mark or e.context_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        what = ": ".join(t for t in (e.context, e.problem) if t) or "invalid YAML"
    elif isinstance(e, yaml.reader.ReaderError):
        where, what = f" at character {e.position}", str(e.reason)
    elif isinstance(e, RecursionError | MemoryError):
        what = "nested too deeply or too large"
    return where, shown(what, quote=False, limit=300)


def _parse(text: str) -> Any:
    loader = _Loader(text)  # the pure-Python reader may already raise here
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()


def load_yaml_text(text: str, name: str = "<text>") -> Any:
    """The one document in `text`, or UserError naming `name` and the problem."""
    try:
        return _parse(text)
    except Exception as e:  # noqa: BLE001  (hostile input: whatever the parser raised)
        where, what = _describe(e)
        raise UserError(f"bad YAML in {name}{where}: {what}") from None


def decode_utf8(raw: bytes, name: str) -> str:
    """`raw` as text; UserError unless it is UTF-8 (a UTF-8 byte-order mark is dropped)."""
    for bom, encoding in _BOMS:
        if raw.startswith(bom):
            raise UserError(
                f"{name}: not UTF-8 text ({encoding} byte-order mark); save it as UTF-8"
            )
    if b"\x00" in raw:
        raise UserError(f"{name}: not UTF-8 text (NUL bytes: UTF-16, or a binary file?)")
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise UserError(
            f"{name}: not UTF-8 text (byte 0x{raw[e.start]:02x} at offset {e.start}); "
            "save it as UTF-8"
        ) from None


def read_bytes(path: Path, limit: int = MAX_BYTES) -> bytes:
    """At most `limit` bytes of a regular file; UserError when missing, unreadable or larger."""
    name = shown(str(path), quote=False)
    try:
        if not path.is_file():
            raise UserError(f"config file not found: {name}")
        with path.open("rb") as fh:
            raw = fh.read(limit + 1)
    except (OSError, ValueError) as e:  # ENAMETOOLONG, EACCES, EISDIR; ValueError: a NUL byte
        reason = getattr(e, "strerror", None) or str(e)
        raise UserError(f"cannot read config file {name}: {reason}") from None
    if len(raw) > limit:
        raise UserError(f"{name}: larger than {limit // 1024} KiB; a config file is a few KB")
    return raw


def load_yaml_file(path: str | Path) -> Any:
    """The one YAML document in the file at `path`, read under every limit of this module."""
    p = Path(path)
    name = shown(str(p), quote=False)
    return load_yaml_text(decode_utf8(read_bytes(p), name), name)

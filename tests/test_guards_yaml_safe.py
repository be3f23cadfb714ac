"""The YAML tags a config may use (`zerofit.config.yaml_safe`): the core ones, and nothing beside.

Branches: an explicit tag must be one of `_TAGS` (str, int, float, bool, null, seq, map of
``tag:yaml.org,2002:``) or the non-specific ``!``; the implicit resolvers lose timestamp, ``=``
(value) and yaml, so those stay strings while ints, floats, bools and nulls still resolve; a
mapping key must be a plain string. Each allowed tag loads as its type; each tag next to them (the
Python ones of full PyYAML, the other core ones, the core names under another prefix) is refused
with a line naming it, and a ``python/object/apply`` payload never runs.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from zerofit.config.yaml_safe import load_yaml_file, load_yaml_text
from zerofit.errors import UserError


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("a: !!str 5", {"a": "5"}),
        ("a: !!int 7", {"a": 7}),
        ("a: !!float 1", {"a": 1.0}),
        ("a: !!bool true", {"a": True}),
        ("a: !!null ''", {"a": None}),
        ("a: !!seq [1, x]", {"a": [1, "x"]}),
        ("a: !!map {b: 1}", {"a": {"b": 1}}),
        ("!!map {a: !!seq [!!str x]}", {"a": ["x"]}),
        ("a: !<tag:yaml.org,2002:str> 5", {"a": "5"}),  # the verbatim form of !!str
        ("a: ! x", {"a": "x"}),  # the non-specific tag
        ("a: ! [1]", {"a": [1]}),
    ],
)
def test_the_core_tags_load_as_their_types(text: str, want: object) -> None:
    got = load_yaml_text(text)
    assert got == want
    assert [type(v) for v in got.values()] == [type(v) for v in want.values()]


@pytest.mark.parametrize(
    "tag_text",
    [
        "!!python/object/apply:os.system ['touch MARKER']",
        "!!python/object/new:os.system ['touch MARKER']",
        "!!python/name:os.system",
        "!!python/module:os",
        "!!python/object:pathlib.PosixPath {}",
        "!!python/tuple [1]",
        "!!python/str x",
        "!!binary aGk=",
        "!!timestamp 2001-12-14",
        "!!set {a}",
        "!!omap [a: 1]",
        "!!pairs [a: 1]",
        "!!merge x",
        "!!value x",
        "!!yaml x",
        "!!strx 5",
        "!!string 5",
        "!!Str 5",
        "!<tag:yaml.org,2002:python/object/apply:os.system> ['touch MARKER']",
        "!<tag:yaml.org,2001:str> 5",
        "!<str> 5",
        "!str 5",
        "!custom x",
    ],
)
def test_a_tag_beside_the_core_ones_is_refused(tmp_path: Path, tag_text: str) -> None:
    marker = tmp_path / "PWNED"
    text = "a: " + tag_text.replace("MARKER", str(marker)) + "\n"
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(UserError, match=r"bad YAML in .*: the YAML tag .* is not supported"):
        load_yaml_file(path)
    assert not marker.exists()


def test_a_redefined_core_prefix_is_refused() -> None:
    """``%TAG !! other:`` makes ``!!str`` another tag: it is refused, not read as a string."""
    with pytest.raises(UserError, match=r"the YAML tag 'tag:evil.example,2000:str' is not"):
        load_yaml_text("%TAG !! tag:evil.example,2000:\n---\na: !!str 5\n")


@pytest.mark.parametrize(
    ("value", "want"),
    [
        ("2001-12-14", "2001-12-14"),  # timestamp: dropped, stays text
        ("2001-12-14t21:59:43.10-05:00", "2001-12-14t21:59:43.10-05:00"),
        ("=", "="),  # value: dropped
        ("5", 5),  # int, float, bool, null: still resolved
        ("0x10", 16),
        ("1.5e+3", 1500.0),
        (".inf", float("inf")),
        ("true", True),
        ("no", False),
        ("~", None),
        ("null", None),
        ("'5'", "5"),
        ("x", "x"),
    ],
)
def test_implicit_types_other_than_timestamps_and_values_resolve(value: str, want: object) -> None:
    got = load_yaml_text(f"a: {value}")["a"]
    assert got == want and type(got) is type(want)


@pytest.mark.parametrize(
    ("text", "what"),
    [
        ("1: x", "a key that is not text"),
        ("!!int 1: x", "a key that is not text"),
        ("null: 1", "a key that is not text"),
        ("true: 1", "a key that is not text"),
        ("[a]: 1", "a key that is not text"),
        ("? {a: 1}\n: b", "a key that is not text"),
        ("<<: {a: 1}", "a merge key (<<)"),
    ],
)
def test_keys_must_be_plain_names(text: str, what: str) -> None:
    with pytest.raises(UserError, match=re.escape(f"{what}: config keys are plain names")):
        load_yaml_text(text)


def test_text_keys_load() -> None:
    assert load_yaml_text("'1': x\n!!str 2: y\nz: 3") == {"1": "x", "2": "y", "z": 3}

"""Dotted paths into a DeepSpeed JSON, with DeepSpeed's two spellings of the ZeRO-3 keys.

DeepSpeed's `DeepSpeedZeroConfig` (runtime/zero/config.py) reads each ZeRO-3 key under its field
name and under an alias: `prefetch_bucket_size` or `stage3_prefetch_bucket_size`, and so on
(`ZERO3_ALIASES`; tests/test_ds_json_resolve.py checks the list against the installed DeepSpeed).
zerofit writes the `stage3_` spelling; a file's own spelling is kept, never written twice.
No deepspeed import here (`zerofit ds-config` runs without torch).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

MISSING: Any = object()  # a path the JSON does not hold
AUTO = "auto"  # HF Trainer's placeholder: "take this from the trainer's own config"

ZERO = "zero_optimization"
ZERO3_ALIASES: dict[str, str] = {  # DeepSpeed's alias (what zerofit writes) -> its field name
    f"stage3_{name}": name
    for name in (
        "prefetch_bucket_size",
        "param_persistence_threshold",
        "model_persistence_threshold",
        "max_live_parameters",
        "max_reuse_distance",
        "gather_16bit_weights_on_model_save",
        "module_granularity_threshold",
        "use_all_reduce_for_fetch_params",
        "allgather_sequential",
    )
}
_OTHER = {**ZERO3_ALIASES, **{v: k for k, v in ZERO3_ALIASES.items()}}


def spellings(parent: str, key: str) -> tuple[str, ...]:
    """The names `key` may have in the object at dotted `parent`: itself, and its ZeRO-3 alias."""
    if parent == ZERO and key in _OTHER:
        return (key, _OTHER[key])
    return (key,)


def spelled(node: Any, parent: str, key: str) -> str | None:
    """How the object `node` at `parent` spells `key` (None: it holds neither spelling)."""
    if not isinstance(node, dict):
        return None
    return next((name for name in spellings(parent, key) if name in node), None)


def locate(tree: dict[str, Any], dotted: str) -> str | None:
    """The dotted path as `tree` spells it, or None when `tree` does not hold it."""
    node: Any = tree
    path: list[str] = []
    for part in dotted.split("."):
        name = spelled(node, ".".join(path), part)
        if name is None:
            return None
        path.append(name)
        node = node[name]
    return ".".join(path)


def get(tree: dict[str, Any], dotted: str) -> Any:
    """The value at `dotted` in either spelling, or MISSING."""
    where = locate(tree, dotted)
    if where is None:
        return MISSING
    node: Any = tree
    for part in where.split("."):
        node = node[part]
    return node


def put(tree: dict[str, Any], dotted: str, value: Any) -> None:
    """Set `dotted` (creating objects on the way)."""
    *parents, leaf = dotted.split(".")
    for part in parents:
        tree = tree.setdefault(part, {})
    tree[leaf] = value


def leaves(tree: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """(dotted path, value) of every non-object value under `tree`."""
    if not isinstance(tree, dict):
        yield prefix, tree
        return
    for key, value in tree.items():
        yield from leaves(value, f"{prefix}.{key}" if prefix else str(key))


def both_spellings(tree: dict[str, Any]) -> list[tuple[str, str]]:
    """The ZeRO-3 keys `tree` gives under both spellings (DeepSpeed would read one of them)."""
    zero = tree.get(ZERO)
    if not isinstance(zero, dict):
        return []
    return [
        (alias, name) for alias, name in ZERO3_ALIASES.items() if alias in zero and name in zero
    ]


def shown(value: Any) -> str:
    """A JSON value as the file would spell it (true, [0.9, 0.95], "cpu"), kept short."""
    text = json.dumps(value, separators=(", ", ": "))
    return text if len(text) <= 80 else text[:77] + "..."

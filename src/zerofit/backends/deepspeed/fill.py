"""A user's DeepSpeed JSON completed from zerofit's own: "auto" replaced, what it leaves out added.

`fill_json(user, own)` keeps every value the user wrote, in the user's spelling, except:
- an "auto" at a path zerofit writes becomes zerofit's value (HF Trainer's convention; which
  zerofit field each path comes from is `ds_json.TABLE`, the HF rules are `user_json`);
- a path zerofit writes and the file leaves out is added, except inside the user's own optimizer
  block, which gets no key DeepSpeed did not find there (its params go to the optimizer's
  constructor: a key it does not take breaks it);
- a scheduler block is left out of what DeepSpeed gets: zerofit sets the learning rate of every
  step itself (`user_json` checks that the block asks for what zerofit's schedule does).
Each change is recorded, for the launcher's notes. No deepspeed import here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from zerofit.backends.deepspeed.json_paths import AUTO, leaves, spelled

USER_BLOCKS = ("optimizer",)  # blocks of the user's that zerofit never adds keys to
DROPPED = ("scheduler",)  # blocks zerofit stands in for (left out of DeepSpeed's JSON)


@dataclass
class Resolved:
    """The JSON DeepSpeed is initialised with, and what zerofit did to the user's file."""

    json: dict[str, Any]
    autos: list[tuple[str, Any]] = field(default_factory=list)  # "auto" -> zerofit's value
    filled: list[tuple[str, Any]] = field(default_factory=list)  # left out -> zerofit's value
    left_auto: list[str] = field(default_factory=list)  # "auto" zerofit has no value for
    dropped: list[str] = field(default_factory=list)  # blocks left out (DROPPED)


def fill_json(user: dict[str, Any], own: dict[str, Any]) -> Resolved:
    out = Resolved({})
    body = {k: v for k, v in user.items() if k not in DROPPED}
    out.dropped = [k for k in DROPPED if k in user]
    out.json = _merge(body, own, "", True, out)
    out.left_auto = [path for path, value in leaves(out.json) if value == AUTO]
    return out


def _merge(
    user: dict[str, Any], own: dict[str, Any], path: str, fill: bool, out: Resolved
) -> dict[str, Any]:
    result = dict(user)
    for key, mine in own.items():
        name = spelled(user, path, key)
        if name is None:
            if fill:
                result[key] = mine
                out.filled += list(leaves(mine, f"{path}.{key}" if path else key))
            continue
        theirs, where = user[name], f"{path}.{name}" if path else name
        if isinstance(mine, dict) and isinstance(theirs, dict):
            result[name] = _merge(theirs, mine, where, fill and where not in USER_BLOCKS, out)
        elif isinstance(theirs, str) and theirs == AUTO:
            result[name] = mine
            out.autos.append((where, mine))
    return result

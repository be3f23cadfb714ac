"""What each fine-tuning format's records hold, read into what the renderers take.

- ``chat``: ``messages``: a list of ``{role, content}`` (more keys pass through to the template).
- ``sharegpt``: ``conversations``: a list of ``{from, value}`` with roles ``human``, ``gpt``,
  ``system`` (and ``user``, ``assistant``), and an optional top-level ``system`` string; it becomes
  a chat. A role outside the map (``tool``, ``observation``, ``function_call``, ...) is an error
  until ``data.roles`` maps it.
- ``alpaca``: ``instruction``, optional ``input`` and ``system``, and ``output``. The user's turn is
  the instruction, then, when the input is not empty, a blank line (``"\\n\\n"``) and the input.
  With a chat template it is a chat (system, user, assistant = output); without one, plain text:
  ``system + "\\n\\n"`` (if any), the user's turn and ``"\\n\\n"`` are the prompt, the output the
  completion.
- ``preference``: ``prompt``, ``chosen`` and ``rejected``, as strings or chat turns (or ``chosen``
  and ``rejected`` alone, whole conversations sharing their prompt); see ``zerofit.data.pairs``.

``data.roles`` maps a record's role names to the template's (``{bot: assistant}``); for chat it
only renames the roles it names. ``data.columns`` renames fields: ``{the format's name: the
records'}`` (``{conversations: dialog, from: speaker}``); see ``field_names``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from zerofit.config.limits import shown
from zerofit.errors import UserError

SAMPLE_FORMATS = ("prompt_completion", "chat", "sharegpt", "alpaca")
SHAREGPT_ROLES = {
    "human": "user",
    "gpt": "assistant",
    "system": "system",
    "user": "user",
    "assistant": "assistant",
}
# The record fields the renderers read, by key: their names in the common files (data.columns
# renames them, by these names or by the key itself).
_BASE = {
    "prompt": "prompt",
    "completion": "completion",
    "messages": "messages",
    "role": "role",
    "content": "content",
    "instruction": "instruction",
    "input": "input",
    "output": "output",
    "system": "system",
    "chosen": "chosen",
    "rejected": "rejected",
}
_FORMAT_NAMES = {"sharegpt": {"messages": "conversations", "role": "from", "content": "value"}}
COLUMN_NAMES = frozenset([*_BASE, *_FORMAT_NAMES["sharegpt"].values()])
_OPTION_KEYS = {
    "prompt": "prompt_field",
    "completion": "completion_field",
    "messages": "messages_field",
    "chosen": "chosen_field",
    "rejected": "rejected_field",
}


def default_names(fmt: str) -> dict[str, str]:
    """Key -> the field name a format reads when nothing renames it."""
    return {**_BASE, **_FORMAT_NAMES.get(fmt, {})}


def field_names(
    fmt: str, columns: Mapping[str, str] | None = None, **given: str | None
) -> dict[str, str]:
    """The record fields a format reads: its defaults, then ``given`` (data.prompt_field,
    completion_field, messages_field, chosen_field, rejected_field: None keeps the default), then ``columns`` (data.columns:
    {the format's field name, or the key: the name in the records})."""
    unknown = sorted(set(columns or {}) - COLUMN_NAMES)
    if unknown:
        raise UserError(
            f"data.columns: {shown(unknown[0])} is not a field name zerofit reads (it reads "
            f"{', '.join(sorted(COLUMN_NAMES))})"
        )
    names = default_names(fmt)
    names.update({k: v for k, v in given.items() if v is not None})
    for key, default in default_names(fmt).items():
        renamed = (columns or {}).get(default, (columns or {}).get(key))
        if renamed is not None:
            names[key] = renamed
    return names


def config_key(fmt: str, key: str) -> str:
    """The config key that names a record field, for an error line."""
    if key in _OPTION_KEYS:
        return f"data.{_OPTION_KEYS[key]}"
    return f"data.columns.{default_names(fmt)[key]}"


def guess_format(obj: dict[str, Any]) -> str | None:
    """The format a record looks like, to name in an error line."""
    if "chosen" in obj and "rejected" in obj:
        return "preference"
    if isinstance(obj.get("conversations"), list):
        return "sharegpt"
    if "instruction" in obj and "output" in obj:
        return "alpaca"
    if isinstance(obj.get("messages"), list):
        return "chat"
    if "prompt" in obj and "completion" in obj:
        return "prompt_completion"
    return "text" if "text" in obj else None


def missing(obj: dict[str, Any], fmt: str, key: str, field: str, where: str) -> UserError:
    """No ``field`` in this record: name its fields, the config key, and the format it looks like."""
    has = ", ".join(str(k) for k in list(obj)[:8]) + (", ..." if len(obj) > 8 else "")
    line = f"{where}: no field {field!r} in this record (it has: {shown(has, quote=False)})"
    guess = guess_format(obj)
    if guess is not None and guess != fmt:
        return UserError(f"{line}; it looks like data.format={guess} (data.format is {fmt})")
    return UserError(f"{line}; set {config_key(fmt, key)} to the field that holds it")


def text(
    obj: dict[str, Any], fmt: str, fields: Mapping[str, str], key: str, where: str, optional: bool
) -> str:
    """A string field ('' for an optional one that is missing or null)."""
    field = fields[key]
    value = obj.get(field)
    if value is None:
        if optional:
            return ""
        raise missing(obj, fmt, key, field, where)
    if not isinstance(value, str):
        raise UserError(f"{where}: field {field!r} is not a string ({config_key(fmt, key)})")
    return value


def role_map(fmt: str, roles: Mapping[str, str] | None) -> dict[str, str] | None:
    """A record's role name -> the template's; None: names pass as they are (chat, no map)."""
    if fmt == "sharegpt":
        return {**SHAREGPT_ROLES, **(roles or {})}
    return dict(roles) if roles else None


def _unknown_role(role: Any, i: int, fmt: str, known: Mapping[str, str], where: str) -> UserError:
    name = shown(role, quote=False, limit=40)
    return UserError(
        f"{where}: message {i} has role {shown(role, limit=40)}, which data.format={fmt} does not "
        f"map (it maps {', '.join(known)}); map it with data.roles.{name}: user, assistant, system "
        "or a role your chat template renders (e.g. tool)"
    )


def conversation(
    obj: dict[str, Any],
    where: str,
    fmt: str,
    fields: Mapping[str, str],
    roles: Mapping[str, str] | None,
) -> list[dict[str, Any]]:
    """A chat or ShareGPT record's turns as ``{role, content}`` messages, roles mapped."""
    key, rf, cf = fields["messages"], fields["role"], fields["content"]
    if key not in obj:
        raise missing(obj, fmt, "messages", key, where)
    turns = obj[key]
    if not isinstance(turns, list) or not turns:
        raise UserError(f"{where}: field {key!r} must be a non-empty list of messages")
    mapping = role_map(fmt, roles)
    out: list[dict[str, Any]] = []
    for i, m in enumerate(turns):
        if not isinstance(m, dict) or not isinstance(m.get(rf), str) or cf not in m:
            raise UserError(f"{where}: message {i} must be an object with {rf!r} and {cf!r}")
        role = m[rf]
        if mapping is not None and fmt != "chat" and role not in mapping:
            raise _unknown_role(role, i, fmt, mapping, where)
        rest = {k: v for k, v in m.items() if k not in (rf, cf)}
        out.append({**rest, "role": (mapping or {}).get(role, role), "content": m[cf]})
    system = text(obj, fmt, fields, "system", where, True) if fmt == "sharegpt" else ""
    if system and out[0]["role"] != "system":
        out.insert(0, {"role": "system", "content": system})
    return out


def check_learns(messages: list[dict[str, Any]], fmt: str, where: str) -> None:
    """train_on=completion: a conversation must have an assistant turn to learn from."""
    if any(m["role"] == "assistant" for m in messages):
        return
    seen = ", ".join(dict.fromkeys(str(m["role"]) for m in messages))
    raise UserError(
        f"{where}: no assistant turn: nothing to learn (roles: {shown(seen, quote=False)}); map "
        f"the answering role with data.roles.<role>: assistant (data.format={fmt}), or set "
        "data.train_on=all to learn every token"
    )


def alpaca_parts(
    obj: dict[str, Any], where: str, fields: Mapping[str, str]
) -> tuple[str, str, str]:
    """(system, user turn, output) of an Alpaca record (see the module doc)."""
    instruction = text(obj, "alpaca", fields, "instruction", where, False)
    extra = text(obj, "alpaca", fields, "input", where, True)
    output = text(obj, "alpaca", fields, "output", where, False)
    system = text(obj, "alpaca", fields, "system", where, True)
    return system, instruction + ("\n\n" + extra if extra else ""), output


def alpaca_messages(system: str, user: str, output: str) -> list[dict[str, Any]]:
    head = [{"role": "system", "content": system}] if system else []
    return [*head, {"role": "user", "content": user}, {"role": "assistant", "content": output}]


def alpaca_prompt(system: str, user: str) -> str:
    """Without a chat template: the prompt text before the output."""
    return (system + "\n\n" if system else "") + user + "\n\n"

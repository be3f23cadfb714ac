"""Fine-tuning samples: a record rendered to token ids and the mask of the tokens the loss falls on.

- ``prompt_completion``: prompt ids + completion ids + the tokenizer's end token; with
  ``train_on=completion`` the loss falls on the completion and its end token.
- ``chat``: ``messages`` rendered with the tokenizer folder's chat template; the ids are exactly
  ``tokenizer.apply_chat_template(messages, tokenize=True)``'s. With ``train_on=completion`` the
  loss falls on each assistant turn as the template renders it after its header: the content and
  the end-of-turn token(s), not the role header. The turns are found by rendering prefixes of the
  conversation (``messages[:i]`` with the generation prompt, and ``messages[:i+1]``), checking each
  is a prefix of the whole rendering, and marking the tokens whose characters overlap the turn's
  span (the fast tokenizer's offset mapping).

A sample's ``mask[j]`` says whether token ``j`` is a loss target (predicted from tokens ``< j``).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from zerofit.data.sources import Record, field_text
from zerofit.data.tokenizers import AnyTokenizer
from zerofit.errors import UserError
from zerofit.limits import shown


@dataclass
class Sample:
    ids: np.ndarray  # [L] int32
    mask: np.ndarray  # [L] bool: token j is a loss target
    where: str  # file:line of its record


def prompt_completion_sample(
    tok: AnyTokenizer, obj: dict[str, Any], where: str, fields: tuple[str, str], train_on: str
) -> Sample:
    """prompt + completion + end token; no BOS is added."""
    prompt = tok.encode(field_text(obj, fields[0], where))
    completion = tok.encode(field_text(obj, fields[1], where))
    end = [] if tok.end_id is None else [tok.end_id]
    ids = np.concatenate([prompt, completion, np.asarray(end, dtype=np.int32)])
    mask = np.ones(len(ids), dtype=bool)
    if train_on == "completion":
        mask[: len(prompt)] = False
    return Sample(ids.astype(np.int32), mask, where)


def _messages(obj: dict[str, Any], field: str, where: str) -> list[dict[str, Any]]:
    if field not in obj:
        raise UserError(f"{where}: no field {field!r} in this record")
    messages = obj[field]
    if not isinstance(messages, list) or not messages:
        raise UserError(f"{where}: field {field!r} must be a non-empty list of messages")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or "content" not in m:
            raise UserError(f"{where}: message {i} must be an object with 'role' and 'content'")
    return messages


class ChatRenderer:
    """Renders conversations with a tokenizer folder's chat template (see the module doc)."""

    def __init__(self, tok: AnyTokenizer, spec: str) -> None:
        hf = getattr(tok, "hf", None)
        if hf is None or not tok.chat_template:
            what = (
                "is not a folder"
                if hf is None
                else "has none (add chat_template to its tokenizer_config.json)"
            )
            raise UserError(
                f"data.format=chat needs a tokenizer folder with a chat template; data.tokenizer "
                f"{shown(spec, quote=False)} {what}"
            )
        if not getattr(hf, "is_fast", False):
            raise UserError(f"data.format=chat needs a fast tokenizer; {spec} is not one")
        self.hf = hf

    def render(self, messages: list[dict[str, Any]], where: str, generation: bool = False) -> str:
        try:
            return self.hf.apply_chat_template(
                messages, tokenize=False, add_generation_prompt=generation
            )
        except Exception as e:  # jinja2 TemplateError (raise_exception), TypeError, ...
            raise UserError(
                f"{where}: the chat template refused this conversation: {shown(e, quote=False)}"
            ) from None

    def assistant_spans(
        self, messages: list[dict[str, Any]], full: str, where: str
    ) -> list[tuple[int, int]]:
        """Character spans of the assistant turns in ``full`` (content + end of turn)."""
        spans = []
        for i, m in enumerate(messages):
            if m["role"] != "assistant":
                continue
            head = self._head(messages[:i], where)
            turn = self.render(messages[: i + 1], where)
            if not (full.startswith(head) and full.startswith(turn) and len(head) <= len(turn)):
                raise UserError(
                    f"{where}: the chat template does not render this conversation turn by turn "
                    f"(message {i} changes what came before it); use data.train_on=all"
                )
            spans.append((len(head), len(turn)))
        return spans

    def _head(self, before: list[dict[str, Any]], where: str) -> str:
        """What precedes an assistant turn: the conversation so far and the assistant header."""
        if before:
            return self.render(before, where, generation=True)
        try:  # an assistant turn first: some templates cannot render an empty conversation
            return self.render([], where, generation=True)
        except UserError:
            return ""

    def sample(self, obj: dict[str, Any], where: str, field: str, train_on: str) -> Sample:
        messages = _messages(obj, field, where)
        full = self.render(messages, where)
        enc = self.hf(full, add_special_tokens=False, return_offsets_mapping=True)
        ids = np.asarray(enc["input_ids"], dtype=np.int32)
        if train_on == "all":
            return Sample(ids, np.ones(len(ids), dtype=bool), where)
        offsets = np.asarray(enc["offset_mapping"], dtype=np.int64).reshape(-1, 2)
        mask = np.zeros(len(ids), dtype=bool)
        for lo, hi in self.assistant_spans(messages, full, where):
            mask |= (offsets[:, 0] < hi) & (np.maximum(offsets[:, 1], offsets[:, 0] + 1) > lo)
        return Sample(ids, mask, where)


def render_samples(
    records: Iterable[Record],
    tok: AnyTokenizer,
    fmt: str,
    fields: dict[str, str],
    train_on: str,
    spec: str,
    max_tokens: int | None = None,
) -> Iterator[Sample]:
    """The records' samples, until ``max_tokens`` tokens have been read."""
    if fmt == "chat":
        renderer = ChatRenderer(tok, spec)
    total = 0
    for obj, where in records:
        if fmt == "chat":
            s = renderer.sample(obj, where, fields["messages"], train_on)
        else:
            pair = (fields["prompt"], fields["completion"])
            s = prompt_completion_sample(tok, obj, where, pair, train_on)
        yield s
        total += len(s.ids)
        if max_tokens is not None and total >= max_tokens:
            return

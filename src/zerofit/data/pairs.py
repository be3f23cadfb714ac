"""Preference pairs (``data.format: preference``): a record rendered to two documents, the prompt
followed by the chosen response and by the rejected one, each with the mask of its loss tokens.

Records follow TRL's conventions (field names: ``data.prompt_field``, ``chosen_field``,
``rejected_field``, and ``data.columns``):

- standard: ``{"prompt": str, "chosen": str, "rejected": str}``: plain text, as
  ``prompt_completion`` renders it (even with a chat template): prompt ids + response ids + the end
  token; the loss on the response and its end token.
- conversational: ``prompt`` a list of chat messages, ``chosen`` / ``rejected`` lists of
  (assistant) messages; each document is ``prompt + response`` rendered with the chat template
  (``zerofit.data.samples.ChatRenderer``); the loss on the response's assistant turns (content and
  end of turn, not the header), never on an assistant turn of the prompt. A string prompt with
  message-list responses is one user turn; a string response with a message-list prompt is one
  assistant turn. ``data.roles`` renames roles as for ``chat``.
- implicit prompt (Anthropic HH): no prompt field, ``chosen`` and ``rejected`` whole conversations
  (message lists) sharing a prefix: the prompt is their longest common prefix of messages (but
  never all of either), the rest of each is its response.

With ``train_on=all`` the loss falls on every token of each document (the prompt's log-probs are
the same in both and cancel in the DPO margin). A missing field, a response that is empty or (with
``train_on=completion``) has no assistant turn, or a value of the wrong type is a UserError naming
the record's file:line. Identical chosen and rejected responses are kept (counted: they teach
nothing).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

import zerofit.data.formats as formats
from zerofit.config.limits import shown
from zerofit.data.samples import ChatRenderer, Sample, until_tokens
from zerofit.data.sources import Record
from zerofit.data.tokenizers import AnyTokenizer
from zerofit.errors import UserError

FORMAT = "preference"
Messages = list[dict[str, Any]]
Part = str | Messages  # a prompt or a response: plain text or chat messages


@dataclass
class Pair:
    """The two documents of a preference record: ``chosen`` and ``rejected``, each the prompt's
    tokens (the first ``*_prompt`` ids) followed by the response's."""

    chosen: Sample
    rejected: Sample
    chosen_prompt: int  # leading tokens of chosen.ids that are the prompt
    rejected_prompt: int
    where: str

    @property
    def tokens(self) -> int:
        return len(self.chosen.ids) + len(self.rejected.ids)

    @property
    def places(self) -> int:
        """Row places the pair takes: a document of L tokens takes L - 1."""
        return self.tokens - 2

    @property
    def identical(self) -> bool:
        return np.array_equal(self.chosen.ids, self.rejected.ids)


def _response(obj: dict[str, Any], fields: Mapping[str, str], key: str, where: str) -> Part:
    field = fields[key]
    value = obj.get(field)
    if value is None:
        raise formats.missing(obj, FORMAT, key, field, where)
    if isinstance(value, str):
        if not value.strip():
            raise UserError(f"{where}: field {field!r} is empty: a pair needs two responses")
        return value
    if isinstance(value, list):
        if not value:
            raise UserError(
                f"{where}: field {field!r} is an empty list: a pair needs two responses"
            )
        return value
    raise UserError(
        f"{where}: field {field!r} must be a string or a list of messages, not "
        f"{type(value).__name__} ({formats.config_key(FORMAT, key)})"
    )


def record_parts(
    obj: dict[str, Any], where: str, fields: Mapping[str, str]
) -> tuple[Part | None, Part, Part]:
    """(prompt, chosen, rejected) as the record holds them; prompt None: implicit."""
    chosen = _response(obj, fields, "chosen", where)
    rejected = _response(obj, fields, "rejected", where)
    prompt = obj.get(fields["prompt"])
    if prompt is None:
        if isinstance(chosen, list) and isinstance(rejected, list):
            return None, chosen, rejected
        has = ", ".join(str(k) for k in list(obj)[:8])
        raise UserError(
            f"{where}: no field {fields['prompt']!r} in this record (it has: "
            f"{shown(has, quote=False)}); set {formats.config_key(FORMAT, 'prompt')} to the field "
            "that holds it (without a prompt, chosen and rejected must be whole conversations: "
            "lists of messages sharing their first turns)"
        )
    if not isinstance(prompt, str | list):
        raise UserError(
            f"{where}: field {fields['prompt']!r} must be a string or a list of messages, not "
            f"{type(prompt).__name__} ({formats.config_key(FORMAT, 'prompt')})"
        )
    return prompt, chosen, rejected


def _messages(
    value: Part,
    role: str,
    field: str,
    where: str,
    fields: Mapping[str, str],
    roles: Mapping[str, str] | None,
) -> Messages:
    """A part as chat messages: a string is one turn of ``role``; a list is read as a chat's
    messages (``data.roles`` renames, ``data.columns`` names role and content)."""
    if isinstance(value, str):
        return [{"role": role, "content": value}]
    if not value:
        return []
    names = {**fields, "messages": field}
    return formats.conversation({field: value}, f"{where} ({field})", "chat", names, roles)


def common_prefix(chosen: Messages, rejected: Messages) -> int:
    """Messages the two conversations share at their start, leaving each at least one."""
    n = min(len(chosen), len(rejected)) - 1
    k = 0
    while k < n and chosen[k] == rejected[k]:
        k += 1
    return k


def _check_response(messages: Messages, field: str, where: str) -> None:
    if all(isinstance(m.get("content"), str) and not m["content"].strip() for m in messages):
        raise UserError(f"{where}: field {field!r} is empty: a pair needs two responses")


def chat_parts(
    parts: tuple[Part | None, Part, Part],
    where: str,
    fields: Mapping[str, str],
    roles: Mapping[str, str] | None,
) -> tuple[Messages, Messages, Messages]:
    """(prompt, chosen, rejected) as chat messages; an implicit prompt split off."""
    prompt, chosen, rejected = parts
    c = _messages(chosen, "assistant", fields["chosen"], where, fields, roles)
    r = _messages(rejected, "assistant", fields["rejected"], where, fields, roles)
    if prompt is None:
        k = common_prefix(c, r)
        p, c, r = c[:k], c[k:], r[k:]
    else:
        p = _messages(prompt, "user", fields["prompt"], where, fields, roles)
    _check_response(c, fields["chosen"], where)
    _check_response(r, fields["rejected"], where)
    return p, c, r


class PairRenderer:
    """Records to ``Pair``s (see the module doc); the chat template is loaded at the first
    conversational record."""

    def __init__(
        self,
        tok: AnyTokenizer,
        fields: Mapping[str, str],
        train_on: str,
        spec: str,
        roles: Mapping[str, str] | None = None,
    ) -> None:
        self.tok, self.fields, self.train_on, self.spec = tok, fields, train_on, spec
        self.roles = dict(roles) if roles else None
        self._chat: ChatRenderer | None = None

    def __call__(self, obj: dict[str, Any], where: str) -> Pair:
        prompt, chosen, rejected = record_parts(obj, where, self.fields)
        if isinstance(prompt, str) and isinstance(chosen, str) and isinstance(rejected, str):
            return self.text_pair(prompt, chosen, rejected, where)
        p, c, r = chat_parts((prompt, chosen, rejected), where, self.fields, self.roles)
        c_doc, c_prompt = self.chat_doc(p, c, where)
        r_doc, r_prompt = self.chat_doc(p, r, where)
        return Pair(c_doc, r_doc, c_prompt, r_prompt, where)

    def text_pair(self, prompt: str, chosen: str, rejected: str, where: str) -> Pair:
        """prompt ids + response ids + end token, as ``prompt_completion`` renders them."""
        p = self.tok.encode(prompt)
        end = np.asarray([] if self.tok.end_id is None else [self.tok.end_id], dtype=np.int32)

        def doc(response: str) -> Sample:
            ids = np.concatenate([p, self.tok.encode(response), end]).astype(np.int32)
            mask = np.ones(len(ids), dtype=bool)
            if self.train_on == "completion":
                mask[: len(p)] = False
            return Sample(ids, mask, where)

        return Pair(doc(chosen), doc(rejected), len(p), len(p), where)

    def chat_doc(self, prompt: Messages, response: Messages, where: str) -> tuple[Sample, int]:
        """``prompt + response`` rendered; the loss on the response's assistant turns. Also the
        prompt's tokens: those starting before the response (after the assistant header)."""
        chat = self.chat(where)
        messages = [*prompt, *response]
        full = chat.render(messages, where)
        ids, offsets = chat.encode(full)
        mask = chat.loss_mask(messages, full, offsets, where, self.train_on, len(prompt))
        head = chat.head(prompt, where) if prompt else ""
        if not full.startswith(head):
            raise UserError(
                f"{where}: the chat template does not render the prompt as the start of the "
                "conversation; it cannot be split into prompt and response"
            )
        return Sample(ids, mask, where), int((offsets[:, 0] < len(head)).sum())

    def chat(self, where: str) -> ChatRenderer:
        if self._chat is None:
            try:
                self._chat = ChatRenderer(self.tok, self.spec, FORMAT)
            except UserError as e:
                raise UserError(f"{where}: a conversational pair: {e}") from None
        return self._chat


def render_pairs(
    records: Iterable[Record],
    tok: AnyTokenizer,
    fields: Mapping[str, str],
    train_on: str,
    spec: str,
    max_tokens: int | None = None,
    roles: Mapping[str, str] | None = None,
) -> Iterator[Pair]:
    """The records' pairs, until ``max_tokens`` tokens (both documents) have been read.
    ``fields``: ``formats.field_names("preference", ...)``."""
    make: Callable[[dict[str, Any], str], Pair] = PairRenderer(tok, fields, train_on, spec, roles)
    yield from until_tokens(
        (make(obj, where) for obj, where in records), max_tokens, lambda p: p.tokens
    )

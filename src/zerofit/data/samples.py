"""Fine-tuning samples: a record rendered to token ids and the mask of the tokens the loss falls on.

- ``prompt_completion``: prompt ids + completion ids + the tokenizer's end token; with
  ``train_on=completion`` the loss falls on the completion and its end token.
- ``chat``: ``messages`` rendered with the tokenizer folder's chat template; the ids are exactly
  ``tokenizer.apply_chat_template(messages, tokenize=True)``'s. With ``train_on=completion`` the
  loss falls on each assistant turn as the template renders it after its header: the content and
  the end-of-turn token(s), not the role header. The turns are found by rendering prefixes of the
  conversation (``messages[:i]`` with the generation prompt, and ``messages[:i+1]``), checking each
  is a prefix of the whole rendering, and marking the tokens whose characters overlap the turn's
  span (the fast tokenizer's offset mapping). A conversation without an assistant turn is an error
  (nothing to learn), as is a role the template refuses.
- ``sharegpt``: read as a chat (``zerofit.data.formats``: fields and the role map).
- ``alpaca``: a chat (system, user, assistant) when the tokenizer is a fast tokenizer folder with a
  chat template, else prompt + completion (see ``zerofit.data.formats`` for the joining).

A sample's ``mask[j]`` says whether token ``j`` is a loss target (predicted from tokens ``< j``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

import zerofit.data.formats as formats
from zerofit.config.limits import shown
from zerofit.data.sources import Record
from zerofit.data.tokenizers import AnyTokenizer
from zerofit.errors import UserError


@dataclass
class Sample:
    ids: np.ndarray  # [L] int32
    mask: np.ndarray  # [L] bool: token j is a loss target
    where: str  # file:line of its record


def text_sample(
    tok: AnyTokenizer, prompt: str, completion: str, where: str, train_on: str
) -> Sample:
    """prompt + completion + end token; no BOS is added."""
    p = tok.encode(prompt)
    end = [] if tok.end_id is None else [tok.end_id]
    ids = np.concatenate([p, tok.encode(completion), np.asarray(end, dtype=np.int32)])
    mask = np.ones(len(ids), dtype=bool)
    if train_on == "completion":
        mask[: len(p)] = False
    return Sample(ids.astype(np.int32), mask, where)


def prompt_completion_sample(
    tok: AnyTokenizer, obj: dict[str, Any], where: str, fields: tuple[str, str], train_on: str
) -> Sample:
    """prompt + completion + end token; no BOS is added."""
    names = {"prompt": fields[0], "completion": fields[1]}
    prompt = formats.text(obj, "prompt_completion", names, "prompt", where, False)
    completion = formats.text(obj, "prompt_completion", names, "completion", where, False)
    return text_sample(tok, prompt, completion, where, train_on)


def has_chat_template(tok: AnyTokenizer) -> bool:
    """A fast tokenizer folder with a chat template (alpaca renders as a chat with it)."""
    hf = getattr(tok, "hf", None)
    return hf is not None and bool(tok.chat_template) and bool(getattr(hf, "is_fast", False))


class ChatRenderer:
    """Renders conversations with a tokenizer folder's chat template (see the module doc)."""

    def __init__(self, tok: AnyTokenizer, spec: str, fmt: str = "chat") -> None:
        hf = getattr(tok, "hf", None)
        if hf is None or not tok.chat_template:
            what = (
                "is not a folder"
                if hf is None
                else "has none (add chat_template to its tokenizer_config.json)"
            )
            raise UserError(
                f"data.format={fmt} needs a tokenizer folder with a chat template; data.tokenizer "
                f"{shown(spec, quote=False)} {what}"
            )
        if not getattr(hf, "is_fast", False):
            raise UserError(f"data.format={fmt} needs a fast tokenizer; {spec} is not one")
        self.hf, self.fmt = hf, fmt

    def render(self, messages: list[dict[str, Any]], where: str, generation: bool = False) -> str:
        try:
            return self.hf.apply_chat_template(
                messages, tokenize=False, add_generation_prompt=generation
            )
        except Exception as e:  # jinja2 TemplateError (raise_exception), TypeError, ...
            roles = ", ".join(dict.fromkeys(str(m.get("role")) for m in messages))
            raise UserError(
                f"{where}: the chat template refused this conversation: {shown(e, quote=False)} "
                f"(roles: {shown(roles, quote=False)}); a role it cannot render can be mapped "
                "with data.roles.<role>: user, assistant or system"
            ) from None

    def assistant_spans(
        self, messages: list[dict[str, Any]], full: str, where: str, first: int = 0
    ) -> list[tuple[int, int]]:
        """Character spans of the assistant turns in ``full`` (content + end of turn), from
        message ``first`` on."""
        spans = []
        for i, m in enumerate(messages):
            if m["role"] != "assistant" or i < first:
                continue
            head = self.head(messages[:i], where)
            turn = self.render(messages[: i + 1], where)
            if not (full.startswith(head) and full.startswith(turn) and len(head) <= len(turn)):
                raise UserError(
                    f"{where}: the chat template does not render this conversation turn by turn "
                    f"(message {i} changes what came before it); use data.train_on=all"
                )
            spans.append((len(head), len(turn)))
        return spans

    def head(self, before: list[dict[str, Any]], where: str) -> str:
        """What precedes an assistant turn: the conversation so far and the assistant header."""
        if before:
            return self.render(before, where, generation=True)
        try:  # an assistant turn first: some templates cannot render an empty conversation
            return self.render([], where, generation=True)
        except UserError:
            return ""

    def sample(self, obj: dict[str, Any], where: str, field: str, train_on: str) -> Sample:
        """A chat record (``field``: its messages)."""
        names = formats.field_names("chat", messages=field)
        messages = formats.conversation(obj, where, "chat", names, None)
        return self.sample_messages(messages, where, train_on)

    def encode(self, full: str) -> tuple[np.ndarray, np.ndarray]:
        """A rendering's ids [L] (int32) and each token's character span [L, 2]."""
        enc = self.hf(full, add_special_tokens=False, return_offsets_mapping=True)
        offsets = np.asarray(enc["offset_mapping"], dtype=np.int64).reshape(-1, 2)
        return np.asarray(enc["input_ids"], dtype=np.int32), offsets

    def sample_messages(self, messages: list[dict[str, Any]], where: str, train_on: str) -> Sample:
        """A conversation's ids, and its assistant turns as the mask (train_on=completion)."""
        full = self.render(messages, where)
        ids, offsets = self.encode(full)
        return Sample(ids, self.loss_mask(messages, full, offsets, where, train_on), where)

    def loss_mask(
        self,
        messages: list[dict[str, Any]],
        full: str,
        offsets: np.ndarray,
        where: str,
        train_on: str,
        first: int = 0,
    ) -> np.ndarray:
        """The tokens of ``full`` (by ``offsets``) the loss falls on: every one (train_on=all),
        else those of the assistant turns from message ``first`` on."""
        if train_on == "all":
            return np.ones(len(offsets), dtype=bool)
        formats.check_learns(messages[first:], self.fmt, where)
        mask = np.zeros(len(offsets), dtype=bool)
        for lo, hi in self.assistant_spans(messages, full, where, first):
            mask |= (offsets[:, 0] < hi) & (np.maximum(offsets[:, 1], offsets[:, 0] + 1) > lo)
        return mask


Sampler = Callable[[dict[str, Any], str], Sample]


def sampler(
    tok: AnyTokenizer,
    fmt: str,
    fields: Mapping[str, str],
    train_on: str,
    spec: str,
    roles: Mapping[str, str] | None = None,
) -> Sampler:
    """(record, where) -> Sample for a fine-tuning format (``fields``: see formats.field_names)."""
    names = formats.field_names(fmt, **fields)
    if fmt in ("chat", "sharegpt"):
        chat = ChatRenderer(tok, spec, fmt)
        return lambda obj, where: chat.sample_messages(
            formats.conversation(obj, where, fmt, names, roles), where, train_on
        )
    if fmt == "alpaca" and has_chat_template(tok):
        alpaca = ChatRenderer(tok, spec, fmt)
        return lambda obj, where: alpaca.sample_messages(
            formats.alpaca_messages(*formats.alpaca_parts(obj, where, names)), where, train_on
        )
    if fmt == "alpaca":

        def plain(obj: dict[str, Any], where: str) -> Sample:
            system, user, output = formats.alpaca_parts(obj, where, names)
            return text_sample(tok, formats.alpaca_prompt(system, user), output, where, train_on)

        return plain
    if fmt == "prompt_completion":
        pair = (names["prompt"], names["completion"])
        return lambda obj, where: prompt_completion_sample(tok, obj, where, pair, train_on)
    raise UserError(f"data.format={shown(fmt)} holds no fine-tuning samples")


def render_samples(
    records: Iterable[Record],
    tok: AnyTokenizer,
    fmt: str,
    fields: Mapping[str, str],
    train_on: str,
    spec: str,
    max_tokens: int | None = None,
    roles: Mapping[str, str] | None = None,
) -> Iterator[Sample]:
    """The records' samples, until ``max_tokens`` tokens have been read."""
    make = sampler(tok, fmt, fields, train_on, spec, roles)
    yield from until_tokens(
        (make(obj, where) for obj, where in records), max_tokens, lambda s: len(s.ids)
    )


T = TypeVar("T")


def until_tokens(
    items: Iterable[T], max_tokens: int | None, size: Callable[[T], int]
) -> Iterator[T]:
    """`items` (samples, pairs) until ``max_tokens`` tokens (``size`` of each) have gone by, the
    item that reaches it included."""
    total = 0
    for item in items:
        yield item
        total += size(item)
        if max_tokens is not None and total >= max_tokens:
            return

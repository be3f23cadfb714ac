"""The loss mask of fine-tuning samples (`zerofit.data.samples`): which tokens a model learns.

prompt + completion: the prompt masked out, the completion and its end token in (all of them
with train_on=all). Chat: exactly the assistant turns' content and end-of-turn tokens, for a turn
at the start of the conversation too, and a template that does not render turn by turn is refused rather than masked wrongly.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from sft_helpers import CHATML, make_tokenizer

from zerofit.data import ByteTokenizer, ChatRenderer, load_tokenizer
from zerofit.data.samples import text_sample
from zerofit.errors import UserError

# Not turn by turn: the number of messages comes first, so each prefix renders differently.
COUNTED = "{{ messages | length }}" + CHATML


class NoEnd(ByteTokenizer):
    end_id = None


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tokenizer(tmp_path_factory.mktemp("tok") / "chatml", CHATML)


def renderer(folder: Path, template: str = CHATML) -> ChatRenderer:
    tok = load_tokenizer(str(folder))
    r = ChatRenderer(tok, str(folder))
    r.hf.chat_template = template  # the same tokenizer, another template
    return r


def learned(r: ChatRenderer, ids: np.ndarray, mask: np.ndarray) -> list[str]:
    """The text of each run of masked-in tokens."""
    runs, start = [], None
    for i, m in enumerate([*mask.tolist(), False]):
        if m and start is None:
            start = i
        elif not m and start is not None:
            runs.append(r.hf.decode(ids[start:i].tolist()))
            start = None
    return runs


# ----------------------------------------------------------------------------- prompt + completion


def test_the_prompt_is_masked_out_the_completion_and_end_token_in() -> None:
    s = text_sample(ByteTokenizer(), "ab", "cde", "f:3", "completion")
    assert s.ids.tolist() == [97, 98, 99, 100, 101, 256]
    assert s.mask.tolist() == [False, False, True, True, True, True]
    assert s.ids.dtype == np.int32 and s.mask.dtype == bool and s.where == "f:3"


def test_train_on_all_learns_the_prompt_too() -> None:
    s = text_sample(ByteTokenizer(), "ab", "c", "f:1", "all")
    assert s.mask.tolist() == [True] * 4


def test_without_an_end_token_nothing_is_appended() -> None:
    s = text_sample(NoEnd(), "ab", "c", "f:1", "completion")
    assert s.ids.tolist() == [97, 98, 99] and s.mask.tolist() == [False, False, True]


def test_an_empty_prompt_learns_everything() -> None:
    s = text_sample(ByteTokenizer(), "", "xy", "f:1", "completion")
    assert s.mask.tolist() == [True, True, True]


# ----------------------------------------------------------------------------- chat


def test_an_assistant_turn_after_a_user_turn(folder: Path) -> None:
    r = renderer(folder)
    msgs = [{"role": "user", "content": "red cat"}, {"role": "assistant", "content": "cat red"}]
    s = r.sample_messages(msgs, "f:1", "completion")
    assert learned(r, s.ids, s.mask) == ["cat red<|im_end|>\n"]


def test_an_assistant_turn_first_is_learned_from_the_start(folder: Path) -> None:
    """Nothing precedes it (transformers refuses to render an empty conversation): the turn is
    learned from its first token, the later turns as usual."""
    r = renderer(folder)
    msgs = [
        {"role": "assistant", "content": "one two"},
        {"role": "user", "content": "big dog"},
        {"role": "assistant", "content": "dog big"},
    ]
    s = r.sample_messages(msgs, "f:1", "completion")
    got = learned(r, s.ids, s.mask)
    assert got == ["<|im_start|>assistant\none two<|im_end|>\n", "dog big<|im_end|>\n"]
    assert s.mask[0]


def test_a_template_that_is_not_turn_by_turn_is_refused(folder: Path) -> None:
    r = renderer(folder, COUNTED)
    msgs = [{"role": "user", "content": "red"}, {"role": "assistant", "content": "cat"}]
    with pytest.raises(
        UserError, match=r"^f:9: the chat template does not render this conversation"
    ):
        r.sample_messages(msgs, "f:9", "completion")
    s = r.sample_messages(msgs, "f:9", "all")  # every token: no turns needed
    assert s.mask.all() and len(s.ids) > 0


def test_train_on_all_needs_no_assistant_turn_but_completion_does(
    folder: Path,
) -> None:
    r = renderer(folder)
    msgs = [{"role": "user", "content": "red"}]
    assert r.sample_messages(msgs, "f:1", "all").mask.all()
    with pytest.raises(UserError, match="f:2: no assistant turn: nothing to learn"):
        r.sample_messages(msgs, "f:2", "completion")


def test_only_assistant_tokens_are_learned_in_a_long_conversation(folder: Path) -> None:
    r = renderer(folder)
    msgs = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "red"},
        {"role": "assistant", "content": "green"},
        {"role": "user", "content": "blue"},
        {"role": "assistant", "content": "sun moon"},
        {"role": "user", "content": "fish"},
    ]
    s = r.sample_messages(msgs, "f:1", "completion")
    assert learned(r, s.ids, s.mask) == ["green<|im_end|>\n", "sun moon<|im_end|>\n"]
    full = r.hf.apply_chat_template(msgs, tokenize=True)
    full = full["input_ids"] if hasattr(full, "keys") else full
    assert s.ids.tolist() == list(full)


def test_a_tokenizer_that_adds_special_tokens_adds_none_to_a_chat(folder: Path) -> None:
    """The template writes the special tokens itself: the ids stay apply_chat_template's even
    where the tokenizer would add a BOS of its own."""
    from tokenizers.processors import TemplateProcessing

    r = renderer(folder)
    bos = r.hf.convert_tokens_to_ids("</s>")
    r.hf.backend_tokenizer.post_processor = TemplateProcessing(
        single="</s> $A", special_tokens=[("</s>", bos)]
    )
    assert r.hf("red")["input_ids"][0] == bos  # it would add one to plain text
    msgs = [{"role": "user", "content": "red"}, {"role": "assistant", "content": "cat"}]
    full = r.hf.apply_chat_template(msgs, tokenize=True)
    full = full["input_ids"] if hasattr(full, "keys") else full
    for train_on in ("completion", "all"):
        assert r.sample_messages(msgs, "f:1", train_on).ids.tolist() == list(full)


# Turns without an end-of-turn marker: an empty assistant turn renders as its header alone.
BARE = (
    "{% for m in messages %}{{ m['role'] + ': ' + m['content'] }}"
    "{% if m['role'] != 'assistant' %}{{ '\\n' }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ 'assistant: ' }}{% endif %}"
)


def test_an_empty_assistant_turn_learns_nothing_and_is_no_error(folder: Path) -> None:
    r = renderer(folder, BARE)
    msgs = [{"role": "user", "content": "red"}, {"role": "assistant", "content": ""}]
    s = r.sample_messages(msgs, "f:1", "completion")
    assert not s.mask.any()
    msgs = [{"role": "user", "content": "red"}, {"role": "assistant", "content": "cat"}]
    s = r.sample_messages(msgs, "f:1", "completion")
    assert learned(r, s.ids, s.mask) == [" cat"]  # the token that overlaps the turn

"""Tiny fine-tuning fixtures built on the spot: a BPE tokenizer folder with a ChatML chat template
(saved by transformers' save_pretrained), and chat / prompt-completion JSONL files."""

from __future__ import annotations

import json
import random
from pathlib import Path

SPECIAL = ["<|im_start|>", "<|im_end|>", "</s>"]
# ChatML; an unknown role stops the template (as real templates do with raise_exception).
CHATML = (
    "{% for m in messages %}"
    "{% if m['role'] not in ['system', 'user', 'assistant'] %}"
    "{{ raise_exception('unknown role: ' + m['role']) }}{% endif %}"
    "{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
WORDS = [
    "red",
    "green",
    "blue",
    "cat",
    "dog",
    "fish",
    "one",
    "two",
    "three",
    "big",
    "small",
    "fast",
    "slow",
    "sun",
    "moon",
]


# A conversation with a system turn and two assistant turns, for exact-mask checks.
CHAT = [
    {"role": "system", "content": "be brief"},
    {"role": "user", "content": "red cat"},
    {"role": "assistant", "content": "cat red"},
    {"role": "user", "content": "one two three"},
    {"role": "assistant", "content": "three two one"},
]


def conversation(rng: random.Random) -> list[dict[str, str]]:
    """A system prompt sometimes, then 1-2 turns: the assistant answers with the user's words
    reversed (something to learn)."""
    msgs = [{"role": "system", "content": "be brief"}] if rng.random() < 0.5 else []
    for _ in range(rng.randint(1, 2)):
        words = rng.choices(WORDS, k=rng.randint(2, 6))
        msgs.append({"role": "user", "content": " ".join(words)})
        msgs.append({"role": "assistant", "content": " ".join(reversed(words))})
    return msgs


def write_jsonl(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def write_chat_jsonl(path: Path, n: int, seed: int = 0) -> Path:
    rng = random.Random(seed)
    return write_jsonl(path, [{"messages": conversation(rng)} for _ in range(n)])


def make_tokenizer(folder: Path, chat_template: str | None = CHATML) -> Path:
    """A byte-level BPE (about 400 tokens) trained on the word list, saved with save_pretrained."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    corpus = [" ".join(WORDS), "system user assistant be brief", "\n".join(WORDS)] * 20
    tok.train_from_iterator(corpus, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="</s>")
    if chat_template is not None:
        fast.chat_template = chat_template
    fast.save_pretrained(str(folder))
    return folder

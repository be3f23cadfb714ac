"""Build what a fine-tuning benchmark needs, offline: a tokenizer with a chat template, chat data
and a Hugging Face model folder of a given shape.

    python benchmarks/sft_fixture.py OUT [--shapes 1b,8b] [--samples 4000] [--seed 0]

writes OUT/model-<shape> for each shape (config.json + the tokenizer; no weights: both stacks
initialise the same shape at random, which does not change their speed; zerofit needs
model.random_init=true for that), OUT/chat.jsonl, OUT/pairs.jsonl (preference pairs: a prompt
and two responses, for DPO) and OUT/fixture.json (what was made).

The tokenizer is a byte-level BPE (32,000 entries) trained on this Python's standard library, with
Llama-3-style header and end-of-turn tokens and a chat template written here. Conversations have 1-3
user/assistant turns (a system message in a quarter of them); each message is a slice of standard
library text whose length is drawn log-uniformly, so samples run from ~50 to ~1,800 tokens, like
public chat SFT sets (many short samples, a long tail).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import sysconfig
from pathlib import Path

SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>"]
SPECIALS += ["<|eot_id|>", "<|pad|>"]
TEMPLATE = (
    "{{- bos_token }}"
    "{%- for m in messages %}"
    "{%- if m['role'] not in ['system', 'user', 'assistant'] %}"
    "{{- raise_exception('unknown role: ' + m['role']) }}"
    "{%- endif %}"
    "{{- '<|start_header_id|>' + m['role'] + '<|end_header_id|>\\n\\n' + m['content'] + '<|eot_id|>' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}"
)
SHAPES = {  # Llama-3.2-1B, Llama-3-8B and Llama-3-70B
    "1b": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
               num_attention_heads=32, num_key_value_heads=8, tie_word_embeddings=True),
    "8b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
               num_attention_heads=32, num_key_value_heads=8, tie_word_embeddings=False),
    "70b": dict(hidden_size=8192, intermediate_size=28672, num_hidden_layers=80,
                num_attention_heads=64, num_key_value_heads=8, tie_word_embeddings=False),
}  # fmt: skip


def model_config(shape: str, bos: int | None = None, eos: int | None = None):  # noqa: ANN201
    """The transformers LlamaConfig of model-<shape> (a LlamaConfig)."""
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=128_256,  # Llama-3's table size; the tokenizer uses 32,000 of it
        max_position_embeddings=8192,
        rope_theta=500_000.0,
        rms_norm_eps=1e-5,
        bos_token_id=bos,
        eos_token_id=eos,
        **SHAPES[shape],
    )


def corpus(max_chars: int = 40_000_000) -> str:
    root = Path(sysconfig.get_paths()["stdlib"])
    parts, total = [], 0
    for path in sorted(root.rglob("*.py")):
        if "site-packages" in path.parts or "test" in path.parts:
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        parts.append(text)
        total += len(text)
        if total >= max_chars:
            break
    return "\n".join(parts)


def tokenizer(text: str, out: Path, vocab: int = 32_000):  # noqa: ANN201 - a transformers tokenizer
    """A byte-level BPE of ``vocab`` entries trained on ``text``, with SPECIALS and TEMPLATE."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=SPECIALS, show_progress=False)
    chunk = 1_000_000
    tok.train_from_iterator((text[i : i + chunk] for i in range(0, len(text), chunk)), trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|begin_of_text|>",
        eos_token="<|eot_id|>",
        pad_token="<|pad|>",
    )
    fast.chat_template = TEMPLATE
    fast.save_pretrained(out)
    return fast


def message(rng: random.Random, text: str, lo: int, hi: int) -> str:
    n = int(math.exp(rng.uniform(math.log(lo), math.log(hi))))
    start = rng.randrange(0, len(text) - n)
    return text[start : start + n]


def conversation(rng: random.Random, text: str) -> dict:
    msgs = []
    if rng.random() < 0.25:
        msgs.append({"role": "system", "content": message(rng, text, 40, 400)})
    for _ in range(rng.choice([1, 1, 2, 3])):
        msgs.append({"role": "user", "content": message(rng, text, 40, 1500)})
        msgs.append({"role": "assistant", "content": message(rng, text, 80, 3000)})
    return {"messages": msgs}


def pair(rng: random.Random, text: str) -> dict:
    """A conversational preference pair: a prompt (a system message in a quarter of them, then a
    user turn) and two assistant responses of independent lengths."""
    prompt = (
        [{"role": "system", "content": message(rng, text, 40, 400)}] if rng.random() < 0.25 else []
    )
    prompt.append({"role": "user", "content": message(rng, text, 40, 1500)})
    chosen, rejected = (message(rng, text, 80, 3000) for _ in range(2))
    return {
        "prompt": prompt,
        "chosen": [{"role": "assistant", "content": chosen}],
        "rejected": [{"role": "assistant", "content": rejected}],
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out")
    p.add_argument("--shapes", default="1b,8b", help="comma-separated: " + ", ".join(SHAPES))
    p.add_argument("--samples", type=int, default=4000)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    out = Path(a.out)
    shapes = a.shapes.split(",")
    if unknown := set(shapes) - set(SHAPES):
        p.error(f"unknown shapes {sorted(unknown)}; choose from {sorted(SHAPES)}")
    text = corpus()
    tok = tokenizer(text, out / "tokenizer")
    for shape in shapes:
        folder = out / f"model-{shape}"
        tok.save_pretrained(folder)
        model_config(shape, tok.bos_token_id, tok.eos_token_id).save_pretrained(folder)
    rng = random.Random(a.seed)
    with open(out / "chat.jsonl", "w") as f:
        for _ in range(a.samples):
            f.write(json.dumps(conversation(rng, text)) + "\n")
    rng = random.Random(a.seed + 1)
    with open(out / "pairs.jsonl", "w") as f:
        for _ in range(a.samples):
            f.write(json.dumps(pair(rng, text)) + "\n")
    facts = {"shapes": shapes, "samples": a.samples, "seed": a.seed, "tokenizer_vocab": len(tok)}
    (out / "fixture.json").write_text(json.dumps(facts, indent=1))
    print(json.dumps(facts), file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Hugging Face architectures train under every engine with transformers' own code.

For each family a tiny folder is written here (a config built in the test, ``save_pretrained``;
nothing downloaded): 2 layers, hidden 64, grouped-query attention, the byte tokenizer's vocabulary.
Each trains 5 steps under FSDP2 and DeepSpeed ZeRO-3, and DDP where the family has something DDP
itself handles (FAMILY_ENGINES), on 2 gloo processes (fp32) from the same name-seeded init
(``model.random_init``: the folder holds no weights). The loss must fall, and the trajectories must
agree.

Tolerance: the engines differ only in summation order (all-reduce vs reduce-scatter vs ZeRO's
flat buckets), ~1e-7 relative per step in fp32, amplified a little by AdamW: RTOL = 1e-5 as in
tests/test_parity.py and tests/test_deepspeed.py (each test prints its worst difference; observed
at most 1.2e-7). A wrong shard, a missed gather of the (tied) head or a lost reduction moves the
loss by > 1e-2 in a step.

The families cover the variations that matter to the engines: Llama (the reference), Qwen3 (q/k
norms inside attention), Mistral (sliding-window attention, window below the sequence length) and
Gemma (tied input/output embeddings, scaled embeddings, GeLU): its head's weight is the
embedding's, which each engine must keep tied, gather, reduce and update once. Every config has a
padding token, whose embedding row HF's own init zeroes (under ZeRO-3 that row is partitioned).

Cost: 10 runs, mostly process start-up (importing torch and transformers in the launcher and both
workers), so they all start in the background together, two at a time (conftest's POOL).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import POOL, losses, train_run, wait_all

transformers = pytest.importorskip("transformers")
pytestmark = [pytest.mark.dist, pytest.mark.slow]

RTOL = 1e-5
STEPS = 5
SIZES = {
    "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 320,
    "max_position_embeddings": 256, "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0,
}  # fmt: skip
FAMILIES: dict[str, Any] = {
    "llama": lambda: transformers.LlamaConfig(**SIZES),
    "qwen3": lambda: transformers.Qwen3Config(**SIZES, head_dim=16),
    "mistral": lambda: transformers.MistralConfig(**SIZES, sliding_window=16),
    "gemma": lambda: transformers.GemmaConfig(**SIZES, head_dim=16),
}
ENGINES = {
    "ddp": {"backend": "ddp"},
    "fsdp": {"backend": "fsdp"},
    # Every parameter partitioned, the tiny ones too, as they are in a real model.
    "zero3": {"backend": "deepspeed", "deepspeed": {"stage": 3, "param_persistence_threshold": 0}},
}


def family_folder(root: Path, family: str) -> Path:
    """A folder holding only the family's config.json: zerofit initialises the weights
    (``model.random_init``)."""
    folder = root / family
    if not (folder / "config.json").is_file():
        FAMILIES[family]().save_pretrained(folder)
    return folder


def _train(tmp: Path, family: str, engine: str) -> dict[int, float]:
    folder = family_folder(tmp, family)
    extra = {
        "model": {
            "preset": None,
            "hf": str(folder),
            "overrides": {},
            "seq_len": 48,
            "random_init": True,
        },
        "data": {"max_tokens": 50_000},
        "train": {"steps": STEPS},
        "parallel": ENGINES[engine],
        "checkpoint": {"save_final": False},
    }
    return losses(train_run(tmp, f"{family}_{engine}", extra, "--nproc", "2"))


# The engines each family trains under: all three where the model has something DDP itself must
# handle (Llama, the reference; Gemma's tied head, one parameter in two places), FSDP2 and ZeRO-3
# alone where the variation is inside the blocks (Qwen3's q/k norms, Mistral's sliding window):
# DDP replicates whole modules and never sees their insides; FSDP2 is then the reference.
FAMILY_ENGINES = {
    "llama": ["ddp", "fsdp", "zero3"],
    "qwen3": ["fsdp", "zero3"],
    "mistral": ["fsdp", "zero3"],
    "gemma": ["ddp", "fsdp", "zero3"],
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    """Every family's runs, started together in the background (two at a time):
    {(family, engine): Future of its losses}."""
    pytest.importorskip("deepspeed")
    tmp = tmp_path_factory.mktemp("families")
    for family in FAMILIES:
        family_folder(tmp, family)
    out = {(f, e): POOL.submit(_train, tmp, f, e) for f, es in FAMILY_ENGINES.items() for e in es}
    yield out
    wait_all(out.values())


@pytest.mark.parametrize("family", list(FAMILIES))
def test_family_trains_alike_under_every_engine(family: str, runs) -> None:  # noqa: ANN001
    """The first engine is the reference (DDP, or FSDP2); the others must follow its loss
    trajectory."""
    got_by_engine = {engine: runs[family, engine].result() for engine in FAMILY_ENGINES[family]}
    reference = FAMILY_ENGINES[family][0]
    ref = got_by_engine.pop(reference)
    assert sorted(ref) == list(range(1, STEPS + 1)), ref
    assert ref[STEPS] < ref[1] - 0.3, ref  # it learns
    for engine, got in got_by_engine.items():
        assert sorted(got) == sorted(ref), engine
        worst = max(abs(got[s] - ref[s]) / abs(ref[s]) for s in ref)
        print(f"{family} {engine} vs {reference}: max relative loss difference = {worst:.2e}")
        assert worst <= RTOL, (engine, {s: (ref[s], got[s]) for s in ref})

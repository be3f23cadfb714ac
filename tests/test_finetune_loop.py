"""The README's fine-tuning loop, as a user runs it, on CPU: a tiny Hugging Face folder with a chat
template and a chat file made here (nothing downloaded) -> the shipped recipe -> `zerofit train` ->
`zerofit export` -> transformers loads the folder, `generate` answers, and the fine-tuned model's
loss on the chats is below the base model's. The full recipe runs on FSDP2, the LoRA recipe on
DeepSpeed ZeRO-3 (test_lora.py runs LoRA on every engine)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path

import pytest
import torch
from conftest import POOL, wait_all, zerofit
from sft_helpers import make_tokenizer, write_chat_jsonl

pytestmark = [pytest.mark.dist, pytest.mark.slow]
transformers = pytest.importorskip("transformers")
CONFIGS = Path(__file__).resolve().parents[1] / "configs"
README = Path(__file__).resolve().parents[1] / "README.md"
# Learning rate and how far the loss must fall in 12 steps. LoRA starts as the base model (B = 0) and
# moves slower (adapters only, the embedding and head frozen): seen here, 5.81 -> 5.40 at 1e-2.
RECIPES = {"full": ("1e-2", 0.8), "lora": ("1e-2", 0.97)}
ENGINES = {
    "fsdp": ["--parallel.backend", "fsdp"],
    "zero3": ["--parallel.backend", "deepspeed", "--parallel.deepspeed.stage", "3"],
}


def base_folder(root: Path) -> Path:
    folder = make_tokenizer(root / "base")
    tok = transformers.AutoTokenizer.from_pretrained(folder)
    config = transformers.LlamaConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=len(tok), max_position_embeddings=256,
        eos_token_id=tok.eos_token_id, tie_word_embeddings=False,
    )  # fmt: skip
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(config).save_pretrained(folder)
    return folder


def chat_loss(model: torch.nn.Module, tok: object, chats: list[list[dict]]) -> float:
    """Mean loss over whole rendered conversations (every token), with transformers' own loss."""
    losses = []
    with torch.no_grad():
        for messages in chats:
            ids = tok.apply_chat_template(messages, tokenize=True, return_tensors="pt")  # type: ignore[attr-defined]
            ids = ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids
            losses.append(float(model(input_ids=ids, labels=ids).loss))
    return sum(losses) / len(losses)


def readme_snippet() -> str:
    """The inference snippet of docs/fine-tuning.md (its `python -c "..."` after `zerofit
    export`, in "The loop"), verbatim."""
    doc = README.parent / "docs" / "fine-tuning.md"
    section = doc.read_text().split("## The loop", 1)[1].split("\n## ", 1)[0]
    found = re.search(r'^python -c "\n(.*?)"$', section, re.DOTALL | re.MULTILINE)
    assert found, "no python -c snippet under docs/fine-tuning.md's heading The loop"
    return found.group(1)


def train(
    tmp: Path, recipe: str, engine: str, base: Path, data: Path, *more: str, name: str = "run"
) -> Path:
    """A recipe's run (12 steps unless ``more`` sets them); the loss must fall over a 12-step run."""
    run = tmp / name
    proc = zerofit(
        "train", "-c", str(CONFIGS / f"finetune-{recipe}.yaml"), "--nproc", "2",
        "--model.hf", str(base), "--data.source", str(data), "--model.seq_len", "64",
        "--train.micro_batch_size", "4", "--train.grad_accum_steps", "1", *(more or ("--train.steps", "12")),
        "--train.eval_every", "0", "--checkpoint.every", "0", "--log.every", "1",
        "--log.progress", "false", "--log.run_dir", str(run), "--optim.lr", RECIPES[recipe][0],
        "--optim.warmup_steps", "2", "--precision.mode", "fp32",
        "--parallel.activation_checkpointing", "none", *ENGINES[engine],
        cwd=tmp,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "data (chat):" in proc.stdout + proc.stderr  # the packing line
    losses = [json.loads(x)["loss"] for x in (run / "metrics.jsonl").read_text().splitlines()]
    losses = [x for x in losses if x is not None]
    if more:
        return run
    assert sum(losses[-3:]) / 3 < RECIPES[recipe][1] * sum(losses[:3]) / 3, losses
    return run


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """(a directory for the runs, the base folder, the chat file)."""
    root = tmp_path_factory.mktemp("finetune")
    return root, base_folder(root), write_chat_jsonl(root / "chat.jsonl", 300)


LOOPS = [("full", "fsdp"), ("lora", "zero3")]  # (recipe, engine)


@pytest.fixture(scope="module")
def recipe_runs(inputs: tuple[Path, Path, Path]) -> Iterator[dict[str, Future[Path]]]:
    """Each recipe's 12-step run, started together in the background (the resume test continues
    the full one)."""
    root, base, data = inputs
    out = {
        recipe: POOL.submit(train, root, recipe, engine, base, data, name=f"{recipe}-{engine}")
        for recipe, engine in LOOPS
    }
    yield out
    wait_all(out.values())


@pytest.mark.parametrize(("recipe", "engine"), LOOPS)
def test_the_recipe_loop_trains_exports_and_generates(
    tmp_path: Path, inputs: tuple[Path, Path, Path], recipe_runs, recipe: str, engine: str
) -> None:  # noqa: ANN001
    _, base, data = inputs
    run = recipe_runs[recipe].result()
    assert list((run / "export").glob("step_*/config.json")), "export_final wrote no folder"
    out = tmp_path / "sft-merged"  # the name the README's snippet loads
    proc = zerofit("export", str(run), "--out", str(out), "--dtype", "fp32", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]

    tok = transformers.AutoTokenizer.from_pretrained(out)
    assert tok.chat_template, "the chat template did not travel with the export"
    tuned = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    before = transformers.AutoModelForCausalLM.from_pretrained(base).eval()
    chats = [json.loads(x)["messages"] for x in data.read_text().splitlines()[:16]]
    assert chat_loss(tuned, tok, chats) < RECIPES[recipe][1] * chat_loss(before, tok, chats)

    # The README's snippet, as a user pastes it, in the folder that holds sft-merged.
    snippet = subprocess.run(
        [sys.executable, "-c", readme_snippet()], cwd=tmp_path, capture_output=True, text=True
    )
    assert snippet.returncode == 0, snippet.stderr[-2000:]
    assert snippet.stdout.endswith("\n"), "the README's snippet printed no answer"  # may be empty

    if recipe == "lora":  # the PEFT folder on the base gives the merged model's loss
        peft = pytest.importorskip("peft")
        adapter = tmp_path / "adapter"
        proc = zerofit("export", str(run), "--out", str(adapter), "--adapter", cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr[-2000:]
        with_adapter = peft.PeftModel.from_pretrained(before, adapter).eval()
        merged = chat_loss(tuned, tok, chats)
        assert abs(chat_loss(with_adapter, tok, chats) - merged) < 1e-4 * max(1.0, merged)


def test_a_run_resumed_into_a_new_directory_exports_at_the_end(
    tmp_path: Path, inputs: tuple[Path, Path, Path], recipe_runs
) -> None:  # noqa: ANN001
    """--resume CHECKPOINT with another log.run_dir: training goes on there, and the final
    export (export_final) finds that directory's config and final checkpoint."""
    _, base, data = inputs
    first = recipe_runs["full"].result()  # 12 steps, saved at the end
    step_12 = first / "checkpoints" / "step_00000012"
    assert step_12.is_dir()
    more = ("--train.steps", "14", "--resume", str(step_12))
    second = train(tmp_path, "full", "fsdp", base, data, *more, name="second")
    assert (second / "config.yaml").is_file()
    exported = sorted(p.parent.name for p in (second / "export").glob("step_*/config.json"))
    assert exported == ["step_00000014"], exported

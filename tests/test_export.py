"""`zerofit export`: checkpoints of every engine become Hugging Face folders that load in
transformers and give the run's own eval loss on its held-out data."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path

import pytest
import torch
from conftest import POOL, train_run, wait_all, zerofit

from zerofit.data import eval_batches, load_tokenizer
from zerofit.errors import UserError
from zerofit.export.run import export_checkpoint, find_checkpoint, llama_to_hf, parse_size
from zerofit.launch.run_config import load_config
from zerofit.models.loss import cross_entropy
from zerofit.train.inputs import build_inputs

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.dist

LAST = 4  # train this many steps, evaluating (and checkpointing) at the last
STEPS = {
    "train": {"steps": LAST, "eval_every": LAST, "eval_batches": 2},
    "data": {"max_tokens": 100_000},
}
HF_TINY = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 512,
    "max_position_embeddings": 256,
}


def write_tokenizer(directory: Path) -> None:
    """A 400-token byte-level BPE trained here on a stdlib file, with ``</s>`` as EOS."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=["</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator([Path(json.__file__).read_text()], trainer)
    tok.save(str(directory / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "</s>"}
    (directory / "tokenizer_config.json").write_text(json.dumps(config))


def hf_folder(directory: Path, config: object) -> Path:
    torch.manual_seed(0)
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(directory)
    return directory


def hf_extra(model_dir: Path, tokenizer: str = "byte") -> dict:
    return {
        "model": {"preset": None, "hf": str(model_dir), "overrides": {}},
        **STEPS,
        "data": {"max_tokens": 100_000, "tokenizer": tokenizer},
    }


@pytest.fixture(scope="module")
def tmp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("export")


@pytest.fixture(scope="module")
def runs(tmp: Path) -> Iterator[dict[str, Future[Path]]]:
    """The four runs below, started together in the background (two at a time)."""
    zero3 = {
        **STEPS,
        "parallel": {"backend": "deepspeed", "deepspeed": {"stage": 3}},
        "checkpoint": {"export_final": True, "export_dtype": "fp32"},  # exported as it ends
    }
    # An untied HF Llama whose folder holds the tokenizer the run trains with.
    llama = hf_folder(tmp / "hf-llama", transformers.LlamaConfig(**HF_TINY))
    write_tokenizer(llama)
    # A Qwen2 with tied embeddings (and q/k/v biases), byte tokenizer.
    qwen = hf_folder(tmp / "hf-qwen", transformers.Qwen2Config(**HF_TINY, tie_word_embeddings=True))
    extras = {"fsdp": STEPS, "zero3": zero3, "llama": hf_extra(llama, str(llama))}
    extras["qwen"] = hf_extra(qwen)
    out = {
        name: POOL.submit(train_run, tmp, name, extra, "--nproc", "2")
        for name, extra in extras.items()
    }
    yield out
    wait_all(out.values())


@pytest.fixture(scope="module")
def fsdp_run(runs: dict[str, Future[Path]]) -> Path:
    return runs["fsdp"].result()


@pytest.fixture(scope="module")
def zero3_run(runs: dict[str, Future[Path]]) -> Path:
    return runs["zero3"].result()


@pytest.fixture(scope="module")
def llama_run(runs: dict[str, Future[Path]]) -> Path:
    return runs["llama"].result()


@pytest.fixture(scope="module")
def qwen_run(runs: dict[str, Future[Path]]) -> Path:
    return runs["qwen"].result()


def logged_eval_loss(run: Path, step: int) -> float:
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return next(r["eval_loss"] for r in records if r["step"] == step and "eval_loss" in r)


@torch.no_grad()
def hf_eval_loss(run: Path, model: torch.nn.Module, world_size: int) -> float:
    """The trainer's eval loss, recomputed: mean over ranks of each rank's mean batch loss."""
    cfg = load_config(run / "config.yaml")
    val = build_inputs(cfg).data.val
    per_rank = []
    for rank in range(world_size):
        batches = eval_batches(
            val, cfg.train.micro_batch_size, rank, world_size, cfg.train.eval_batches
        )
        losses = [cross_entropy(model(input_ids=x).logits, y).item() for x, y in batches]
        per_rank.append(sum(losses) / len(losses))
    return sum(per_rank) / len(per_rank)


def load(out: Path) -> torch.nn.Module:
    model, info = transformers.AutoModelForCausalLM.from_pretrained(
        out, output_loading_info=True, local_files_only=True
    )
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    assert not info["mismatched_keys"], info
    return model.eval()


def check_export(run: Path, out: Path, dtype: str, rel: float, **kw: int) -> torch.nn.Module:
    """Export (unless ``out`` is already there), load, compare the eval loss; returns the model."""
    ckpt = find_checkpoint(run, None)
    if not out.exists():
        summary = export_checkpoint(ckpt, run, out, dtype, **kw)
        assert summary["dtype"] == dtype and summary["step"] == LAST
    model = load(out)
    assert model.dtype == {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype]
    meta = json.loads((ckpt / "meta.json").read_text())
    got, want = hf_eval_loss(run, model, meta["world_size"]), logged_eval_loss(run, LAST)
    diff = abs(got - want) / want
    print(f"{run.name} {dtype}: HF eval loss {got:.7f}, run's {want:.7f}, rel diff {diff:.2e}")
    assert diff < rel, (got, want)
    return model


def test_size_parsing_and_name_table() -> None:
    assert parse_size("5GB") == 5 * 10**9 and parse_size("20MiB") == 20 * 2**20
    assert parse_size("1000") == 1000
    assert llama_to_hf("layers.3.feed_forward.w1.weight") == "model.layers.3.mlp.gate_proj.weight"
    assert llama_to_hf("layers.3.feed_forward.w2.weight") == "model.layers.3.mlp.down_proj.weight"
    assert (
        llama_to_hf("layers.0.ffn_norm.weight") == "model.layers.0.post_attention_layernorm.weight"
    )
    assert llama_to_hf("output.weight") == "lm_head.weight"
    assert llama_to_hf("layers.0.attention.wq.bias") is None


@pytest.mark.slow
def test_builtin_fsdp_fp32_sharded(fsdp_run: Path, tmp: Path) -> None:
    out = tmp / "fsdp-fp32"
    model = check_export(fsdp_run, out, "fp32", 1e-5, max_shard_bytes=2 * 2**20)
    index = json.loads((out / "model.safetensors.index.json").read_text())
    shards = sorted(out.glob("model-*.safetensors"))
    assert len(shards) > 1 and set(index["weight_map"].values()) == {p.name for p in shards}
    assert all(p.stat().st_size <= 2 * 2**20 + 4096 for p in shards)  # header slack
    assert list(index["weight_map"])[:2] == [
        "model.embed_tokens.weight",
        "model.layers.0.self_attn.q_proj.weight",
    ]
    assert index["metadata"]["total_size"] == sum(p.numel() * 4 for p in model.parameters())
    logged = logged_eval_loss(fsdp_run, LAST)
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["eos_token_id"] == 256
    assert not (out / "tokenizer.json").exists()
    # Control: the interleaved RoPE layout (Meta's original checkpoints) would need q/k rows
    # permuted per head; applying that permutation here must change the loss by far more.
    with torch.no_grad():
        for layer in model.model.layers:
            for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj):
                w = proj.weight
                heads = w.shape[0] // model.config.head_dim
                w.copy_(w.view(heads, 2, -1, w.shape[1]).transpose(1, 2).reshape(w.shape))
    permuted = hf_eval_loss(fsdp_run, model, 2)
    print(
        f"q/k permuted: eval loss {permuted:.7f} (rel diff {abs(permuted - logged) / logged:.2e})"
    )
    assert abs(permuted - logged) / logged > 1e-4  # 10x the tolerance above
    prompt = torch.tensor([list(b"def main():")])
    generated = model.generate(prompt, max_new_tokens=4, do_sample=False)
    assert generated.shape == (1, prompt.shape[1] + 4)


@pytest.mark.slow
def test_builtin_fsdp_bf16_through_the_cli(fsdp_run: Path, tmp: Path) -> None:
    out = tmp / "fsdp-bf16"
    proc = zerofit("export", str(fsdp_run), "--out", str(out), cwd=tmp)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = proc.stdout.strip()
    assert "\n" not in line and f"LlamaForCausalLM step {LAST}" in line and "bf16" in line, line
    check_export(fsdp_run, out, "bf16", 1e-2)
    assert not list(tmp.glob("fsdp-bf16.tmp-*"))


@pytest.mark.slow
@pytest.mark.parametrize("dtype,rel", [("fp32", 1e-5), ("bf16", 1e-2)])
def test_deepspeed_zero3(zero3_run: Path, tmp: Path, dtype: str, rel: float) -> None:
    # fp32: the folder `checkpoint.export_final` wrote at the end of training
    out = zero3_run / "export" / f"step_{LAST:08d}" if dtype == "fp32" else tmp / "zero3-bf16"
    if dtype == "fp32":
        assert (out / "model.safetensors.index.json").is_file()
    model = check_export(zero3_run, out, dtype, rel)
    generated = model.generate(torch.tensor([[104, 105]]), max_new_tokens=3, do_sample=False)
    assert generated.shape == (1, 5)


@pytest.mark.slow
def test_hf_llama_with_its_tokenizer(llama_run: Path, tmp: Path) -> None:
    out = tmp / "llama-fp32"
    check_export(llama_run, out, "fp32", 1e-5)
    assert (out / "tokenizer.json").is_file() and (out / "tokenizer_config.json").is_file()
    tok = transformers.AutoTokenizer.from_pretrained(out, local_files_only=True)
    text = "def f(x):\n    return x + 1\n"
    ours = load_tokenizer(str(tmp / "hf-llama")).encode(text).tolist()
    assert tok(text, add_special_tokens=False).input_ids == ours
    check_export(llama_run, tmp / "llama-bf16", "bf16", 1e-2)


@pytest.mark.slow
def test_hf_qwen2_tied(qwen_run: Path, tmp: Path) -> None:
    out = tmp / "qwen-fp32"
    model = check_export(qwen_run, out, "fp32", 1e-5)
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert "lm_head.weight" not in index["weight_map"]
    assert "model.layers.0.self_attn.q_proj.bias" in index["weight_map"]
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    assert json.loads((out / "config.json").read_text())["tie_word_embeddings"] is True
    check_export(qwen_run, tmp / "qwen-bf16", "bf16", 1e-2)


def _fails(tmp: Path, *args: str) -> str:
    """`zerofit export ARGS` as a user runs it: exit 2 and one line, nothing else."""
    proc = zerofit("export", *args, cwd=tmp)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    return lines[0]


def _fails_here(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    """The same through `zerofit.cli.main` in this process (no process start-up)."""
    from zerofit.cli import main

    code = main(["export", *args])
    out, err = capsys.readouterr()
    assert code == 2, (out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    return lines[0]


@pytest.mark.slow
def test_cli_errors(fsdp_run: Path, tmp: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = str(tmp / "never")
    assert "no such run directory" in _fails_here(capsys, str(tmp / "nope"), "--out", out)
    (tmp / "not-a-run").mkdir()
    assert "not a zerofit run" in _fails_here(capsys, str(tmp / "not-a-run"), "--out", out)
    with pytest.raises(UserError, match="no checkpoint at step 7 .*there: step_00000004"):
        find_checkpoint(fsdp_run, 7)
    full = tmp / "full-out"
    full.mkdir()
    (full / "x.txt").write_text("keep me")
    assert "not empty" in _fails_here(capsys, str(fsdp_run), "--out", str(full))
    no_lora = _fails_here(capsys, str(fsdp_run), "--out", out, "--adapter")
    assert "trained no LoRA adapters" in no_lora
    assert (full / "x.txt").read_text() == "keep me"

    broken = tmp / "broken"
    shutil.copytree(fsdp_run, broken)
    config = (broken / "config.yaml").read_text().replace(str(fsdp_run), str(broken))
    (broken / "config.yaml").write_text(config)
    for f in (broken / "checkpoints" / "step_00000004" / "model").glob("*.distcp"):
        f.unlink()
    assert "missing" in _fails(tmp, str(broken), "--out", out)  # end to end, in its own process
    assert not (tmp / "never").exists() and not list(tmp.glob("never.tmp-*"))


def test_an_export_inside_a_run_or_checkpoint_is_refused(
    fsdp_run: Path, tmp: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Written inside a checkpoint, an export is damage to the next resume, and a later save of
    that step deletes it: refused inside this run, any checkpoint and any other run folder."""
    step = fsdp_run / "checkpoints" / "step_00000004"
    before = sorted(p.relative_to(fsdp_run) for p in fsdp_run.rglob("*"))
    other = tmp / "other-run"
    (other / "checkpoints").mkdir(parents=True)
    (other / "config.yaml").write_text("{}")
    loose = tmp / "a-copied-checkpoint"
    loose.mkdir()
    (loose / "manifest.json").write_text("{}")
    for out, why in (
        (step / "hf", f"inside the checkpoint {step}"),
        (fsdp_run / "hf", "inside the run being exported"),
        (fsdp_run / "checkpoints" / "hf", "inside its checkpoints"),
        (other / "hf", f"inside the run {other}"),
        (loose / "deeper" / "hf", f"inside the checkpoint {loose}"),
    ):
        line = _fails_here(capsys, str(fsdp_run), "--out", str(out))
        assert why in line and "export outside any run folder" in line, line
        assert not out.exists()
    assert sorted(p.relative_to(fsdp_run) for p in fsdp_run.rglob("*")) == before
    # the run's own export/ folder, where checkpoint.export_final writes, is allowed
    from zerofit.cli import main

    mine = fsdp_run / "export" / "mine"
    assert main(["export", str(fsdp_run), "--out", str(mine)]) == 0
    assert (mine / "config.json").is_file()
    shutil.rmtree(mine)
    if not any(mine.parent.iterdir()):
        mine.parent.rmdir()
    assert sorted(p.relative_to(fsdp_run) for p in fsdp_run.rglob("*")) == before


@pytest.mark.slow
def test_a_failed_export_leaves_nothing(
    fsdp_run: Path, tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import safetensors.torch

    real, calls = safetensors.torch.save_file, []

    def fail_on_second_shard(*args: object, **kwargs: object) -> None:
        calls.append(1)
        if len(calls) == 2:
            raise OSError("disk full")
        real(*args, **kwargs)

    monkeypatch.setattr(safetensors.torch, "save_file", fail_on_second_shard)
    out = tmp / "half"
    with pytest.raises(OSError, match="disk full"):
        export_checkpoint(find_checkpoint(fsdp_run, None), fsdp_run, out, "fp32", 2**20)
    assert len(calls) == 2 and not out.exists() and not list(tmp.glob("half.tmp-*"))

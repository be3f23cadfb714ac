"""Hugging Face models (configs written to a temp dir; nothing downloaded).

In process: the adapter's loss and every parameter's gradient equal transformers' own
``model(input_ids, labels=...)`` for each family (fused head, or full logits where the architecture
transforms them); packed documents (``positions``) give each document's loss alone; the planner and
the model take the same head decision; a folder with its own code needs model.trust_remote_code.
Marked ``dist``: a tiny Llama's saved weights are loaded into the FSDP shards, and it trains.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import safetensors.torch
import torch
import torch.nn.functional as F
from conftest import TINY, deep_update, losses, train_run
from test_hf_families import SIZES

from zerofit.errors import UserError
from zerofit.launch.run_config import config_from_dict
from zerofit.models import build_model
from zerofit.models.loss import IGNORE_INDEX, LMHead
from zerofit.models.meta import allocate_
from zerofit.models.shape import hf_head_fallback, shape_from_config
from zerofit.train.inputs import build_inputs, make_loader

transformers = pytest.importorskip("transformers")

# fp32. The fused head sums the loss and the head's gradient chunk by chunk, transformers over all
# logits at once: the same math in another order, ~1e-7 relative (observed: loss <= 8.2e-8,
# gradients <= 8.3e-7 of each tensor's largest entry). A missed shift, a lost -100 mask, a wrong mean
# or an untied head moves them by > 1e-2.
LOSS_RTOL = 1e-5
GRAD_RTOL = 1e-5
CHUNK = 16  # tokens per chunk: the 2 x 24 tokens below take 3 chunks

# Family -> (config, whether the head is fused). Gemma 2 caps its logits, Cohere scales them.
CONFIGS = {
    "llama": (lambda: transformers.LlamaConfig(**SIZES), True),
    "qwen2": (lambda: transformers.Qwen2Config(**SIZES), True),
    "qwen3": (lambda: transformers.Qwen3Config(**SIZES, head_dim=16), True),
    "mistral": (lambda: transformers.MistralConfig(**SIZES, sliding_window=8), True),
    "gemma": (lambda: transformers.GemmaConfig(**SIZES, head_dim=16), True),
    "phi3": (lambda: transformers.Phi3Config(**SIZES), True),
    "gemma2": (lambda: transformers.Gemma2Config(**SIZES, head_dim=16, sliding_window=8), False),
    "cohere": (lambda: transformers.CohereConfig(**SIZES), False),
}


def _saved(tmp: Path, family: str) -> tuple[Path, torch.nn.Module]:
    """The family's folder with random weights, and transformers' model of it."""
    torch.manual_seed(0)
    reference = transformers.AutoModelForCausalLM.from_config(CONFIGS[family][0]())
    reference.save_pretrained(tmp / family)
    return tmp / family, reference


def _ours(folder: Path, reference: torch.nn.Module) -> torch.nn.Module:
    """zerofit's module of ``folder`` (fused head as built), holding the reference's weights."""
    model = build_model(hf=str(folder), loss_chunk=CHUNK).construct()
    model.hf.load_state_dict(reference.state_dict())
    return model


def _batch(vocab: int, t: int = 24) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, vocab, (2, t), generator=gen)
    targets = torch.randint(0, vocab, (2, t), generator=gen)
    targets[0, 3] = targets[1, 10:14] = IGNORE_INDEX  # no loss there
    targets[:, -1] = IGNORE_INDEX  # HF shifts labels: its last position never has one
    return tokens, targets


@pytest.mark.parametrize("family", list(CONFIGS))
def test_loss_and_gradients_match_transformers(family: str, tmp_path: Path) -> None:
    folder, reference = _saved(tmp_path, family)
    spec = build_model(hf=str(folder), loss_chunk=CHUNK)
    fused = CONFIGS[family][1]
    assert spec.shape.fused_head is fused
    model = _ours(folder, reference)
    assert isinstance(model.hf.get_output_embeddings(), LMHead) is fused
    tokens, targets = _batch(SIZES["vocab_size"])
    loss = model(tokens, targets)
    loss.backward()
    # zerofit's targets are already shifted; HF's labels are the targets one place later.
    labels = torch.cat([torch.full((2, 1), IGNORE_INDEX), targets[:, :-1]], dim=1)
    expected = reference(input_ids=tokens, labels=labels)
    expected.loss.backward()
    rel = abs(loss.item() - expected.loss.item()) / expected.loss.item()
    theirs = dict(reference.named_parameters())
    worst = 0.0
    for name, p in model.named_parameters():
        want = theirs[name.removeprefix("hf.")].grad
        worst = max(worst, ((p.grad - want).abs().max() / want.abs().max()).item())
    print(f"{family}: loss rel diff {rel:.1e}, worst gradient diff {worst:.1e} (fused={fused})")
    assert rel <= LOSS_RTOL and worst <= GRAD_RTOL, (rel, worst)
    with torch.no_grad():  # no targets: the logits
        torch.testing.assert_close(model(tokens), expected.logits, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("family", ["llama", "mistral", "gemma2"])
def test_packed_documents_see_only_themselves(family: str, tmp_path: Path) -> None:
    """Two documents in one row (positions restart at 0) give each one's loss alone. Mistral's
    sliding window (8) and Gemma 2's eager attention take their own mask paths."""
    folder, reference = _saved(tmp_path, family)
    model = _ours(folder, reference)
    a, b = 19, 13
    tokens, targets = _batch(SIZES["vocab_size"], a + b)
    tokens, targets = tokens[:1], targets[:1].clone()
    targets[0, a - 1] = IGNORE_INDEX  # no target across the boundary (it is the data's job)
    positions = torch.cat([torch.arange(a), torch.arange(b)])[None]
    with torch.no_grad():
        for lo, hi in ((0, a), (a, a + b)):
            only = torch.full_like(targets, IGNORE_INDEX)
            only[:, lo:hi] = targets[:, lo:hi]
            packed = model(tokens, only, positions).item()
            alone = model(tokens[:, lo:hi], targets[:, lo:hi]).item()
            assert packed == pytest.approx(alone, rel=1e-5, abs=0), (lo, packed, alone)
        seen = model(tokens, only).item()  # positions=None: plain causal, document 2 sees 1
        assert seen != pytest.approx(alone, rel=1e-3), (seen, alone)


def test_planner_and_model_take_the_same_head_decision(tmp_path: Path) -> None:
    cases = {
        "llama": ({}, 4096, True),
        "llama_full": ({}, 0, False),
        "gemma2": ({}, 4096, False),
        "gemma2_uncapped": ({"final_logit_softcapping": None}, 4096, True),
        "cohere": ({}, 4096, False),
        "cohere_unscaled": ({"logit_scale": 1.0}, 4096, True),
    }
    for case, (overrides, chunk, fused) in cases.items():
        folder = tmp_path / case
        CONFIGS[case.split("_")[0]][0]().save_pretrained(folder)
        spec = build_model(hf=str(folder), overrides=overrides, loss_chunk=chunk, random_init=True)
        model = {"hf": str(folder), "overrides": overrides, "loss_chunk": chunk}  # hf alone
        planned = shape_from_config(config_from_dict({"model": model}))
        assert spec.shape.fused_head is planned.fused_head is fused, case
        assert spec.module.fused is fused, case
    granite = {"model_type": "granite", "logits_scaling": 8.0}
    assert "logits_scaling=8.0" in (hf_head_fallback(granite, 4096) or "")
    assert hf_head_fallback({"model_type": "granite"}, 4096) is None  # default 1.0
    assert hf_head_fallback({"model_type": "gemma2"}, 4096) is not None  # capped by default
    assert hf_head_fallback({"model_type": "minicpm3"}, 4096) is not None  # rescales before
    assert hf_head_fallback({"model_type": "gemma3", "text_config": {"logit_scale": 2}}, 1)


def test_allocation_keeps_a_tied_head_tied(tmp_path: Path) -> None:
    """DDP and FSDP allocate the meta module in place: Gemma's head must stay its embedding."""
    CONFIGS["gemma"][0]().save_pretrained(tmp_path)
    spec = build_model(hf=str(tmp_path), random_init=True)
    hf = allocate_(spec.module, "cpu").hf
    assert hf.get_output_embeddings().weight is hf.get_input_embeddings().weight
    assert "hf.lm_head.weight" not in dict(spec.module.named_parameters())


def test_config_transformers_cannot_build_is_one_line(tmp_path: Path) -> None:
    transformers.LlamaConfig(**{**SIZES, "pad_token_id": 5000}).save_pretrained(tmp_path)
    with pytest.raises(UserError, match="cannot build a causal LM") as caught:
        build_model(hf=str(tmp_path))  # the padding row is outside the 320-token vocabulary
    assert "\n" not in str(caught.value)


REMOTE_CONFIG = """from transformers import LlamaConfig


class ZfTestConfig(LlamaConfig):
    model_type = "zerofit_test_llama"
"""
REMOTE_MODEL = """from transformers import LlamaForCausalLM

from .configuration_zftest import ZfTestConfig


class ZfTestForCausalLM(LlamaForCausalLM):
    config_class = ZfTestConfig
"""


def test_folder_code_runs_only_when_trusted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import sys

    from transformers import dynamic_module_utils

    monkeypatch.setattr(dynamic_module_utils, "HF_MODULES_CACHE", str(tmp_path / "modules"))
    monkeypatch.setattr(sys, "path", list(sys.path))
    folder = tmp_path / "custom"
    folder.mkdir()
    (folder / "configuration_zftest.py").write_text(REMOTE_CONFIG)
    (folder / "modeling_zftest.py").write_text(REMOTE_MODEL)
    config = transformers.LlamaConfig(**SIZES).to_dict()
    config.update(model_type="zerofit_test_llama", architectures=["ZfTestForCausalLM"])
    config["auto_map"] = {
        "AutoConfig": "configuration_zftest.ZfTestConfig",
        "AutoModelForCausalLM": "modeling_zftest.ZfTestForCausalLM",
    }
    (folder / "config.json").write_text(json.dumps(config))

    with pytest.raises(UserError, match=r"set model\.trust_remote_code=true") as caught:
        build_model(hf=str(folder))
    assert "\n" not in str(caught.value)
    assert capsys.readouterr().err == ""

    spec = build_model(hf=str(folder), trust_remote_code=True, random_init=True)
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "trust_remote_code" in err[0] and "will run" in err[0], err
    assert type(spec.module.hf).__name__ == "ZfTestForCausalLM"
    assert not spec.shape.fused_head  # its own code: the head is not known to be plain
    model = spec.construct()
    assert type(model.hf).__name__ == "ZfTestForCausalLM"
    # Export reads the run's flag too: the folder's classes name the exported tensors.
    from zerofit.export.hf import hf_parameters
    from zerofit.models.hf import load_config as load_hf_config

    arch, shapes, _ = hf_parameters(load_hf_config(str(folder), None, True), True)
    assert arch == "ZfTestForCausalLM" and "lm_head.weight" in shapes
    model.hf.load_state_dict(transformers.LlamaForCausalLM(model.hf.config).state_dict())
    tokens, targets = _batch(SIZES["vocab_size"])
    assert torch.isfinite(model(tokens, targets))


# ---- training runs (2 gloo processes) ---------------------------------------------------------


def tiny_llama(directory: Path) -> Path:
    """A tiny Llama folder with its weights (seed 0)."""
    cfg = transformers.LlamaConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=320,
        max_position_embeddings=256,
    )
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(cfg).save_pretrained(directory, safe_serialization=True)
    return directory


@pytest.mark.slow
@pytest.mark.dist
def test_hf_llama_trains_under_fsdp_from_its_weights_loaded_into_shards(tmp_path: Path) -> None:
    """Step 1's loss under FSDP equals the saved model's own loss on the same global batch, and
    the loss falls over 20 steps (one run; config-only folders, `random_init`, train in
    tests/test_hf_families.py)."""
    model_dir = tiny_llama(tmp_path / "llama")
    extra = {
        "model": {"preset": None, "hf": str(model_dir), "overrides": {}},
        "train": {"steps": 20},
    }
    run = train_run(tmp_path, "hfw", extra, "--nproc", "2")
    got = losses(run)
    assert got[20] < got[1] - 1.0, got
    cfg = config_from_dict(deep_update(TINY, extra))
    data = build_inputs(cfg).data
    batch = [make_loader(cfg, data, r, 2).next_microbatch() for r in range(2)]
    inputs = torch.cat([b[0] for b in batch])
    targets = torch.cat([b[1] for b in batch])
    model = transformers.LlamaForCausalLM.from_pretrained(model_dir)
    with torch.no_grad():
        expected = F.cross_entropy(
            model(inputs).logits.flatten(0, 1).float(), targets.flatten()
        ).item()
    assert got[1] == pytest.approx(expected, rel=1e-5)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["weights"]["files"] == ["model.safetensors"]
    saved = safetensors.torch.load_file(model_dir / "model.safetensors")
    assert summary["weights"]["tensors"] == len(saved)
    assert summary["trainable_params"] == summary["num_params"] == model.num_parameters()

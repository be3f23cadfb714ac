"""A ``model.hf`` folder's weights: every layout transformers writes loads, tensor for tensor; a
folder without weights, a Git LFS pointer, a damaged file, a missing, extra or misshapen tensor is
one error line (exit 2 from the CLI, before any worker starts); ``.bin`` files never run code;
``model.random_init`` skips the weights; the run's weight source and parameter counts."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from conftest import write_config, zerofit

from zerofit.config.schema import LoRAConfig
from zerofit.errors import UserError
from zerofit.launch.run_config import config_from_dict
from zerofit.models import build_model
from zerofit.models.build import param_counts, params_line, weights_line
from zerofit.models.lora import adapter_count, apply_lora, is_adapter

transformers = pytest.importorskip("transformers")
safetensors_torch = pytest.importorskip("safetensors.torch")

SIZES = {
    "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 2, "vocab_size": 320, "max_position_embeddings": 64,
}  # fmt: skip
LAYOUTS = [
    "safetensors",
    "safetensors-index",
    "safetensors-shards",
    "bin",
    "bin-index",
    "bin-shards",
]
SHARD = "20KB"  # the tiny model in several safetensors shards


def _model(tied: bool = False) -> torch.nn.Module:
    torch.manual_seed(0)
    config = transformers.LlamaConfig(**SIZES, tie_word_embeddings=tied)
    return transformers.AutoModelForCausalLM.from_config(config)


def _save_bins(model: torch.nn.Module, folder: Path, index: bool) -> None:
    """``pytorch_model-0000k-of-00003.bin`` shards (and their index), as older transformers did."""
    state = model.state_dict()
    names = list(state)
    parts = [names[k::3] for k in range(3)]
    files = [f"pytorch_model-{k + 1:05d}-of-00003.bin" for k in range(3)]
    weight_map = {}
    for part, name in zip(parts, files, strict=True):
        torch.save({k: state[k].clone() for k in part}, folder / name)
        weight_map.update(dict.fromkeys(part, name))
    if index:
        text = json.dumps({"metadata": {}, "weight_map": weight_map})
        (folder / "pytorch_model.bin.index.json").write_text(text)


def saved(folder: Path, layout: str, tied: bool = False) -> dict[str, torch.Tensor]:
    """A tiny Llama folder in ``layout``; returns the saved state dict."""
    model = _model(tied)
    if layout.startswith("safetensors"):
        shard = {} if layout == "safetensors" else {"max_shard_size": SHARD}
        model.save_pretrained(folder, **shard)
        if layout == "safetensors-shards":
            (folder / "model.safetensors.index.json").unlink()
    else:
        model.config.save_pretrained(folder)
        if layout == "bin":
            torch.save(model.state_dict(), folder / "pytorch_model.bin")
        else:
            _save_bins(model, folder, index=layout == "bin-index")
    return {k: v.clone() for k, v in model.state_dict().items()}


def config_only(folder: Path) -> Path:
    transformers.LlamaConfig(**SIZES).save_pretrained(folder)
    return folder


def refused(folder: Path, **kw: object) -> str:
    """The one line ``build_model`` refuses ``folder`` with."""
    with pytest.raises(UserError) as caught:
        build_model(hf=str(folder), **kw)  # type: ignore[arg-type]
    line = str(caught.value)
    assert "\n" not in line and len(line) < 600, line
    return line


def rewrite(folder: Path, change: dict[str, torch.Tensor | None]) -> None:
    """Replace (a tensor), add (a new name) or drop (None) tensors of a model.safetensors."""
    path = folder / "model.safetensors"
    state = safetensors_torch.load_file(path)
    for name, tensor in change.items():
        if tensor is None:
            del state[name]
        else:
            state[name] = tensor
    safetensors_torch.save_file(state, path)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_every_layout_loads_each_tensor(tmp_path: Path, layout: str) -> None:
    want = saved(tmp_path, layout)
    spec = build_model(hf=str(tmp_path))
    assert spec.weights is not None
    for name, p in spec.module.named_parameters():
        got = spec.weights(name)
        assert got.shape == p.shape and torch.equal(got, want[name.removeprefix("hf.")]), name
    source = spec.weights_source
    assert source is not None and source["format"] == layout.split("-")[0]
    assert source["tensors"] == len(want)


def test_bin_files_are_each_loaded_once_weights_only_memory_mapped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    saved(tmp_path, "bin-index")
    calls: list[tuple[str, dict]] = []
    real = torch.load

    def counted(path: str, **kw: object) -> object:
        calls.append((os.path.basename(path), kw))
        return real(path, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(torch, "load", counted)
    spec = build_model(hf=str(tmp_path))
    assert spec.weights is not None
    for name, _ in spec.module.named_parameters():
        spec.weights(name)
    assert sorted(c[0] for c in calls) == [f"pytorch_model-{k:05d}-of-00003.bin" for k in (1, 2, 3)]
    assert all(kw["weights_only"] and kw["mmap"] for _, kw in calls), calls


def test_safetensors_are_preferred_to_bin(tmp_path: Path) -> None:
    want = saved(tmp_path, "safetensors")
    torch.save({k: torch.zeros_like(v) for k, v in want.items()}, tmp_path / "pytorch_model.bin")
    spec = build_model(hf=str(tmp_path))
    assert spec.weights_source is not None and spec.weights_source["format"] == "safetensors"
    assert spec.weights is not None
    assert torch.equal(spec.weights("hf.model.norm.weight"), want["model.norm.weight"])


def test_a_folder_without_weights_is_refused_unless_random_init(tmp_path: Path) -> None:
    config_only(tmp_path)
    line = refused(tmp_path)
    assert f"{tmp_path} holds no weights" in line and "model.random_init=true" in line, line
    spec = build_model(hf=str(tmp_path), random_init=True)
    assert spec.weights is None
    assert spec.weights_source == {"format": "none", "reason": "model.random_init: true"}
    assert weights_line(spec.weights_source) == (
        "weights: none (model.random_init: true): random initialisation"
    )
    preset = build_model(preset="tiny", random_init=False)  # presets: always random
    assert preset.weights is None and "model.preset: tiny" in weights_line(preset.weights_source)


def test_random_init_does_not_read_the_weights(tmp_path: Path) -> None:
    saved(tmp_path, "safetensors")
    (tmp_path / "model.safetensors").write_bytes(b"not read")
    assert build_model(hf=str(tmp_path), random_init=True).weights is None


def test_a_missing_tensor_is_named(tmp_path: Path) -> None:
    saved(tmp_path, "safetensors")
    rewrite(tmp_path, {"model.layers.1.mlp.up_proj.weight": None})
    line = refused(tmp_path)
    assert "lack 1 of the model's 21 parameters: model.layers.1.mlp.up_proj.weight" in line, line
    layer = [k for k in saved(tmp_path / "b", "safetensors") if k.startswith("model.layers.1.")]
    rewrite(tmp_path / "b", dict.fromkeys(layer))
    line = refused(tmp_path / "b")
    assert f"lack {len(layer)} of the model's" in line and f"and {len(layer) - 3} more" in line


def test_an_unexpected_tensor_is_named_and_buffers_are_ignored(tmp_path: Path) -> None:
    saved(tmp_path, "safetensors")
    rewrite(tmp_path, {"model.layers.0.self_attn.rotary_emb.inv_freq": torch.ones(4)})
    build_model(hf=str(tmp_path))  # an older layout's buffer: ignored, as transformers does
    rewrite(tmp_path, {"model.layers.2.mlp.up_proj.weight": torch.ones(64, 32)})
    line = refused(tmp_path)
    assert "hold 1 tensors no parameter of the model takes: model.layers.2.mlp.up_proj" in line
    line = refused(tmp_path, overrides={"num_hidden_layers": 1})  # fewer layers than the files
    assert "model.overrides changes config.json" in line, line


def test_a_shape_mismatch_names_both_shapes(tmp_path: Path) -> None:
    saved(tmp_path, "safetensors")
    rewrite(tmp_path, {"model.norm.weight": torch.ones(31)})
    line = refused(tmp_path)
    assert "model.norm.weight has shape [31], the model's model.norm.weight [32]" in line, line


@pytest.mark.parametrize("layout", ["safetensors", "bin"])
def test_a_tied_head_takes_the_embedding(tmp_path: Path, layout: str) -> None:
    want = saved(tmp_path, layout, tied=True)  # safetensors: no lm_head; .bin: both names
    files = sorted(tmp_path.glob("*.safetensors")) + sorted(tmp_path.glob("*.bin"))
    load = safetensors_torch.load_file if layout == "safetensors" else torch.load
    assert ("lm_head.weight" in load(files[0])) is (layout == "bin")
    spec = build_model(hf=str(tmp_path))
    assert spec.weights is not None
    assert torch.equal(spec.weights("hf.lm_head.weight"), want["model.embed_tokens.weight"])


def test_an_untied_head_must_be_in_the_files(tmp_path: Path) -> None:
    saved(tmp_path, "safetensors")
    rewrite(tmp_path, {"lm_head.weight": None})
    assert "lm_head.weight" in refused(tmp_path)


@pytest.mark.parametrize("name", ["model.safetensors", "pytorch_model.bin"])
def test_a_git_lfs_pointer_is_named(tmp_path: Path, name: str) -> None:
    config_only(tmp_path)
    pointer = "version https://git-lfs.github.com/spec/v1\noid sha256:0123\nsize 2471000000\n"
    (tmp_path / name).write_text(pointer)
    line = refused(tmp_path)
    assert line == f"{name} is a Git LFS pointer, not the weights: run `git lfs pull` in {tmp_path}"


def test_a_git_lfs_pointer_shard_is_named(tmp_path: Path) -> None:
    saved(tmp_path, "safetensors-index")
    shard = sorted(tmp_path.glob("model-*.safetensors"))[2]
    shard.write_text("version https://git-lfs.github.com/spec/v1\noid sha256:0\nsize 9\n")
    assert refused(tmp_path).startswith(f"{shard.name} is a Git LFS pointer")


def test_a_truncated_safetensors_file_is_named(tmp_path: Path) -> None:
    saved(tmp_path, "safetensors")
    path = tmp_path / "model.safetensors"
    data = path.read_bytes()
    path.write_bytes(data[:-100])
    line = refused(tmp_path)
    assert f"model.safetensors in {tmp_path} is truncated or not a safetensors file" in line
    assert f"describes {len(data)} bytes, the file holds {len(data) - 100}" in line, line
    path.write_bytes(b"\xff" * 64)  # a header length beyond the file
    assert "truncated or not a safetensors file (a header of" in refused(tmp_path)
    path.write_bytes(b"")
    assert "not a safetensors file (0 bytes, too few for a header)" in refused(tmp_path)


def test_a_truncated_bin_file_is_named(tmp_path: Path) -> None:
    saved(tmp_path, "bin")
    path = tmp_path / "pytorch_model.bin"
    path.write_bytes(path.read_bytes()[:1000])
    line = refused(tmp_path)
    assert line.startswith(f"pytorch_model.bin in {tmp_path} is truncated or not a PyTorch"), line


class _Payload:
    """Pickles as a call to os.mkdir: what a hostile .bin would run on a plain torch.load."""

    def __init__(self, target: Path) -> None:
        self.target = target

    def __reduce__(self) -> tuple:
        return (os.mkdir, (str(self.target),))


def test_a_bin_file_with_code_is_refused_not_run(tmp_path: Path) -> None:
    config_only(tmp_path)
    marker = tmp_path / "ran"
    torch.save({"model.norm.weight": _Payload(marker)}, tmp_path / "pytorch_model.bin")
    line = refused(tmp_path)
    assert "holds Python objects, not only tensors" in line and "weights_only" in line, line
    assert not marker.exists()


def test_the_weight_source_names_files_tensors_and_bytes(tmp_path: Path) -> None:
    want = saved(tmp_path, "safetensors-index")
    spec = build_model(hf=str(tmp_path))
    shards = sorted(tmp_path.glob("model-*.safetensors"))
    assert len(shards) > 1
    assert spec.weights_source == {
        "format": "safetensors",
        "directory": str(tmp_path),
        "files": [p.name for p in shards],
        "tensors": len(want),
        "bytes": sum(p.stat().st_size for p in shards),
    }
    line = weights_line(spec.weights_source)
    assert line.startswith(
        f"weights: {len(shards)} safetensors files in {tmp_path}, {len(want)} tensors ("
    ), line
    assert line.endswith(" kB)"), line


def test_lora_counts_only_the_adapters_as_trainable(tmp_path: Path) -> None:
    want = saved(tmp_path, "safetensors")
    base = build_model(hf=str(tmp_path))
    total = param_counts(base.module)[0]
    assert param_counts(base.module) == (total, total) and total == base.num_params
    spec = apply_lora(base, LoRAConfig(rank=4, targets=["q_proj", "v_proj"]))
    assert spec.weights is not None
    all_params, trainable = param_counts(spec.module)
    # q_proj 32 -> 32 and v_proj 32 -> 16 in each of 2 layers: A [4, in] + B [out, 4]
    assert trainable == adapter_count(spec.module) == 2 * (4 * 32 + 32 * 4 + 4 * 32 + 16 * 4)
    assert all_params == total + trainable == spec.num_params
    for name, p in spec.module.named_parameters():  # the base loads, the adapters initialise
        got = spec.weights(name)
        assert (got is None) if is_adapter(name) else torch.equal(got, want[name[3:]]), name
        assert p.requires_grad is is_adapter(name)
    assert params_line(all_params, trainable) == "params: 40.0K, 896 trainable (2.24%)"


def test_the_run_inputs_count_the_trainable_parameters(tmp_path: Path) -> None:
    from zerofit.train.inputs import build_inputs

    saved(tmp_path, "safetensors")
    model = {"preset": None, "hf": str(tmp_path), "seq_len": 32, "lora": {"rank": 4}}
    cfg = config_from_dict({"model": model, "data": {"tokenizer": "byte", "max_tokens": 20_000}})
    spec = build_inputs(cfg).spec
    assert spec.trainable_params == adapter_count(spec.module) > 0


def test_cli_refuses_a_folder_without_weights_in_one_line(tmp_path: Path) -> None:
    folder = config_only(tmp_path / "model")
    model = {"preset": None, "hf": str(folder), "overrides": {}}
    cfg = write_config(tmp_path / "c.yaml", {"model": model, "data": {"tokenizer": "byte"}})
    proc = zerofit("train", "-c", str(cfg), "--nproc", "2", cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr[-3000:]
    err = proc.stderr.strip()
    assert err.startswith(f"error: {folder} holds no weights") and "\n" not in err, err
    assert "Traceback" not in proc.stdout + proc.stderr
    assert not (tmp_path / "runs").exists()  # refused before a run directory

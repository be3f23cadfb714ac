"""LoRA's update is ``(alpha / rank) * B @ A`` on every path: `LoRALinear` (lean, through
`lora_delta`, and module by module), `lora_delta`'s own backward, and the merge of ``zerofit
export`` (`merged_reader`), checked on tiny layers with known A and B. alpha != rank and alpha/rank
!= rank/alpha (8 / 2 = 4 against 0.25; 3 / 2 = 1.5 against 0.67), so an inverted or dropped
scale fails here in milliseconds, not in the slow export test.

Also the parts a user's adapters rest on: which layers are adapted, what trains, the factors'
initial values, and the PEFT adapter config and tensor shapes that ``--adapter`` writes.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import math
from pathlib import Path

import pytest
import torch
from conftest import same_bits
from torch import nn

from zerofit.checkpoint.neutral import MODEL
from zerofit.config.schema import LoRAConfig
from zerofit.errors import UserError
from zerofit.export.lora import (
    LoRAInfo,
    adapter_config,
    adapter_tensors,
    base_names,
    dequantized,
    lora_info,
    merged_reader,
    write_adapter,
)
from zerofit.models import build_model
from zerofit.models.lora import (
    LoRALinear,
    LoRAShape,
    adapter_count,
    apply_lora,
    block_adapters,
    init_adapter_,
    inject,
    is_adapter,
    linear_layers,
    select_targets,
)
from zerofit.models.lora_delta import lora_delta
from zerofit.models.loss import LMHead
from zerofit.models.nf4 import PIECES, dequantize, quantize

IN, OUT = 3, 4
# (rank, alpha): the scale, and what it would be inverted
SCALES = [(2, 8.0), (2, 3.0), (1, 0.5)]


def factors(rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A [rank, IN] and B [OUT, rank]: small integers, not symmetric, B nonzero."""
    a = torch.arange(1.0, 1.0 + rank * IN).reshape(rank, IN) - 2.0
    b = torch.arange(1.0, 1.0 + OUT * rank).reshape(OUT, rank) * 0.5
    return a, b


def base_layer() -> nn.Linear:
    layer = nn.Linear(IN, OUT)
    with torch.no_grad():
        layer.weight.copy_(torch.arange(OUT * IN, dtype=torch.float32).reshape(OUT, IN) / 10)
        layer.bias.copy_(torch.tensor([0.5, -1.0, 2.0, 0.0]))
    return layer


def adapted(rank: int, alpha: float, lean: bool, dropout: float = 0.0) -> LoRALinear:
    layer = LoRALinear(base_layer(), rank, alpha, dropout, lean)
    a, b = factors(rank)
    with torch.no_grad():
        layer.lora_A.weight.copy_(a)
        layer.lora_B.weight.copy_(b)
    return layer


X = torch.tensor([[1.0, 0.0, -2.0], [0.5, 3.0, 1.0]])


def expected(rank: int, alpha: float, x: torch.Tensor = X) -> torch.Tensor:
    base = base_layer()
    a, b = factors(rank)
    with torch.no_grad():
        return x @ base.weight.T + base.bias + (alpha / rank) * (x @ a.T @ b.T)


@pytest.mark.parametrize(("rank", "alpha"), SCALES)
@pytest.mark.parametrize("lean", [True, False], ids=["lean", "modules"])
def test_lora_linear_adds_alpha_over_rank_times_b_a(rank: int, alpha: float, lean: bool) -> None:
    layer = adapted(rank, alpha, lean)
    assert layer.scale == alpha / rank
    for mode in (layer.train, layer.eval):
        mode()
        torch.testing.assert_close(layer(X), expected(rank, alpha), rtol=0, atol=1e-5)
    # the same in a batch of sequences [batch, seq, in]
    x3 = torch.stack([X, -X])
    torch.testing.assert_close(layer(x3)[1], expected(rank, alpha, -X), rtol=0, atol=1e-5)


@pytest.mark.parametrize(("rank", "alpha"), SCALES)
@pytest.mark.parametrize("lean", [True, False], ids=["lean", "modules"])
def test_lora_linear_gradients_are_those_of_the_scaled_update(
    rank: int, alpha: float, lean: bool
) -> None:
    layer = adapted(rank, alpha, lean)
    x = X.clone().requires_grad_()
    g = torch.tensor([[1.0, -1.0, 0.5, 2.0], [0.0, 1.0, 1.0, -1.0]])
    (layer(x) * g).sum().backward()
    a, b = factors(rank)
    s = alpha / rank
    w = base_layer().weight.detach()
    torch.testing.assert_close(layer.lora_B.weight.grad, s * g.T @ (X @ a.T), atol=1e-5, rtol=0)
    torch.testing.assert_close(layer.lora_A.weight.grad, s * (g @ b).T @ X, atol=1e-5, rtol=0)
    torch.testing.assert_close(x.grad, g @ w + s * g @ b @ a, atol=1e-5, rtol=0)


@pytest.mark.parametrize(("rank", "alpha"), SCALES)
def test_lora_delta_is_the_scaled_product_and_its_gradients(rank: int, alpha: float) -> None:
    a0, b0 = factors(rank)
    scale = alpha / rank
    x = X.clone().requires_grad_()
    a, b = a0.clone().requires_grad_(), b0.clone().requires_grad_()
    out = lora_delta(x, a, b, 0.0, scale, training=True)
    torch.testing.assert_close(out, scale * X @ a0.T @ b0.T, atol=1e-5, rtol=0)
    g = torch.tensor([[1.0, 2.0, -1.0, 0.5], [3.0, 0.0, 1.0, 1.0]])
    (out * g).sum().backward()
    torch.testing.assert_close(x.grad, scale * g @ b0 @ a0, atol=1e-5, rtol=0)
    torch.testing.assert_close(a.grad, scale * (g @ b0).T @ X, atol=1e-5, rtol=0)
    torch.testing.assert_close(b.grad, scale * g.T @ (X @ a0.T), atol=1e-5, rtol=0)


@pytest.mark.parametrize("p", [0.25, 0.5])
def test_lora_delta_dropout_drops_and_rescales_the_same_inputs_in_backward(p: float) -> None:
    """A = B = I (rank = in = out) makes the update ``scale * mask * x / (1 - p)``: the mask can
    be read back, and backward must use the same one."""
    n, scale = 64, 1.5
    torch.manual_seed(0)
    x = (torch.rand(8, n) + 1.0).requires_grad_()
    eye = torch.eye(n)
    out = lora_delta(x, eye, eye, p, scale, training=True)
    kept = out.detach() / (scale * x.detach() / (1 - p))
    assert set(kept.round(decimals=4).unique().tolist()) == {0.0, 1.0}
    dropped = (kept < 0.5).float().mean().item()
    assert 0.5 * p < dropped < 1.5 * p
    out.sum().backward()
    torch.testing.assert_close(x.grad, scale * kept / (1 - p), atol=1e-5, rtol=0)
    # not training: no dropout at all
    again = lora_delta(x.detach(), eye, eye, p, scale, training=False)
    torch.testing.assert_close(again, scale * x.detach(), atol=1e-6, rtol=0)


@pytest.mark.parametrize(("lean", "p"), [(True, 0.9), (False, 0.5)], ids=["lean", "module"])
def test_lora_linear_dropout_applies_only_in_training(lean: bool, p: float) -> None:
    layer = adapted(2, 8.0, lean=lean, dropout=p)
    assert isinstance(layer.dropout, nn.Dropout) and layer.dropout.p == p
    layer.eval()
    torch.testing.assert_close(layer(X), expected(2, 8.0), rtol=0, atol=1e-5)
    layer.train()
    torch.manual_seed(1)
    outs = torch.stack([layer(X) for _ in range(8)])
    assert not torch.allclose(outs, expected(2, 8.0).expand_as(outs))
    assert isinstance(adapted(2, 8.0, lean=lean).dropout, nn.Identity)  # no dropout: none


# ----------------------------------------------------------------------------- export: merge


class View:
    """What `merged_reader` and `lora_info` read of a checkpoint: tensors by neutral key."""

    def __init__(self, tensors: dict[str, torch.Tensor]) -> None:
        self.tensors = tensors
        self.where = "ckpt/step_00000004"
        self.entries = {k: (tuple(v.shape), v.dtype) for k, v in tensors.items()}

    def names(self) -> list[str]:
        return [k[len(MODEL) :] for k in self.tensors if k.startswith(MODEL)]

    def read(self, key: str, dtype: torch.dtype | None = None) -> torch.Tensor:
        t = self.tensors[key]
        return t.to(dtype or t.dtype, copy=True)


def lora_view(rank: int) -> View:
    a, b = factors(rank)
    layer = base_layer()
    return View(
        {
            f"{MODEL}q.weight": layer.weight.detach().clone(),
            f"{MODEL}q.bias": layer.bias.detach().clone(),
            f"{MODEL}q.lora_A.weight": a,
            f"{MODEL}q.lora_B.weight": b,
            f"{MODEL}k.weight": torch.full((OUT, IN), 7.0),
        }
    )


@pytest.mark.parametrize(("rank", "alpha"), SCALES)
def test_the_export_merges_w_plus_alpha_over_rank_b_a(rank: int, alpha: float) -> None:
    info = LoRAInfo(rank, alpha, ["q"])
    assert info.scale == alpha / rank
    view = lora_view(rank)
    read = merged_reader(view, info)
    a, b = factors(rank)
    want = base_layer().weight.detach() + (alpha / rank) * b @ a
    torch.testing.assert_close(read(f"{MODEL}q.weight", torch.float32), want, rtol=0, atol=1e-6)
    # the merged layer computes what the adapted one does
    merged = read(f"{MODEL}q.weight", torch.float32)
    torch.testing.assert_close(
        X @ merged.T + base_layer().bias.detach(), expected(rank, alpha), rtol=1e-6, atol=1e-5
    )
    # others pass through: a bias, a layer without adapters, the factors themselves
    assert torch.equal(read(f"{MODEL}q.bias", torch.float32), view.tensors[f"{MODEL}q.bias"])
    assert torch.equal(read(f"{MODEL}k.weight", torch.float32), torch.full((OUT, IN), 7.0))
    assert torch.equal(read(f"{MODEL}q.lora_A.weight", torch.float32), a)
    # the stored weight is not changed by a merge (it is read again each time)
    assert torch.equal(view.tensors[f"{MODEL}q.weight"], base_layer().weight.detach())


def test_the_merge_is_in_fp32_then_cast() -> None:
    info = LoRAInfo(2, 8.0, ["q"])
    view = lora_view(2)
    got = merged_reader(view, info)(f"{MODEL}q.weight", torch.bfloat16)
    a, b = factors(2)
    want = (base_layer().weight.detach() + 4.0 * b @ a).to(torch.bfloat16)
    assert got.dtype == torch.bfloat16 and torch.equal(got, want)


def test_without_lora_the_reader_passes_weights_through() -> None:
    view = lora_view(2)
    read = merged_reader(view, None)
    assert torch.equal(read(f"{MODEL}q.weight", torch.float32), base_layer().weight.detach())


def test_lora_info_reads_the_fingerprint_and_checks_the_factors() -> None:
    view = lora_view(2)
    meta = {"model": {"lora": {"rank": 2, "alpha": 3, "modules": ["q"]}}}
    info = lora_info(meta, view)
    assert info == LoRAInfo(2, 3.0, ["q"]) and info.scale == 1.5
    assert lora_info({"model": {}}, view) is None
    assert lora_info({}, view) is None
    assert lora_info({"model": None}, view) is None
    for factor in ("lora_A", "lora_B"):
        partial = View({k: v for k, v in view.tensors.items() if factor not in k})
        with pytest.raises(UserError, match=rf"lacks the adapter q\.{factor}$"):
            lora_info(meta, partial)
    assert base_names(view) == ["q.weight", "q.bias", "k.weight"]


# ----------------------------------------------------------------------------- export: PEFT


def test_the_adapter_config_carries_rank_and_alpha_unscaled() -> None:
    """PEFT computes lora_alpha / r itself: the config must hold both as trained."""
    info = LoRAInfo(2, 8.0, ["layers.0.q", "layers.1.q"])
    linear = {"m.layers.0.q", "m.layers.1.q", "m.layers.0.k", "m.layers.1.k"}
    cfg = adapter_config(info, ["m.layers.0.q", "m.layers.1.q"], linear, 0.05, "base")
    assert (cfg["r"], cfg["lora_alpha"], cfg["lora_dropout"]) == (2, 8.0, 0.05)
    assert cfg["target_modules"] == ["q"]  # the leaf name selects exactly the adapted layers
    assert cfg["peft_type"] == "LORA" and cfg["task_type"] == "CAUSAL_LM"
    assert cfg["base_model_name_or_path"] == "base"
    assert cfg["use_rslora"] is False and cfg["use_dora"] is False  # rslora: alpha / sqrt(r)
    assert cfg["fan_in_fan_out"] is False and cfg["bias"] == "none"
    assert cfg["inference_mode"] is True and cfg["modules_to_save"] is None
    # a leaf name that would select more than the adapted layers: full names
    only_one = adapter_config(info, ["m.layers.0.q"], linear, 0.0, "base")
    assert only_one["target_modules"] == ["m.layers.0.q"]


def test_adapter_tensors_are_checked_against_the_hf_shapes() -> None:
    view = lora_view(2)
    info = LoRAInfo(2, 8.0, ["q"])
    names = adapter_tensors(info, view, lambda n: "model." + n, {"model.q.weight": (OUT, IN)})
    assert names == [
        (f"{MODEL}q.lora_A.weight", "base_model.model.model.q.lora_A.weight"),
        (f"{MODEL}q.lora_B.weight", "base_model.model.model.q.lora_B.weight"),
    ]
    with pytest.raises(UserError, match=r"q\.lora_A\.weight has shape \(2, 3\), not \(2, 4\)"):
        adapter_tensors(info, view, lambda n: n, {"q.weight": (OUT, OUT)})
    with pytest.raises(UserError, match=r"q\.lora_B\.weight has shape \(4, 2\), not \(3, 2\)"):
        adapter_tensors(info, view, lambda n: n, {"q.weight": (IN, IN)})
    with pytest.raises(UserError, match="adapted layer q has no HF weight"):
        adapter_tensors(info, view, lambda n: None, {"q.weight": (OUT, IN)})
    with pytest.raises(UserError, match="adapted layer q has no HF weight"):
        adapter_tensors(info, view, lambda n: n, {})


# ----------------------------------------------------------------------------- the model


class Tiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(10, IN)
        self.block = nn.ModuleDict({"q": nn.Linear(IN, IN), "k": nn.Linear(IN, IN, bias=False)})
        self.mlp = nn.Sequential(nn.Linear(IN, OUT), nn.ReLU(), nn.Linear(OUT, IN))
        self.output = LMHead(IN, 10, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.embed(tokens)
        h = self.block["q"](h) + self.block["k"](h)
        return self.output(self.mlp(h))


def test_targets_select_by_exact_name_or_dotted_suffix_never_the_head() -> None:
    m = Tiny()
    assert list(linear_layers(m)) == ["block.q", "block.k", "mlp.0", "mlp.2"]
    assert select_targets(m, "all-linear") == ["block.q", "block.k", "mlp.0", "mlp.2"]
    assert select_targets(m, ["k", "q"]) == ["block.q", "block.k"]  # module order
    assert select_targets(m, "block.k") == ["block.k"]
    assert select_targets(m, ["0"]) == ["mlp.0"]
    with pytest.raises(UserError, match="'lock.k' matches no linear layer"):
        select_targets(m, ["lock.k"])  # a suffix only at a dot
    with pytest.raises(UserError, match=r"'output' matches no linear layer \(that is the output"):
        select_targets(m, ["output"])
    with pytest.raises(UserError, match="model.lora.targets is empty"):
        select_targets(m, [])
    with pytest.raises(UserError, match="no linear layer to adapt"):
        select_targets(nn.Sequential(nn.ReLU()), "all-linear")


@pytest.mark.parametrize(("rank", "alpha"), SCALES)
def test_inject_adapts_the_named_layers_and_trains_only_the_factors(
    rank: int, alpha: float
) -> None:
    m = Tiny()
    q_weight = m.block["q"].weight
    inject(m, ["block.q", "mlp.2"], rank, alpha, 0.0)
    assert isinstance(m.block["q"], LoRALinear) and isinstance(m.mlp[2], LoRALinear)
    assert isinstance(m.block["k"], nn.Linear) and not isinstance(m.block["k"], LoRALinear)
    assert m.block["q"].weight is q_weight  # the base's own parameter, same name
    assert m.block["q"].scale == alpha / rank == m.mlp[2].scale
    assert m.block["q"].lora_A.weight.shape == (rank, IN)
    assert m.block["q"].lora_B.weight.shape == (IN, rank)
    trains = sorted(n for n, p in m.named_parameters() if p.requires_grad)
    assert trains == [
        "block.q.lora_A.weight", "block.q.lora_B.weight",
        "mlp.2.lora_A.weight", "mlp.2.lora_B.weight",
    ]  # fmt: skip
    # the frozen embedding's output requires grad, so the first block's backward runs
    out = m.embed(torch.tensor([[1, 2]]))
    assert out.requires_grad
    with torch.no_grad():
        assert not m.embed(torch.tensor([[1, 2]])).requires_grad


def test_adapter_names() -> None:
    assert is_adapter("layers.0.wq.lora_A.weight") and is_adapter("lora_B.weight")
    assert not is_adapter("layers.0.wq.weight")
    assert not is_adapter("layers.0.wq.lora_A.bias")
    assert not is_adapter("lora_A")
    assert not is_adapter("layers.lora_A.x.weight")


def test_factors_start_as_peft_does() -> None:
    g = torch.Generator().manual_seed(0)
    a = torch.empty(8, 400)
    init_adapter_("layers.0.wq.lora_A.weight", a, g)
    bound = 1 / math.sqrt(400)
    assert a.abs().max() <= bound and a.abs().max() > 0.9 * bound
    assert abs(a.std().item() - bound / math.sqrt(3)) < 0.1 * bound
    b = torch.ones(400, 8)
    init_adapter_("layers.0.wq.lora_B.weight", b, g)
    assert not b.any()
    # bf16 factors are drawn in fp32 then cast: the same numbers as fp32, rounded
    a16 = torch.empty(8, 400, dtype=torch.bfloat16)
    init_adapter_("x.lora_A.weight", a16, torch.Generator().manual_seed(0))
    a32 = torch.empty(8, 400)
    init_adapter_("x.lora_A.weight", a32, torch.Generator().manual_seed(0))
    assert torch.equal(a16, a32.to(torch.bfloat16))


def test_lora_shape_drops_two_flops_per_frozen_weight() -> None:
    from dataclasses import fields

    from zerofit.launch.run_config import default_config
    from zerofit.models.shape import ModelShape, shape_from_config

    base = shape_from_config(default_config())
    kw = {f.name: getattr(base, f.name) for f in fields(ModelShape)}
    shape = LoRAShape(**kw, frozen_flops_params=1000)
    assert shape.flops_per_token(64) == base.flops_per_token(64) - 2000.0


# ----------------------------------------------------------------------------- a model, end to end


def test_the_fingerprint_carries_rank_and_alpha_to_the_export() -> None:
    """Training writes ``model.lora`` of the fingerprint into the checkpoint's meta.json; the
    export reads its scale from there: alpha / rank, not swapped."""
    base = build_model("tiny", overrides={"n_layers": 2})
    base_params, base_flops = base.shape.num_params, base.shape.flops_params
    spec = apply_lora(base, LoRAConfig(rank=2, alpha=3.0, targets=["wq", "w2"]))
    fp = spec.fingerprint["lora"]
    modules = [
        "layers.0.attention.wq", "layers.0.feed_forward.w2",
        "layers.1.attention.wq", "layers.1.feed_forward.w2",
    ]  # fmt: skip
    assert fp == {"rank": 2, "alpha": 3.0, "modules": modules}
    layers = [m for m in spec.module.modules() if isinstance(m, LoRALinear)]
    assert len(layers) == 4 and all(m.scale == 1.5 for m in layers)
    entries = {
        f"{MODEL}{m}.{f}.weight": torch.zeros(1) for m in modules for f in ("lora_A", "lora_B")
    }
    info = lora_info({"model": {"lora": fp}}, View(entries))
    assert info == LoRAInfo(2, 3.0, modules) and info.scale == 1.5
    # the shape counts the adapters; the FLOPs drop the frozen base's weight gradients
    n_adapters = adapter_count(spec.module)
    assert n_adapters == sum(2 * (m.in_features + m.out_features) for m in layers)
    assert spec.shape.num_params == base_params + n_adapters
    assert spec.shape.frozen_flops_params == base_flops
    blocks = spec.module.get_submodule(spec.blocks_path)
    assert spec.shape.block_params == max(sum(p.numel() for p in b.parameters()) for b in blocks)
    assert spec.shape.root_params == base.shape.root_params
    assert len(block_adapters(spec)) == 2
    # rank 0: LoRA off, the spec itself
    assert apply_lora(base, LoRAConfig(rank=0)) is base


def test_the_adapter_folder_holds_peft_names_in_the_export_dtype(tmp_path: Path) -> None:
    import json

    from safetensors.torch import load_file

    view = lora_view(2)
    info = LoRAInfo(2, 8.0, ["q"])
    names = adapter_tensors(info, view, lambda n: "model." + n, {"model.q.weight": (OUT, IN)})
    config = adapter_config(info, ["model.q"], {"model.q"}, 0.0, "base")
    size = write_adapter(view, names, torch.bfloat16, config, tmp_path)
    got = load_file(str(tmp_path / "adapter_model.safetensors"))
    a, b = factors(2)
    assert sorted(got) == [
        "base_model.model.model.q.lora_A.weight",
        "base_model.model.model.q.lora_B.weight",
    ]
    assert torch.equal(got["base_model.model.model.q.lora_A.weight"], a.to(torch.bfloat16))
    assert torch.equal(got["base_model.model.model.q.lora_B.weight"], b.to(torch.bfloat16))
    assert size == (a.numel() + b.numel()) * 2
    assert json.loads((tmp_path / "adapter_config.json").read_text()) == config


def test_a_meta_model_gets_meta_factors_and_shows_its_scale() -> None:
    with torch.device("meta"):
        base = nn.Linear(IN, OUT)
    layer = LoRALinear(base, 2, 3.0, 0.0)
    assert layer.lora_A.weight.is_meta and layer.lora_B.weight.is_meta
    assert not LoRALinear(nn.Linear(IN, OUT), 2, 3.0, 0.0).lora_A.weight.is_meta
    assert "in=3, out=4, r=2, scale=1.5" in repr(layer)


class HFLike(nn.Module):
    """A Hugging Face style model: a config, input and output embeddings by method."""

    def __init__(self) -> None:
        super().__init__()
        self.config = object()
        self.tok = nn.Embedding(10, IN)
        self.proj = nn.Linear(IN, IN)
        self.lm_head = nn.Linear(IN, 10, bias=False)

    def get_input_embeddings(self) -> nn.Module:
        return self.tok

    def get_output_embeddings(self) -> nn.Module:
        return self.lm_head


def test_hugging_face_heads_and_embeddings_are_found_by_their_methods() -> None:
    m = HFLike()
    assert list(linear_layers(m)) == ["proj"]  # lm_head: the output head
    with pytest.raises(UserError, match=r"'lm_head' matches no linear layer \(that is the output"):
        select_targets(m, ["lm_head"])
    inject(m, ["proj"], 2, 4.0, 0.0)
    assert m.tok(torch.tensor([1])).requires_grad  # its input embedding, by the method


def test_a_top_level_layer_is_adapted_in_place() -> None:
    m = nn.Sequential(nn.Linear(IN, OUT), nn.ReLU())
    inject(m, ["0"], 2, 8.0, 0.0)
    assert isinstance(m[0], LoRALinear) and m[0].scale == 4.0


def test_the_adapted_spec_initialises_reads_and_rebuilds_with_its_adapters() -> None:
    base = build_model("tiny", overrides={"n_layers": 1})
    spec = apply_lora(base, LoRAConfig(rank=2, alpha=4.0, targets=["wq"]))
    g = torch.Generator().manual_seed(0)
    b = torch.ones(4, 2)
    spec.init_param_("layers.0.attention.wq.lora_B.weight", b, g)
    assert not b.any()  # the adapter init, not the base's
    a = torch.zeros(2, 64)
    spec.init_param_("layers.0.attention.wq.lora_A.weight", a, g)
    assert 0 < a.abs().max() <= 1 / 8
    rebuilt = spec.construct()
    layers = [m for m in rebuilt.modules() if isinstance(m, LoRALinear)]
    assert len(layers) == 1 and layers[0].scale == 2.0
    assert spec.weights is None  # a preset: nothing on disk, for the base or the adapters
    on_disk = {"w": torch.ones(1)}
    from dataclasses import replace as dc_replace

    with_disk = apply_lora(
        dc_replace(build_model("tiny", overrides={"n_layers": 1}), weights=on_disk.get),
        LoRAConfig(rank=2, alpha=4.0, targets=["wq"]),
    )
    assert with_disk.weights("w") is on_disk["w"]
    assert with_disk.weights("layers.0.attention.wq.lora_A.weight") is None


class Wrapped(nn.Module):
    """As zerofit holds a Hugging Face model (`HFCausalLM`): under ``hf``, so its head is
    ``hf.lm_head``."""

    def __init__(self) -> None:
        super().__init__()
        self.hf = HFLike()


def test_the_head_named_by_its_last_name_is_said_to_be_the_head() -> None:
    with pytest.raises(
        UserError,
        match=r"^model\.lora\.targets: 'lm_head' matches no linear layer \(that is the output head",
    ):
        select_targets(Wrapped(), ["lm_head"])


def test_a_module_that_is_not_linear_is_not_called_the_head() -> None:
    with pytest.raises(UserError) as err:
        select_targets(Wrapped(), ["tok"])  # the embedding: not linear, not the head
    assert str(err.value) == (
        "model.lora.targets: 'tok' matches no linear layer; valid module-name suffixes: proj"
    )


def test_a_misspelt_dotted_target_is_matched_by_its_last_name() -> None:
    with pytest.raises(
        UserError,
        match=r"'model\.layers\.0\.projj' matches no linear layer \(did you mean 'proj'\?\)",
    ):
        select_targets(Wrapped(), ["model.layers.0.projj"])


class PositionsFirst(nn.Module):
    """A Hugging Face style model whose first ``nn.Embedding`` is not the one it reads tokens
    through (a position table, or a vision tower's, registered first)."""

    def __init__(self) -> None:
        super().__init__()
        self.config = object()
        self.pos = nn.Embedding(10, IN)
        self.tok = nn.Embedding(10, IN)
        self.proj = nn.Linear(IN, IN)

    def get_input_embeddings(self) -> nn.Module:
        return self.tok


def test_the_input_embedding_is_the_one_the_model_names() -> None:
    m = PositionsFirst()
    inject(m, ["proj"], 2, 4.0, 0.0)
    assert m.tok(torch.tensor([1])).requires_grad  # the first block's input needs a gradient


# ----------------------------------------------------------------------------- QLoRA (nf4)

needs_torchao = pytest.mark.skipif(
    importlib.util.find_spec("torchao") is None, reason="QLoRA quantises with torchao"
)
WQ = "layers.0.attention.wq"  # 256 x 256 in the tiny preset: one NF4 quantum of 16384, 4 times


def qlora_spec(quantize: str = "nf4", weights: dict[str, torch.Tensor] | None = None):  # noqa: ANN201
    base = build_model("tiny", overrides={"n_layers": 1})
    if weights is not None:
        base = dataclasses.replace(base, weights=weights.get)
    return apply_lora(base, LoRAConfig(rank=2, alpha=4.0, targets=["wq"], quantize=quantize))


@needs_torchao
def test_a_qlora_base_quantises_the_weights_on_disk_and_reads_the_rest_as_they_are() -> None:
    """A QLoRA run from a Hugging Face folder: the 4-bit layer is quantised from its weight on
    disk, every other weight is read as it is there, the adapters start from their init."""
    g = torch.Generator().manual_seed(0)
    on_disk = {
        f"{WQ}.weight": torch.randn(256, 256, generator=g),
        "tok_embeddings.weight": torch.randn(512, 256, generator=g),
    }
    spec = qlora_spec(weights=on_disk)
    got = {p: spec.weights(f"{WQ}.nf4.{p}") for p in PIECES}
    want = quantize(on_disk[f"{WQ}.weight"].to(got["codes"].device))
    for piece in PIECES:
        assert same_bits(got[piece], want[piece]), piece
    assert spec.weights("tok_embeddings.weight") is on_disk["tok_embeddings.weight"]
    assert spec.weights(f"{WQ}.lora_A.weight") is None  # not on disk: initialised


@needs_torchao
def test_the_export_reads_a_qlora_base_back_as_the_run_recorded_it() -> None:
    """meta.json's model.lora (the fingerprint) tells the export which layers are 4-bit and their
    shapes: it reads each back as one bf16 ``<layer>.weight``, the rest as stored."""
    spec = qlora_spec()
    pieces = {p: spec.weights(f"{WQ}.nf4.{p}") for p in PIECES}
    norm = torch.ones(256)
    view = View(
        {**{f"{MODEL}{WQ}.nf4.{p}": t for p, t in pieces.items()}, f"{MODEL}norm.weight": norm}
    )
    meta = json.loads(json.dumps({"model": spec.fingerprint}))  # as meta.json holds it
    seen = dequantized(meta, view)
    assert seen.entries == {
        f"{MODEL}{WQ}.weight": ((256, 256), torch.bfloat16),  # in place of its four pieces
        f"{MODEL}norm.weight": ((256,), torch.float32),
    }
    want = dequantize(pieces, (256, 256), torch.bfloat16)
    got = seen.read(f"{MODEL}{WQ}.weight", torch.float32)
    assert got.dtype == torch.float32 and torch.equal(got, want.float())
    got = seen.read(f"{MODEL}{WQ}.weight")  # no dtype: the bf16 it holds
    assert got.dtype == torch.bfloat16 and torch.equal(got, want)
    assert torch.equal(seen.read(f"{MODEL}norm.weight"), norm)
    # a 4-bit layer that meta.json does not list is refused, not read as garbage
    meta["model"]["lora"]["quantized"] = {"layers.0.attention.wk": [128, 256]}
    with pytest.raises(
        UserError, match=rf"^checkpoint {view.where}: {WQ} is 4-bit, meta.json says not"
    ):
        dequantized(meta, view)


@needs_torchao
def test_a_qlora_checkpoint_is_not_resumed_as_plain_lora() -> None:
    from zerofit.checkpoint.compat import check

    saved, now = {"model": qlora_spec().fingerprint}, {"model": qlora_spec("none").fingerprint}
    with pytest.raises(
        UserError, match=r"is for a different run: model\.lora\.quantize is 'nf4' there, None here"
    ):
        check(Path("ckpt"), json.loads(json.dumps(saved)), now, None)


@needs_torchao
@pytest.mark.gpu
def test_on_cuda_a_qlora_base_is_quantised_on_the_gpu() -> None:
    codes = qlora_spec().weights(f"{WQ}.nf4.codes")
    assert codes.is_cuda and codes.dtype == torch.uint8 and codes.shape == (256 * 256 // 2,)

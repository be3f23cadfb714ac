"""LoRA (``model.lora``): the adapters train and the base stays bitwise unchanged, in its dtype,
under DDP, FSDP2 and DeepSpeed ZeRO-3 (2 gloo processes, fp32: the same losses); a fresh model
computes what its base does; resume is exact; targets are checked; the planner and the precision
report count the frozen base apart; ``zerofit export`` merges the adapters or writes a PEFT
adapter folder, and either gives the trained model's loss."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path

import pytest
import torch
from conftest import POOL, deep_update, losses, train_run, wait_all, write_config, zerofit
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from zerofit.backends import checkpoint_readers
from zerofit.checkpoint import read_meta
from zerofit.checkpoint.neutral import MODEL, OPTIM, NeutralView, open_reader
from zerofit.config.schema import LoRAConfig
from zerofit.distributed.parallelize import materialize_
from zerofit.errors import UserError
from zerofit.export.run import export_checkpoint, find_checkpoint
from zerofit.launch.run_config import load_config
from zerofit.models import ModelSpec, build_model
from zerofit.models.build import param_counts
from zerofit.models.lora import adapter_count, apply_lora, is_adapter
from zerofit.models.loss import cross_entropy

transformers = pytest.importorskip("transformers")

STEPS = 4
LORA = {"rank": 4, "alpha": 8.0}
RUN = {"model": {"lora": LORA}, "train": {"steps": STEPS}, "checkpoint": {"every": 2}}
ENGINES = {
    "ddp": {"parallel": {"backend": "ddp"}},
    "fsdp": {"parallel": {"backend": "fsdp"}},
    "zero3": {"parallel": {"backend": "deepspeed", "deepspeed": {"stage": 3}}},
}
HF_LLAMA = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 320,
    "max_position_embeddings": 256,
}


def tiny(lora: dict | None = None, n_layers: int = 2) -> ModelSpec:
    spec = build_model("tiny", overrides={"n_layers": n_layers})
    return apply_lora(spec, LoRAConfig(**lora)) if lora else spec


def materialized(spec: ModelSpec) -> torch.nn.Module:
    materialize_(
        spec.module, torch.device("cpu"), init_seed=0, init_param_=spec.init_param_,
        weights=spec.weights,
    )  # fmt: skip
    return spec.module


def checkpoint_view(run: Path, step: int = STEPS) -> NeutralView:
    ckpt = find_checkpoint(run, step)
    fmt = read_meta(ckpt)["format"]
    return NeutralView(open_reader(ckpt / "model", fmt, checkpoint_readers()), ckpt)


@torch.no_grad()
def trained_loss(run: Path, batches: list) -> float:
    """The run's own model (LoRA built as the run built it) with its final checkpoint's weights."""
    m = load_config(run / "config.yaml").model
    base = build_model(m.preset, m.hf, m.overrides, m.loss_chunk, random_init=True)  # read below
    model = materialized(apply_lora(base, m.lora)).eval()
    view = checkpoint_view(run)
    for name, p in model.named_parameters():
        p.copy_(view.read(MODEL + name, p.dtype))
    return sum(model(x, y).item() for x, y in batches) / len(batches)


@torch.no_grad()
def hf_loss(model: torch.nn.Module, batches: list) -> float:
    return sum(cross_entropy(model(input_ids=x).logits, y).item() for x, y in batches) / len(
        batches
    )


def fixed_batches() -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Two batches of 2 x 64 byte tokens of real text (a stdlib file), targets shifted by one."""
    text = torch.tensor(list(Path(json.__file__).read_bytes()[: 4 * 65])).view(2, 2, 65)
    return [(seq[:, :-1], seq[:, 1:]) for seq in text]


# ------------------------------------------------------------------ the model, in process


def test_targets_and_names() -> None:
    spec = tiny(LORA)
    names = [n for n, _ in spec.module.named_parameters()]
    adapters = [n for n in names if is_adapter(n)]
    assert len(adapters) == 2 * 2 * 7  # 2 layers x q/k/v/o/w1/w2/w3 x (A, B); not the head
    assert "layers.0.attention.wq.weight" in names and "output.weight" in names
    assert "layers.0.attention.wq.lora_A.weight" in adapters
    assert not any(n.startswith("output.") for n in adapters)
    assert all(p.requires_grad == is_adapter(n) for n, p in spec.module.named_parameters())
    assert spec.num_params == sum(p.numel() for p in spec.module.parameters())
    assert spec.fingerprint["lora"]["modules"][:2] == [
        "layers.0.attention.wq",
        "layers.0.attention.wk",
    ]
    picked = tiny({**LORA, "targets": ["wq", "feed_forward.w2", "layers.1.attention.wo"]})
    chosen = picked.fingerprint["lora"]["modules"]
    assert chosen == [
        "layers.0.attention.wq", "layers.0.feed_forward.w2", "layers.1.attention.wq",
        "layers.1.attention.wo", "layers.1.feed_forward.w2",
    ]  # fmt: skip
    with pytest.raises(UserError, match=r"'wqq' matches no linear layer \(did you mean 'wq'\?\); "
                       r"valid module-name suffixes: w1, w2, w3, wk, wo, wq, wv$"):  # fmt: skip
        tiny({**LORA, "targets": ["wq", "wqq"]})
    with pytest.raises(UserError, match="'output' .*the output head"):
        tiny({**LORA, "targets": ["output"]})
    assert tiny({**LORA, "rank": 0}).module is not None  # rank 0: LoRA off
    assert not any(is_adapter(n) for n, _ in tiny({**LORA, "rank": 0}).module.named_parameters())


def test_a_fresh_lora_model_computes_what_its_base_does() -> None:
    base, lora = materialized(tiny()), materialized(tiny(LORA))
    params = dict(lora.named_parameters())
    for name, p in base.named_parameters():  # the same names and values: B = 0, base untouched
        assert torch.equal(params[name], p), name
    a = params["layers.1.feed_forward.w2.lora_A.weight"]  # [r, ffn]: U(-1/sqrt(ffn), ..)
    assert (
        a.shape == (4, 768)
        and 0 < a.abs().max() <= 768**-0.5
        and a.std() > 0.5 * 768**-0.5 / 3**0.5
    )
    assert not params["layers.1.feed_forward.w2.lora_B.weight"].any()
    again = materialized(tiny(LORA))  # name-seeded: the same numbers every time
    assert torch.equal(dict(again.named_parameters())["layers.0.attention.wq.lora_A.weight"],
                       params["layers.0.attention.wq.lora_A.weight"])  # fmt: skip
    tokens = torch.randint(0, 256, (2, 32), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(base(tokens), lora(tokens))


def test_optimizer_holds_only_the_adapters() -> None:
    from zerofit.backends.torch_common import build_adamw, param_groups
    from zerofit.config.schema import OptimConfig

    module = materialized(tiny(LORA))
    adapters = {id(p) for n, p in module.named_parameters() if is_adapter(n)}
    groups = param_groups(module, 0.1)  # DeepSpeed is given these groups too
    assert {id(p) for g in groups for p in g["params"]} == adapters
    opt = build_adamw(module, OptimConfig(), torch.device("cpu"))
    assert {id(p) for g in opt.param_groups for p in g["params"]} == adapters


def test_flops_drop_the_frozen_weight_gradients() -> None:
    """FLOPs per token of a LoRA model against the counter: the frozen base does 4 FLOPs per
    weight and token (no weight gradient), the adapters 6; norms are elementwise (0 counted)."""
    spec = tiny(LORA)
    model = materialized(spec)
    tokens = torch.randint(0, 256, (2, 64))
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        model(tokens, tokens).backward()
    norms = sum(p.numel() for n, p in model.named_parameters() if "norm" in n)
    assert counter.get_total_flops() == spec.flops_per_token(64) * 128 - 4 * norms * 128
    assert spec.flops_per_token(64) < tiny().flops_per_token(64) * 0.75


@pytest.mark.dist
def test_unknown_target_is_one_line_through_the_cli(tmp_path: Path) -> None:
    cfg = write_config(tmp_path / "c.yaml", {"model": {"lora": {**LORA, "targets": ["q_prj"]}}})
    proc = zerofit("train", "-c", str(cfg), cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "'q_prj' matches no linear layer" in lines[0], proc.stderr
    assert "valid module-name suffixes: w1, w2, w3, wk, wo, wq, wv" in lines[0]


# ------------------------------------------------------------------ the planner


def test_the_planner_counts_the_frozen_base_apart(tmp_path: Path, capsys) -> None:
    from zerofit.cli import main
    from zerofit.models.shape import shape_from_config
    from zerofit.planner.memory import Strategy, estimate, workload_for

    cfg = load_config(write_config(tmp_path / "8b.yaml", {
        "model": {"preset": "llama3-8b", "seq_len": 2048, "overrides": {}, "lora": {"rank": 16}},
        "precision": {"mode": "auto"},
    }))  # fmt: skip
    m, w = shape_from_config(cfg), workload_for(cfg, 8)
    A, P = 41_943_040, m.num_params  # PEFT's count for Llama-3-8B, r=16, all linear layers
    assert w.lora is not None and w.lora.params == A and w.lora.per_block == 7
    assert (w.compute_dtype, w.master_dtype) == ("bf16", "fp32")
    fsdp = estimate(m, w, Strategy.of("fsdp"))
    assert fsdp.parameters == (2 * P + 4 * A) / 8  # frozen base in bf16, adapters in fp32
    assert fsdp.gradients == 4 * A / 8 and fsdp.optimizer_states == 2 * 4 * A / 8
    zero3 = estimate(m, w, Strategy.of("deepspeed", stage=3))
    assert zero3.parameters == 2 * (P + A) / 8  # the module's copies; fp32 masters: adapters'
    assert zero3.optimizer_states == 3 * 4 * A / 8
    full = estimate(m, workload_for(load_config(write_config(tmp_path / "f.yaml", {
        "model": {"preset": "llama3-8b", "seq_len": 2048, "overrides": {}},
        "precision": {"mode": "auto"},
    })), 8), Strategy.of("fsdp"))  # fmt: skip
    assert fsdp.peak_allocated < full.peak_allocated - 8 * 2**30
    cfg_path = tmp_path / "8b.yaml"
    assert main(["plan", "-c", str(cfg_path), "--gpus", "8", "--gpu-mem", "80GB", "--json"]) == 0
    out = capsys.readouterr().out
    data = json.loads(out[: out.rindex("}") + 1])
    assert data["workload"]["lora"] == {"params": A, "rank": 16, "per_block": 7, "block_inputs": 0,
        "quantized": 0, "block_quantized": 0, "largest_quantized": 0, "rebuilt_inputs": 0}  # fmt: skip
    assert main(["plan", "-c", str(cfg_path), "--gpus", "8", "--gpu-mem", "80GB"]) == 0
    assert "LoRA r=16: 41.9M adapter params train, the base is frozen in bf16" in " ".join(
        capsys.readouterr().out.split()
    )


# ------------------------------------------------------------------ training, 2 gloo processes


@pytest.fixture(scope="module")
def tmp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("lora")


@pytest.fixture(scope="module")
def background(tmp: Path) -> Iterator[dict[str, Future[Path]]]:
    """Every training run of this file, started together in the background (two at a time)."""
    extras = {name: deep_update(RUN, extra) for name, extra in ENGINES.items()}
    extras["fsdp-bf16"] = deep_update(
        RUN, {"precision": {"mode": "bf16"}, "parallel": {"backend": "fsdp"}}
    )
    # LoRA on q/v of a tiny HF Llama whose weights come from its folder (the adapters do not).
    folder = tmp / "hf-llama"
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**HF_LLAMA))
    model.save_pretrained(folder, safe_serialization=True)
    extras["hf"] = {
        "model": {"preset": None, "hf": str(folder), "overrides": {},
                  "lora": {**LORA, "targets": ["q_proj", "self_attn.v_proj"]}},
        "data": {"tokenizer": "byte"}, "parallel": {"backend": "fsdp"},
        "train": {"steps": STEPS}, "checkpoint": {"every": 0},
    }  # fmt: skip
    out = {name: POOL.submit(train_run, tmp, name, extra, "--nproc", "2")
           for name, extra in extras.items()}  # fmt: skip
    yield out
    wait_all(out.values())


@pytest.fixture(scope="module")
def runs(background: dict[str, Future[Path]]) -> dict[str, Path]:
    return {name: background[name].result() for name in ENGINES}


@pytest.mark.slow
@pytest.mark.dist
def test_engines_train_the_same_adapters(runs: dict[str, Path]) -> None:
    got = {name: losses(run) for name, run in runs.items()}
    ref = got["ddp"]
    assert ref[STEPS] < ref[1] - 0.5, ref  # the adapters learn
    for name, trajectory in got.items():
        for step, loss in ref.items():
            assert abs(trajectory[step] - loss) <= 1e-5 * loss, (name, step, trajectory, ref)


@pytest.mark.slow
@pytest.mark.dist
@pytest.mark.parametrize("engine", list(ENGINES))
def test_the_base_stays_bitwise_and_only_adapters_have_optimizer_state(
    runs: dict[str, Path], engine: str
) -> None:
    view, init = checkpoint_view(runs[engine]), dict(materialized(tiny(LORA)).named_parameters())
    assert set(view.names()) == set(init)
    for name, start in init.items():
        saved = view.read(MODEL + name)
        assert saved.dtype == torch.float32, name
        if is_adapter(name):
            assert not torch.equal(saved, start), f"{engine}: {name} did not train"
            assert f"{OPTIM}{name}.exp_avg" in view.entries, name
        else:
            assert torch.equal(saved, start), f"{engine}: frozen {name} changed"
            assert f"{OPTIM}{name}.exp_avg" not in view.entries, name


@pytest.mark.slow
@pytest.mark.dist
def test_resume_is_exact(runs: dict[str, Path], tmp: Path) -> None:
    """FSDP resumes its step-2 checkpoint, as if it had died at step 3: the same losses."""
    full, cut = runs["fsdp"], tmp / "fsdp-cut"
    shutil.copytree(full / "checkpoints" / "step_00000002", cut / "checkpoints" / "step_00000002")
    extra = deep_update(deep_update(RUN, ENGINES["fsdp"]), {"log": {"run_dir": str(cut)}})
    proc = zerofit("train", "-c", str(write_config(tmp / "cut.yaml", extra)), "--nproc", "2",
                   "--resume", cwd=tmp)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    before, after = losses(full), losses(cut)
    assert sorted(after) == [3, 4] and all(after[s] == before[s] for s in after), (before, after)


@pytest.mark.slow
@pytest.mark.dist
def test_bf16_keeps_the_frozen_base_in_bf16_beside_fp32_adapters(background) -> None:  # noqa: ANN001
    """FSDP2 with bf16 compute: the frozen base is stored in bf16 and the adapters in fp32 in the
    same FSDP units (uniform dtype is needed among the trainable parameters only)."""
    run = background["fsdp-bf16"].result()
    report = json.loads((run / "precision.json").read_text())
    eff = report["effective"]
    assert (eff["frozen_weights"], eff["adapter_weights"], eff["master_weights"]) == (
        "bf16", "fp32", "fp32"), report  # fmt: skip
    assert eff["compute"] == "bf16" and report["warnings"] == []
    view, init = checkpoint_view(run), dict(materialized(tiny(LORA)).named_parameters())
    for name, start in init.items():
        saved = view.read(MODEL + name)
        want = torch.float32 if is_adapter(name) else torch.bfloat16
        assert saved.dtype == want, name
        if not is_adapter(name):
            assert torch.equal(saved, start.to(torch.bfloat16)), name
    got = losses(run)
    assert all(v == v for v in got.values()) and got[STEPS] < got[1], got


# ------------------------------------------------------------------ export


def _peft_loss(folder: Path, base: Path, batches: list) -> float:
    PeftModel = pytest.importorskip("peft").PeftModel  # noqa: N806 (peft's class)

    model = transformers.AutoModelForCausalLM.from_pretrained(base, local_files_only=True)
    return hf_loss(PeftModel.from_pretrained(model, folder).eval(), batches)


def _close(a: float, b: float, what: str) -> None:
    print(f"{what}: {a:.7f} vs the trained model's {b:.7f} (rel {abs(a - b) / b:.1e})")
    assert abs(a - b) <= 1e-5 * b, (what, a, b)


@pytest.mark.slow
@pytest.mark.dist
@pytest.mark.parametrize("engine,cli", [("ddp", True), ("zero3", False)])
def test_export_merged_and_as_a_peft_adapter(
    runs: dict[str, Path], tmp: Path, engine: str, cli: bool
) -> None:
    run = runs[engine]
    batches, ckpt = fixed_batches(), find_checkpoint(run, None)
    want = trained_loss(run, batches)
    merged = tmp / f"{engine}-merged"
    summary = export_checkpoint(ckpt, run, merged, "fp32")
    assert summary["lora"] == {"rank": 4, "alpha": 8.0, "layers": 14, "adapter": False}
    index = json.loads((merged / "model.safetensors.index.json").read_text())
    assert not any("lora" in n for n in index["weight_map"])  # merged: no adapter tensors
    model = transformers.AutoModelForCausalLM.from_pretrained(merged, local_files_only=True)
    _close(hf_loss(model.eval(), batches), want, f"{engine} merged")
    adapter = tmp / f"{engine}-adapter"
    if cli:
        args = ("export", str(run), "--out", str(adapter), "--adapter", "--dtype", "fp32")
        proc = zerofit(*args, cwd=tmp)
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert "LoRA adapter (r=4, alpha=8, 14 layers" in proc.stdout, proc.stdout
    else:
        export_checkpoint(ckpt, run, adapter, "fp32", adapter=True)
    config = json.loads((adapter / "adapter_config.json").read_text())
    assert config["target_modules"] == [
        "down_proj", "gate_proj", "k_proj", "o_proj", "q_proj", "up_proj", "v_proj"]  # fmt: skip
    assert Path(config["base_model_name_or_path"]) == adapter / "base"
    from safetensors import safe_open

    with safe_open(str(adapter / "adapter_model.safetensors"), "pt") as f:
        keys = set(f.keys())
    assert "base_model.model.model.layers.1.mlp.down_proj.lora_B.weight" in keys and len(keys) == 28
    base_only = hf_loss(
        transformers.AutoModelForCausalLM.from_pretrained(adapter / "base"), batches
    )
    assert abs(base_only - want) > 1e-3 * want  # the base alone is another model: a real check
    _close(_peft_loss(adapter, adapter / "base", batches), want, f"{engine} base + PEFT adapter")


@pytest.fixture(scope="module")
def hf_run(background: dict[str, Future[Path]]) -> Path:
    """LoRA on q/v of a tiny HF Llama whose weights come from its folder (the adapters do not)."""
    return background["hf"].result()


@pytest.mark.slow
@pytest.mark.dist
def test_hf_model_lora_export(hf_run: Path, tmp: Path) -> None:
    folder, batches = tmp / "hf-llama", fixed_batches()
    view = checkpoint_view(hf_run)
    original = transformers.AutoModelForCausalLM.from_pretrained(folder).state_dict()
    for name in view.names():  # the base is the folder's, unchanged
        if not is_adapter(name):
            assert torch.equal(view.read(MODEL + name), original[name.removeprefix("hf.")]), name
    adapters = sorted(n for n in view.names() if is_adapter(n))
    assert (
        len(adapters) == 2 * 2 * 2
        and "hf.model.layers.1.self_attn.v_proj.lora_B.weight" in adapters
    )
    m = load_config(hf_run / "config.yaml").model  # only the adapters train, the base is counted
    spec = apply_lora(build_model(hf=m.hf, random_init=True), m.lora)
    summary = json.loads((hf_run / "summary.json").read_text())
    assert (
        summary["trainable_params"]
        == adapter_count(spec.module)
        == 2 * (4 * 64 * 2 + 64 * 4 + 32 * 4)
    )
    assert summary["num_params"] == param_counts(spec.module)[0]
    assert summary["weights"]["files"] == ["model.safetensors"]
    want = trained_loss(hf_run, batches)
    ckpt = find_checkpoint(hf_run, None)
    export_checkpoint(ckpt, hf_run, tmp / "hf-merged", "fp32")
    merged = transformers.AutoModelForCausalLM.from_pretrained(tmp / "hf-merged")
    _close(hf_loss(merged.eval(), batches), want, "HF merged")
    export_checkpoint(ckpt, hf_run, tmp / "hf-adapter", "fp32", adapter=True)
    config = json.loads((tmp / "hf-adapter" / "adapter_config.json").read_text())
    assert config["target_modules"] == ["q_proj", "v_proj"] and config["r"] == 4
    assert Path(config["base_model_name_or_path"]) == folder.resolve()
    assert not (tmp / "hf-adapter" / "base").exists()
    _close(_peft_loss(tmp / "hf-adapter", folder, batches), want, "HF folder + PEFT adapter")

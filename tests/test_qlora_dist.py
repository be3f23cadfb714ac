"""QLoRA (``model.lora.quantize: nf4``) on 2 gloo processes under FSDP2 (the 4-bit base sharded
and all-gathered as it is) and DDP (replicated), fp32 compute: the loss falls, both engines log
the same losses (they differ only in summation order: 1e-5 as in tests/test_lora.py), the
checkpoint's base is bitwise the quantised init, in its integer storage, and a resumed run goes on
exactly. tests/test_nf4.py has the format and the single-process checks."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from conftest import POOL, assert_resume_exact, losses, same_bits, train_run, wait_all

from zerofit.backends import checkpoint_readers
from zerofit.backends.base import materialize_from_spec
from zerofit.checkpoint import read_meta
from zerofit.checkpoint.neutral import MODEL, NeutralView, open_reader
from zerofit.config.schema import LoRAConfig
from zerofit.export.run import find_checkpoint
from zerofit.models import build_model
from zerofit.models.lora import apply_lora

pytest.importorskip("torchao.quantization")
pytestmark = [pytest.mark.slow, pytest.mark.dist]

QLORA = {
    "model": {"lora": {"rank": 4, "alpha": 8.0, "quantize": "nf4"}},
    "train": {"steps": 10},
    "checkpoint": {"every": 5},
}
ENGINES = ("fsdp", "ddp")


def _extra(engine: str) -> dict:
    return {**QLORA, "parallel": {"backend": engine}}


# A tiny HF Llama whose weights come from its folder: q/o and the MLP are 4-bit (a multiple of
# 16384 weights), k/v (64 x 128) stay in the compute dtype.
HF_LLAMA = {
    "hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 320,
    "max_position_embeddings": 256,
}  # fmt: skip


def _hf_extra(folder: Path) -> dict:
    return {
        "model": {
            "preset": None,
            "hf": str(folder),
            "overrides": {},
            "lora": QLORA["model"]["lora"],
        },
        "data": {"tokenizer": "byte"},
        "parallel": {"backend": "fsdp"},
        "train": {"steps": 10},
        "checkpoint": {"every": 0},
    }


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    transformers = pytest.importorskip("transformers")
    tmp = tmp_path_factory.mktemp("qlora")
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**HF_LLAMA))
    model.to(torch.bfloat16).save_pretrained(tmp / "hf-llama", safe_serialization=True)
    out = {e: POOL.submit(train_run, tmp, e, _extra(e), "--nproc", "2") for e in ENGINES}
    out["hf"] = POOL.submit(train_run, tmp, "hf", _hf_extra(tmp / "hf-llama"), "--nproc", "2")
    yield out
    wait_all(out.values())


def test_qlora_trains_alike_under_fsdp_and_ddp(runs) -> None:  # noqa: ANN001
    fsdp, ddp = losses(runs["fsdp"].result()), losses(runs["ddp"].result())
    assert sorted(fsdp) == list(range(1, 11)) and fsdp[10] < fsdp[1] - 0.5, fsdp
    worst = max(abs(fsdp[s] - ddp[s]) / abs(ddp[s]) for s in ddp)
    assert worst <= 1e-5, {s: (fsdp[s], ddp[s]) for s in ddp}


def _view(ckpt: Path) -> NeutralView:
    fmt = read_meta(ckpt)["format"]
    return NeutralView(open_reader(ckpt / "model", fmt, checkpoint_readers()), ckpt)


def _model(quantize: str) -> torch.nn.Module:
    """The runs' model (LoRA r=4, alpha 8 on the tiny preset), materialised from its init."""
    lora = LoRAConfig(**{**QLORA["model"]["lora"], "quantize": quantize})
    spec = apply_lora(build_model("tiny", overrides={"n_layers": 2}), lora)
    materialize_from_spec(spec.module, torch.device("cpu"), spec, init_seed=0)
    return spec.module


@pytest.mark.parametrize("engine", ENGINES)
def test_the_checkpointed_base_is_the_quantised_init_bitwise(runs, engine: str) -> None:  # noqa: ANN001
    ckpt = find_checkpoint(runs[engine].result(), 10)
    view = _view(ckpt)
    model = _model("nf4")
    pieces = {n: p for n, p in model.named_parameters() if ".nf4." in n}
    assert len(pieces) == 14 * 4
    for name, want in pieces.items():
        saved = view.read(MODEL + name)  # every piece in its bf16 words, on every engine
        assert same_bits(saved, want), name


def test_qlora_resumes_exactly_under_fsdp(runs, tmp_path: Path) -> None:  # noqa: ANN001
    assert_resume_exact(tmp_path, runs["fsdp"].result(), _extra("fsdp"))


@torch.no_grad()
def _trained_loss(ckpt: Path, batches: list) -> float:
    """The QLoRA model, built as the run built it, with the checkpoint's pieces and adapters."""
    model = _model("nf4")
    view = _view(ckpt)
    for name, p in model.named_parameters():
        p.copy_(view.read(MODEL + name, p.dtype))
    return sum(model(x, y).item() for x, y in batches) / len(batches)


def test_export_merged_and_as_a_peft_adapter(runs, tmp_path: Path) -> None:  # noqa: ANN001
    """Merged: each 4-bit layer's bf16 weight plus (alpha / r) B A; adapter: the 4-bit base read
    back in bf16 as ``base/`` plus PEFT's adapter. Both give the trained model's loss; the merged
    weights sit NF4's ~9% (relative) from the weights the base was quantised from."""
    from test_lora import _close, _peft_loss, fixed_batches, hf_loss

    from zerofit.export.run import export_checkpoint

    transformers = pytest.importorskip("transformers")
    run = runs["fsdp"].result()
    batches, ckpt = fixed_batches(), find_checkpoint(run, None)
    want = _trained_loss(ckpt, batches)
    merged = tmp_path / "merged"
    summary = export_checkpoint(ckpt, run, merged, "fp32")
    assert summary["lora"] == {"rank": 4, "alpha": 8.0, "layers": 14, "adapter": False}
    model = transformers.AutoModelForCausalLM.from_pretrained(merged, local_files_only=True)
    _close(hf_loss(model.eval(), batches), want, "qlora merged")

    plain = _model("none")
    view = _view(ckpt)
    layer = plain.layers[1].feed_forward.w2
    a = view.read(MODEL + "layers.1.feed_forward.w2.lora_A.weight")
    b = view.read(MODEL + "layers.1.feed_forward.w2.lora_B.weight")
    exact = layer.weight.detach() + 2.0 * b @ a  # the bf16-free base plus the adapters
    got = model.model.layers[1].mlp.down_proj.weight.detach()
    rel = float((got - exact).norm() / exact.norm())
    print(f"merged 4-bit layer vs its original weight plus adapters: {rel:.3f} relative")
    assert 0.03 < rel < 0.12, rel

    adapter = tmp_path / "adapter"
    export_checkpoint(ckpt, run, adapter, "fp32", adapter=True)
    _close(_peft_loss(adapter, adapter / "base", batches), want, "qlora base + PEFT adapter")


def test_an_hf_folders_weights_are_quantised_as_read_and_the_loss_falls(runs) -> None:  # noqa: ANN001
    """The folder's bf16 weights, quantised: the checkpoint's pieces are bitwise those of
    ``quantize(weight)``; the unquantised k/v and the rest are the folder's own."""
    from safetensors.torch import load_file

    from zerofit.models.nf4 import quantize

    run = runs["hf"].result()
    got = losses(run)
    assert got[10] < got[1] - 0.3, got
    original = load_file(str(run.parent / "hf-llama" / "model.safetensors"))
    ckpt = find_checkpoint(run, None)
    view = _view(ckpt)
    four_bit = [n for n in view.names() if n.endswith(".nf4.codes")]
    assert len(four_bit) == 2 * 5  # q, o, gate, up, down in each of 2 layers
    for name in four_bit:
        layer = name.removesuffix(".nf4.codes")
        want = quantize(original[layer.removeprefix("hf.") + ".weight"])
        for piece, value in want.items():
            saved = view.read(f"{MODEL}{layer}.nf4.{piece}")
            assert same_bits(saved, value), (layer, piece)
    k = view.read(MODEL + "hf.model.layers.0.self_attn.k_proj.weight")
    assert torch.equal(k.to(torch.bfloat16), original["model.layers.0.self_attn.k_proj.weight"])


SHARED_READ = """
import json, os, sys, torch, torch.distributed as dist
from zerofit.models.nf4 import PIECES, QuantizedSource, quantize
dist.init_process_group("gloo")
shapes = {f"l{i}.weight": (128, 128 * (i + 1)) for i in range(5)}
def value(name, shape):
    g = torch.Generator().manual_seed(int(name[1]))
    return (torch.randn(shape, generator=g) * 0.02).to(torch.bfloat16)
read = []
def source(name, shape):
    read.append(name)
    return value(name, shape)
q = QuantizedSource(source, shapes)
bits = lambda t: t.view(torch.int16)  # bitwise: NF4 words often read as NaN
same = all(torch.equal(bits(q(n.replace(".weight", ".nf4." + p))), bits(quantize(value(n, s))[p]))
           for n, s in shapes.items() for p in PIECES)
line = json.dumps({"rank": dist.get_rank(), "read": read, "same": same}) + "\\n"
os.write(1, line.encode())  # one write: the ranks' lines never interleave
dist.destroy_process_group()
"""


def test_each_layer_is_read_and_quantised_by_one_rank_only(tmp_path: Path) -> None:
    """3 ranks, 5 layers: rank r reads layers r, r + 3; every rank gets every layer's pieces,
    equal to quantising it where it is read."""
    import json
    import os
    import subprocess
    import sys

    script = tmp_path / "shared_read.py"
    script.write_text(SHARED_READ)
    src = str(Path(__file__).resolve().parents[1] / "src")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "3",
           "--standalone", str(script)]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": src, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)  # hang guard
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [json.loads(x) for x in proc.stdout.splitlines() if x.startswith("{")]
    ranks = {r["rank"]: r for r in lines}
    assert {r: ranks[r]["read"] for r in ranks} == {
        0: ["l0.weight", "l3.weight"], 1: ["l1.weight", "l4.weight"], 2: ["l2.weight"]}  # fmt: skip
    assert all(ranks[r]["same"] for r in ranks)

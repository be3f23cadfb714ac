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
from conftest import POOL, assert_resume_exact, losses, train_run, wait_all

from zerofit.backends import checkpoint_readers
from zerofit.checkpoint import read_meta
from zerofit.checkpoint.neutral import MODEL, NeutralView, open_reader
from zerofit.config.schema import LoRAConfig
from zerofit.distributed.parallelize import materialize_
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


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    tmp = tmp_path_factory.mktemp("qlora")
    out = {e: POOL.submit(train_run, tmp, e, _extra(e), "--nproc", "2") for e in ENGINES}
    yield out
    wait_all(out.values())


def test_qlora_trains_alike_under_fsdp_and_ddp(runs) -> None:  # noqa: ANN001
    fsdp, ddp = losses(runs["fsdp"].result()), losses(runs["ddp"].result())
    assert sorted(fsdp) == list(range(1, 11)) and fsdp[10] < fsdp[1] - 0.5, fsdp
    worst = max(abs(fsdp[s] - ddp[s]) / abs(ddp[s]) for s in ddp)
    assert worst <= 1e-5, {s: (fsdp[s], ddp[s]) for s in ddp}


@pytest.mark.parametrize("engine", ENGINES)
def test_the_checkpointed_base_is_the_quantised_init_bitwise(runs, engine: str) -> None:  # noqa: ANN001
    ckpt = find_checkpoint(runs[engine].result(), 10)
    view = NeutralView(
        open_reader(ckpt / "model", read_meta(ckpt)["format"], checkpoint_readers()), ckpt
    )
    spec = apply_lora(
        build_model("tiny", overrides={"n_layers": 2}),
        LoRAConfig(rank=4, alpha=8.0, quantize="nf4"),
    )
    materialize_(
        spec.module, torch.device("cpu"), init_seed=0, init_param_=spec.init_param_,
        weights=spec.weights,
    )  # fmt: skip
    pieces = {n: p for n, p in spec.module.named_parameters() if ".nf4." in n}
    assert len(pieces) == 14 * 4
    for name, want in pieces.items():
        saved = view.read(MODEL + name)
        assert saved.dtype == want.dtype or want.dtype == torch.bfloat16, (
            name
        )  # scales: fp32 compute
        assert torch.equal(saved.to(want.dtype), want), name


def test_qlora_resumes_exactly_under_fsdp(runs, tmp_path: Path) -> None:  # noqa: ANN001
    assert_resume_exact(tmp_path, runs["fsdp"].result(), _extra("fsdp"))

"""PyTorch's and DeepSpeed's own tools still read zerofit checkpoints, with the expected names
and shapes (a user is never locked in to zerofit to get their weights out)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch
from conftest import train_run

from zerofit.models.llama import PRESETS, param_shapes

pytestmark = pytest.mark.dist

EXPECTED = param_shapes(replace(PRESETS["tiny"], n_layers=2))  # conftest's TINY model


def test_dcp_to_torch_save_reads_an_fsdp_checkpoint(tmp_path: Path) -> None:
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    run = train_run(tmp_path, "fsdp", {"train": {"steps": 2}}, "--nproc", "2")
    out = tmp_path / "full.pt"
    dcp_to_torch_save(str(run / "checkpoints" / "step_00000002" / "model"), str(out))
    sd = torch.load(out, weights_only=True)
    assert {k: tuple(v.shape) for k, v in sd["model"].items()} == EXPECTED
    moments = sd["optim"]["state"]
    assert set(moments) == set(EXPECTED)
    for name, shape in EXPECTED.items():
        assert tuple(moments[name]["exp_avg"].shape) == shape
        assert float(moments[name]["step"]) == 2


@pytest.mark.parametrize("stage", [2, 3])
def test_deepspeed_zero_to_fp32_reads_a_deepspeed_checkpoint(tmp_path: Path, stage: int) -> None:
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    extra = {
        "parallel": {"backend": "deepspeed", "deepspeed": {"stage": stage}},
        "train": {"steps": 2},
    }
    run = train_run(tmp_path, "ds", extra, "--nproc", "2")
    sd = get_fp32_state_dict_from_zero_checkpoint(
        str(run / "checkpoints" / "step_00000002"), tag="model"
    )
    assert {k: tuple(v.shape) for k, v in sd.items()} == EXPECTED

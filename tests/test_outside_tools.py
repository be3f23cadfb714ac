"""PyTorch's and DeepSpeed's own tools still read zerofit checkpoints, with the expected names
and shapes (a user is never locked in to zerofit to get their weights out)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch

from zerofit.models.llama import PRESETS, param_shapes

pytestmark = [pytest.mark.dist, pytest.mark.slow]

EXPECTED = param_shapes(replace(PRESETS["tiny"], n_layers=2))  # conftest's TINY model


def test_dcp_to_torch_save_reads_an_fsdp_checkpoint(tmp_path: Path, shared_run) -> None:  # noqa: ANN001
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    run = shared_run("fsdp@2")  # 10 steps
    out = tmp_path / "full.pt"
    dcp_to_torch_save(str(run / "checkpoints" / "step_00000010" / "model"), str(out))
    sd = torch.load(out, weights_only=True)
    assert {k: tuple(v.shape) for k, v in sd["model"].items()} == EXPECTED
    moments = sd["optim"]["state"]
    assert set(moments) == set(EXPECTED)
    for name, shape in EXPECTED.items():
        assert tuple(moments[name]["exp_avg"].shape) == shape
        assert float(moments[name]["step"]) == 10


@pytest.mark.parametrize("stage", [2, 3])
def test_deepspeed_zero_to_fp32_reads_a_deepspeed_checkpoint(stage: int, shared_run) -> None:  # noqa: ANN001
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    run = shared_run(f"zero{stage}@2")  # 10 steps
    sd = get_fp32_state_dict_from_zero_checkpoint(
        str(run / "checkpoints" / "step_00000010"), tag="model"
    )
    assert {k: tuple(v.shape) for k, v in sd.items()} == EXPECTED

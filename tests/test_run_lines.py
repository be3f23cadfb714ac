"""What a run prints about itself: the summary's losses say which is the last step's and which a
window's mean; the model line says what the run's speed rests on (compile, attention, head)."""

from __future__ import annotations

import io
import re

import torch
from rich.console import Console
from torch import nn

from zerofit.config import compiles
from zerofit.launch.run_config import config_from_dict, default_config
from zerofit.models.describe import fast_path_line
from zerofit.report.progress import summary_table


def _rendered(summary: dict) -> str:
    out = io.StringIO()
    Console(file=out, width=200).print(summary_table(summary))
    return out.getvalue()


def test_final_loss_is_the_last_steps_and_the_window_mean_is_labelled() -> None:
    text = _rendered({"step": 40, "final_step_loss": 1.25, "loss": 1.5, "loss_steps": 10})
    assert re.search(r"final loss \(step 40\) +│ 1\.2500 ", text), text
    assert re.search(r"mean loss, last 10 steps +│ 1\.5000 ", text), text


def test_a_one_step_window_is_not_called_a_mean() -> None:
    text = _rendered({"step": 3, "final_step_loss": 2.0, "loss": 2.0, "loss_steps": 1})
    assert "mean loss" not in text and "logged loss, last step" in text


class _HFLike(nn.Module):
    """The attributes of ``HFCausalLM`` the model line reads."""

    def __init__(self, varlen: bool, fused: bool, lean: list[str]) -> None:
        super().__init__()
        self.varlen, self.fused, self.lean_ops = varlen, fused, lean
        self.hf = nn.Module()
        self.hf.config = type("C", (), {"_attn_implementation": "sdpa"})()


def test_the_model_line_names_compile_attention_head_and_lean_ops() -> None:
    cuda, cpu = torch.device("cuda", 0), torch.device("cpu")
    line = fast_path_line(_HFLike(True, True, ["LlamaMLP", "LlamaRMSNorm"]), cuda, True, 4096, True)
    assert line == (
        "model: compiled per block; attention FlashAttention varlen per packed sample "
        "(zerofit_varlen); head fused with the loss in 4,096-token chunks; "
        "lean LlamaMLP, LlamaRMSNorm"
    )
    line = fast_path_line(_HFLike(False, False, []), cpu, False, 4096, True)
    assert line == (
        "model: eager (parallel.compile off); attention transformers' sdpa; "
        "head full logits, then the loss"
    )
    builtin = nn.Linear(2, 2)  # no HF attributes: the built-in Llama
    assert "FlexAttention per packed sample" in fast_path_line(builtin, cuda, True, 0, True)
    assert "head full logits" in fast_path_line(builtin, cpu, True, 0, False)


def test_compile_auto_is_on_for_cuda_only() -> None:
    p = default_config().parallel
    assert p.compile == "auto"
    assert compiles(p, "cuda") and not compiles(p, "cpu")
    for value in (True, False):
        explicit = config_from_dict({"parallel": {"compile": value}}).parallel
        assert compiles(explicit, "cuda") is value and compiles(explicit, "cpu") is value

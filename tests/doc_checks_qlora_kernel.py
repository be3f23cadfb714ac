"""test_doc_figures' checks for docs/benchmarks/2026-12-07-qlora-kernel-h200.md (issue 26, QLoRA
speed: the Triton NF4 rebuild on an H200, and what a compiled QLoRA block keeps on CPU)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from zerofit.backends.terms import Adapters
from zerofit.models.shape import ModelShape
from zerofit.planner.memory import block_activation_bytes

DOC = "docs/benchmarks/2026-12-07-qlora-kernel-h200.md"
DIR = "2026-12-07-qlora-kernel-h200/"
DATA = Path(__file__).resolve().parents[1] / "docs" / "benchmarks" / "data"
FORMATS = {  # row: the format's name in nf4_formats.py's results
    "zerofit, torch ops, eager": "zerofit pieces",
    "zerofit, torch ops, compiled": "zerofit pieces, compiled",
    "zerofit, Triton kernel": "zerofit pieces, Triton kernel",
    "torchao NF4Tensor": "torchao NF4Tensor",
    "bitsandbytes, nested": "bitsandbytes Params4bit (nested)",
}


def _load(rel: str) -> Any:
    return json.loads((DATA / DIR / rel).read_text())


def format_rows(got: dict[str, Any]) -> dict[str, list]:
    """Per format of nf4_formats.py's `formats` results: bytes a weight, rebuild ms for one 8B
    block's weights, the same bits as zerofit's torch ops (yes/no)."""
    return {
        row: [
            got[name]["bytes_per_weight"],
            got[name]["rebuild_ms"],
            "yes" if got[name]["same_bits_as_torch_ops"] else "no",
        ]  # fmt: skip
        for row, name in FORMATS.items()
    }


def formats() -> dict[str, list]:
    """Call 1's formats table (`format_rows`)."""
    return format_rows(_load("call1/formats.json")["formats"])


def runs() -> list[str]:
    """Call 1's two 8B runs: stock's real tokens/s, step s and peak allocated GiB; zerofit's
    status."""
    res = _load("call1/all-results.json")["results"]
    stock = res["8b-qlora-stock-liger-compile"]
    ours = res["8b-qlora-host-2x8-kernel"]["results"][0]
    return [
        f"{stock['real_tokens_per_s']:,.0f} real tokens/s",
        f"{stock['step_s_median']:.3f} s a step",
        f"{stock['peak_allocated_gib']:.2f} GiB",
        f"zerofit's run: {ours['status']}",
    ]


def _kept(way: str) -> float:
    return _load("cpu-block/block-saved.json")["ways"][way]["bytes_per_token_h"]


def block_bytes() -> dict[str, list]:
    """Bytes a compiled / eager QLoRA block keeps per token and hidden unit on CPU, and what the
    planner counts for that block compiled (its shape: hidden 1024, ffn 3584, 8 heads, 2 KV
    heads; LoRA r16 on 7 layers with dropout, the gated MLP's down projection rebuilt)."""
    d = _load("cpu-block/block-saved.json")
    hidden, tokens = d["hidden"], d["tokens"]
    m = ModelShape("cpu-block", 1, hidden, 8, 2, int(3.5 * hidden), 1024)
    inputs = 6 * hidden + m.ffn_dim  # q, k, v, o, gate, up and down: one mask bit a feature
    lora = Adapters(0, 16, 7, inputs, rebuilt_inputs=m.ffn_dim)
    plan = block_activation_bytes(m, tokens, 2, True) + lora.activation_bytes(tokens, 2, True)
    return {
        "compiled": [_kept("compiled"), plan / (tokens * hidden)],
        "eager": [_kept("eager"), ...],
    }


QLORA_KERNEL: dict[str, tuple[list[str], Callable[[], Any]]] = {
    "qlora-kernel-formats": ([DIR + "call1/formats.json"], formats),
    "qlora-kernel-runs": ([DIR + "call1/all-results.json"], runs),
    "qlora-kernel-block": ([DIR + "cpu-block/block-saved.json"], block_bytes),
}

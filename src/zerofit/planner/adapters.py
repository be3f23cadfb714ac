"""When full fine-tuning fits nowhere: the same run with LoRA, and with QLoRA, planned as well.

A full fine-tune keeps every weight's gradient and AdamW states; LoRA trains rank-r adapters on
a frozen base, and QLoRA also stores that base in 4 bits (``zerofit.models.nf4``). `zerofit plan`
shows their best options (or their closest) beside the verdict, each with the overrides that
select it, so the next step is one flag away.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from zerofit.backends.terms import Adapters, Workload
from zerofit.config import with_fields
from zerofit.config.schema import Config
from zerofit.models.shape import ModelShape
from zerofit.planner.plan import Option, closest, plan, recommend
from zerofit.planner.shape import Hardware

RANK = 16  # LoRA's usual rank (PEFT's examples, torchtune's recipes use 8-64)
WAYS = {
    "LoRA": {"model.lora.rank": RANK},
    "QLoRA": {"model.lora.rank": RANK, "model.lora.quantize": "nf4"},
}


QUANTUM = 64 * 256  # an NF4 weight's size is a multiple of this (zerofit.models.nf4)


def estimated_adapters(m: ModelShape, rank: int, quantize: bool, gated: bool = False) -> Adapters:
    """LoRA on every linear layer of the blocks (``all-linear``), counted from the shape without
    building the model (torch-free; `zerofit plan` with ``model.lora`` set counts the built
    model's). `gated`: a Hugging Face gated MLP under ``model.lean_ops``, whose adapted down
    projection keeps no input (``Adapters.rebuilt_inputs``)."""
    linears = m.block_linears
    sizes = [i * o for i, o in linears if i * o % QUANTUM == 0] if quantize else []
    return Adapters(
        params=m.n_layers * rank * sum(i + o for i, o in linears),
        rank=rank,
        per_block=len(linears),
        quantized=m.n_layers * sum(sizes),
        block_quantized=sum(sizes),
        largest_quantized=max(sizes, default=0),
        rebuilt_inputs=m.ffn_dim if gated else 0,
    )


@dataclass(frozen=True)
class Lighter:
    """One lighter way to train the same model: its name, overrides and best (or closest)."""

    name: str
    overrides: dict[str, object]
    best: Option
    fits: bool


def lighter_ways(m: ModelShape, w: Workload, hw: Hardware, base: Config) -> list[Lighter]:
    """LoRA and QLoRA for a full fine-tune (``model.lora.rank`` 0), at `w`'s batch: each way's
    fastest fitting option, else its closest. Empty for a run that already uses adapters."""
    if base.model.lora.rank > 0:
        return []
    out = []
    for name, overrides in WAYS.items():
        # every engine that takes the adapters (a config naming one that refuses them: the others)
        cfg = with_fields(base, {**overrides, "parallel.backend": "auto"})
        gated = base.model.hf is not None and base.model.lean_ops
        lora = estimated_adapters(m, RANK, "model.lora.quantize" in overrides, gated)
        adapted = replace(w, lora=lora)
        options = plan(m, adapted, hw, cfg)
        best = recommend(options)
        out.append(Lighter(name, overrides, best or closest(options), best is not None))
    return out


def lighter_lines(ways: list[Lighter]) -> list[str]:
    """One line per way: what it would need per GPU and how fast, and how to select it."""
    lines = []
    for way in ways:
        o, flags = way.best, " ".join(f"--{k} {v}" for k, v in way.overrides.items())
        gib = o.memory.peak_reserved / 2**30
        if way.fits:
            what = f"fits: {o.strategy.label}, {gib:.1f} GiB per GPU, ~{o.speed.tokens_per_s:,.0f} tokens/s"
        else:
            what = f"does not fit either: the closest is {o.strategy.label} ({o.why_not})"
        lines.append(f"{way.name} (r={RANK}, {flags}) {what}")
    return lines

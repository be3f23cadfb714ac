"""The training objectives' own settings (``train.objective`` picks one; ``zerofit.train.objectives``
runs it)."""

from __future__ import annotations

from typing import Annotated as A
from typing import Literal

from pydantic.dataclasses import dataclass

from zerofit.config.fields import SECTION, Float, Positive, doc


@dataclass(config=SECTION)
class DPOConfig:
    """Direct preference optimisation (train.objective dpo): raise the policy's log-probability
    margin of each chosen response over its rejected one, relative to a frozen reference."""

    beta: A[Positive, doc("the inverse temperature of the implicit reward", le=1000)] = 0.1
    label_smoothing: A[
        Float, doc("the share of pairs assumed mislabelled (cDPO), in [0, 0.5)", ge=0, lt=0.5)
    ] = 0.0
    reference: A[
        Literal["auto", "adapters_off", "precomputed", "copy"],
        doc(
            "the frozen reference: adapters_off (LoRA / QLoRA: the base with the adapters off, no "
            "extra weights), precomputed (the starting model's log-probs of every pair, computed "
            "in a first pass and kept with the run: no extra weights, no extra forward a step), "
            "copy (full fine-tuning: a frozen copy of the starting model, sharded as the policy, "
            "one more forward a micro-batch: for a run shorter than a pass over its pairs), auto "
            "(adapters_off with LoRA, else precomputed: the cheapest in memory and step time)"
        ),
    ] = "auto"

    def resolved(self, lora: bool) -> str:
        """The reference a run uses: ``auto`` settled (``lora``: the model has adapters)."""
        if self.reference != "auto":
            return self.reference
        return "adapters_off" if lora else "precomputed"

"""What a training step minimises: the next-token loss, or DPO's preference loss.

An objective turns a step's micro-batches into the losses the engine backpropagates, weighted so
that the update is that of the whole global batch's mean (over valid targets, or over preference
pairs), and gives eval its figures (DPO: the held-out pairs' accuracy and margin too). The
trainer calls it and knows nothing of either loss.

- ``NextToken``: text rows, each micro-batch's mean loss / accumulation; fine-tuning rows, the mean
  over every valid target of the global batch (``weights``).
- ``Preference`` (``train.objective: dpo``): rows of preference pairs (``zerofit.data``: a fourth
  channel names each scored place's pair, + chosen, - rejected). Each pair's summed log-probability
  of its chosen and rejected responses under the policy, against the frozen reference's
  (``zerofit.train.reference``), gives DPO's sigmoid loss; the step's loss is the mean over every
  pair of the global batch, and its reward margin, preference accuracy and log-probabilities are
  logged beside it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from zerofit.config import Config
from zerofit.data import Batch, real_tokens
from zerofit.distributed.mesh import DistContext
from zerofit.models.loss import IGNORE_INDEX
from zerofit.train.micro_batch import forward
from zerofit.train.preference import (
    METRICS,
    dpo_loss,
    dpo_metrics,
    metric_means,
    pair_index,
    pair_logps,
    shared_prefix_tokens,
)
from zerofit.train.reference import Reference


def _global_weights(
    ctx: DistContext, counts: list[int], batches: list[Batch], repeated: int = 0
) -> tuple[list[torch.Tensor], torch.Tensor, torch.Tensor]:
    """Micro-batch ``a``'s weight ``n_a * D / N`` (``N``: the global batch's count, one
    all-reduce); the global batch's real tokens, those ``repeated`` on any rank left out, and
    the repeated ones (no sync)."""
    real = sum(real_tokens(b) for b in batches)
    sums = torch.tensor([sum(counts), real, repeated], dtype=torch.float64, device=ctx.device)
    sums = ctx.all_reduce_sum(sums)
    n = sums[0].clamp(min=1.0)
    return [(c * ctx.dp_size / n).float() for c in counts], sums[1] - sums[2], sums[2]


class NextToken:
    """The mean next-token loss."""

    repeated: torch.Tensor | None = None  # every token counts (see Preference)

    def __init__(self, cfg: Config, ctx: DistContext, masked: bool) -> None:
        self.cfg, self.ctx, self.masked = cfg, ctx, masked

    def weights(self, batches: list[Batch]) -> tuple[list[torch.Tensor] | None, Any]:
        """Each micro-batch's loss weight and the global batch's real tokens. Masked rows: the
        engines average gradients over the D ranks, so the update is that of the global token
        mean, and the logged loss (summed, averaged over ranks) is that mean. Text rows: None."""
        if not self.masked:
            return None, None
        counts = [int((b[1] != IGNORE_INDEX).sum()) for b in batches]
        return _global_weights(self.ctx, counts, batches)[:2]

    def loss(self, model: nn.Module, batch: Batch) -> torch.Tensor:
        return forward(model, batch, self.ctx.device)

    def evaluate(
        self, model: nn.Module, batches: Iterable[Batch], micro_step: Any
    ) -> dict[str, float]:
        """``eval_loss``: over the ranks' mean batch losses (text rows), or over every valid
        target of every rank's batches (masked rows)."""
        return {"eval_loss": self._eval_loss(model, batches, micro_step)}

    def _eval_loss(self, model: nn.Module, batches: Iterable[Batch], micro_step: Any) -> float:
        ctx = self.ctx
        total, count = torch.zeros((), device=ctx.device), 0
        sums = torch.zeros(2, dtype=torch.float64, device=ctx.device)  # loss x n, n
        for batch in batches:
            with micro_step(is_last=True):
                loss = self.loss(model, batch)
            total, count = total + loss, count + 1
            n = float((batch[1] != IGNORE_INDEX).sum())
            sums += torch.stack([loss.double() * n, loss.new_tensor(n, dtype=torch.float64)])
        if self.masked:
            sums = ctx.all_reduce_sum(sums)
            return (sums[0] / sums[1].clamp(min=1.0)).item()
        return ctx.all_reduce_mean(total / max(count, 1)).item()

    def record(self) -> dict[str, float]:
        return {}


class Preference:
    """DPO: the mean over pairs of -log sigmoid(beta x (policy - reference) margin).

    A pair's chosen and rejected documents start with the same prompt, computed in both: its
    second copy is work done twice, and the tokens a step counts (its real tokens here, and
    through ``repeated`` the throughput and MFU the trainer logs) count it once."""

    def __init__(self, cfg: Config, ctx: DistContext, reference: Reference) -> None:
        self.cfg, self.ctx, self.reference = cfg, ctx, reference
        self.sums = torch.zeros(len(METRICS), dtype=torch.float64, device=ctx.device)
        # the last step's places that repeat their pair's other document (the global batch's)
        self.repeated: torch.Tensor | None = None

    def weights(self, batches: list[Batch]) -> tuple[list[torch.Tensor], Any]:
        """Micro-batch ``a``'s weight ``n_a * D / N`` for ``n_a`` its pairs: the update is that of
        the global batch's mean over pairs. Its real tokens count each pair's shared prompt once
        (``shared_prefix_tokens``)."""
        counts = [pair_index(b[3]).ids.numel() for b in batches]  # as the loss indexes them
        repeated = sum(shared_prefix_tokens(b) for b in batches)
        weights, real, self.repeated = _global_weights(self.ctx, counts, batches, repeated)
        return weights, real

    def _pair_terms(self, model: nn.Module, batch: Batch, split: str) -> tuple[torch.Tensor, ...]:
        index = pair_index(batch[3]).to(self.ctx.device)  # from the host's copy: no sync
        # the reference first: its forward's transient memory comes before the policy's saved
        # activations, not on top of them
        ref_chosen, ref_rejected = self.reference.logps(model, batch, index, split)
        nll = forward(model, batch, self.ctx.device, per_token=True)
        _, chosen, rejected = pair_logps(nll, index)
        d = self.cfg.train.dpo
        losses, r_chosen, r_rejected = dpo_loss(
            chosen, rejected, ref_chosen, ref_rejected, d.beta, d.label_smoothing
        )
        return losses, chosen.detach(), rejected.detach(), r_chosen, r_rejected

    def loss(self, model: nn.Module, batch: Batch) -> torch.Tensor:
        terms = self._pair_terms(model, batch, "train")
        self.sums += dpo_metrics(*terms[1:])
        losses = terms[0]
        return losses.mean() if losses.numel() else losses.sum()

    def evaluate(
        self, model: nn.Module, batches: Iterable[Batch], micro_step: Any
    ) -> dict[str, float]:
        """Over every held-out pair of every rank: the mean DPO loss (``eval_loss``), preference
        accuracy and reward margin (``eval_dpo_accuracy``, ``eval_dpo_margin``)."""
        sums = torch.zeros(len(METRICS) + 1, dtype=torch.float64, device=self.ctx.device)
        for batch in batches:
            with micro_step(is_last=True):
                losses, *terms = self._pair_terms(model, batch, "val")
            sums[0] += losses.double().sum()
            sums[1:] += dpo_metrics(*terms)
        sums = self.ctx.all_reduce_sum(sums)
        means = metric_means(sums[1:])
        return {
            "eval_loss": sums[0].item() / max(means["pairs"], 1.0),
            "eval_dpo_accuracy": means["accuracy"],
            "eval_dpo_margin": means["margin"],
        }

    def record(self) -> dict[str, float]:
        """The logging window's DPO figures, each a mean over its pairs (one all-reduce)."""
        sums = self.ctx.all_reduce_sum(self.sums.clone())
        self.sums.zero_()
        means = metric_means(sums)
        return {"pairs": int(means.pop("pairs")), **{f"dpo_{k}": v for k, v in means.items()}}


def make_objective(
    cfg: Config, ctx: DistContext, masked: bool, reference: Reference | None
) -> NextToken | Preference:
    if cfg.train.objective == "dpo":
        assert reference is not None
        return Preference(cfg, ctx, reference)
    return NextToken(cfg, ctx, masked)

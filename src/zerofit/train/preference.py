"""DPO's arithmetic on per-token losses: each pair's summed log-probabilities, the loss, the figures.

A preference row holds pairs (a prompt, a chosen and a rejected response), and a ``pairs`` tensor
the shape of the targets names, for each place, the pair its target scores: ``g + 1`` for the chosen
response of pair ``g`` (numbered over the global batch), ``-(g + 1)`` for the rejected one, 0
elsewhere (prompts, padding). The model's per-token losses (``model(..., per_token=True)``, 0 where
a target is -100) then give each response's log-probability, ``-sum`` of its losses:
`pair_logps`. That of the policy (with gradients) and of the frozen reference (without) give
`dpo_loss`, DPO's sigmoid loss (Rafailov et al. 2023) with the label smoothing of conservative DPO,
as TRL's ``DPOTrainer`` (``loss_type="sigmoid"``) computes it. `dpo_metrics` sums what is logged,
so that sums over micro-batches and ranks (one all-reduce) give means over pairs (`metric_means`).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

# The figures `dpo_metrics` sums, in its order: the pairs counted, then each figure's sum over them.
METRICS = (
    "pairs",
    "margin",  # chosen reward - rejected reward
    "accuracy",  # 1 where the chosen reward is above the rejected one
    "logp_chosen",  # the policy's log-probability of the chosen response
    "logp_rejected",
    "reward_chosen",  # beta x (policy - reference) log-probability of the chosen response
    "reward_rejected",
)


@dataclass(frozen=True)
class PairIndex:
    """Where a batch's pairs are scored: the pair ids ``g`` present (sorted, [P]), the flat places
    whose targets score one ([S]), and each place's slot ``2 x (its pair's rank in ids) + side``
    (side 0 chosen, 1 rejected). Computed from the host's copy of the batch and moved with it, so
    that summing on the GPU needs no device sync (a ``nonzero`` or ``unique`` there waits)."""

    ids: torch.Tensor
    places: torch.Tensor
    slots: torch.Tensor

    def to(self, device: torch.device) -> PairIndex:
        return PairIndex(
            *(t.to(device, non_blocking=True) for t in (self.ids, self.places, self.slots))
        )


def pair_index(pairs: torch.Tensor) -> PairIndex:
    """The `PairIndex` of a pairs tensor [B, T] (int64: ``g + 1`` chosen, ``-(g + 1)`` rejected,
    0 none). A pair's places may lie anywhere in the batch (any rows)."""
    flat = pairs.flatten()
    scored = (flat != 0).nonzero().squeeze(1)
    marks = flat[scored]
    ids, slot = torch.unique(marks.abs() - 1, sorted=True, return_inverse=True)
    return PairIndex(ids, scored, 2 * slot + (marks < 0).long())


def pair_logps(
    token_nll: torch.Tensor, pairs: torch.Tensor | PairIndex
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-token losses [B, T] and the pairs' places (a pairs tensor [B, T], or its `PairIndex`)
    -> (the pair ids ``g`` present, sorted, int64 [P]; each one's chosen response's summed
    log-probability [P]; its rejected one's [P]), in the losses' dtype. A pair with only one side
    present gets 0 for the other. Differentiable in ``token_nll``."""
    if isinstance(pairs, torch.Tensor):
        if token_nll.shape != pairs.shape:
            raise ValueError(
                f"token_nll {tuple(token_nll.shape)} and pairs {tuple(pairs.shape)} differ"
            )
        pairs = pair_index(pairs)
    nll = token_nll.flatten()[pairs.places]
    sums = nll.new_zeros(2 * pairs.ids.numel()).index_add(0, pairs.slots, nll)
    logps = -sums.view(-1, 2)
    return pairs.ids, logps[:, 0], logps[:, 1]


def shared_prefix_tokens(batch: tuple[torch.Tensor, ...]) -> int:
    """Input places of a batch of preference rows (on the host) that compute what another place
    already does: for each pair, the common start of its chosen and rejected documents' inputs
    (the prompt, and any first tokens the two responses share). Attention is causal and within a
    document, so the same weights give those places the same hidden states in both documents:
    the work is done twice but counts once (``zerofit.train.objectives``: tokens and FLOPs)."""
    inputs, positions, pairs = (t.numpy() for t in (batch[0], batch[2], batch[3]))
    total = 0
    for row_in, row_pos, row_pairs in zip(inputs, positions, pairs, strict=True):
        bounds = [*np.flatnonzero(row_pos == 0).tolist(), len(row_pos)]
        docs = {}  # a document's pair mark (+ chosen, - rejected) -> its inputs
        for a, b in itertools.pairwise(bounds):
            marks = row_pairs[a:b][row_pairs[a:b] != 0]
            if marks.size:  # not padding
                docs[int(marks[0])] = row_in[a:b]
        for mark, chosen in docs.items():
            rejected = docs.get(-mark) if mark > 0 else None
            if rejected is not None:
                n = min(len(chosen), len(rejected))
                differ = np.flatnonzero(chosen[:n] != rejected[:n])
                total += int(differ[0]) if differ.size else n
    return total


def dpo_loss(
    policy_chosen: torch.Tensor,
    policy_rejected: torch.Tensor,
    ref_chosen: torch.Tensor,
    ref_rejected: torch.Tensor,
    beta: float,
    label_smoothing: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Each pair's DPO loss and the rewards of its chosen and rejected responses ([P] each).

    logits = beta ((policy_chosen - ref_chosen) - (policy_rejected - ref_rejected));
    loss = -(1 - ls) log sigmoid(logits) - ls log sigmoid(-logits) (``ls``: label_smoothing, the
    share of pairs assumed mislabelled); reward = beta (policy - reference), detached. With the
    policy equal to the reference, every loss is ln 2. The reference's log-probabilities take no
    gradient (detached here, whatever the caller passes)."""
    chosen_ratio = policy_chosen - ref_chosen.detach()
    rejected_ratio = policy_rejected - ref_rejected.detach()
    logits = beta * (chosen_ratio - rejected_ratio)
    losses = -F.logsigmoid(logits)
    if label_smoothing:
        losses = (1 - label_smoothing) * losses - label_smoothing * F.logsigmoid(-logits)
    return losses, beta * chosen_ratio.detach(), beta * rejected_ratio.detach()


def dpo_metrics(
    policy_chosen: torch.Tensor,
    policy_rejected: torch.Tensor,
    chosen_rewards: torch.Tensor,
    rejected_rewards: torch.Tensor,
) -> torch.Tensor:
    """The sums of `METRICS` over these pairs, one fp64 tensor [len(METRICS)] on their device
    (no sync): add them over micro-batches, all-reduce them over ranks, then `metric_means`."""
    margin = (chosen_rewards - rejected_rewards).detach().double()
    terms = [
        torch.full((), float(margin.numel()), dtype=torch.float64, device=margin.device),
        margin.sum(),
        (margin > 0).double().sum(),
        policy_chosen.detach().double().sum(),
        policy_rejected.detach().double().sum(),
        chosen_rewards.detach().double().sum(),
        rejected_rewards.detach().double().sum(),
    ]
    return torch.stack(terms)


def metric_means(sums: torch.Tensor) -> dict[str, float]:
    """`dpo_metrics` sums (over any micro-batches and ranks) -> each figure's mean over the pairs,
    and ``pairs``, their count (one host sync)."""
    values = sums.double().tolist()
    n = values[0]
    means = {name: v / max(n, 1.0) for name, v in zip(METRICS[1:], values[1:], strict=True)}
    return {"pairs": n, **means}

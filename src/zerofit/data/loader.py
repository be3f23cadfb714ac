"""The sharded, seeded, resumable micro-batch stream over training rows, and the eval batches.

A batch is ``(inputs, targets)`` for text rows [N, seq_len+1], ``(inputs, targets, positions)``
for fine-tuning rows [N, 3, seq_len], and ``(inputs, targets, positions, pairs)`` for preference
rows [N, 4, seq_len] (``zerofit.data.pair_rows``: ``g + 1`` / ``-(g + 1)`` where a target scores
the chosen / rejected response of pair ``g``, 0 elsewhere); all int64 [B, seq_len].

Sequence layout of one global batch (``B`` = micro batch size, ``A`` = grad-accum steps,
``D`` = data-parallel size): micro-step ``a`` on rank ``r`` takes the permutation entries at
offsets ``a*D*B + r*B + [0, B)``. So one process with ``A=2`` sees exactly the micro-batches
that two ranks with ``A=1`` see, which the parity tests rely on.
"""

from __future__ import annotations

import numpy as np
import torch

from zerofit.errors import UserError

Batch = tuple[torch.Tensor, ...]


def to_batch(rows: np.ndarray | torch.Tensor) -> Batch:
    t = torch.as_tensor(rows).to(torch.int64)
    if t.dim() == 3:  # fine-tuning rows: inputs, targets, positions (and pair ids)
        return tuple(t[:, c].contiguous() for c in range(t.shape[1]))
    return t[:, :-1].contiguous(), t[:, 1:].contiguous()


def real_tokens(batch: Batch, ignore_index: int = -100) -> int:
    """Input places of a batch that hold sample tokens, not padding. Text rows have no padding.
    Fine-tuning rows end in padding: from the first document start (position 0) after which no
    target carries a loss (every kept sample has a loss target, so that is where padding begins)."""
    if len(batch) < 3:
        return batch[0].numel()
    targets, positions = batch[1], batch[2]
    has_loss = targets != ignore_index
    # loss_after[i]: a target at i or later carries a loss (a reversed running "any")
    loss_after = has_loss.flip(-1).to(torch.int32).cummax(-1).values.flip(-1).bool()
    pad_start = (positions == 0) & ~loss_after
    seq = targets.shape[-1]
    index = torch.arange(seq).expand_as(targets)
    first_pad = torch.where(pad_start, index, torch.full_like(index, seq)).min(-1).values
    return int(first_pad.sum())


class PackedLoader:
    """Endless, sharded, seeded micro-batch stream over packed train sequences."""

    def __init__(
        self,
        sequences: np.ndarray | torch.Tensor,
        *,
        micro_batch_size: int,
        grad_accum_steps: int,
        dp_rank: int,
        dp_size: int,
        seed: int,
        shuffle: bool = True,
    ) -> None:
        if micro_batch_size < 1 or grad_accum_steps < 1 or dp_size < 1:
            raise UserError("micro_batch_size, grad_accum_steps and dp_size must be >= 1")
        if not 0 <= dp_rank < dp_size:
            raise UserError(f"dp_rank {dp_rank} out of range for dp_size {dp_size}")
        self.sequences = sequences
        self.B, self.A, self.rank, self.D = micro_batch_size, grad_accum_steps, dp_rank, dp_size
        self.seed, self.shuffle = seed, shuffle
        self.global_batch = micro_batch_size * grad_accum_steps * dp_size
        self.n = len(sequences)
        if self.n < self.global_batch:
            raise UserError(
                f"data: only {self.n} training rows but one global batch needs "
                f"{self.global_batch} (train.micro_batch_size={micro_batch_size} x "
                f"train.grad_accum_steps={grad_accum_steps} x {dp_size} ranks); lower "
                "train.micro_batch_size or train.grad_accum_steps, set data.val_fraction=0, "
                "lower model.seq_len, or add data"
            )
        self.epoch = 0
        self.position = 0  # offset in this epoch's permutation of the current global batch
        self.micro = 0  # next micro-step within the current global batch
        self._perm: torch.Tensor | None = None
        self._perm_epoch = -1

    @property
    def masked(self) -> bool:
        """Whether batches carry positions and masked targets (fine-tuning rows)."""
        return np.ndim(self.sequences) == 3

    @property
    def paired(self) -> bool:
        """Whether batches carry pair ids (preference rows: 4-tuples)."""
        return self.masked and self.sequences.shape[1] == 4

    def _permutation(self) -> torch.Tensor:
        if self._perm_epoch != self.epoch:
            if self.shuffle:
                g = torch.Generator().manual_seed(self.seed + self.epoch)
                self._perm = torch.randperm(self.n, generator=g)
            else:
                self._perm = torch.arange(self.n)
            self._perm_epoch = self.epoch
        assert self._perm is not None
        return self._perm

    def next_microbatch(self) -> Batch:
        if self.position + self.global_batch > self.n:  # remainder dropped: next epoch
            self.epoch += 1
            self.position = 0
        start = self.position + self.micro * self.D * self.B + self.rank * self.B
        idx = self._permutation()[start : start + self.B].numpy()
        self.micro += 1
        if self.micro == self.A:
            self.micro = 0
            self.position += self.global_batch
        return to_batch(self.sequences[idx])

    def state_dict(self) -> dict:
        return {
            "epoch": self.epoch,
            "position": self.position,
            "micro": self.micro,
            "seed": self.seed,
            "num_sequences": self.n,
        }

    def load_state_dict(self, d: dict) -> None:
        n = d.get("num_sequences", self.n)
        if n != self.n:
            raise UserError(
                f"data loader state is for {n} train sequences but the data now has {self.n}; "
                "the data, tokenizer or seq_len changed since the checkpoint"
            )
        self.epoch = int(d["epoch"])
        self.position = int(d["position"])
        self.micro = int(d.get("micro", 0))
        self.seed = int(d.get("seed", self.seed))


def eval_batches(
    sequences: np.ndarray | torch.Tensor,
    micro_batch_size: int,
    dp_rank: int,
    dp_size: int,
    max_batches: int | None = None,
) -> list[Batch]:
    """Fixed, unshuffled eval micro-batches for this rank (same layout as training, A=1).

    Every rank gets the same number of full batches: ``min(max_batches, N // (B*D))``, but at
    least one, wrapping around the val set when it is smaller than one global batch.
    """
    n, gb = len(sequences), micro_batch_size * dp_size
    if n == 0:
        return []
    n_batches = n // gb
    if max_batches is not None:
        n_batches = min(n_batches, max_batches)
    n_batches = max(1, n_batches)
    out = []
    for k in range(n_batches):
        start = k * gb + dp_rank * micro_batch_size
        idx = np.arange(start, start + micro_batch_size) % n
        out.append(to_batch(sequences[idx]))
    return out

"""Rows of training data, and the train/val split.

- Text: documents concatenated, each followed by EOS, cut into rows of ``seq_len + 1`` tokens
  (inputs = row[:-1], targets = row[1:]), documents running across rows.
- Fine-tuning samples: rows of shape [3, seq_len] (inputs, targets, positions), each holding whole
  samples kept apart. A sample of ``L`` tokens takes ``L - 1`` places (its last token is only a
  target); its positions restart at 0, its targets are -100 where no loss falls, and the rest of a
  row is padding (targets -100, positions 0, 1, ... as one more document). With packing, samples
  go first-fit in order: each into the first row with room for it (rows kept in the order they
  were opened); without packing, one sample per row. A sample longer than ``seq_len + 1`` tokens
  follows ``overlong``: ``truncate`` keeps its first ``seq_len + 1`` tokens, ``drop`` skips it,
  ``error`` stops with its file:line. A sample left with no loss target is skipped.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import ClassVar

import numpy as np
import torch

from zerofit.data.samples import Sample
from zerofit.data.sizing import val_rows
from zerofit.data.tokenizers import Tokenizer
from zerofit.errors import UserError

IGNORE_INDEX = (
    -100
)  # zerofit.models.loss.IGNORE_INDEX (not imported: data does not need torch models)


def tokenize_stream(
    docs: Iterable[str], tok: Tokenizer, max_tokens: int | None = None, batch_docs: int = 64
) -> np.ndarray:
    """All documents tokenized and concatenated, each followed by EOS (if the tokenizer has
    one), truncated to ``max_tokens``. Stops reading documents once the cap is reached."""
    parts: list[np.ndarray] = []
    total = 0
    eos = None if tok.eos_id is None else np.asarray([tok.eos_id], dtype=np.int32)
    batch: list[str] = []

    def flush() -> None:
        nonlocal total
        for ids in tok.encode_batch(batch):
            parts.append(ids)
            total += len(ids)
            if eos is not None:
                parts.append(eos)
                total += 1
        batch.clear()

    for doc in docs:
        batch.append(doc)
        if len(batch) >= batch_docs:
            flush()
            if max_tokens is not None and total >= max_tokens:
                break
    flush()  # the remainder (empty after a break)
    stream = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int32)
    return stream[:max_tokens] if max_tokens is not None else stream


def pack(stream: np.ndarray, seq_len: int) -> np.ndarray:
    """Cut a token stream into non-overlapping rows of ``seq_len + 1`` (inputs=row[:-1],
    targets=row[1:]). The tail that does not fill a row is dropped."""
    if seq_len < 1:
        raise UserError(f"seq_len must be >= 1, got {seq_len}")
    n = len(stream) // (seq_len + 1)
    return np.ascontiguousarray(stream[: n * (seq_len + 1)].reshape(n, seq_len + 1))


@dataclass
class PackStats:
    """What packing did with the samples (reported at start and in summary.json)."""

    samples: int = 0  # read
    tokens: int = 0  # in the samples read
    truncated_samples: int = 0
    truncated_tokens: int = 0  # cut off
    dropped_samples: int = 0  # overlong=drop
    dropped_tokens: int = 0
    skipped_samples: int = 0  # no loss target (left)
    rows: int = 0
    fill: float = 0.0  # share of row places holding sample tokens

    def as_dict(self) -> dict[str, float]:
        return asdict(self)

    UNIT: ClassVar[str] = "samples"  # what `samples` counts, in the start line

    def line(self, packing: bool) -> str:
        how = "packed first-fit into" if packing else "one per sequence in"
        unit = self.UNIT
        out = f"{self.samples} {unit} ({self.tokens} tokens) {how} {self.rows} sequences, "
        out += f"{self.fill:.1%} filled; truncated {self.truncated_samples} {unit} "
        out += f"({self.truncated_tokens} tokens), dropped {self.dropped_samples} "
        out += f"({self.dropped_tokens} tokens)"
        if self.skipped_samples:
            out += f", skipped {self.skipped_samples} with no token to learn"
        return out


def fit_samples(
    samples: Iterable[Sample], seq_len: int, overlong: str
) -> tuple[list[Sample], PackStats]:
    """Apply ``overlong`` to each sample; drop those with no loss target. Counts in the stats."""
    stats, kept, limit = PackStats(), [], seq_len + 1
    for s in samples:
        stats.samples += 1
        stats.tokens += len(s.ids)
        if len(s.ids) > limit:
            if overlong == "error":
                raise UserError(
                    f"{s.where}: sample of {len(s.ids)} tokens is longer than model.seq_len + 1 "
                    f"= {limit}; raise model.seq_len or set data.overlong to truncate or drop"
                )
            if overlong == "drop":
                stats.dropped_samples += 1
                stats.dropped_tokens += len(s.ids)
                continue
            stats.truncated_samples += 1
            stats.truncated_tokens += len(s.ids) - limit
            s = Sample(s.ids[:limit], s.mask[:limit], s.where)
        if len(s.ids) < 2 or not s.mask[1:].any():
            stats.skipped_samples += 1
            continue
        kept.append(s)
    return kept, stats


def first_fit(lengths: list[int], capacity: int) -> list[int]:
    """Row of each item: the first row (in opening order) with room for it. A max-tree over
    the rows' free room finds it in O(log n)."""
    size = 1 << max(1, (len(lengths) - 1).bit_length())
    free = [capacity] * (2 * size)
    out = []
    for n in lengths:
        node = 1
        while node < size:
            node = 2 * node if free[2 * node] >= n else 2 * node + 1
        out.append(node - size)
        free[node] -= n
        node //= 2
        while node:
            free[node] = max(free[2 * node], free[2 * node + 1])
            node //= 2
    return out


def pack_samples(samples: list[Sample], seq_len: int, packing: bool) -> tuple[np.ndarray, float]:
    """Rows [R, 3, seq_len] int32 (inputs, targets, positions) and the share of places filled."""
    lengths = [len(s.ids) - 1 for s in samples]
    where = first_fit(lengths, seq_len) if packing else list(range(len(samples)))
    n_rows = max(where) + 1 if where else 0
    rows = np.zeros((n_rows, 3, seq_len), dtype=np.int32)
    rows[:, 1] = IGNORE_INDEX
    used = [0] * n_rows
    for s, r in zip(samples, where, strict=True):
        o, n = used[r], len(s.ids) - 1
        rows[r, 0, o : o + n] = s.ids[:-1]
        rows[r, 1, o : o + n] = np.where(s.mask[1:], s.ids[1:], IGNORE_INDEX)
        rows[r, 2, o : o + n] = np.arange(n)
        used[r] += n
    for r, o in enumerate(used):  # padding: one more document, no loss
        rows[r, 2, o:] = np.arange(seq_len - o)
    fill = sum(used) / (n_rows * seq_len) if n_rows else 0.0
    return rows, fill


def split_train_val(
    sequences: np.ndarray, val_fraction: float, seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """A seeded, deterministic, disjoint split; at least one val row when val_fraction > 0."""
    is_val = held_out(len(sequences), val_fraction, seed, "packed sequences")
    return sequences[~is_val], sequences[is_val]


def held_out(n: int, val_fraction: float, seed: int, what: str) -> np.ndarray:
    """Which of ``n`` items go to validation [n] bool: a seeded, deterministic choice of
    ``max(1, round(n * val_fraction))`` (none when val_fraction is 0)."""
    if not 0.0 <= val_fraction < 1.0:
        raise UserError(f"val_fraction must be in [0, 1), got {val_fraction}")
    n_val = val_rows(n, val_fraction)
    if n_val >= n:
        raise UserError(f"only {n} {what}: too few to hold out {n_val} for validation")
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed)).numpy()
    is_val = np.zeros(n, dtype=bool)
    is_val[perm[:n_val]] = True
    return is_val

"""Preference pairs into rows: the split by pair, overlong pairs, and packing.

Rows are [R, 4, seq_len]: channels 0-2 as fine-tuning rows (``zerofit.data.packing``: inputs;
targets, -100 where no loss falls and on padding; positions, restarting at 0 for each document),
and channel 3 the **pair ids**: at each place whose target carries a loss, ``g + 1`` for the chosen
document of pair ``g`` and ``-(g + 1)`` for its rejected one; 0 elsewhere. ``g`` is the pair's
index in its split (train pairs ``0 .. n_train - 1``, val pairs ``0 .. n_val - 1``), in record
order, so the same data and seed give the same ids.

- The split is by pair (``split_pairs``): a seeded choice of ``max(1, round(n * val_fraction))``
  pairs for validation, as ``split_train_val`` chooses rows; each side is then packed on its own.
- A pair's two documents go consecutively into one row, chosen first. With packing, pairs go
  first-fit by their places (chosen's + rejected's; a document of L tokens takes L - 1); without,
  one pair per row.
- A pair longer than a row (``places > seq_len``) follows ``overlong``: ``error`` stops with its
  file:line, ``drop`` skips it, ``truncate`` cuts it (``truncate_pair``): both responses are cut
  from the end to one common length, the longest that fits, and the prompt is kept whole unless
  that would leave either response fewer than ``seq_len // 4`` tokens (or all of it, when
  shorter); then the prompt is cut from the left, as little as gives the responses that much.
- A pair with a document left without a loss target is skipped (counted).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from zerofit.data.packing import IGNORE_INDEX, PackStats, first_fit, held_out
from zerofit.data.pairs import Pair
from zerofit.data.samples import Sample
from zerofit.errors import UserError

CHANNELS = 4  # inputs, targets, positions, pair ids


@dataclass
class PairStats(PackStats):
    """What packing did with the pairs: ``samples`` counts pairs (``tokens``: both documents),
    as do the truncated, dropped and skipped counts."""

    identical_pairs: int = 0  # chosen = rejected: kept, though they teach nothing
    train_pairs: int = 0
    val_pairs: int = 0

    UNIT: ClassVar[str] = "pairs"

    def line(self, packing: bool) -> str:
        out = super().line(packing)
        if self.identical_pairs:
            out += f", {self.identical_pairs} with chosen = rejected (nothing to learn)"
        return out + f"; {self.train_pairs} train / {self.val_pairs} val pairs"


def _cut(s: Sample, start: int, stop: int) -> Sample:
    return Sample(s.ids[start:stop], s.mask[start:stop], s.where)


def response_cap(chosen: int, rejected: int, budget: int) -> int:
    """The longest common length both responses may keep within ``budget`` tokens together."""
    short, long = sorted((chosen, rejected))
    if short + long <= budget:
        return long
    if 2 * short <= budget:
        return budget - short
    return max(budget // 2, 0)


def _prompt_cut(pc: int, pr: int, need: int, room: int) -> int:
    """Tokens to cut from the left of each prompt so both fit beside ``need`` response tokens."""
    cut = max(0, -(-(pc + pr + need - room) // 2))
    while max(pc - cut, 0) + max(pr - cut, 0) + need > room:
        cut += 1
    return cut


def truncate_pair(pair: Pair, seq_len: int) -> Pair:
    """The pair cut to fit one row of ``seq_len`` places (see the module doc)."""
    room = seq_len + 2  # tokens of the two documents together
    pc, pr = pair.chosen_prompt, pair.rejected_prompt
    rc, rr = len(pair.chosen.ids) - pc, len(pair.rejected.ids) - pr
    floor = max(1, seq_len // 4)
    cut = _prompt_cut(pc, pr, min(rc, floor) + min(rr, floor), room)
    kc, kr = max(pc - cut, 0), max(pr - cut, 0)
    cap = response_cap(rc, rr, room - kc - kr)
    chosen = _cut(pair.chosen, pc - kc, pc + min(rc, cap))
    rejected = _cut(pair.rejected, pr - kr, pr + min(rr, cap))
    return Pair(chosen, rejected, kc, kr, pair.where)


def _learns(s: Sample) -> bool:
    return len(s.ids) >= 2 and bool(s.mask[1:].any())


def fit_pairs(pairs: Iterable[Pair], seq_len: int, overlong: str) -> tuple[list[Pair], PairStats]:
    """Apply ``overlong`` to each pair; skip those with a document that has no loss target."""
    stats, kept = PairStats(), []
    for p in pairs:
        stats.samples += 1
        stats.tokens += p.tokens
        if p.places > seq_len:
            if overlong == "error":
                raise UserError(
                    f"{p.where}: pair of {len(p.chosen.ids)} + {len(p.rejected.ids)} tokens "
                    f"(chosen + rejected) takes {p.places} places, more than model.seq_len = "
                    f"{seq_len} (both go in one row); raise model.seq_len or set data.overlong "
                    "to truncate or drop"
                )
            if overlong == "drop":
                stats.dropped_samples += 1
                stats.dropped_tokens += p.tokens
                continue
            cut = truncate_pair(p, seq_len)
            stats.truncated_samples += 1
            stats.truncated_tokens += p.tokens - cut.tokens
            p = cut
        if not (_learns(p.chosen) and _learns(p.rejected)):
            stats.skipped_samples += 1
            continue
        stats.identical_pairs += p.identical
        kept.append(p)
    return kept, stats


def split_pairs(
    pairs: list[Pair], val_fraction: float, seed: int = 0
) -> tuple[list[Pair], list[Pair]]:
    """(train, val) pairs, each in record order: a seeded, deterministic, disjoint split."""
    is_val = held_out(len(pairs), val_fraction, seed, "pairs")
    train = [p for p, v in zip(pairs, is_val, strict=True) if not v]
    return train, [p for p, v in zip(pairs, is_val, strict=True) if v]


def _place(row: np.ndarray, at: int, s: Sample, pair_id: int) -> int:
    """Put a document at place ``at`` of a row [4, seq_len]; returns the places it took."""
    n = len(s.ids) - 1
    loss = s.mask[1:]
    row[0, at : at + n] = s.ids[:-1]
    row[1, at : at + n] = np.where(loss, s.ids[1:], IGNORE_INDEX)
    row[2, at : at + n] = np.arange(n)
    row[3, at : at + n] = np.where(loss, pair_id, 0)
    return n


def pack_pairs(pairs: list[Pair], seq_len: int, packing: bool) -> tuple[np.ndarray, float]:
    """Rows [R, 4, seq_len] int32 (pair ``g`` is ``pairs[g]``) and the share of places filled."""
    if any(p.places > seq_len for p in pairs):
        raise ValueError("a pair longer than a row: fit_pairs first")
    where = first_fit([p.places for p in pairs], seq_len) if packing else list(range(len(pairs)))
    n_rows = max(where) + 1 if where else 0
    rows = np.zeros((n_rows, CHANNELS, seq_len), dtype=np.int32)
    rows[:, 1] = IGNORE_INDEX
    used = [0] * n_rows
    for g, (p, r) in enumerate(zip(pairs, where, strict=True)):
        used[r] += _place(rows[r], used[r], p.chosen, g + 1)
        used[r] += _place(rows[r], used[r], p.rejected, -(g + 1))
    for r, o in enumerate(used):  # padding: one more document, no loss
        rows[r, 2, o:] = np.arange(seq_len - o)
    fill = sum(used) / (n_rows * seq_len) if n_rows else 0.0
    return rows, fill


def pair_ids(rows: np.ndarray) -> np.ndarray:
    """The pairs whose documents a set of rows holds (sorted g's)."""
    return np.unique(np.abs(rows[:, 3][rows[:, 3] != 0])) - 1

"""Whether the data is big enough for a run, and steps from epochs.

Small data has to hold out its validation rows (``data.val_fraction``, at least one row when it is
above 0) and still fill one global batch of training rows (``micro_batch_size x grad_accum_steps x
data-parallel ranks``). Both are checked together, before the split, so that a single error line
names every fix, with one combination of settings that fits.

``train.epochs`` gives ``steps = ceil(epochs x training rows / global batch rows)``: each step
takes one global batch, the loader reshuffles for each pass and drops a pass's last partial batch,
so a run of E epochs sees at least E x rows rows.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

from zerofit.errors import UserError


@dataclass(frozen=True)
class GlobalBatch:
    """Rows one optimizer step takes."""

    micro: int  # train.micro_batch_size
    accum: int  # train.grad_accum_steps
    dp: int  # data-parallel ranks

    @property
    def rows(self) -> int:
        return self.micro * self.accum * self.dp

    def describe(self) -> str:
        return (
            f"{self.rows} rows (train.micro_batch_size={self.micro} x "
            f"train.grad_accum_steps={self.accum} x {self.dp} rank{'s' if self.dp > 1 else ''})"
        )


@dataclass(frozen=True)
class RowSupply:
    """The rows the data gives, and how to get more (for the error line)."""

    rows: int
    what: str  # e.g. "1 packed row (3 samples)"
    unpacked: int | None = None  # rows with data.packing=false, when that gives more
    more: tuple[str, ...] = ("add data",)


def val_rows(n: int, val_fraction: float) -> int:
    """Rows held out for validation: at least one when ``val_fraction`` > 0 (as the split does)."""
    return 0 if val_fraction == 0 else max(1, round(n * val_fraction))


def _fits(n: int, val_fraction: float, need: int) -> bool:
    held = val_rows(n, val_fraction)
    return held < n and n - held >= need


def _fitting(supply: RowSupply, val_fraction: float, batch: GlobalBatch | None) -> list[str]:
    """The fewest setting changes that make the data fit (empty: none does, short of more rows)."""
    micro, per = (batch.micro, batch.accum * batch.dp) if batch else (1, 1)
    unpack = [False] + ([True] if supply.unpacked and supply.unpacked > supply.rows else [])
    best: list[str] | None = None
    for packing_off in unpack:
        n = supply.unpacked if packing_off and supply.unpacked else supply.rows
        for vf in dict.fromkeys([val_fraction, 0.0]):
            m = min(micro, (n - val_rows(n, vf)) // per)
            if m < 1:
                continue
            changes = ["data.packing=false"] if packing_off else []
            changes += ["data.val_fraction=0"] if vf != val_fraction else []
            changes += [f"train.micro_batch_size={m}"] if m < micro else []
            if best is None or len(changes) < len(best):
                best = changes
    return best or []


def check_rows(supply: RowSupply, val_fraction: float, batch: GlobalBatch | None) -> None:
    """One UserError naming every fix when the rows cannot hold out validation and fill one global
    batch (``batch`` None: one training row)."""
    n, need = supply.rows, batch.rows if batch else 1
    if _fits(n, val_fraction, need):
        return
    held = val_rows(n, val_fraction)
    goals = [f"hold out {held} for validation (data.val_fraction={val_fraction})"] if held else []
    goals.append(f"fill a global batch of {batch.describe()}" if batch else "train on one")
    fix = _fitting(supply, val_fraction, batch)
    fits = f"this fits: {' '.join(fix)}" if fix else "no batch setting fits"
    others = ["data.val_fraction=0"] if held else []
    if batch and batch.rows > 1:
        others.append(
            "a lower train.micro_batch_size / train.grad_accum_steps or fewer ranks (--nproc)"
        )
    if supply.unpacked and supply.unpacked > n:
        others.append(f"data.packing=false ({supply.unpacked} rows, one per sample)")
    raise UserError(
        f"data: {supply.what} {'is' if n == 1 else 'are'} too few to {' and '.join(goals)}; {fits}; "
        f"other fixes: {', '.join([*others, *supply.more])}"
    )


def epoch_steps(epochs: float, rows: int, batch_rows: int) -> int:
    """ceil(epochs x rows / batch_rows), exact for the decimal the user wrote (0.1 x 30 / 3 = 1)."""
    return math.ceil(Fraction(repr(float(epochs))) * rows / batch_rows)


def passes(steps: int, batch_rows: int, rows: int) -> str:
    """How many times over the rows ``steps`` global batches go, for a note line."""
    return f"{steps * batch_rows / rows:.3g}"

"""DPO's frozen reference: each pair's summed log-probabilities of its chosen and rejected responses
under the model the run started from.

- ``AdaptersOff`` (LoRA / QLoRA): the policy's own base with every adapter switched off, run
  without gradients on the same micro-batch. No extra weights; one more forward per micro-batch.
- ``Copy`` (full fine-tuning, ``train.dpo.reference: copy``): a frozen copy of the starting model,
  built from the model's source as the policy is (the name-seeded init or the weights on disk,
  never a checkpoint: a resume has the starting weights again) and sharded like it by the same
  engine (``Backend.wrap_frozen``), run without gradients on the same micro-batch. The copy's
  weights in the compute dtype; one more forward a micro-batch.
- ``Precomputed`` (any model, full fine-tuning included): a first pass over every pair of both
  splits with the starting weights, before the first step, kept in the run folder
  (``reference_logps.pt``). No extra weights and no extra forward while training; a resume reads
  the file (the weights it would recompute from are no longer the starting ones).

`train.dpo.reference: auto` is ``adapters_off`` with LoRA, else ``precomputed``
(``DPOConfig.resolved``).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch
from torch import nn

from zerofit.config import Config
from zerofit.data import Batch, to_batch
from zerofit.distributed.mesh import DistContext
from zerofit.errors import UserError
from zerofit.models.lora import LoRALinear
from zerofit.train.micro_batch import forward
from zerofit.train.preference import PairIndex, pair_index, pair_logps

FILE = "reference_logps.pt"
SPLITS = ("train", "val")


@contextlib.contextmanager
def adapters_off(model: nn.Module) -> Iterator[None]:
    """Every LoRA layer of `model` runs its frozen base alone while inside."""
    layers = [m for m in model.modules() if isinstance(m, LoRALinear)]
    for layer in layers:
        layer.enabled = False
    try:
        yield
    finally:
        for layer in layers:
            layer.enabled = True


class Reference:
    """The reference's (chosen, rejected) log-probabilities of a micro-batch's pairs (`index`, on
    the device: ``zerofit.train.preference.PairIndex``)."""

    def logps(
        self, model: nn.Module, batch: Batch, index: PairIndex, split: str
    ) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError


class AdaptersOff(Reference):
    def __init__(self, device: torch.device) -> None:
        self.device = device

    def logps(
        self, model: nn.Module, batch: Batch, index: PairIndex, split: str
    ) -> tuple[torch.Tensor, torch.Tensor]:
        with torch.no_grad(), adapters_off(model):
            nll = forward(model, batch, self.device, per_token=True)
        _, chosen, rejected = pair_logps(nll, index)
        return chosen, rejected


class Copy(Reference):
    def __init__(self, frozen: nn.Module, device: torch.device) -> None:
        self.frozen, self.device = frozen, device

    def logps(
        self, model: nn.Module, batch: Batch, index: PairIndex, split: str
    ) -> tuple[torch.Tensor, torch.Tensor]:
        with torch.no_grad():
            nll = forward(self.frozen, batch, self.device, per_token=True)
        _, chosen, rejected = pair_logps(nll, index)
        return chosen, rejected


class Precomputed(Reference):
    def __init__(self, tables: dict[str, torch.Tensor]) -> None:
        self.tables = tables  # split -> [pairs, 2] (chosen, rejected), on the device

    def logps(
        self, model: nn.Module, batch: Batch, index: PairIndex, split: str
    ) -> tuple[torch.Tensor, torch.Tensor]:
        table = self.tables[split]
        return table[index.ids, 0], table[index.ids, 1]


def pair_count(rows: np.ndarray) -> int:
    """How many pairs a split's rows hold (their ids run from 0)."""
    return int(np.abs(rows[:, 3]).max()) if len(rows) else 0


def _rank_batches(rows: np.ndarray, micro: int, ctx: DistContext) -> Iterator[Batch | None]:
    """This rank's share of `rows` in micro-batches, as many on every rank (a sharded engine
    gathers in each forward); None for a turn past this rank's share (its forward is discarded)."""
    mine = rows[ctx.dp_rank :: ctx.dp_size]
    turns = math.ceil(math.ceil(len(rows) / ctx.dp_size) / micro)
    for k in range(turns):
        part = mine[k * micro : (k + 1) * micro]
        yield to_batch(part) if len(part) else None


@torch.no_grad()
def first_pass(
    model: nn.Module, splits: dict[str, np.ndarray], micro: int, ctx: DistContext
) -> dict[str, torch.Tensor]:
    """Each split's table of the model's (chosen, rejected) log-probabilities, every pair once."""
    tables = {}
    for name, rows in splits.items():
        table = torch.zeros(pair_count(rows), 2, dtype=torch.float64, device=ctx.device)
        spare = to_batch(rows[:1]) if len(rows) else None
        for batch in _rank_batches(rows, micro, ctx):
            nll = forward(model, batch if batch is not None else spare, ctx.device, per_token=True)
            if batch is None:
                continue
            ids, chosen, rejected = pair_logps(nll, pair_index(batch[3]).to(ctx.device))
            table[ids] += torch.stack([chosen, rejected], dim=1).double()
        tables[name] = ctx.all_reduce_sum(table).float()
    return tables


def _load(path: Path, splits: dict[str, np.ndarray], device: torch.device) -> dict:
    try:
        saved = torch.load(path, map_location=device, weights_only=True)
        tables = {name: saved[name] for name in SPLITS}
    except (OSError, RuntimeError, KeyError, TypeError, ValueError) as e:
        raise UserError(f"{path}: the reference log-probabilities cannot be read ({e})") from None
    for name, rows in splits.items():
        if tuple(tables[name].shape) != (pair_count(rows), 2):
            raise UserError(
                f"{path}: holds {tables[name].shape[0]} {name} pairs, the data "
                f"{pair_count(rows)}: the data changed since the run started"
            )
    return tables


def make_reference(
    cfg: Config, model: nn.Module, splits: dict[str, np.ndarray], run_dir: Path, ctx: DistContext,
    fresh: bool, frozen: nn.Module | None = None,
) -> Reference:  # fmt: skip
    """The run's reference. `fresh`: the run starts at step 0 (a precomputed reference is
    computed now from the starting weights and saved); else it is read back from the run folder.
    `frozen`: the engine's frozen copy of the starting model (reference: copy)."""
    way = cfg.train.dpo.resolved(cfg.model.lora.rank > 0)
    if way == "adapters_off":
        return AdaptersOff(ctx.device)
    if way == "copy":
        assert frozen is not None, "reference: copy, and the engine built no copy"
        return Copy(frozen, ctx.device)
    path = run_dir / FILE
    if not fresh:
        if not path.is_file():
            raise UserError(
                f"{path} is missing: a resumed DPO run reads the reference log-probabilities its "
                "first step computed; start the run again"
            )
        return Precomputed(_load(path, splits, ctx.device))
    was = model.training
    model.eval()
    tables = first_pass(model, splits, cfg.train.micro_batch_size, ctx)
    model.train(was)
    if ctx.is_main:
        torch.save({name: t.cpu() for name, t in tables.items()}, path)
    return Precomputed(tables)

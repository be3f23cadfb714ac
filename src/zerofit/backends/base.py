"""The runtime interface every engine implements (its torch side; `engine.Engine` is the rest)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager
from pathlib import Path
from typing import ClassVar

import torch
from torch import nn

from zerofit.checkpoint.neutral import READ_ERRORS, ReaderFactory, checkpoint_error, open_reader
from zerofit.config import Config
from zerofit.distributed.mesh import DistContext
from zerofit.distributed.parallelize import materialize_
from zerofit.faults.nonfinite import StepResult
from zerofit.models import ModelSpec

# Called once per step between backward and the update: True when the update may be applied.
Gate = Callable[[torch.Tensor], bool]

DTYPE = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def materialize_from_spec(
    module: nn.Module, device: torch.device, spec: ModelSpec, init_seed: int
) -> None:
    """Allocate `module`'s meta parameters on `device` and fill them as `spec` says (weights from
    disk, else the name-seeded init): what every engine does once its model is wrapped."""
    materialize_(
        module, device, init_seed=init_seed, init_param_=spec.init_param_, weights=spec.weights
    )


class Backend(ABC):
    """Owns the wrapped model and its optimizer. The trainer only calls what is declared here.

    One step is: for each micro-batch, `with backend.micro_step(is_last)`: forward through
    `backend.model`, then `backend.backward(loss)`; then `backend.step(lr, loss, gate)`.
    """

    name: ClassVar[str]
    # How `save` writes its files; a reader for it is registered in zerofit.checkpoint.neutral.
    checkpoint_format: ClassVar[str] = "dcp"
    model: nn.Module
    optimizer: torch.optim.Optimizer

    def __init__(
        self, ctx: DistContext, cfg: Config, readers: Mapping[str, ReaderFactory] | None = None
    ) -> None:
        self.ctx = ctx
        self.readers = dict(readers or {})  # other engines' checkpoint formats, by format
        self.cfg = cfg  # precision-resolved
        self.parallel = cfg.parallel
        self.precision = cfg.precision
        self.optim_cfg = cfg.optim

    @abstractmethod
    def setup(self, spec: ModelSpec, init_seed: int) -> None:
        """Wrap/shard `spec.module` (parameters on meta), materialize it on this rank, build AdamW."""

    @abstractmethod
    def wrap_frozen(self, spec: ModelSpec, init_seed: int) -> nn.Module:
        """A frozen copy of the model the run starts from, for DPO's reference: `spec.module` a
        fresh, unwrapped module (parameters on meta: a copy taken before `setup`), filled as
        `setup` fills the policy (the name-seeded init or the weights on disk, never a checkpoint)
        and sharded the way the policy is, stored in the compute dtype, without gradients or an
        optimizer. Called after `setup`; it runs forward only, under no_grad, inside
        `micro_step`."""

    @abstractmethod
    def micro_step(self, is_last: bool) -> AbstractContextManager[None]:
        """Context around one micro-batch's forward+backward; gradients sync only when is_last."""

    @abstractmethod
    def backward(self, loss: torch.Tensor) -> None: ...

    @abstractmethod
    def step(self, lr: float, loss: torch.Tensor, gate: Gate) -> StepResult:
        """Unscale, clip, optimizer step at `lr`, zero grads. Before updating, call
        ``gate(evidence)`` once with the step's loss (and the global gradient norm where known
        before the update) on the device: when it returns False the update must not be applied.
        Returns the pre-clip global grad norm and whether the update was applied."""

    @abstractmethod
    def save(self, path: Path) -> None:
        """Write model + optimizer state (sharded, collective) under `path`, in tensors only."""

    @abstractmethod
    def restore(self, path: Path, saved: dict) -> None:
        """Load model + optimizer state (collective) from `path`, written by any engine at any world
        size; `saved` is the checkpoint's meta.json (its `format` and `layout`)."""

    def check_restorable(self, path: Path, saved: dict) -> None:
        """Open (safely) everything `restore` will read on this rank, without collectives, so an
        unreadable file stops every rank before any of them enters `restore`'s collectives."""
        try:
            open_reader(path, saved["format"], self.readers).read_metadata()
        except READ_ERRORS as e:
            raise checkpoint_error(path.parent, e) from None

    def layout(self) -> dict:
        """What this engine's own files depend on: a checkpoint with the same layout (and format)
        can be loaded natively, others go through the engine-neutral view."""
        return {"world_size": self.ctx.world_size}

    @abstractmethod
    def reduce_dtype_in_use(self) -> torch.dtype:
        """The dtype gradients are actually reduced in, read from the engine after wrapping."""

    def master_tensors(self) -> Iterator[torch.Tensor]:
        """The tensors the optimizer updates (this rank's master weights)."""
        for group in self.optimizer.param_groups:
            yield from group["params"]

    def extra_state(self) -> dict:
        """Small per-rank state (e.g. the loss scaler) saved beside the checkpoint."""
        return {}

    def load_extra_state(self, state: dict) -> None:  # noqa: B027 - optional hook
        pass

    def local_param_numel(self) -> Iterator[tuple[str, int, int]]:
        """(name, local elements on this rank, global elements) for every parameter."""
        for name, p in self.model.named_parameters():
            local = p.to_local() if hasattr(p, "to_local") else p
            yield name, local.numel(), p.numel()

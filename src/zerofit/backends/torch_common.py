"""What the PyTorch-native engines (DDP, FSDP2) share: AdamW, loss scaling, clipping, DCP checkpoints."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from zerofit.backends.base import DTYPE, Backend, Gate
from zerofit.checkpoint.neutral import READ_ERRORS, checkpoint_error, index_file, open_reader
from zerofit.config.schema import OptimConfig
from zerofit.faults.nonfinite import StepResult
from zerofit.models import nf4


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Weight decay on matrices only (not on norms or biases). Every engine uses these groups."""
    decay, no_decay = [], []
    for p in model.parameters():
        if p.requires_grad:
            ndim = len(
                getattr(p, "ds_shape", p.shape)
            )  # a ZeRO-3 partitioned param's data is empty
            (decay if ndim >= 2 else no_decay).append(p)
    return [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]


def adamw_for_probe(fused: bool) -> Callable[[int, torch.device], tuple[Callable[[], float], int]]:
    """torch's AdamW on the CPU as FSDP2's CPU offload steps it (fused or foreach), for the host
    probe (`planner.optimizer_probe`): from a parameter count, (a step that returns its seconds,
    the parameters it steps), over four fp32 tensors with gradients. The step is the host's
    part of `TorchBackend.step` whole: the gradients' norm and clipping (`clip_grad_norm_`,
    which multiplies every gradient by its clamped coefficient, 1.0 when none clips, so that
    the same passes run at no limit), then AdamW. Timed alone, AdamW read 106-156 GB/s on H100
    machines, and a held-out FSDP2 offload run came out -37.9% (2026-12-07); the clipping's
    passes over the gradients are as long on the host as the update's."""

    def make(numel: int, device: torch.device) -> tuple[Callable[[], float], int]:
        params = [torch.zeros(numel // 4, requires_grad=True) for _ in range(4)]
        for param in params:
            param.grad = torch.full_like(param, 1e-3)
        optimizer = torch.optim.AdamW(params, lr=1e-4, fused=fused, foreach=not fused)

        def step() -> float:
            start = time.perf_counter()
            torch.nn.utils.clip_grad_norm_(params, math.inf, foreach=True)
            optimizer.step()
            return time.perf_counter() - start

        return step, 4 * (numel // 4)

    return make


def cast_frozen_(model: nn.Module, dtype: torch.dtype) -> None:
    """Store every frozen parameter (``requires_grad`` False: a LoRA base) in ``dtype``, the
    compute dtype: nothing updates it, so it needs no master copy. In place (ties kept). A QLoRA
    base's NF4 pieces go back to their storage words instead (``nf4.STORAGE``: on meta, where the
    engines call this, a dtype change only), whatever an earlier ``.to`` made of them."""
    for name, p in model.named_parameters():
        want = nf4.STORAGE if nf4.piece_of(name) is not None else dtype
        if not p.requires_grad and p.dtype != want:
            p.data = p.data.to(want)


def frozen_(module: nn.Module, dtype: torch.dtype, linears_only: bool = False) -> nn.Module:
    """``module`` frozen for DPO's reference copy (``Backend.wrap_frozen``): no parameter takes a
    gradient, and each is stored in ``dtype``, the dtype it is computed in; ``linears_only``
    (autocast): only the Linear layers' weights, which autocast casts to ``dtype`` anyway, the
    rest (embeddings, norms: autocast leaves them as they are) kept as they are. In place, on
    meta: a dtype change only."""
    module.requires_grad_(False)
    if not linears_only:
        return module.to(dtype)
    embedded = {id(m.weight) for m in module.modules() if isinstance(m, nn.Embedding)}
    for m in module.modules():
        if isinstance(m, nn.Linear) and id(m.weight) not in embedded:  # a tied head: a lookup too
            m.weight.data = m.weight.data.to(dtype)
    return module


def trainable(model: nn.Module) -> list[nn.Parameter]:
    return [p for p in model.parameters() if p.requires_grad]


def build_adamw(
    model: nn.Module, cfg: OptimConfig, device: torch.device, offloaded: bool = False
) -> torch.optim.AdamW:
    """AdamW over `model`'s parameter groups. Unless `optim.fused` says otherwise, fused on a GPU
    and for states offloaded to host RAM (torch's fused CPU kernel makes one vectorised pass:
    5.3x the foreach update on 50M fp32 parameters on a 2-core CPU, 2026-12-03), else foreach."""
    groups = param_groups(model, cfg.weight_decay)
    fused = cfg.fused if cfg.fused is not None else device.type == "cuda" or offloaded
    impl = {"fused": True} if fused else {"foreach": True}
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=tuple(cfg.betas), eps=cfg.eps, **impl)


class TorchBackend(Backend):
    """Step, clipping, scaler and DCP checkpointing shared by DDP and FSDP2."""

    scaler: torch.amp.GradScaler | None = None

    def make_scaler(self) -> torch.amp.GradScaler | None:
        if self.precision.param_dtype != "fp16":
            return None
        return torch.amp.GradScaler(self.ctx.device.type)

    def backward(self, loss: torch.Tensor) -> None:
        (self.scaler.scale(loss) if self.scaler else loss).backward()

    def step(self, lr: float, loss: torch.Tensor, gate: Gate) -> StepResult:
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        if self.scaler:
            self.scaler.unscale_(self.optimizer)
        max_norm = self.optim_cfg.grad_clip if self.optim_cfg.grad_clip is not None else math.inf
        norm = torch.nn.utils.clip_grad_norm_(
            [p for p in self.model.parameters() if p.grad is not None], max_norm, foreach=True
        )
        if hasattr(norm, "full_tensor"):
            norm = norm.full_tensor()
        if self.scaler:  # the loss decides; overflowing scaled gradients are the scaler's business
            result = self._scaled_step(norm, gate(loss.detach().float().reshape(1)))
        else:
            # FSDP cpu_offload computes the norm on the host: one device for the one-sync gate
            ok = gate(torch.stack([loss.detach().float(), norm.detach().float().to(loss.device)]))
            if ok:
                self.optimizer.step()
            result = StepResult(norm, applied=ok)
        self.optimizer.zero_grad(set_to_none=True)
        return result

    def _scaled_step(self, norm: torch.Tensor, ok: bool) -> StepResult:
        assert self.scaler is not None
        if not ok:
            self.scaler.update()  # after unscale_: resets the scaler's per-step record
            return StepResult(norm, applied=False)
        before = self.scaler.get_scale()
        self.scaler.step(self.optimizer)
        self.scaler.update()
        skipped = self.scaler.get_scale() < before  # the scale only drops on an overflow
        return StepResult(norm, applied=not skipped, scale_skip=skipped)

    def _tensor_state(self) -> tuple[dict, dict, list]:
        """The neutral-keyed tensors (``model.*``, one key per tied tensor; ``optim.state.*``),
        the full model state dict (same tensors) and the optimizer's param groups: only tensors
        are saved, hyper-parameters come from the config."""
        model_sd, optim_sd = get_state_dict(self.model, self.optimizer)
        seen: set[int] = set()
        unique = {}
        for k, v in model_sd.items():
            if id(v) not in seen:
                seen.add(id(v))
                unique[k] = v
        state = {"model": unique, "optim": {"state": optim_sd["state"]}}
        return state, model_sd, optim_sd["param_groups"]

    def save(self, path: Path) -> None:
        state, _, _ = self._tensor_state()
        dcp.save(state, checkpoint_id=str(path))

    def restore(self, path: Path, saved: dict) -> None:
        """DCP reshards across world sizes and between DDP and FSDP2 itself; other engines'
        files come through their registered reader under the same keys."""
        state, model_sd, groups = self._tensor_state()
        reader = open_reader(path, saved["format"], self.readers)
        try:
            reader.read_metadata()  # refused here, in one line, before DCP logs its fallbacks
            dcp.load(state, storage_reader=reader)
        except READ_ERRORS as e:
            raise checkpoint_error(path.parent, e, index_file(reader)) from None
        set_state_dict(
            self.model,
            self.optimizer,
            model_state_dict=model_sd,  # loaded in place: aliases of tied tensors included
            optim_state_dict={"state": state["optim"]["state"], "param_groups": groups},
        )

    def extra_state(self) -> dict:
        return {"scaler": self.scaler.state_dict()} if self.scaler else {}

    def load_extra_state(self, state: dict) -> None:
        if self.scaler and "scaler" in state:
            self.scaler.load_state_dict(state["scaler"])

    @property
    def master_dtype(self) -> torch.dtype:
        return DTYPE[self.precision.master_dtype]

    @property
    def param_dtype(self) -> torch.dtype:
        return DTYPE[self.precision.param_dtype]

    @property
    def reduce_dtype(self) -> torch.dtype:
        return DTYPE[self.precision.reduce_dtype]

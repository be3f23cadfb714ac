"""DeepSpeed ZeRO stages 0-3 with CPU/NVMe offload, configured from the same zerofit config.

The DeepSpeed JSON comes from `ds_json` (one table of field <-> JSON path). At stage 3 the
model is built inside `deepspeed.zero.Init`, so each module's parameters are partitioned as soon as
the module exists; each rank then fills only its own partition with the same name-seeded init the
other engines use. No rank ever holds the full model.
"""

from __future__ import annotations

import contextlib
import os
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

from zerofit.backends.base import DTYPE, Backend, Gate, materialize_from_spec
from zerofit.backends.deepspeed import nvme_runtime as nvme
from zerofit.backends.deepspeed.checkpoint import load_ds_file
from zerofit.backends.deepspeed.ds_json import to_ds_json
from zerofit.backends.deepspeed.lazy_muon import import_muon_lazily
from zerofit.backends.torch_common import frozen_, param_groups
from zerofit.checkpoint.neutral import (
    MODEL,
    MOMENTS,
    OPTIM,
    READ_ERRORS,
    NeutralView,
    checkpoint_error,
    open_reader,
)
from zerofit.checkpoint.safe_load import reason
from zerofit.distributed.parallelize import (
    apply_ac,
    apply_compile,
    apply_compile_forward,
    full_param,
    get_blocks,
)
from zerofit.errors import DamagedFile, UserError
from zerofit.faults.nonfinite import StepResult
from zerofit.faults.stale_locks import clear_and_report
from zerofit.models import ModelSpec
from zerofit.models.llama import strip_wrapper_names
from zerofit.report import quiet


def _deepspeed():  # noqa: ANN202 - the module, imported late: it is an optional extra
    try:
        import deepspeed  # optional: deepspeed (the deepspeed extra)
    except ImportError:
        raise UserError(
            "parallel.backend=deepspeed needs DeepSpeed: pip install 'zerofit[deepspeed]'"
        ) from None
    import_muon_lazily()  # before any ZeRO optimizer imports it, compiling at import
    return deepspeed


class DeepSpeedBackend(Backend):
    name = "deepspeed"
    checkpoint_format = "deepspeed"

    def setup(self, spec: ModelSpec, init_seed: int) -> None:
        deepspeed = _deepspeed()
        with quiet.deepspeed_setup():
            self._initialize(deepspeed, spec, init_seed)
        if self.ctx.rank == 0:  # DeepSpeed's one line of the run (its own per-rank ones dropped)
            accelerator = deepspeed.accelerator.get_accelerator().device_name()
            print(
                f"deepspeed {deepspeed.__version__}: ZeRO-{self.parallel.deepspeed.stage} on "
                f"its {accelerator} accelerator",
                flush=True,
            )

    def _initialize(self, deepspeed: Any, spec: ModelSpec, init_seed: int) -> None:
        self.ds_json = to_ds_json(self.cfg, self.ctx.world_size)
        # DeepSpeed calls torch.distributed functions that torch has deprecated, from inside;
        # users can do nothing about it, and the warning repeats on every step.
        warnings.filterwarnings(
            "ignore",
            message=r".*is deprecated\. Please use `torch\.distributed",
            category=FutureWarning,
        )
        os.environ.setdefault("LOCAL_RANK", str(self.ctx.local_rank))  # zero.Init reads it
        clear_and_report(self.ctx.rank)  # DeepSpeed JIT-builds ops: a killed build's lock hangs
        # Adopts the process group zerofit already initialised (NCCL on GPUs, gloo on CPU).
        deepspeed.init_distributed(
            dist_backend="nccl" if self.ctx.device.type == "cuda" else "gloo"
        )
        stage = self.parallel.deepspeed.stage
        if stage == 3 and self.parallel.deepspeed.offload_param == "nvme":
            nvme.dedupe_swap_ins()
        if stage == 3:
            with deepspeed.zero.Init(config_dict_or_path=self.ds_json):
                module = spec.construct()
            _init_params_(module, self.ctx.rank, init_seed, spec, masters=False)
        else:
            module = spec.module
            materialize_from_spec(module, self.ctx.device, spec, init_seed)
        blocks = get_blocks(module, spec.blocks_path)
        if stage == 3 and self.parallel.deepspeed.leaf_blocks:
            from deepspeed.utils import set_z3_leaf_modules  # optional: deepspeed

            set_z3_leaf_modules(module, [type(blocks[0])])
        apply_ac(
            blocks,
            self.parallel.activation_checkpointing,
            self.parallel.ac_every,
            self.parallel.ac_blocks,
        )
        if self.parallel.compile and stage < 3:
            apply_compile(blocks)
        elif self.parallel.compile:  # ZeRO-3 gathers in module hooks: compile inside them
            apply_compile_forward(blocks)
        engine, optimizer, _, _ = deepspeed.initialize(
            model=module,
            model_parameters=param_groups(module, self.optim_cfg.weight_decay),
            config=self.ds_json,
        )
        if self.precision.param_dtype != "fp32" and self.precision.master_dtype == "fp32":
            with nvme.swapped_masters(optimizer) as set_master:  # NVMe: a sub-group read once
                _init_params_(engine.module, self.ctx.rank, init_seed, spec, True, set_master)
        self.model, self.optimizer = engine, optimizer
        self._last = True

    def wrap_frozen(self, spec: ModelSpec, init_seed: int) -> nn.Module:
        """ZeRO-3: partitioned like the policy, built inside ``zero.Init`` and filled partition by
        partition, then handed to a second DeepSpeed engine without an optimizer (DeepSpeed's
        ZeRO-Inference: it gathers each module's parameters around its forward, with the
        policy's parameter offload). Stages 0-2 shard no parameters: the copy is replicated, in
        the compute dtype DeepSpeed holds the policy's module in."""
        stage, compiled = self.parallel.deepspeed.stage, self.parallel.compile
        if stage < 3:
            module = frozen_(spec.module, DTYPE[self.precision.param_dtype])
            if compiled:
                apply_compile(get_blocks(module, spec.blocks_path))
            materialize_from_spec(module, self.ctx.device, spec, init_seed)
            return module.eval()
        deepspeed, ds_json = _deepspeed(), frozen_json(self.ds_json)
        with quiet.deepspeed_setup():
            with deepspeed.zero.Init(config_dict_or_path=ds_json):
                module = spec.construct()
            module.requires_grad_(False)
            _init_params_(module, self.ctx.rank, init_seed, spec, masters=False)
            blocks = get_blocks(module, spec.blocks_path)
            if self.parallel.deepspeed.leaf_blocks:
                from deepspeed.utils import set_z3_leaf_modules  # optional: deepspeed

                set_z3_leaf_modules(module, [type(blocks[0])])
            if compiled:
                apply_compile_forward(blocks)
            engine, *_ = deepspeed.initialize(model=module, config=ds_json)
        engine.eval()  # DeepSpeed's returns None
        return engine

    @contextlib.contextmanager
    def micro_step(self, is_last: bool) -> Iterator[None]:
        self._last = is_last
        yield

    def backward(self, loss: torch.Tensor) -> None:
        self.model.backward(loss, scale_wrt_gas=False)  # the trainer already divides by accum steps
        if not self._last:
            self.model.step()  # DeepSpeed counts micro-steps; it only updates on the boundary

    def step(self, lr: float, loss: torch.Tensor, gate: Gate) -> StepResult:
        """DeepSpeed clips and checks the gradients inside its own step, skipping an update whose
        gradients are not finite (an "overflow"); the gate sees the loss before it."""
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        loss_ok = gate(loss.detach().float().reshape(1))
        self.model.step()
        applied = self.model.was_step_applied()
        norm = self.model.get_global_grad_norm()
        norm_t = torch.tensor(float(norm) if norm is not None else float("nan"))
        if applied or not loss_ok:  # a non-finite loss is never a loss-scale matter
            return StepResult(norm_t, applied=applied and loss_ok)
        if self.precision.param_dtype == "fp16":  # a finite loss: the loss scale overflowed
            return StepResult(norm_t, applied=False, scale_skip=True)
        return StepResult(
            norm_t,
            applied=False,
            detail="the gradients are not finite (DeepSpeed skipped the update as an overflow)",
        )

    def save(self, path: Path) -> None:
        self.model.save_checkpoint(str(path.parent), tag=path.name, save_latest=False)

    def layout(self) -> dict:
        ds = self.parallel.deepspeed
        return {
            "world_size": self.ctx.world_size,
            "stage": ds.stage,
            "offload_optimizer": ds.offload_optimizer,
            "offload_param": ds.offload_param,
            "master_dtype": self.precision.master_dtype,
        }

    def _native(self, saved: dict) -> bool:
        return saved["format"] == self.checkpoint_format and saved.get("layout") == self.layout()

    def check_restorable(self, path: Path, saved: dict) -> None:
        if not self._native(saved):
            return super().check_restorable(path, saved)
        try:
            for file in sorted(path.glob("*.pt")):  # what DeepSpeed's loader may open
                load_ds_file(file)
        except UserError as e:  # the file named relative to its checkpoint
            raise checkpoint_error(path.parent, e) from None

    def restore(self, path: Path, saved: dict) -> None:
        """DeepSpeed's own loader for its own layout (every file it opens read weights-only);
        anything else through the neutral view, one full tensor at a time."""
        opened: list[Path] = []  # by DeepSpeed's loader: a failure is the last one's
        try:
            if self._native(saved):
                self._load_native(path, opened)
            else:
                self._load_neutral(
                    NeutralView(open_reader(path, saved["format"], self.readers), path.parent)
                )
        except READ_ERRORS as e:  # one line, naming the file
            if opened and not isinstance(e, UserError):
                e = DamagedFile(opened[-1], f"DeepSpeed could not load it: {reason(e)}")
            raise checkpoint_error(path.parent, e) from None

    def _load_native(self, path: Path, opened: list[Path]) -> None:
        engine = self.model

        def load(file: str, map_location: Any = None) -> Any:
            opened.append(Path(file))
            return load_ds_file(file, map_location, mmap=False)

        engine.checkpoint_engine.load = load
        loaded, _ = engine.load_checkpoint(
            str(path.parent), tag=path.name, load_lr_scheduler_states=False
        )
        if loaded is None:
            raise UserError(f"DeepSpeed could not load the checkpoint in {path}")
        if self.parallel.deepspeed.offload_optimizer == "nvme":  # what DeepSpeed's load skips
            nvme.restore_unswapped_(self.optimizer, path, self.ctx.rank, load)

    def _load_neutral(self, view: NeutralView) -> None:
        from deepspeed.utils import safe_set_full_optimizer_state  # optional: deepspeed

        module, step = self.model.module, None
        _materialize_optimizer_state_(self.optimizer)
        for name, p in module.named_parameters():
            key = strip_wrapper_names(name)
            full = view.read(MODEL + key, torch.float32)
            _set_full_param_(p, full, self.ctx.rank, masters=p.requires_grad)
            if not p.requires_grad:  # frozen (a LoRA base): no master, no optimizer state
                continue
            for m in MOMENTS:
                safe_set_full_optimizer_state(p, view.read(f"{OPTIM}{key}.{m}", torch.float32), m)
            if step is None:
                step = float(view.read(f"{OPTIM}{key}.step"))
        _set_optimizer_step_(self.optimizer, step or 0.0)

    def master_tensors(self) -> Iterator[torch.Tensor]:
        """ZeRO keeps its own flat master partitions (stage 3 / stages 1-2 / bf16 optimizer)."""
        for attr in (
            "fp32_partitioned_groups_flat",
            "single_partition_of_fp32_groups",
            "fp32_groups_flat_partition",
        ):
            yield from getattr(self.optimizer, attr, None) or []
        yield from super().master_tensors()

    def reduce_dtype_in_use(self) -> torch.dtype:
        return self.model.communication_data_type

    def local_param_numel(self) -> Iterator[tuple[str, int, int]]:
        for name, p in self.model.module.named_parameters():
            if hasattr(p, "ds_tensor"):  # ZeRO-3: the partition this rank owns
                yield name, p.ds_tensor.ds_numel, p.ds_numel
            else:
                yield name, p.numel(), p.numel()


def frozen_json(ds_json: dict[str, Any]) -> dict[str, Any]:
    """The policy's DeepSpeed JSON for a model without an optimizer: no optimizer, scheduler or
    optimizer offload; the rest (ZeRO-3, dtype, parameter offload) as the policy's, but NVMe
    swap files in a folder of their own (DeepSpeed empties its swap folder when it starts)."""
    out = {k: v for k, v in ds_json.items() if k not in ("optimizer", "scheduler")}
    out.pop("zero_force_ds_cpu_optimizer", None)
    zero = dict(out.get("zero_optimization", {}))
    zero.pop("offload_optimizer", None)
    param = dict(zero.get("offload_param") or {})
    if param.get("nvme_path"):
        param["nvme_path"] = os.path.join(param["nvme_path"], "dpo_reference")
        zero["offload_param"] = param
    out["zero_optimization"] = zero
    return out


@torch.no_grad()
def _set_full_param_(
    p: nn.Parameter, full: torch.Tensor, rank: int, masters: bool = True, set_master: Any = None
) -> None:
    """Set one parameter everywhere DeepSpeed keeps it, from its full tensor: the module's copy
    (this rank's ZeRO-3 partition, or the whole tensor) and, once the optimizer exists
    (``masters``), its fp32 master (through ``set_master(p, full, rank)`` when given)."""
    from deepspeed.runtime.zero.partition_parameters import ZeroParamStatus  # optional: deepspeed
    from deepspeed.utils import safe_set_full_fp32_param  # optional: deepspeed

    if hasattr(p, "ds_tensor"):
        size = p.ds_tensor.ds_numel
        local = full.flatten()[rank * size : (rank + 1) * size]
        with nvme.on_disk_partition(p):  # offload_param: nvme keeps it on the disk
            p.ds_tensor.data.zero_()
            p.ds_tensor.data[: local.numel()].copy_(local)
        if p.ds_status == ZeroParamStatus.AVAILABLE:  # persistent (small) params are kept whole
            p.data.copy_(full)
    else:
        p.data.copy_(full)
    if masters and set_master is not None:
        set_master(p, full, rank)
    elif masters:
        safe_set_full_fp32_param(p, full)


@torch.no_grad()
def _materialize_optimizer_state_(optimizer: object) -> None:
    """Create the base optimizer's (lazily built) AdamW state so it can be overwritten: one step
    at lr 0 on zero gradients, which moves no weight (as torch's own get_state_dict does)."""
    base = getattr(optimizer, "optimizer", optimizer)
    attach = getattr(optimizer, "_set_fp32_optimizer_param_groups", None)  # ZeRO-3 attaches its
    if attach is not None:  # fp32 partitions to the base optimizer only around its step
        attach()
    params = [p for g in base.param_groups for p in g["params"]]
    if not all(p in base.state and "exp_avg" in base.state[p] for p in params):
        lrs = [g["lr"] for g in base.param_groups]
        for g in base.param_groups:
            g["lr"] = 0.0
        grads = [p.grad for p in params]
        for p in params:
            p.grad = torch.zeros_like(p)
        base.step()
        for p, grad in zip(params, grads, strict=True):
            p.grad = grad
        for g, lr in zip(base.param_groups, lrs, strict=True):
            g["lr"] = lr
    if attach is not None:
        optimizer._clear_fp32_optimizer_param_groups()
    link = getattr(optimizer, "_lazy_init_hp_params_optimizer_state", None)  # ZeRO-1/2, bf16:
    if link is not None:  # point each parameter's fragment map at the new state
        link()


def _set_optimizer_step_(optimizer: object, step: float) -> None:
    """AdamW's step count, wherever the base optimizer keeps it (per state, or per group)."""
    base = getattr(optimizer, "optimizer", optimizer)
    for state in base.state.values():
        if "step" in state:
            old = state["step"]
            state["step"] = (
                torch.full_like(old, step) if isinstance(old, torch.Tensor) else type(old)(step)
            )
    for group in base.param_groups:
        if "step" in group:
            group["step"] = int(step)


@torch.no_grad()
def _init_params_(
    module: nn.Module,
    rank: int,
    init_seed: int,
    spec: ModelSpec,
    masters: bool,
    set_master: Any = None,
) -> None:
    """Every parameter from its full, name-seeded init (or the model's weights), one at a time.

    Before ``deepspeed.initialize`` (``masters=False``) this fills each ZeRO-3 partition. After
    it, DeepSpeed has derived fp32 masters from the bf16/fp16 copy (the init rounded to 8 or 11
    bits); ``masters=True`` puts the exact fp32 init back, so every engine starts from the same
    master weights."""
    for name, p in module.named_parameters():
        if masters and not p.requires_grad:  # frozen (a LoRA base): it has no master copy
            continue
        shape = p.ds_shape if hasattr(p, "ds_shape") else p.shape
        device = p.ds_tensor.device if hasattr(p, "ds_tensor") else p.device
        full = full_param(
            name,
            shape,
            device,
            init_seed=init_seed,
            init_param_=spec.init_param_,
            weights=spec.weights,
        )
        _set_full_param_(p, full, rank, masters, set_master)


BACKEND = DeepSpeedBackend

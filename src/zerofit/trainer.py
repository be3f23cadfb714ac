"""The training loop. Engine-agnostic: everything engine-specific is behind `Backend`."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TypeVar

import torch

from zerofit import checkpoint as ckpt
from zerofit import precision_report
from zerofit.backends import Backend, get_backend
from zerofit.config import Config, check_world, resolve_precision
from zerofit.data import DataBundle, PackedLoader, build_data, eval_batches
from zerofit.dist import DistContext, init_distributed
from zerofit.errors import UserError
from zerofit.metrics import MetricsSink, StepTimer, Throughput, memory_stats, peak_flops
from zerofit.models import ModelSpec, build_model
from zerofit.models.llama import set_attention_backend
from zerofit.precision_report import watch_compute_dtype
from zerofit.progress import Progress
from zerofit.schedule import lr_at

T = TypeVar("T")


@dataclass
class RunInputs:
    """What a run is built from; also used by the launcher to check input before starting workers."""

    spec: ModelSpec
    data: DataBundle


def build_inputs(cfg: Config) -> RunInputs:
    spec = build_model(cfg.model.preset, cfg.model.hf, cfg.model.overrides, cfg.model.loss_chunk)
    if cfg.model.seq_len > spec.max_seq_len:
        raise UserError(
            f"model.seq_len={cfg.model.seq_len} is above the model's maximum {spec.max_seq_len}"
        )
    d = cfg.data
    data = build_data(
        d.source, d.tokenizer, d.field, cfg.model.seq_len, d.val_fraction, d.max_tokens, d.seed
    )
    if data.tokenizer.vocab_size > spec.vocab_size:
        raise UserError(
            f"tokenizer has {data.tokenizer.vocab_size} tokens but the model's vocabulary is {spec.vocab_size}"
        )
    return RunInputs(spec, data)


def make_loader(cfg: Config, data: DataBundle, dp_rank: int, dp_size: int) -> PackedLoader:
    t = cfg.train
    return PackedLoader(
        data.train,
        micro_batch_size=t.micro_batch_size,
        grad_accum_steps=t.grad_accum_steps,
        dp_rank=dp_rank,
        dp_size=dp_size,
        seed=cfg.data.seed,
    )


def checkpoint_meta(cfg: Config, spec: ModelSpec, world_size: int) -> dict[str, Any]:
    """What a checkpoint records about the run that wrote it (see zerofit.checkpoint.compat)."""
    t = cfg.train
    return {
        "backend": cfg.parallel.backend,
        "world_size": world_size,
        "model": spec.fingerprint,
        "optimizer": "adamw",
        "seq_len": cfg.model.seq_len,
        "master_dtype": cfg.precision.master_dtype,
        "micro_batch_size": t.micro_batch_size,
        "grad_accum_steps": t.grad_accum_steps,
        "global_batch": t.micro_batch_size * t.grad_accum_steps * world_size,
        "train_steps": t.steps,
        "data": {"source": cfg.data.source, "tokenizer": cfg.data.tokenizer},
    }


class Trainer:
    def __init__(self, cfg: Config, run_dir: Path, ctx: DistContext):
        cfg = replace(cfg, precision=resolve_precision(cfg.precision, ctx.device.type))
        self.cfg, self.run_dir, self.ctx = cfg, run_dir, ctx
        check_world(cfg, ctx.world_size)
        torch.manual_seed(cfg.train.seed + ctx.rank)
        set_attention_backend(cfg.model.attention)
        inputs = build_inputs(cfg)
        self.spec, self.data = inputs.spec, inputs.data
        self.loader = make_loader(cfg, self.data, ctx.dp_rank, ctx.dp_size)
        backend_cls = get_backend(cfg.parallel.backend)
        self.backend: Backend = backend_cls(ctx, cfg)
        self.backend.setup(self.spec, cfg.model.init_seed)
        self.ckpt_root = ckpt.checkpoint_root(cfg.checkpoint.dir, run_dir)
        self.meta = checkpoint_meta(cfg, self.spec, ctx.world_size)
        self.step = 0
        self.write_sharding_report()
        if ctx.is_main:
            (run_dir / "env.json").write_text(json.dumps(environment(ctx), indent=1))

    def write_sharding_report(self) -> None:
        """Per-rank local vs global parameter elements: proof that sharding took effect."""
        params = {name: [local, full] for name, local, full in self.backend.local_param_numel()}
        local = sum(v[0] for v in params.values())
        full = sum(v[1] for v in params.values())
        report = {
            "rank": self.ctx.rank,
            "world_size": self.ctx.world_size,
            "local_numel": local,
            "global_numel": full,
            "params": params,
        }
        out = self.run_dir / "sharding"
        out.mkdir(parents=True, exist_ok=True)
        (out / f"rank{self.ctx.rank}.json").write_text(json.dumps(report))

    def write_precision_report(self, compute: torch.dtype | None) -> None:
        rep = precision_report.report(self.backend, compute)
        if self.ctx.is_main:
            (self.run_dir / "precision.json").write_text(json.dumps(rep, indent=1))
            eff = rep["effective"]
            print(
                f"precision ({rep['backend']}): compute {eff['compute']}, master weights {eff['master_weights']}, "
                f"optimizer states {eff['optimizer_states']}, gradient reduction {eff['gradient_reduction']}",
                flush=True,
            )
            for line in rep["warnings"]:
                print(f"warning: {line}", flush=True)

    # ------------------------------------------------------------------ checkpoints
    def resume(self, path: Path) -> None:
        """Restore from a verified checkpoint of any engine and world size (checked by the
        launcher: zerofit.checkpoint.compat)."""
        saved = ckpt.read_meta(path)
        state, own = agreed(
            self.ctx, lambda: ckpt.load_rank_state(path, saved, self.ctx.rank, self.ctx.world_size)
        )
        agreed(self.ctx, lambda: self.backend.check_restorable(path / "model", saved))
        self.backend.restore(path / "model", saved)
        agreed(self.ctx, lambda: self._apply_rank_state(path, saved, state, own))
        self.step = saved["step"]

    def _apply_rank_state(self, path: Path, saved: dict, state: dict, own: bool) -> None:
        name = f"rank{self.ctx.rank if own else 0}.json"
        try:
            self.loader.load_state_dict(state["data"])  # a global position: the same everywhere
            if saved["backend"] == self.cfg.parallel.backend:
                self.backend.load_extra_state(state["backend"])  # e.g. the fp16 loss scale
            if own:
                ckpt.rank_state.set_rng_state(state["rng"])
        except (KeyError, TypeError, ValueError, IndexError, RuntimeError) as e:
            raise UserError(
                f"checkpoint {path}: {name} holds a malformed state ({e!r:.200})"
            ) from None
        if not own:  # another world size: fresh per-rank streams, a function of seed, rank, step
            torch.manual_seed(self.cfg.train.seed + self.ctx.rank + 1_000_003 * saved["step"])

    def save(self) -> Path:
        state = {
            "data": self.loader.state_dict(),
            "rng": ckpt.rank_state.rng_state(),
            "backend": self.backend.extra_state(),
        }
        meta = {
            **self.meta,
            "format": self.backend.checkpoint_format,
            "layout": self.backend.layout(),
        }
        return ckpt.save_checkpoint(
            self.backend, self.ckpt_root, self.step, state, meta, self.cfg.checkpoint.keep_last
        )

    # ------------------------------------------------------------------ steps
    def train_step(self) -> tuple[torch.Tensor, torch.Tensor]:
        accum = self.cfg.train.grad_accum_steps
        device = self.ctx.device
        total = torch.zeros((), device=device)
        for a in range(accum):
            inputs, targets = self.loader.next_microbatch()
            inputs = inputs.to(device, non_blocking=True)
            targets = targets.to(device, non_blocking=True)
            with self.backend.micro_step(is_last=a == accum - 1):
                loss = self.backend.model(inputs, targets) / accum
                self.backend.backward(loss)
            total += loss.detach()
        o = self.cfg.optim
        self.lr = lr_at(
            self.step,
            lr=o.lr,
            warmup_steps=o.warmup_steps,
            total_steps=self.cfg.train.steps,
            min_lr_ratio=o.min_lr_ratio,
        )
        grad_norm = self.backend.step(self.lr)
        self.step += 1
        return total, grad_norm

    @torch.no_grad()
    def evaluate(self) -> float:
        model = self.backend.model
        model.eval()
        batches = eval_batches(
            self.data.val,
            self.cfg.train.micro_batch_size,
            self.ctx.dp_rank,
            self.ctx.dp_size,
            self.cfg.train.eval_batches,
        )
        total = torch.zeros((), device=self.ctx.device)
        for inputs, targets in batches:
            with self.backend.micro_step(is_last=True):
                total += model(inputs.to(self.ctx.device), targets.to(self.ctx.device))
        model.train()
        return self.ctx.all_reduce_mean(total / len(batches)).item()

    def fit(self) -> dict[str, Any]:
        cfg, ctx = self.cfg, self.ctx
        t = cfg.train
        tokens_per_step = t.micro_batch_size * t.grad_accum_steps * ctx.dp_size * cfg.model.seq_len
        flops_per_token = self.spec.flops_per_token(cfg.model.seq_len)
        peak = peak_flops(ctx.device)
        meter = Throughput(tokens_per_step, flops_per_token, ctx.world_size, peak)
        timer = StepTimer(ctx.device)
        sink = MetricsSink(self.run_dir, cfg.log.jsonl, cfg.log.tensorboard, ctx.is_main)
        progress = Progress(t.steps, self.step, enabled=ctx.is_main and cfg.log.progress)
        loss_sum = torch.zeros((), device=ctx.device)
        window = 0
        summary: dict[str, Any] = {"run_dir": str(self.run_dir), "start_step": self.step}
        last_saved = self.step
        t_start = time.perf_counter()
        self.backend.model.train()
        read_compute_dtype = watch_compute_dtype(self.backend.model)
        timer.mark()
        with progress:
            while self.step < t.steps:
                loss, grad_norm = self.train_step()
                timer.mark()
                if read_compute_dtype is not None:
                    self.write_precision_report(read_compute_dtype())
                    read_compute_dtype = None
                if (
                    self.step == 3 and ctx.device.type == "cuda"
                ):  # steady state reached: stop recording
                    torch.cuda.memory._record_memory_history(enabled=None)
                loss_sum += loss
                window += 1
                meter.tick()
                record: dict[str, Any] | None = None
                if self.step % cfg.log.every == 0 or self.step == t.steps:
                    if ctx.device.type == "cuda":
                        torch.cuda.synchronize(ctx.device)
                    record = {
                        "step": self.step,
                        "loss": ctx.all_reduce_mean(loss_sum / window).item(),
                    }
                    record["grad_norm"] = float(grad_norm)
                    record["lr"] = self.lr  # of the step just taken
                    record.update(meter.read())
                    record.update(memory_stats(ctx.device))
                    loss_sum.zero_()
                    window = 0
                    meter.reset()
                if (
                    t.eval_every
                    and (self.step % t.eval_every == 0 or self.step == t.steps)
                    and len(self.data.val)
                ):
                    record = record or {"step": self.step}
                    record["eval_loss"] = self.evaluate()
                if record is not None:
                    sink.write(record)
                    progress.update(self.step, record)
                    summary.update(record)
                if cfg.checkpoint.every and self.step % cfg.checkpoint.every == 0:
                    self.save()
                    last_saved = self.step
                progress.advance(self.step)
        if cfg.checkpoint.save_final and (
            last_saved != self.step or not ckpt.latest_checkpoint(self.ckpt_root)
        ):
            self.save()
        # The last step's own loss (the logged ones are means over a window).
        if self.step > summary["start_step"]:
            summary["final_step_loss"] = ctx.all_reduce_mean(loss.detach()).item()
        summary["checkpoint"] = str(ckpt.latest_checkpoint(self.ckpt_root) or "-")
        summary["wall_time_s"] = time.perf_counter() - t_start
        summary["world_size"] = ctx.world_size
        summary["device"] = ctx.device.type
        summary["num_params"] = self.spec.num_params
        # What `zerofit bench` needs: per-step times (log/eval/save steps included) and the FLOPs.
        summary["step_times_s"] = timer.durations()
        summary["tokens_per_step"] = tokens_per_step
        summary["flops_per_token"] = flops_per_token
        summary["peak_flops"] = peak
        sink.close()
        if ctx.is_main:
            (self.run_dir / "summary.json").write_text(json.dumps(summary, indent=1))
        return summary


def agreed(ctx: DistContext, fn: Callable[[], T]) -> T:
    """Run ``fn`` on every rank; if it raised a UserError on any rank, raise it on all of them
    (so no rank goes on into a collective its peers will never join)."""
    error: str | None = None
    result = None
    try:
        result = fn()
    except UserError as e:
        error = str(e)
    failed = [(r, m) for r, m in enumerate(ctx.gather_object(error)) if m]
    if failed:
        rank, message = failed[0]
        raise UserError(message if len({m for _, m in failed}) == 1 else f"(rank {rank}) {message}")
    return result  # type: ignore[return-value]


def environment(ctx: DistContext) -> dict[str, Any]:
    """What `zerofit doctor` checks about the machine: versions, GPUs, NCCL/CUDA variables."""
    import os

    gpus = (
        [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        if ctx.device.type == "cuda"
        else []
    )
    keep = (
        "NCCL_",
        "CUDA_",
        "TORCH_NCCL",
        "TORCH_DISTRIBUTED",
        "OMP_NUM_THREADS",
        "PYTORCH_CUDA_ALLOC_CONF",
    )
    return {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "device": ctx.device.type,
        "world_size": ctx.world_size,
        "gpus": gpus,
        "env": {k: v for k, v in os.environ.items() if k.startswith(keep)},
    }


def run_training(cfg: Config, run_dir: Path, resume: Path | None) -> dict[str, Any]:
    ctx = init_distributed(cfg.parallel.replicate_degree)
    if ctx.device.type == "cuda":  # record allocations during start-up and the first steps
        torch.cuda.memory._record_memory_history(max_entries=200_000)
    try:
        trainer = Trainer(cfg, run_dir, ctx)
        if resume is not None:
            trainer.resume(resume)
        return trainer.fit()
    except torch.cuda.OutOfMemoryError:
        raise UserError(oom_report(cfg, run_dir, ctx)) from None


def oom_report(cfg: Config, run_dir: Path, ctx: DistContext) -> str:
    """Dump the CUDA memory snapshot and a diagnosis; returns the one-line message."""
    from zerofit.doctor import oom_advice

    snapshot = run_dir / f"oom_snapshot_rank{ctx.rank}.pickle"
    torch.cuda.memory._dump_snapshot(str(snapshot))
    torch.cuda.memory._record_memory_history(enabled=None)
    gpu_mem = torch.cuda.get_device_properties(ctx.device).total_memory
    advice = oom_advice(cfg, ctx.world_size, gpu_mem)
    (run_dir / f"oom_rank{ctx.rank}.txt").write_text(advice + "\n")
    return f"CUDA out of memory on rank {ctx.rank}: {advice}. Snapshot: {snapshot} (open it at pytorch.org/memory_viz)"

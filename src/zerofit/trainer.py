"""The training loop. Engine-agnostic: everything engine-specific is behind `Backend`."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TypeVar

import torch

from zerofit import checkpoint as ckpt
from zerofit import precision_report
from zerofit.backends import Backend, get_backend
from zerofit.config import Config, check_world, resolve_precision
from zerofit.data import eval_batches
from zerofit.dist import DistContext, init_distributed
from zerofit.errors import EXIT_IO, EXIT_NONFINITE, RunStopped, UserError
from zerofit.faults.nonfinite import NonFinitePolicy, StepResult
from zerofit.faults.signals import StopSignals, signal_name
from zerofit.faults.step_gate import StepGate, describe
from zerofit.inputs import build_inputs, checkpoint_meta, make_loader
from zerofit.metrics import MetricsSink, StepTimer, Throughput, memory_stats, peak_flops
from zerofit.models.llama import set_attention_backend
from zerofit.precision_report import watch_compute_dtype
from zerofit.progress import Progress
from zerofit.reports import environment, oom_report, write_sharding_report
from zerofit.schedule import lr_at

T = TypeVar("T")


@dataclass
class RunControl:
    """How a worker was started, beyond the config: its stop signals, the command that
    continues the run (quoted in stop lines), and which elastic restart this is."""

    signals: StopSignals = field(default_factory=StopSignals)
    resume_command: str = "zerofit train --resume"
    restart: int = 0


class Trainer:
    def __init__(
        self, cfg: Config, run_dir: Path, ctx: DistContext, control: RunControl | None = None
    ):
        cfg = replace(cfg, precision=resolve_precision(cfg.precision, ctx.device.type))
        self.cfg, self.run_dir, self.ctx = cfg, run_dir, ctx
        self.control = control or RunControl()
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
        self.gate = StepGate(self.control.signals, ctx.world_size)
        self.nonfinite = NonFinitePolicy(cfg.train.on_nonfinite, cfg.train.max_skipped_steps)
        self.step = 0
        self.last_saved = 0
        write_sharding_report(self.backend, run_dir, ctx)
        if ctx.is_main:
            (run_dir / "env.json").write_text(json.dumps(environment(ctx), indent=1))

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
        self.step = self.last_saved = saved["step"]

    def _apply_rank_state(self, path: Path, saved: dict, state: dict, own: bool) -> None:
        name = f"rank{self.ctx.rank if own else 0}.json"
        try:
            self.loader.load_state_dict(state["data"])  # a global position: the same everywhere
            self.nonfinite.load_state_dict(state.get("nonfinite", {}))
            if saved["backend"] == self.cfg.parallel.backend:
                self.backend.load_extra_state(state["backend"])  # e.g. the fp16 loss scale
            if own:
                ckpt.rank_state.set_rng_state(state["rng"])
        except (KeyError, TypeError, ValueError, IndexError, RuntimeError, AttributeError) as e:
            raise UserError(
                f"checkpoint {path}: {name} holds a malformed state ({e!r:.200})"
            ) from None
        if not own:  # another world size: fresh per-rank streams, a function of seed, rank, step
            torch.manual_seed(self.cfg.train.seed + self.ctx.rank + 1_000_003 * saved["step"])

    def save(self) -> Path:
        """A checkpoint of this step; never of non-finite weights, and a failed write ends the
        run with one line (the previous checkpoint stays intact)."""
        if not self._weights_finite():
            raise RunStopped(
                f"step {self.step}: the weights hold NaN or inf values; refusing to save them. "
                f"The last good checkpoint is {self.last_good()}",
                EXIT_NONFINITE,
                "nonfinite",
            )
        state = {
            "data": self.loader.state_dict(),
            "rng": ckpt.rank_state.rng_state(),
            "backend": self.backend.extra_state(),
            "nonfinite": self.nonfinite.state_dict(),
        }
        meta = {
            **self.meta,
            "format": self.backend.checkpoint_format,
            "layout": self.backend.layout(),
        }
        previous = ckpt.latest_checkpoint(self.ckpt_root)
        then = (
            f"The previous checkpoint ({previous}) is intact; make room, then continue with: "
            f"{self.control.resume_command}"
            if previous
            else "No earlier checkpoint exists; make room and run again"
        )
        try:
            path = ckpt.save_checkpoint(
                self.backend, self.ckpt_root, self.step, state, meta, self.cfg.checkpoint.keep_last
            )
        except ckpt.SaveFailed as e:
            raise RunStopped(
                f"could not save the checkpoint of step {self.step}: {e}. {then}",
                EXIT_IO,
                "io",
            ) from None
        self.last_saved = self.step
        return path

    def _weights_finite(self) -> bool:
        flags = []
        for t in self.backend.master_tensors():
            local = t.to_local() if hasattr(t, "to_local") else t
            if local.numel():
                flags.append(torch.isfinite(local).all())
        ok = bool(torch.stack(flags).all()) if flags else True
        return all(self.ctx.gather_object(ok))

    def next_move(self) -> str:
        """How to go on from the newest checkpoint, for lines that end the run."""
        found = ckpt.latest_checkpoint(self.ckpt_root)
        if found is None:
            return "no checkpoint was saved (set checkpoint.every to save as you go)"
        return f"the last good checkpoint is {found}; continue with: {self.control.resume_command}"

    def last_good(self) -> str:
        found = ckpt.latest_checkpoint(self.ckpt_root)
        return str(found) if found else "none (set checkpoint.every to save as you go)"

    # ------------------------------------------------------------------ steps
    def train_step(self) -> tuple[torch.Tensor, StepResult]:
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
        result = self.backend.step(self.lr, total, self.gate)
        self.step += 1
        what = result.detail or describe(self.gate.evidence)
        self.nonfinite.record(self.step, result, what, self.next_move())
        return total, result

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

    def stop_on_signal(self) -> None:
        """After the step every rank agreed to stop at: save it, then end with one line."""
        name = signal_name(self.gate.signum)
        code = 128 + self.gate.signum
        cmd = self.control.resume_command
        if self.step == self.last_saved:
            where = ckpt.latest_checkpoint(self.ckpt_root)
            held = f"checkpoint {where} holds it" if where else "nothing to save yet"
            line = f"stopped at step {self.step} by {name}; {held}; continue with: {cmd}"
            raise RunStopped(line, code, "signal")
        t0 = time.perf_counter()
        path = self.save()
        line = (
            f"stopped at step {self.step} by {name}; saved {path} in "
            f"{time.perf_counter() - t0:.1f} s; continue with: {cmd}"
        )
        raise RunStopped(line, code, "signal")

    def fit(self) -> dict[str, Any]:
        cfg, ctx = self.cfg, self.ctx
        t = cfg.train
        loop = _Loop(self)
        self.backend.model.train()
        read_compute_dtype = watch_compute_dtype(self.backend.model)
        with loop.progress:
            if self.gate.poll():  # asked to stop while starting up
                self.stop_on_signal()
            while self.step < t.steps:
                loss, result = self.train_step()
                loop.timer.mark()
                if read_compute_dtype is not None:
                    self.write_precision_report(read_compute_dtype())
                    read_compute_dtype = None
                if self.step == 3 and ctx.device.type == "cuda":  # steady state: stop recording
                    torch.cuda.memory._record_memory_history(enabled=None)
                loop.after_step(loss, result)
                if cfg.checkpoint.every and self.step % cfg.checkpoint.every == 0:
                    self.save()
                if self.gate.signum:
                    loop.sink.close()
                    self.stop_on_signal()
                loop.progress.advance(self.step)
        if cfg.checkpoint.save_final and (
            self.last_saved != self.step or not ckpt.latest_checkpoint(self.ckpt_root)
        ):
            self.save()
        return loop.finish(loss if self.step > loop.summary["start_step"] else None)


class _Loop:
    """The bookkeeping around the steps: metrics records, eval, progress and the summary."""

    def __init__(self, trainer: Trainer) -> None:
        self.tr = trainer
        cfg, ctx = trainer.cfg, trainer.ctx
        t = cfg.train
        self.tokens_per_step = (
            t.micro_batch_size * t.grad_accum_steps * ctx.dp_size * cfg.model.seq_len
        )
        self.flops_per_token = trainer.spec.flops_per_token(cfg.model.seq_len)
        self.peak = peak_flops(ctx.device)
        self.meter = Throughput(
            self.tokens_per_step, self.flops_per_token, ctx.world_size, self.peak
        )
        self.timer = StepTimer(ctx.device)
        self.sink = MetricsSink(trainer.run_dir, cfg.log.jsonl, cfg.log.tensorboard, ctx.is_main)
        self.progress = Progress(t.steps, trainer.step, enabled=ctx.is_main and cfg.log.progress)
        self.loss_sum = torch.zeros((), device=ctx.device)
        self.window = 0
        self.summary: dict[str, Any] = {"run_dir": str(trainer.run_dir), "start_step": trainer.step}
        self.t_start = time.perf_counter()
        self.timer.mark()

    def after_step(self, loss: torch.Tensor, result: StepResult) -> None:
        tr, cfg, ctx = self.tr, self.tr.cfg, self.tr.ctx
        step = tr.step
        if result.applied:  # a skipped step's non-finite loss stays out of the mean
            self.loss_sum += loss
            self.window += 1
        self.meter.tick()
        record: dict[str, Any] | None = None
        if step % cfg.log.every == 0 or step == cfg.train.steps or result.nonfinite:
            if ctx.device.type == "cuda":
                torch.cuda.synchronize(ctx.device)
            mean = self.loss_sum / max(self.window, 1) if self.window else loss
            record = {"step": step, "loss": ctx.all_reduce_mean(mean.clone()).item()}
            record["grad_norm"] = float(result.grad_norm)  # type: ignore[arg-type]
            record["lr"] = tr.lr  # of the step just taken
            if result.nonfinite:
                record["skipped"] = True
            record.update(self.meter.read())
            record.update(memory_stats(ctx.device))
            self.loss_sum.zero_()
            self.window = 0
            self.meter.reset()
        t = cfg.train
        if t.eval_every and (step % t.eval_every == 0 or step == t.steps) and len(tr.data.val):
            record = record or {"step": step}
            record["eval_loss"] = tr.evaluate()
        if record is not None:
            self.sink.write(record)
            self.progress.update(step, record)
            self.summary.update(record)

    def finish(self, last_loss: torch.Tensor | None) -> dict[str, Any]:
        tr, ctx = self.tr, self.tr.ctx
        summary = self.summary
        if last_loss is not None:  # the last step's own loss (the logged ones are window means)
            summary["final_step_loss"] = ctx.all_reduce_mean(last_loss.detach().clone()).item()
        summary["checkpoint"] = str(ckpt.latest_checkpoint(tr.ckpt_root) or "-")
        summary["wall_time_s"] = time.perf_counter() - self.t_start
        summary["world_size"] = ctx.world_size
        summary["device"] = ctx.device.type
        summary["num_params"] = tr.spec.num_params
        summary["nonfinite_skips"] = tr.nonfinite.skipped
        summary["loss_scale_skips"] = tr.nonfinite.scale_skips
        # What `zerofit bench` needs: per-step times (log/eval/save steps included) and the FLOPs.
        summary["step_times_s"] = self.timer.durations()
        summary["tokens_per_step"] = self.tokens_per_step
        summary["flops_per_token"] = self.flops_per_token
        summary["peak_flops"] = self.peak
        self.sink.close()
        if ctx.is_main:
            (tr.run_dir / "summary.json").write_text(json.dumps(summary, indent=1))
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


def run_training(
    cfg: Config, run_dir: Path, resume: Path | None, control: RunControl | None = None
) -> dict[str, Any]:
    control = control or RunControl()
    ctx = init_distributed(cfg.parallel.replicate_degree)
    if ctx.device.type == "cuda":  # record allocations during start-up and the first steps
        torch.cuda.memory._record_memory_history(max_entries=200_000)
    try:
        trainer = Trainer(cfg, run_dir, ctx, control)
        if control.restart:
            resume = restart_checkpoint(trainer, control.restart)
        if resume is not None:
            trainer.resume(resume)
        return trainer.fit()
    except torch.cuda.OutOfMemoryError:
        raise UserError(oom_report(cfg, run_dir, ctx)) from None


def restart_checkpoint(trainer: Trainer, restart: int) -> Path | None:
    """After an elastic restart: the newest checkpoint that verifies (rank 0 picks, every rank
    takes the same), or None to start over. Metrics of the lost steps move aside."""
    from zerofit.metrics import truncate_metrics

    ctx, limit = trainer.ctx, trainer.cfg.train.max_restarts
    found: Path | None = None
    if ctx.is_main:
        try:
            found, saved, notes = ckpt.select_checkpoint(trainer.ckpt_root)
            step = saved["step"]
        except UserError:
            found, notes, step = None, [], 0
        truncate_metrics(trainer.run_dir, step)
        where = (
            f"resuming from {found} (step {step})" if found else "no checkpoint yet: from step 0"
        )
        for line in [f"restart {restart} of {limit} after a failure: {where}", *notes]:
            print(f"note: {line}", flush=True)
    return ctx.broadcast_object(found)  # type: ignore[return-value]

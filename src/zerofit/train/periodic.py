"""What the training loop does besides stepping, one small part per cadence.

- `MetricsLog` (log.every): the window's mean loss, throughput and memory as a record, written to
  metrics.jsonl / TensorBoard and the progress display.
- `EvalEvery` (train.eval_every): the steps that evaluate.
- `SaveEvery` (checkpoint.every, checkpoint.save_final; each save applies checkpoint.keep_last).
- `StopChecks`: a stop signal agreed across ranks, and the non-finite policy (train.on_nonfinite).
- `FirstSteps`: the one-off reports early in a run.
- `RunSummary`: per-step times and summary.json.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from zerofit import checkpoint as ckpt
from zerofit.errors import RunStopped
from zerofit.faults.nonfinite import NonFinitePolicy, StepResult
from zerofit.faults.signals import StopSignals, signal_name
from zerofit.faults.step_gate import StepGate, describe
from zerofit.report.memory_history import MEMORY_HISTORY_STEPS
from zerofit.report.metrics import MetricsSink, StepTimer, Throughput, memory_stats, peak_flops
from zerofit.report.precision import watch_compute_dtype
from zerofit.report.progress import Progress

if TYPE_CHECKING:
    from zerofit.config import Config
    from zerofit.distributed.mesh import DistContext
    from zerofit.models import ModelSpec


class MetricsLog:
    """log.every: a record of the steps since the last one (at every log.every-th step, the last
    step and any skipped step), and where records go: metrics.jsonl / TensorBoard and the progress
    display on rank 0. A context manager around the loop (the progress bar)."""

    def __init__(
        self, cfg: Config, ctx: DistContext, spec: ModelSpec, run_dir: Path, start_step: int
    ) -> None:
        t = cfg.train
        self.ctx, self.every, self.last_step = ctx, cfg.log.every, t.steps
        tokens_per_step = t.micro_batch_size * t.grad_accum_steps * ctx.dp_size * cfg.model.seq_len
        self.rates = {  # what `zerofit bench` needs beside the step times
            "tokens_per_step": tokens_per_step,
            "flops_per_token": spec.flops_per_token(cfg.model.seq_len),
            "peak_flops": peak_flops(ctx.device),
        }
        self.meter = Throughput(
            tokens_per_step, self.rates["flops_per_token"], ctx.world_size, self.rates["peak_flops"]
        )
        self.sink = MetricsSink(run_dir, cfg.log.jsonl, cfg.log.tensorboard, ctx.is_main)
        self.progress = Progress(t.steps, start_step, enabled=ctx.is_main and cfg.log.progress)
        self.loss_sum = torch.zeros((), device=ctx.device)
        self.window = 0

    def after_step(
        self,
        step: int,
        loss: torch.Tensor,
        result: StepResult,
        lr: float,
        real_tokens: torch.Tensor | None = None,
        repeated: torch.Tensor | None = None,
    ) -> dict[str, Any] | None:
        """Count the step in the window; return the window's record when one is due.
        ``real_tokens``: the global batch's non-padding tokens (fine-tuning rows only);
        ``repeated``: its places counted once elsewhere (DPO: `Throughput.tick`)."""
        if result.applied:  # a skipped step's non-finite loss stays out of the mean
            self.loss_sum += loss
            self.window += 1
        self.meter.tick(real_tokens, repeated)
        if step % self.every == 0 or step == self.last_step or result.nonfinite:
            return self._record(step, loss, result, lr)
        return None

    def _record(
        self, step: int, loss: torch.Tensor, result: StepResult, lr: float
    ) -> dict[str, Any]:
        ctx = self.ctx
        if ctx.device.type == "cuda":
            torch.cuda.synchronize(ctx.device)
        mean = self.loss_sum / max(self.window, 1) if self.window else loss
        record: dict[str, Any] = {"step": step, "loss": ctx.all_reduce_mean(mean.clone()).item()}
        record["loss_steps"] = max(self.window, 1)  # how many steps `loss` is the mean of
        record["grad_norm"] = float(result.grad_norm)  # type: ignore[arg-type]
        record["lr"] = lr  # of the step just taken
        if result.nonfinite:
            record["skipped"] = True
        record.update(self.meter.read())
        record.update(memory_stats(ctx.device))
        self.loss_sum.zero_()
        self.window = 0
        self.meter.reset()
        return record

    def write(self, step: int, record: dict[str, Any]) -> None:
        self.sink.write(record)
        self.progress.update(step, record)

    def advance(self, step: int) -> None:
        self.progress.advance(step)

    def close(self) -> None:
        self.sink.close()

    def __enter__(self) -> MetricsLog:
        self.progress.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.__exit__(*exc)


class EvalEvery:
    """train.eval_every: evaluate every N steps and after the last, when there is held-out data."""

    def __init__(self, every: int, last_step: int, has_val: bool) -> None:
        self.every, self.last_step, self.has_val = every, last_step, has_val

    def due(self, step: int) -> bool:
        return bool(
            self.every and (step % self.every == 0 or step == self.last_step) and self.has_val
        )


class SaveEvery:
    """checkpoint.every and checkpoint.save_final (each save keeps checkpoint.keep_last)."""

    def __init__(self, every: int, save_final: bool) -> None:
        self.every, self.save_final = every, save_final

    def due(self, step: int) -> bool:
        return bool(self.every and step % self.every == 0)

    def final_due(self, step: int, last_saved: int, ckpt_root: Path) -> bool:
        """After the last step: unless that step is already saved (and its checkpoint is there)."""
        return self.save_final and (last_saved != step or not ckpt.latest_checkpoint(ckpt_root))


class StopChecks:
    """The ways a run ends early: a stop signal (every rank agrees on it through the step gate,
    before the first step and in each step) and train.on_nonfinite for a step whose loss or
    gradient norm is not finite."""

    def __init__(self, on_nonfinite: str, max_skipped: int, signals: StopSignals, world: int):
        self.gate = StepGate(signals, world)  # the engines call it in each step
        self.nonfinite = NonFinitePolicy(on_nonfinite, max_skipped)

    def asked_at_start(self) -> bool:
        """Whether any rank was asked to stop while the run was starting up."""
        return bool(self.gate.poll())

    def asked(self) -> bool:
        """Whether the ranks agreed to stop after the step just taken."""
        return bool(self.gate.signum)

    def check_step(self, step: int, result: StepResult, next_move: str) -> None:
        """Account for optimizer step ``step``; raises RunStopped when the policy ends the run."""
        what = result.detail or describe(self.gate.evidence)
        self.nonfinite.record(step, result, what, next_move)

    def signal_stop(self, step: int, what: str, resume_command: str) -> RunStopped:
        """The one line (and exit status 128 + signal) a stop on a signal ends the run with."""
        name = signal_name(self.gate.signum)
        line = f"stopped at step {step} by {name}; {what}; continue with: {resume_command}"
        return RunStopped(line, 128 + self.gate.signum, "signal")


class FirstSteps:
    """One-off work after the first steps: the precision report once the first step has shown the
    compute dtype; on CUDA, stop recording allocations (started with the run) after
    MEMORY_HISTORY_STEPS steps."""

    def __init__(
        self, model: torch.nn.Module, device: torch.device, report: Callable[[Any], None]
    ) -> None:
        self.read_compute_dtype = watch_compute_dtype(model)
        self.report, self.cuda = report, device.type == "cuda"

    def after_step(self, step: int) -> None:
        if self.read_compute_dtype is not None:
            self.report(self.read_compute_dtype())
            self.read_compute_dtype = None
        if step == MEMORY_HISTORY_STEPS and self.cuda:  # steady state: stop recording
            torch.cuda.memory._record_memory_history(enabled=None)


class RunSummary:
    """summary.json: the run directory and start step, the values of the last records, then the
    run's totals; and each step's duration (for `zerofit bench`)."""

    def __init__(self, run_dir: Path, start_step: int, ctx: DistContext) -> None:
        self.run_dir, self.start_step, self.ctx = run_dir, start_step, ctx
        self.data: dict[str, Any] = {"run_dir": str(run_dir), "start_step": start_step}
        self.t_start = time.perf_counter()
        self.timer = StepTimer(ctx.device)
        self.timer.mark()
        self.real_tokens: list[torch.Tensor] = []  # per step, fine-tuning rows only
        self.repeated: list[torch.Tensor] = []  # per step, DPO only (`Throughput.tick`)
        self.losses: list[
            torch.Tensor
        ] = []  # per step, this rank's (averaged over ranks at the end)

    def mark_step(
        self,
        real_tokens: torch.Tensor | None = None,
        loss: torch.Tensor | None = None,
        repeated: torch.Tensor | None = None,
    ) -> None:
        """A step ended: its time, and (kept on the device, no sync) its tokens and loss."""
        self.timer.mark()
        if real_tokens is not None:
            self.real_tokens.append(real_tokens)
        if repeated is not None:
            self.repeated.append(repeated)
        if loss is not None:
            self.losses.append(loss.detach().float().reshape(()))

    def update(self, record: dict[str, Any]) -> None:
        self.data.update(record)

    def finish(
        self,
        last_loss: torch.Tensor | None,
        ckpt_root: Path,
        counts: dict[str, Any],
        log: MetricsLog,
    ) -> dict[str, Any]:
        """Add the totals, close the metrics log, write summary.json (rank 0); returns it."""
        summary, ctx = self.data, self.ctx
        if last_loss is not None:  # the last step's own loss (the logged ones are window means)
            summary["final_step_loss"] = ctx.all_reduce_mean(last_loss.detach().clone()).item()
        summary["checkpoint"] = str(ckpt.latest_checkpoint(ckpt_root) or "-")
        summary["wall_time_s"] = time.perf_counter() - self.t_start
        summary["world_size"] = ctx.world_size
        summary["device"] = ctx.device.type
        summary.update(counts)
        # Per-step times (log/eval/save steps included), for `zerofit bench`.
        summary["step_times_s"] = self.timer.durations()
        if self.losses:  # each step's loss, the mean over ranks (one collective for the run)
            losses = ctx.all_reduce_mean(torch.stack(self.losses))
            summary["step_losses"] = [x if math.isfinite(x) else None for x in losses.tolist()]
        if self.real_tokens:  # and each step's non-padding tokens, for real tokens/s
            summary["step_real_tokens"] = [int(n) for n in torch.stack(self.real_tokens).tolist()]
        if self.repeated:  # and each step's places counted once elsewhere (DPO's prompts)
            summary["step_repeated_tokens"] = [int(n) for n in torch.stack(self.repeated).tolist()]
        summary.update(log.rates)
        log.close()
        if ctx.is_main:
            (self.run_dir / "summary.json").write_text(json.dumps(summary, indent=1))
        return summary

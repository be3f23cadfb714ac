"""The Trainer: optimizer steps, eval, checkpoints (save, resume) and the loop that runs them.

Engine-agnostic: everything engine-specific is behind `Backend`. What a run is built from is in
`zerofit.train.components`, when the loop logs, evaluates, saves and stops in `zerofit.train.periodic`, and how a
worker's run is assembled in `zerofit.train.run`.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch

from zerofit import checkpoint as ckpt
from zerofit.config import Config
from zerofit.data import eval_batches
from zerofit.distributed.mesh import DistContext
from zerofit.errors import EXIT_IO, EXIT_NONFINITE, DamagedFile, RunStopped, UserError
from zerofit.faults.nonfinite import StepResult
from zerofit.models.build import params_line, weights_line
from zerofit.models.describe import fast_path_line
from zerofit.report.profiling import DATA, FORWARD_BACKWARD, OPTIMIZER, StepProfiler
from zerofit.report.run_files import write_precision_report
from zerofit.train.components import RunControl, agreed, build_parts
from zerofit.train.lr_schedule import lr_at
from zerofit.train.objectives import NextToken, Preference, make_objective
from zerofit.train.periodic import (
    EvalEvery,
    FirstSteps,
    MetricsLog,
    RunSummary,
    SaveEvery,
    StopChecks,
)
from zerofit.train.reference import make_reference


class Trainer:
    def __init__(
        self, cfg: Config, run_dir: Path, ctx: DistContext, control: RunControl | None = None
    ):
        # `cfg` is resolved (zerofit.launch.resolve, in the launcher): every dtype explicit, the engine's
        # own section settled, the world size checked. Workers trust it as saved.
        self.cfg, self.run_dir, self.ctx = cfg, run_dir, ctx
        self.control = control or RunControl()
        parts = build_parts(cfg, run_dir, ctx)
        self.spec, self.data, self.loader = parts.spec, parts.data, parts.loader
        self.backend = parts.backend
        self.ckpt_root, self.meta, self.frozen = parts.ckpt_root, parts.meta, parts.frozen
        t = cfg.train
        self.stops = StopChecks(
            t.on_nonfinite, t.max_skipped_steps, self.control.signals, ctx.world_size
        )
        self.step = 0
        self.last_saved = 0
        self.real_tokens: torch.Tensor | None = None  # the last step's, on fine-tuning rows
        self.profiler = StepProfiler.off()  # log.profile_steps: set up by fit()
        self._objective: NextToken | Preference | None = None
        if ctx.is_main:
            for line in self._start_lines():
                print(line, flush=True)

    def _start_lines(self) -> list[str]:
        """What the run says first: where the weights come from, how many parameters train, what
        packing did with fine-tuning data, and what the speed rests on (compile, attention, head)."""
        spec, p, m = self.spec, self.cfg.parallel, self.cfg.model
        lines = [
            weights_line(spec.weights_source),
            params_line(spec.num_params, spec.trainable_params or 0),
            self.data.report_line(),
            fast_path_line(spec.module, self.ctx.device, p.compile, m.loss_chunk, self.data.masked),
        ]
        return [line for line in lines if line]

    # ------------------------------------------------------------------ the loop
    def fit(self) -> dict[str, Any]:
        """Train up to train.steps; returns the run summary (also written to summary.json)."""
        cfg, ctx, start = self.cfg, self.ctx, self.step
        log = MetricsLog(cfg, ctx, self.spec, self.run_dir, start)
        summary = RunSummary(self.run_dir, start, ctx)
        evals = EvalEvery(cfg.train.eval_every, cfg.train.steps, has_val=len(self.data.val) > 0)
        saves = SaveEvery(cfg.checkpoint.every, cfg.checkpoint.save_final)
        self.backend.model.train()
        first = FirstSteps(self.backend.model, ctx.device, self._write_precision_report)
        self.profiler = StepProfiler(
            cfg.log.profile_steps,
            cfg.train.steps - start,
            self.run_dir / "profile" if ctx.is_main else None,
            ctx.device.type == "cuda",
        )
        with log:
            if self.stops.asked_at_start():
                self.stop_on_signal()
            while self.step < cfg.train.steps:
                with self.profiler.step():
                    loss, result = self.train_step()
                repeated = self.objective().repeated  # DPO: each pair's prompt counts once
                summary.mark_step(self.real_tokens, loss, repeated)
                first.after_step(self.step)
                record = log.after_step(
                    self.step, loss, result, self.lr, self.real_tokens, repeated
                )
                if record is not None:
                    record.update(self.objective().record())
                if evals.due(self.step):
                    record = record or {"step": self.step}
                    record.update(self.evaluate())
                if record is not None:
                    log.write(self.step, record)
                    summary.update(record)
                if saves.due(self.step):
                    self.save()
                if self.stops.asked():
                    log.close()
                    self.stop_on_signal()
                log.advance(self.step)
        if saves.final_due(self.step, self.last_saved, self.ckpt_root):
            self.save()
        last_loss = loss if self.step > start else None
        return summary.finish(last_loss, self.ckpt_root, self._counts(), log)

    def _counts(self) -> dict[str, Any]:
        """The run's totals for the summary, beside those of the loop."""
        counts: dict[str, Any] = {
            "num_params": self.spec.num_params,
            "trainable_params": self.spec.trainable_params,
            "weights": self.spec.weights_source,
            "nonfinite_skips": self.stops.nonfinite.skipped,
            "loss_scale_skips": self.stops.nonfinite.scale_skips,
        }
        if self.data.stats is not None:  # samples and tokens truncated or dropped, rows, fill
            counts["data"] = self.data.stats.as_dict()
        return counts

    def _write_precision_report(self, compute: torch.dtype | None) -> None:
        write_precision_report(self.backend, self.run_dir, self.ctx, compute)

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
            self.stops.nonfinite.load_state_dict(state.get("nonfinite", {}))
            if saved["backend"] == self.cfg.parallel.backend:
                self.backend.load_extra_state(state["backend"])  # e.g. the fp16 loss scale
            if own:
                ckpt.rank_state.set_rng_state(state["rng"])
        except (KeyError, TypeError, ValueError, IndexError, RuntimeError, AttributeError) as e:
            raise UserError(
                DamagedFile(path / name, f"holds a malformed state ({e!r})").line(path)
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
            "nonfinite": self.stops.nonfinite.state_dict(),
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
            else "No earlier checkpoint exists; make room, then start it again with: "
            f"{self.control.resume_command}"
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
        """One optimizer step over ``grad_accum_steps`` micro-batches. Text rows: each micro-batch
        loss / accum. Masked rows: the step's loss is the mean over every valid target of the
        global batch, or DPO's mean over pairs (the objective's weights)."""
        accum = self.cfg.train.grad_accum_steps
        total = torch.zeros((), device=self.ctx.device)
        objective = self.objective()
        with self.profiler.phase(DATA):
            batches = [self.loader.next_microbatch() for _ in range(accum)]
            weights, self.real_tokens = objective.weights(batches)
        with self.profiler.phase(FORWARD_BACKWARD):
            for a, batch in enumerate(batches):
                with self.backend.micro_step(is_last=a == accum - 1):
                    loss = objective.loss(self.backend.model, batch)
                    loss = loss / accum if weights is None else loss * weights[a]
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
        with self.profiler.phase(OPTIMIZER):
            result = self.backend.step(self.lr, total, self.stops.gate)
        self.step += 1
        self.stops.check_step(self.step, result, self.next_move())
        return total, result

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        """The objective's eval figures (``eval_loss``, ...) over every rank's eval batches."""
        model = self.backend.model
        model.eval()
        batches = eval_batches(
            self.data.val,
            self.cfg.train.micro_batch_size,
            self.ctx.dp_rank,
            self.ctx.dp_size,
            self.cfg.train.eval_batches,
        )
        figures = self.objective().evaluate(model, batches, self.backend.micro_step)
        model.train()
        return figures

    def objective(self) -> NextToken | Preference:
        """What the steps minimise (``zerofit.train.objectives``), made at the first step: DPO's
        precomputed reference is taken from the weights the run starts from, or read back on a
        resume."""
        if self._objective is None:
            reference = None
            if self.cfg.train.objective == "dpo":
                splits = {"train": self.data.train, "val": self.data.val}
                reference = make_reference(
                    self.cfg,
                    self.backend.model,
                    splits,
                    self.run_dir,
                    self.ctx,
                    self.step == 0,
                    self.frozen,
                )
            self._objective = make_objective(self.cfg, self.ctx, self.data.masked, reference)
        return self._objective

    def stop_on_signal(self) -> None:
        """After the step every rank agreed to stop at: save it, then end with one line."""
        cmd = self.control.resume_command
        if self.step == self.last_saved:
            where = ckpt.latest_checkpoint(self.ckpt_root)
            held = (
                f"checkpoint {where} holds it" if where else "nothing saved yet (it starts again)"
            )
            raise self.stops.signal_stop(self.step, held, cmd)
        t0 = time.perf_counter()
        path = self.save()
        took = f"saved {path} in {time.perf_counter() - t0:.1f} s"
        raise self.stops.signal_stop(self.step, took, cmd)

"""Today's planner against every measured GPU run committed under docs/benchmarks/data/.

    python tools/planner_residuals.py                 # the table, fit and held-out sets
    python tools/planner_residuals.py --fit           # refit the host constants on FIT_SET
    python tools/planner_residuals.py --json OUT.json

Each run of the corpus (`planner_corpus`: `--measure-out` rows and `zerofit bench` results, on
the card that ran them) is forecast with `zerofit.planner.speed.predict` and
`zerofit.planner.memory.estimate`, with and without the host term (`speed.host_seconds`: the
same forecast with every host rate at 0, the roofline before the term), and
printed with what it ran: engine, eager or compiled, activation checkpointing, tokens per
micro-batch, accumulation, master dtype, offload, LoRA/QLoRA, sequence length, model size.

FIT_SET names the runs the host constants were fitted on; every other run is held out from that
fit. Among those, the 2026-12-03 `--measure` files timed 2 steps after a 2-step warm-up, so that
the first timed step still recorded CUDA allocations (slower on the host; `plan_measure.WARMUP`);
they are held out, with that caveat (`RECORDED`). Errors are forecast / measured - 1.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from planner_corpus import GIB, Run, bench_runs, corpus, fixture_models  # noqa: E402

from zerofit.backends.deepspeed import costs  # noqa: E402
from zerofit.planner import speed  # noqa: E402
from zerofit.planner.memory import estimate  # noqa: E402
from zerofit.planner.shape import with_host  # noqa: E402

FIT_SET = ("2026-12-04-planner-heldout/a-measured.json",)
RECORDED = ("2026-12-03-planner-heldout/",)  # timed steps that recorded allocations
BOUND = 0.10  # |speed error| that counts as a hit (plan_measure.TIME_BOUND)
MEMORY_BOUND = 0.05


@dataclass(frozen=True)
class Row:
    run: Run
    roofline_s: float  # the forecast without the host term
    forecast_s: float  # today's forecast
    host_s: float  # host seconds a step, of today's forecast
    memory_gib: float

    @property
    def before(self) -> float:
        return self.roofline_s / self.run.step_s - 1

    @property
    def after(self) -> float:
        return self.forecast_s / self.run.step_s - 1

    @property
    def memory_error(self) -> float | None:
        got = self.run.alloc_gib
        return self.memory_gib / got - 1 if got else None

    @property
    def group(self) -> str:
        key = self.run.key
        if key.startswith(FIT_SET):
            return "fit"
        return "held out (recorded)" if key.startswith(RECORDED) else "held out"


@contextmanager
def constants(launch: float, hook: float, passes: int | None = None) -> Iterator[None]:
    """The host term's constants set for a while (the module globals `predict` reads)."""
    saved = speed.LAUNCH_SECONDS, speed.HOOK_SECONDS, costs.ZERO12_STEP_PASSES
    speed.LAUNCH_SECONDS, speed.HOOK_SECONDS = launch, hook
    costs.ZERO12_STEP_PASSES = saved[2] if passes is None else passes
    try:
        yield
    finally:
        speed.LAUNCH_SECONDS, speed.HOOK_SECONDS, costs.ZERO12_STEP_PASSES = saved


def step_time(r: Run) -> float:
    return speed.predict(r.m, r.w, r.s, r.hw).step_time


def row(r: Run) -> Row:
    instant = with_host(r.hw, 0.0, 0.0, 0.0)  # a host that issues work in no time: the roofline
    roofline = speed.predict(r.m, r.w, r.s, instant).step_time
    today = speed.predict(r.m, r.w, r.s, r.hw)
    mem = estimate(r.m, r.w, r.s).peak_allocated / GIB
    return Row(r, roofline, today.step_time, today.host, mem)


def traits(r: Run) -> str:
    """What a run was, short: engine + AC, eager/compiled, tokens x accumulation, seq, dtype."""
    w, s = r.w, r.s
    lora = "" if not w.lora else (" QLoRA" if w.lora.quantized else " LoRA")
    mode = "compiled" if s.compile else "eager"
    size = f"{r.m.num_params / 1e9:.1f}B"
    return (
        f"{s.label}{lora}, {mode}, {w.micro_batch_size}x{w.seq_len}={w.tokens} tok x{w.grad_accum_steps}"
        f", {w.master_dtype} master, {size} L{r.m.n_layers}, {r.hw.name.split()[0]}"
    )


def pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:+.1f}%"


def table(rows: list[Row]) -> list[str]:
    """Markdown: one line a run, grouped, each group's hits and median |error| under it."""
    out = []
    for group in ("fit", "held out", "held out (recorded)"):
        chosen = [x for x in rows if x.group == group]
        if not chosen:
            continue
        out += [
            f"\n### {group} ({len(chosen)} runs)\n",
            "| run | what | measured s | roofline s | err | with host s | err | host s "
            "| memory err |",
            "|---|---|--:|--:|--:|--:|--:|--:|--:|",
        ]
        for x in chosen:
            out.append(
                f"| {x.run.key} | {traits(x.run)} | {x.run.step_s:.3f} | {x.roofline_s:.3f} "
                f"| {pct(x.before)} | {x.forecast_s:.3f} | {pct(x.after)} | {x.host_s:.3f} "
                f"| {pct(x.memory_error)} |"
            )
        out.append(summary(chosen))
    return out


def summary(rows: list[Row]) -> str:
    """Speed hits within BOUND and median |error|, without and with the host term; memory."""

    def hits(errors: list[float]) -> str:
        inside = sum(abs(e) <= BOUND for e in errors)
        median = statistics.median(abs(e) for e in errors) if errors else math.nan
        return f"{inside} of {len(errors)} within {BOUND:.0%} (median |error| {median:.1%})"

    mem = [e for x in rows if (e := x.memory_error) is not None]
    mem_hits = sum(abs(e) <= MEMORY_BOUND for e in mem)
    return (
        f"\nspeed, roofline alone: {hits([x.before for x in rows])}; with the host term: "
        f"{hits([x.after for x in rows])}; memory within {MEMORY_BOUND:.0%}: "
        f"{mem_hits} of {len(mem)}\n"
    )


def loss(runs: list[Run]) -> float:
    return sum(math.log(step_time(r) / r.step_s) ** 2 for r in runs)


def fit(runs: list[Run]) -> tuple[float, float, int]:
    """(LAUNCH_SECONDS, HOOK_SECONDS, ZERO12_STEP_PASSES) with the least squared log error on
    `runs`: a grid of 1 us launch steps, 5 us hook steps and whole passes."""
    best: tuple[float, float, float, int] | None = None
    for passes in range(0, 9):
        for launch_us in range(1, 81):
            for hook_us in range(0, 401, 5):
                with constants(launch_us * 1e-6, hook_us * 1e-6, passes):
                    value = loss(runs)
                if best is None or value < best[0]:
                    best = (value, launch_us * 1e-6, hook_us * 1e-6, passes)
    assert best is not None
    return best[1], best[2], best[3]


def fresh(root: Path) -> tuple[list[Run], list[tuple[str, str]]]:
    """The runs of a benchmark folder not yet in the corpus (`benchmarks/planner_heldout.sh`'s
    output): every `*/results.json` under `root`, all held out."""
    runs: list[Run] = []
    skipped: list[tuple[str, str]] = []
    for path in sorted(root.glob("*/results.json")):
        for item in bench_runs(path, root):
            (runs if isinstance(item, Run) else skipped).append(item)  # type: ignore[arg-type]
    return runs, skipped


def as_json(rows: list[Row]) -> list[dict[str, object]]:
    return [
        {
            "run": x.run.key,
            "group": x.group,
            "what": traits(x.run),
            "notes": list(x.run.notes),
            "measured_step_s": x.run.step_s,
            "roofline_step_s": x.roofline_s,
            "forecast_step_s": x.forecast_s,
            "host_s": x.host_s,
            "measured_alloc_gib": x.run.alloc_gib,
            "forecast_alloc_gib": x.memory_gib,
        }
        for x in rows
    ]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--fit", action="store_true", help="refit the host constants on FIT_SET")
    p.add_argument("--json", metavar="PATH", help="write the rows as JSON")
    p.add_argument("--skipped", action="store_true", help="list the runs left out, and why")
    p.add_argument(
        "--results",
        metavar="DIR",
        help="forecast the bench results under DIR (*/results.json) instead of the corpus",
    )
    args = p.parse_args(argv)
    runs, skipped = corpus() if args.results is None else fresh(Path(args.results))
    if args.fit:
        launch, hook, passes = fit([r for r in runs if r.key.startswith(FIT_SET)])
        print(
            f"fitted on {', '.join(FIT_SET)}: LAUNCH_SECONDS = {launch * 1e6:.0f}e-6, "
            f"HOOK_SECONDS = {hook * 1e6:.0f}e-6, ZERO12_STEP_PASSES = {passes} (in use: "
            f"{speed.LAUNCH_SECONDS * 1e6:.0f}e-6, {speed.HOOK_SECONDS * 1e6:.0f}e-6, "
            f"{costs.ZERO12_STEP_PASSES})"
        )
        return 0
    rows = [row(r) for r in runs]
    print(f"{len(rows)} runs forecast again ({len(skipped)} left out: --skipped lists them)")
    print("\n".join(table(rows)))
    if args.skipped:
        print("\n".join(f"left out: {key} ({why})" for key, why in skipped))
    if args.json:
        Path(args.json).write_text(json.dumps(as_json(rows), indent=1) + "\n")
    return 0


if __name__ == "__main__":
    with fixture_models():  # the fine-tuning runs name bench-fixture's models
        sys.exit(main())

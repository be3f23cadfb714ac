"""`zerofit bench`: the same model, data and seed under several engines and settings, side by side.

Each variant is one `zerofit train` in its own processes (so a crash or an OOM stays there), with
checkpoints and eval off. From each run's per-step times it takes the median after warm-up, and
reports tokens/s, TFLOP/s, MFU, peak memory and the final loss; `zerofit.bench.report` writes the
table, results.json and charts. With `--profile N` each run goes on for one more step and N
profiled ones (log.profile_steps, see `zerofit.report.profiling`) after the timed steps, so the profiler
does not touch the timing; its trace and step-time breakdown are kept with the variant's result.

Variants come from `--backends` x every `--sweep key=v1,v2` (a key only one engine reads, such as
parallel.deepspeed.reduce_bucket_size, is swept for that engine alone), plus any `--variant`.
"""

from __future__ import annotations

import itertools
import json
import re
import statistics
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from zerofit.errors import UserError
from zerofit.launch import child_run as runner
from zerofit.report.rates import rates


@dataclass
class Variant:
    name: str
    overrides: list[str]  # dotted key=value, applied after the shared ones
    backend: str = ""  # filled in once the variant's config is loaded
    model: str = ""  # likewise: its model, as charts and results.md name it


@dataclass
class Result:
    name: str
    overrides: list[str]
    backend: str
    status: str  # ok | oom | failed | timeout
    error: str = ""
    tokens_per_s: float | None = None
    real_tokens_per_s: float | None = None  # padded fine-tuning rows: non-padding tokens only
    tokens_per_s_per_gpu: float | None = None
    tflops_per_gpu: float | None = None
    mfu: float | None = None
    step_time_s: float | None = None
    mem_alloc_gib: float | None = None
    mem_reserved_gib: float | None = None
    alloc_retries: int | None = None  # the caching allocator's cudaMalloc retries (memory pressure)
    # GPU runs: rank 0's peak host RSS (loading is where it peaks)
    host_rss_gib: float | None = None
    final_loss: float | None = None
    measured_steps: int = 0
    wall_s: float = 0.0
    run_dir: str = ""
    profile_dir: str = ""  # with --profile: <run_dir>/profile (trace and summary.json)
    profile: dict[str, Any] | None = None  # its summary.json: breakdown and top kernels


def parse_sweep(text: str) -> tuple[str, list[str]]:
    """'train.micro_batch_size=1,2,4' -> ('train.micro_batch_size', ['1', '2', '4'])."""
    key, sep, values = text.partition("=")
    items = [v.strip() for v in values.split(",") if v.strip()]
    if not sep or "." not in key or not items:
        raise UserError(f"--sweep {text!r}: expected section.key=v1,v2,...")
    return key.strip(), items


def parse_variant(text: str) -> Variant:
    """'name: key=v key2=v2' -> Variant('name', ['key=v', 'key2=v2'])."""
    name, sep, rest = text.partition(":")
    overrides = rest.split()
    if not sep or not name.strip() or any("=" not in o or "." not in o for o in overrides):
        raise UserError(f"--variant {text!r}: expected 'NAME: section.key=value ...'")
    return Variant(name.strip(), overrides)


def _owner(key: str, owners: dict[str, tuple[str, ...]]) -> str | None:
    """The one backend that reads `key`, or None when it is shared."""
    for backend, keys in owners.items():
        if any(key == k or (k.endswith(".") and key.startswith(k)) for k in keys):
            return backend
    return None


def expand(
    backends: list[str],
    sweeps: list[tuple[str, list[str]]],
    owners: dict[str, tuple[str, ...]],
) -> list[Variant]:
    """backends x sweep product; keys owned by one engine vary only for that engine."""
    variants: list[Variant] = []
    for backend in backends:
        axes = [(k, vals) for k, vals in sweeps if _owner(k, owners) in (None, backend)]
        for combo in itertools.product(*(vals for _, vals in axes)):
            sets = [f"{k}={v}" for (k, _), v in zip(axes, combo, strict=True)]
            label = " ".join([backend, *(s.rsplit(".", 1)[-1] for s in sets)])
            variants.append(Variant(label, [f"parallel.backend={backend}", *sets], backend))
    return variants


def slug(index: int, name: str) -> str:
    return f"{index:02d}-" + re.sub(r"[^A-Za-z0-9_.=-]+", "_", name)[:80]


def classify(code: int, log: str) -> tuple[str, str]:
    """(oom | failed, the most telling line): the exception itself over the launcher's summary."""
    lines = [re.sub(r"^\[rank\d+\]:\s*", "", ln) for ln in log.splitlines() if ln.strip()]
    exception = re.compile(
        r"^(?:[a-z_]\w*\.)*[A-Z]\w*(?<!Warning): "
    )  # RuntimeError: / torch.x.Unsupported:
    error = next((ln for ln in reversed(lines) if exception.match(ln)), "")
    if not error:
        error = next(
            (ln for ln in reversed(lines) if ln.startswith("error:")),
            lines[-1] if lines else f"exit code {code}",
        )
    status = "oom" if re.search(r"out of memory|OutOfMemory", log, re.I) else "failed"
    return status, error.strip()[:300]


def measure(summary: dict[str, Any], warmup: int, count: int | None = None) -> dict[str, Any]:
    """Median step time over the `count` steps after warm-up (default: all the rest), and what
    follows from it."""
    end = None if count is None else warmup + count
    times = summary["step_times_s"][warmup:end]
    if not times:
        raise ValueError("no measured steps")
    median = statistics.median(times)
    tps = summary["tokens_per_step"] / median
    repeated = summary.get("step_repeated_tokens", [])[warmup:end]
    if len(repeated) == len(times):  # DPO: each pair's prompt counts once
        tps = statistics.median(
            (summary["tokens_per_step"] - n) / t for n, t in zip(repeated, times, strict=True)
        )
    extra = {
        k: summary[k]
        for k in ("mem_alloc_gib", "mem_reserved_gib", "alloc_retries", "host_rss_gib")
        if k in summary
    }
    if "mem_rss_gib" in summary:  # CPU: peak host RSS of rank 0
        extra = {"mem_alloc_gib": summary["mem_rss_gib"]}
    real = summary.get("step_real_tokens", [])[warmup:end]
    if len(real) == len(times):  # padded fine-tuning rows: non-padding tokens over each step
        extra["real_tokens_per_s"] = statistics.median(
            n / t for n, t in zip(real, times, strict=True)
        )
    return {
        "mfu": None,  # unless the GPU's peak is known
        **rates(tps, summary["flops_per_token"], summary["world_size"], summary.get("peak_flops")),
        "step_time_s": median,
        "final_loss": summary.get("final_step_loss", summary.get("loss")),
        "measured_steps": len(times),
        **extra,
    }


@dataclass
class Settings:
    """What every variant of one bench shares."""

    base: list[str]  # dotted overrides applied to every variant
    config: str | None
    nproc: int | None
    warmup: int
    steps: int
    timeout: float | None = None
    profile: int = 0  # profiled steps after the timed ones (0: none)


def run_variant(variant: Variant, index: int, out: Path, st: Settings) -> Result:
    run_dir = out / slug(index, variant.name)
    total = st.warmup + st.steps + (1 + st.profile if st.profile else 0)
    forced = [f"train.steps={total}", f"log.every={total}", *runner.MEASURE_ONLY]
    forced.append(f"log.profile_steps={st.profile}")  # never over the timed steps
    outcome = runner.train(
        run_dir,
        [*st.base, *variant.overrides, *forced],
        out / "logs" / f"{run_dir.name}.log",
        st.config,
        st.nproc,
        st.timeout,
    )
    result = Result(variant.name, variant.overrides, variant.backend, "ok", run_dir=str(run_dir))
    result.wall_s = outcome.wall_s
    if outcome.code == runner.TIMED_OUT:
        result.status, result.error = "timeout", f"no result within {st.timeout:.0f} s"
    elif not outcome.ok:
        result.status, result.error = classify(outcome.code, outcome.log())
    else:
        for key, value in measure(outcome.summary or {}, st.warmup, st.steps).items():
            setattr(result, key, value)
        if st.profile:
            read_profile(result, run_dir / "profile")
    return result


def read_profile(result: Result, folder: Path) -> None:
    """The run's profile summary into its result (a note in `error` when it left none)."""
    found = folder / "summary.json"
    if not found.is_file():
        result.error = f"no profile summary in {folder} (see the run's log)"
        return
    result.profile_dir = str(folder)
    result.profile = json.loads(found.read_text())


def best(results: list[Result], backend: str | None = None) -> Result | None:
    """The fastest variant that ran (of one engine, if given)."""
    ok = [r for r in results if r.status == "ok" and r.tokens_per_s]
    ok = [r for r in ok if backend is None or r.backend == backend]
    return max(ok, key=lambda r: r.tokens_per_s or 0.0) if ok else None


def best_lines(results: list[Result]) -> list[str]:
    """'best: ...' overall (with its engine when several engines ran), then the best of each
    other engine: no variant is named twice."""
    top = best(results)
    if top is None:
        return []
    engines = sorted({r.backend for r in results})
    several = len(engines) > 1
    engine = f"{top.backend}, " if several else ""
    lines = [f"best: {top.name} ({engine}{top.tokens_per_s:,.0f} tokens/s)"]
    for other in engines if several else []:
        b = best(results, other)
        if b is not None and b is not top:
            lines.append(f"best {other}: {b.name} ({b.tokens_per_s:,.0f} tokens/s)")
    return lines


def run_bench(
    variants: list[Variant], out: Path, st: Settings, on_result: Any = None
) -> list[Result]:
    out.mkdir(parents=True, exist_ok=True)
    results: list[Result] = []
    for i, variant in enumerate(variants):
        result = run_variant(variant, i, out, st)
        results.append(result)
        (out / "results.json").write_text(
            json.dumps({"results": [asdict(r) for r in results]}, indent=1)
        )
        if on_result:
            on_result(result)
    return results

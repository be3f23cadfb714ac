"""Every measured GPU run committed under docs/benchmarks/data/ that can be forecast again.

Two kinds of files carry what a forecast needs:
- `zerofit plan --measure-out` files (`*-measured.json`): each row has its workload, its strategy
  and the hardware it ran on (`plan_measure.replay`), with `measured_step_s` and the peak allocated
  memory;
- `zerofit bench` results (`results.json`, `*-results.json`, and the call bundles
  `*all-results.json` that nest them): the command names the config and the shared overrides, each
  variant its own overrides; `meta.env.gpu` names the card (H200, or the H100 of the 2026-12-05
  QLoRA sessions 4 and 5) and `meta.nproc` the world size.

A config kept outside the repository when it ran is read from the copy committed beside its
results (`COPIES`) or rebuilt from the fields the plan wrote (`REBUILT`). A run under
`parallel.backend: auto` took the planner's pick of its day: read from the run's log
("parallel.backend auto: LABEL") or its resolved config copy (`RESOLVED`), never re-picked by
today's planner. Bundles repeat their results files: a run is counted once (`dedupe`).
Left out, with the reason (`skipped`): failed, OOM and timed-out runs, and runs whose config or
pick was not kept. Stock (transformers/TRL) results carry no bench block and are not read.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from zerofit.backends.terms import Workload
from zerofit.commands import plan_measure
from zerofit.config.schema import Config
from zerofit.launch.run_config import load_config
from zerofit.models.shape import ModelShape, shape_from_config
from zerofit.planner.gpus import gpu_named
from zerofit.planner.memory import Strategy, strategy_for, workload_for
from zerofit.planner.plan import candidates
from zerofit.planner.shape import Hardware, with_gpu, with_host

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "docs" / "benchmarks" / "data"
FIXTURE = "bench-fixture"  # benchmarks/sft_fixture.py's folder, named relative to the repository
# The same models under the folders the runs named: the SFT fixture, and the DPO runs' copy of it
# (benchmarks/dpo_carry.sh)
FIXTURES = (FIXTURE, ".dpo/fix")
# Folders outside the repository where a device call built the same fixture (sft_fixture.py
# /tmp/fx): a run's paths under them are read under FIXTURE
FIXTURE_ELSEWHERE = ("/tmp/fx/",)


@contextlib.contextmanager
def fixture_models() -> Iterator[None]:
    """Inside, `bench-fixture/model-<shape>` and `.dpo/fix/model-<shape>` name folders with that
    model's config.json, as the configs of the fine-tuning runs name them: the repository's own
    fixtures where they were built (device assets, git-ignored), else the configs alone, written
    to a temporary folder (a fresh clone: the shape is all a forecast reads)."""
    here = Path.cwd()
    with tempfile.TemporaryDirectory() as tmp:
        if all((ROOT / f).is_dir() for f in FIXTURES):
            os.chdir(ROOT)
        else:
            sys.path.insert(0, str(ROOT / "benchmarks"))
            from sft_fixture import SHAPES, model_config  # noqa: PLC0415 - a sibling script

            for folder in FIXTURES:
                for shape in SHAPES:
                    model_config(shape).save_pretrained(Path(tmp) / folder / f"model-{shape}")
            os.chdir(tmp)
        try:
            yield
        finally:
            os.chdir(here)


GIB = 2**30
PROBE_FILE = "host-probe.json"  # `zerofit plan --host-probe --json` of the device call
HOST_RAM = 125 * GIB  # the H200 and H100 hosts' RAM as the planner saw it (offload fits)

S3, S4 = "2026-12-03-speed2-h200/", "2026-12-04-speed2-h200/"
FK, Q = "2026-12-04-first-k-h200/", "2026-12-05-qlora-h200/"
# (data folder, config path outside the repository) -> the copy committed under data/
COPIES = {
    (S4, "/tmp/w/plans/1.5b-24gb.yaml"): S4 + "plans/1.5b-24gb.yaml",
    (S4, "/tmp/w/plans/3.6b-24gb.yaml"): S4 + "plans/3.6b-24gb.yaml",
    (S4, "/tmp/w/1.5b.yaml"): S4 + "plans/1.5b-levers.yaml",
    (FK, "/root/out/c18/plans/1.5b-24gb.yaml"): FK + "plans/1.5b-24gb.yaml",
}
# What `zerofit plan --write` wrote for the 2026-12-03 24 GB rehearsal (c2/1.5b-plan-a87e507.json)
REHEARSAL_1_5B = [
    "model.preset=llama3-1b",
    "model.seq_len=2048",
    "model.loss_chunk=4096",
    "train.micro_batch_size=1",
    "train.grad_accum_steps=64",
    "train.global_batch_size=64",
    "precision.mode=bf16",
    "precision.master_dtype=fp32",
    "parallel.backend=deepspeed",
    "parallel.activation_checkpointing=none",
    "parallel.compile=false",
    "parallel.deepspeed.stage=3",
    "parallel.deepspeed.offload_optimizer=cpu",
    "parallel.deepspeed.offload_param=none",
    "parallel.deepspeed.offload_ratio=0.7",
]
REBUILT = {(S3, "/root/out/c2/plans/1.5b-24gb.yaml"): REHEARSAL_1_5B}
# Results files whose bench meta (the command) was not written: the config the call ran
RESULTS_ONLY = {S4 + "24gb-3.6b-results.json": S4 + "plans/3.6b-24gb.yaml"}
# `auto` runs whose log is not kept: the resolved config beside them, or what their write-up
# says the planner picked (2026-12-05-qlora-session5.md: "DDP, recomputing the first 12 blocks")
DDP_FIRST12 = [
    "parallel.backend=ddp",
    "parallel.activation_checkpointing=first_k",
    "parallel.ac_blocks=12",
]
RESOLVED: dict[str, str | list[str]] = {
    Q + "call6-h200/8b-all-results.json:recipe defaults": Q
    + "call6-h200/8b-recipe-defaults-config.yaml",
    Q + "call6-h200/8b-profile-results.json:recipe defaults": Q
    + "call6-h200/8b-recipe-defaults-config.yaml",
    Q + "session4-h100/call2-results.json:recipe defaults (4 x 4)": Q
    + "session4-h100/call2-01-recipe_defaults_4_x_4_-config.yaml",
    Q + "session4-h100/call3-profile-results.json:2 x 8, planner": DDP_FIRST12,
    Q + "session5-h100/call2-zerofit-results.json:2 x 8, planner's choice": DDP_FIRST12,
    Q + "session5-h100/call2-all-results.json:2 x 8, planner's choice": DDP_FIRST12,
    Q + "session5-h100/call4/all-results.json:2 x 8, planner's choice": DDP_FIRST12,
    Q + "session5-h100/call4/zerofit-2x8-results.json:2 x 8, planner's choice": DDP_FIRST12,
}


@dataclass(frozen=True)
class Run:
    """One measured run and what forecasts it."""

    key: str  # "<file under data/>:<variant or strategy>"
    kind: str  # "measure" (plan --measure-out row) | "bench" (zerofit bench variant)
    m: ModelShape
    w: Workload
    s: Strategy
    hw: Hardware
    step_s: float  # measured median step time
    alloc_gib: float | None  # measured peak allocated memory
    notes: tuple[str, ...] = ()

    @property
    def folder(self) -> str:
        return self.key.split("/")[0]


def hardware(gpu: str | None, world_size: int) -> Hardware:
    """The card a run names (the H200 when it names none), `world_size` of it on one node."""
    base = Hardware(gpus_per_node=world_size, gpu_mem=141 * 10**9, cpu_mem=HOST_RAM)
    card = gpu_named(gpu or "H200")
    return with_gpu(base, card) if card else base


def measure_runs(path: Path) -> Iterator[Run | tuple[str, str]]:
    """The rows of a `--measure-out` file: a Run each, or (key, why it is left out)."""
    found = json.loads(path.read_text())
    name = path.relative_to(DATA).as_posix()
    for row in found["rows"]:
        key = f"{name}:{row['strategy']}"
        if row["status"] != "ok" or not row.get("measured_step_s"):
            yield key, f"status {row['status']}"
            continue
        m, w, hw, s = plan_measure.replay(found["meta"], row)
        hw = replace(hw, cpu_mem=hw.cpu_mem or HOST_RAM)
        yield Run(key, "measure", m, w, s, hw, row["measured_step_s"], row["measured_alloc_gib"])


def bench_blocks(data: Any) -> Iterator[dict[str, Any]]:
    """Every {meta, results} block of a bench file, however deep a bundle nests it."""
    if isinstance(data, dict):
        if isinstance(data.get("results"), list):
            yield data
            return
        for value in data.values():
            yield from bench_blocks(value)


def command_parts(command: str) -> tuple[str | None, list[str]]:
    """(the -c config, the shared dotted overrides) of a `zerofit bench` command line."""
    argv = shlex.split(command)[2:]
    config, shared, i = None, [], 0
    while i < len(argv):
        arg = argv[i]
        if arg in ("-c", "--config"):
            config, i = argv[i + 1], i + 2
        elif arg.startswith("--") and "." in arg.split("=")[0]:
            if "=" in arg:
                shared.append(arg[2:])
                i += 1
            else:
                shared.append(f"{arg[2:]}={argv[i + 1]}")
                i += 2
        else:  # bench's own options (--warmup 2, --variant '...', ...)
            i += 2 if i + 1 < len(argv) and not argv[i + 1].startswith("--") else 1
    return config, shared


def in_fixture(override: str) -> str:
    """`key=value` with a value under FIXTURE_ELSEWHERE moved under FIXTURE."""
    key, _, value = override.partition("=")
    for folder in FIXTURE_ELSEWHERE:
        if value.startswith(folder):
            return f"{key}={FIXTURE}/{value.removeprefix(folder)}"
    return override


def slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "_", name)


def logged_pick(path: Path, index: int, variant: str) -> str | None:
    """The strategy label an `auto` run's log names ("parallel.backend auto: LABEL (...")."""
    for log in path.parent.rglob(f"{index:02d}-{slug(variant)}.log"):
        for line in log.read_text(errors="replace").splitlines():
            if line.startswith("parallel.backend auto: "):
                return line.removeprefix("parallel.backend auto: ").split(" (")[0]
    return None


def labelled(cfg: Config, hw: Hardware, label: str) -> Strategy | None:
    """The strategy of `cfg`'s candidates whose label is `label` (first_k with its count)."""
    k = re.search(r"AC first (\d+)", label)
    for s in candidates(replace(hw, nvme=1), cfg):
        if s.activation_checkpointing == "first_k":
            s = replace(s, ac_blocks=int(k.group(1)) if k else None)
        if s.label == label:
            return s
    return None


def bench_config(folder: str, command: str, overrides: list[str]) -> Config | str:
    """The config a bench variant ran with, or why it cannot be rebuilt."""
    config, shared = command_parts(command)
    shared = [in_fixture(kv) for kv in shared]
    if config is None or (ROOT / config).is_file():
        path = str(ROOT / config) if config else None
        return load_config(path, [*shared, *overrides])
    if (folder, config) in COPIES:
        return load_config(str(DATA / COPIES[folder, config]), [*shared, *overrides])
    if (folder, config) in REBUILT:
        return load_config(None, [*REBUILT[folder, config], *shared, *overrides])
    return f"config {config} not kept"


def resolve(key: str, path: Path, index: int, cfg: Config, hw: Hardware) -> Strategy | str:
    """The strategy a bench variant ran: its config's, or an `auto` run's pick of the day."""
    if cfg.parallel.backend != "auto":
        return strategy_for(cfg)
    fixed = RESOLVED.get(key)
    if isinstance(fixed, list):
        return strategy_for(load_config(None, fixed))  # the strategy fields alone
    if isinstance(fixed, str):
        return strategy_for(load_config(str(DATA / fixed)))
    label = logged_pick(path, index, key.split(":", 1)[1])
    if label is None:
        return "auto run: its pick is not kept"
    return labelled(cfg, hw, label) or f"auto pick {label!r} is no strategy of today's"


def bench_runs(path: Path, base: Path = DATA) -> Iterator[Run | tuple[str, str]]:
    """The variants of a bench results file (keyed by its path under `base`): a Run each, or
    (key, why it is left out)."""
    name = path.relative_to(base).as_posix()
    folder = name.split("/")[0] + "/"
    for block in bench_blocks(json.loads(path.read_text())):
        meta = block.get("meta") or _command_of(name)
        if meta is None:
            yield name, "no bench meta: its command is not kept"
            continue
        gpu, nproc = (meta.get("env") or {}).get("gpu"), int(meta.get("nproc") or 1)
        notes = ("profiled",) if meta.get("profile_steps") else ()
        for index, r in enumerate(block["results"]):
            key = f"{name}:{r['name']}"
            if r["status"] != "ok" or not r.get("step_time_s"):
                yield key, f"status {r['status']}"
                continue
            cfg = bench_config(folder, meta["command"], r["overrides"])
            if isinstance(cfg, str):
                yield key, cfg
                continue
            hw = probed_host(hardware(gpu, nproc), path, base)
            s = resolve(key, path, index, cfg, hw)
            if isinstance(s, str):
                yield key, s
                continue
            extra = (*notes, "auto") if cfg.parallel.backend == "auto" else notes
            if cfg.data.format in ("chat", "prompt_completion"):
                extra = (*extra, "padded")
            m, w = shape_from_config(cfg), workload_for(cfg, nproc)
            yield Run(key, "bench", m, w, s, hw, r["step_time_s"], r.get("mem_alloc_gib"), extra)


def probed_host(hw: Hardware, path: Path, base: Path) -> Hardware:
    """`hw` with the host rates that `zerofit plan --host-probe --json` measured in the same
    device call, saved as PROBE_FILE beside the results or in a folder above them (under
    `base`); unchanged where none was saved."""
    for folder in [path.parent, *path.parent.parents]:
        if (folder / PROBE_FILE).is_file():
            return _with_probe(hw, json.loads((folder / PROBE_FILE).read_text())["hardware"])
        if folder == base:
            break
    return hw


def _with_probe(hw: Hardware, found: dict[str, Any]) -> Hardware:
    """`hw` with a plan JSON's host rates (`plan_json.hardware_json`, in microseconds)."""

    def seconds(key: str) -> float | None:
        return None if found.get(key) is None else found[key] * 1e-6

    hooks = tuple((k, v * 1e-6) for k, v in (found.get("host_hooks_us") or {}).items())
    launch, hook = seconds("host_launch_us"), seconds("host_hook_us")
    compiled = seconds("host_compiled_launch_us")
    adam = tuple((k, v * 1e9) for k, v in (found.get("host_adam_gb_per_s") or {}).items())
    if found.get("pcie_bw_gbs"):  # the card's, or since 2026-12-07 the probe's
        hw = replace(hw, pcie_bw=found["pcie_bw_gbs"] * 1e9)
    return with_host(hw, launch, hook, compiled, hooks, found["host_from"], adam)


def _command_of(name: str) -> dict[str, Any] | None:
    """A bench meta for a results file written without one (`RESULTS_ONLY`): one H200."""
    if name not in RESULTS_ONLY:
        return None
    config = (DATA / RESULTS_ONLY[name]).relative_to(ROOT)
    return {"command": f"zerofit bench -c {config}", "env": {"gpu": "NVIDIA H200"}, "nproc": 1}


def corpus(data: Path = DATA) -> tuple[list[Run], list[tuple[str, str]]]:
    """(every run that can be forecast, deduplicated; every one left out with the reason)."""
    runs: list[Run] = []
    skipped: list[tuple[str, str]] = []
    for path in sorted(data.rglob("*.json")):
        found = json.loads(path.read_text())
        if path.name.endswith("-measured.json"):
            items = measure_runs(path)
        elif any(True for _ in bench_blocks(found)):
            items = bench_runs(path)
        else:
            continue
        for item in items:
            (runs if isinstance(item, Run) else skipped).append(item)  # type: ignore[arg-type]
    return dedupe(runs), skipped


def dedupe(runs: list[Run]) -> list[Run]:
    """One run per measurement: a bundle repeats its results files (same variant, same step
    time to the microsecond); the shortest key (the results file itself) is kept."""
    seen: dict[tuple[str, float], Run] = {}
    for run in sorted(runs, key=lambda r: (len(r.key), r.key)):
        ident = (run.key.split(":", 1)[1], round(run.step_s, 6))
        seen.setdefault(ident, run)
    return sorted(seen.values(), key=lambda r: r.key)

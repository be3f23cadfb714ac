"""test_doc_figures' checks for docs/benchmarks/2026-12-06-nvme-h100.md (issue 31: NVMe offload on
one H100): each cell from the run's results.json (`benchmarks/nvme_3b.sh`), the step time the
median of the steps after the warm-up ones, the errors forecast over measured."""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any

from doc_checks_speed2 import _load

DOC = "docs/benchmarks/2026-12-06-nvme-h100.md"
RESULTS = "2026-12-06-nvme-h100/results.json"
WARMUP, TOKENS = 2, 4 * 2 * 2048  # the call's WARMUP, and micro-batch x accumulation x seq
ROWS = {
    "cpu": ("optimizer in host RAM (`offload_optimizer: cpu`)", "optimizer in host RAM"),
    "nvme_optim": ("optimizer on NVMe (`offload_optimizer: nvme`)", "optimizer on NVMe"),
}


def _step(run: dict) -> float:
    summary = run["measured"]["summary"]
    assert run["measured"]["returncode"] == 0 and len(summary["step_times_s"]) == 5
    return statistics.median(summary["step_times_s"][WARMUP:])


def _moved(run: dict) -> float:
    m = run["measured"]
    return m["disk_read_bytes_per_step"] + m["disk_write_bytes_per_step"]


def _forecast_moved(run: dict) -> float:
    """The plan's disk bytes read and written per step (0 for a run without NVMe)."""
    shown = ((run["disk"] or {}).get("shown") or [{}])[0]
    keys = ("disk_read_bytes_per_step_per_node", "disk_write_bytes_per_step_per_node")
    return sum(shown.get(k, 0.0) for k in keys)


def _measured_row(run: dict) -> list:
    """Step s, tokens/s, GPU peak GiB, rank-0 RSS GiB, disk GB read and written per step."""
    s, m, step = run["measured"]["summary"], run["measured"], _step(run)
    gb = [m["disk_read_bytes_per_step"] / 1e9, m["disk_write_bytes_per_step"] / 1e9]
    return [step, TOKENS / step, s["mem_alloc_gib"], s["host_rss_gib"], *gb]


def nvme_table() -> dict[str, list]:
    """Per variant: step s, tokens/s, GPU peak GiB, rank-0 RSS GiB, disk GB read and written."""
    return {name: _measured_row(_load(RESULTS)[key]) for key, (name, _) in ROWS.items()}


def nvme_plan() -> dict[str, list]:
    """Per variant: the forecast's step s, GPU allocated GiB and disk GB, each with its error."""
    out = {}
    for key, (_, name) in ROWS.items():
        run = _load(RESULTS)[key]
        f, step, alloc = run["forecast"], _step(run), run["measured"]["summary"]["mem_alloc_gib"]
        disk = _forecast_moved(run)
        disk_err = "–" if not disk else 100 * (disk / _moved(run) - 1)
        out[name] = [
            f["step_time_s"],
            100 * (f["step_time_s"] / step - 1),
            f["peak_allocated_gib"],
            100 * (f["peak_allocated_gib"] / alloc - 1),
            disk / 1e9,
            disk_err,
        ]
    return out


def readme_nvme() -> list[str]:
    """The README's NVMe paragraph: the NVMe step beside the CPU-offload one, and the forecast."""
    runs = _load(RESULTS)
    cpu, nvme = runs["cpu"], runs["nvme_optim"]
    m, step, forecast = nvme["measured"], _step(nvme), _forecast_moved(nvme)
    return [
        f"a Llama model of {m['summary']['num_params'] / 1e9:.2f}B parameters",
        f"a step takes {step:.2f} s ({TOKENS / step:,.0f} tokens/s) and reads and writes "
        f"{m['disk_read_bytes_per_step'] / 1e9:.2f} GB",
        f"against {_step(cpu):.2f} s with it in host RAM, at the same "
        f"{m['summary']['mem_alloc_gib']:.2f} GiB GPU peak",
        f"planner's disk bytes per step are {100 * (forecast / _moved(nvme) - 1):+.3f}% off",
        f"its step time is {100 * (nvme['forecast']['step_time_s'] / step - 1):.1f}% high",
        *readme_nvme_both(),
    ]


def readme_nvme_both() -> list[str]:
    """The README's sentence on the run with the parameters on NVMe too."""
    rel, key = FINE["optimizer and parameters on NVMe (4)"]
    run = _load(rel)[key]
    step, moved, forecast = _step(run), _moved(run), _forecast_moved(run)
    return [
        f"a step takes {step:.2f} s and moves {moved / 1e9:.2f} GB",
        f"planner's bytes are {100 * (forecast / moved - 1):+.1f}% off and its step time "
        f"{100 * (run['forecast']['step_time_s'] / step - 1):.1f}% high",
    ]


FINE = {  # the second session: the row's label -> (its call's results.json, the variant)
    "optimizer on NVMe (3)": ("2026-12-06-nvme-h100/both4/results.json", "nvme_optim"),
    "optimizer and parameters on NVMe (4)": (
        "2026-12-06-nvme-h100/both5/results.json",
        "nvme_both",
    ),
}


def nvme_fine() -> dict[str, list]:
    """The 1e8 sub-group runs: as `nvme_table`, each from its own call's results.json."""
    out = {}
    for name, (rel, key) in FINE.items():
        run = _load(rel)[key]
        m = run["measured"]
        assert m["summary"]["world_size"] == 1 and "100000000" in m["args"]  # 1e8, one GPU
        out[name] = _measured_row(run)
    return out


def nvme_fine_plan() -> dict[str, list]:
    """Each 1e8 run against its own call's probe and forecast, and its RSS over the host one."""
    out = {}
    for name, (rel, key) in FINE.items():
        run = _load(rel)[key]
        f, disk, step = run["forecast"], run["disk"], _step(run)
        s = run["measured"]["summary"]
        out[name] = [
            [disk["nvme_read_gbs"], disk["nvme_write_gbs"]],
            f["step_time_s"],
            100 * (f["step_time_s"] / step - 1),
            f["peak_allocated_gib"],
            100 * (f["peak_allocated_gib"] / s["mem_alloc_gib"] - 1),
            100 * (_forecast_moved(run) / _moved(run) - 1),
            s["host_rss_gib"] - f["host_gib_per_gpu"],
        ]
    return out


README_NVME = ([RESULTS, FINE["optimizer and parameters on NVMe (4)"][0]], readme_nvme)
NVME: dict[str, tuple[list[str], Callable[[], Any], int]] = {
    "nvme-h100": ([RESULTS], nvme_table, 1),
    "nvme-h100-plan": ([RESULTS], nvme_plan, 1),
    "nvme-h100-fine": ([rel for rel, _ in FINE.values()], nvme_fine, 1),
    "nvme-h100-fine-plan": ([rel for rel, _ in FINE.values()], nvme_fine_plan, 1),
}

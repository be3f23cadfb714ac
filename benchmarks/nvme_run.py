"""One `zerofit train` with its process tree's disk traffic and host memory sampled (issue 31).

    python benchmarks/nvme_run.py OUT_JSON WARMUP_STEPS -- TRAIN_ARGS...

Starts `python -m zerofit.cli train TRAIN_ARGS` (they must set --log.run_dir and --log.every 1),
and every SAMPLE_S seconds reads, for the launcher and every process under it, /proc/PID/io
(read_bytes / write_bytes: what reached the storage layer, O_DIRECT aio included, the page cache
not) and VmRSS. Each time a step's record lands in the run's metrics.jsonl the tree's I/O
totals are noted; disk bytes per step are the difference between the record of step
WARMUP_STEPS and the last, over the steps between (start-up, the initial swap-out and the
checkpoints outside). The JSON also holds the run's summary.json (tokens/s, peak GPU memory per
rank 0) and the tree's peak summed RSS (every rank's host memory at once). Stdlib only.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

SAMPLE_S = 0.2


def _children() -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(entry.path, "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        out.setdefault(ppid, []).append(int(entry.name))
    return out


def _tree(root: int) -> list[int]:
    kids, todo, seen = _children(), [root], []
    while todo:
        pid = todo.pop()
        seen.append(pid)
        todo += kids.get(pid, [])
    return seen


def _io_and_rss(pid: int) -> tuple[int, int, int] | None:
    try:
        io = dict(line.split(": ") for line in Path(f"/proc/{pid}/io").read_text().splitlines())
        status = Path(f"/proc/{pid}/status").read_text().splitlines()
    except (OSError, ValueError):
        return None
    rss = next((int(s.split()[1]) * 1024 for s in status if s.startswith("VmRSS:")), 0)
    return int(io["read_bytes"]), int(io["write_bytes"]), rss


class Sampler:
    """The tree's cumulative I/O (processes that ended keep their last figures) and peak RSS."""

    def __init__(self, root: int) -> None:
        self.root, self.peak_rss = root, 0
        self.last: dict[int, tuple[int, int]] = {}

    def sample(self) -> tuple[int, int]:
        rss = 0
        for pid in _tree(self.root):
            got = _io_and_rss(pid)
            if got is not None:
                self.last[pid] = got[:2]
                rss += got[2]
        self.peak_rss = max(self.peak_rss, rss)
        return sum(r for r, _ in self.last.values()), sum(w for _, w in self.last.values())


def _steps(metrics: Path, seen: int) -> tuple[list[int], int]:
    if not metrics.exists():
        return [], seen
    lines = metrics.read_text().splitlines()
    new = [json.loads(x)["step"] for x in lines[seen:] if x.strip() and '"step"' in x]
    return new, len(lines)


def run(out: Path, warmup: int, args: list[str]) -> dict:
    run_dir = Path(args[args.index("--log.run_dir") + 1])
    start = time.time()
    proc = subprocess.Popen([sys.executable, "-m", "zerofit.cli", "train", *args], stderr=subprocess.PIPE, text=True)  # fmt: skip
    sampler, marks, seen = Sampler(proc.pid), [], 0
    while proc.poll() is None:
        read, write = sampler.sample()
        steps, seen = _steps(run_dir / "metrics.jsonl", seen)
        marks += [
            {"step": s, "t": time.time() - start, "read": read, "write": write} for s in steps
        ]
        time.sleep(SAMPLE_S)
    err = proc.stderr.read() if proc.stderr else ""
    summary_file = run_dir / "summary.json"
    summary = json.loads(summary_file.read_text()) if summary_file.exists() else {}
    after = [m for m in marks if m["step"] >= warmup]
    per_step = {}
    if len(after) >= 2:
        a, b, n = after[0], after[-1], after[-1]["step"] - after[0]["step"]
        per_step = {
            "disk_read_bytes_per_step": (b["read"] - a["read"]) / n,
            "disk_write_bytes_per_step": (b["write"] - a["write"]) / n,
            "seconds_per_step_wall": (b["t"] - a["t"]) / n,
            "steps_measured": n,
        }
    result = {
        "args": args,
        "returncode": proc.returncode,
        "stderr_tail": err[-3000:],
        "summary": summary,
        "host_peak_rss_bytes_all_ranks": sampler.peak_rss,
        **per_step,
        "io_marks": marks,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    return result


def main() -> int:
    if len(sys.argv) < 4 or sys.argv[3] != "--":
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        return 2
    r = run(Path(sys.argv[1]), int(sys.argv[2]), sys.argv[4:])
    s = r["summary"]
    print(
        f"{Path(sys.argv[1]).stem}: rc {r['returncode']}, {s.get('tokens_per_s', 0):,.0f} tokens/s, "
        f"GPU peak alloc {s.get('mem_alloc_gib', float('nan')):.2f} GiB, host peak (all ranks) "
        f"{r['host_peak_rss_bytes_all_ranks'] / 2**30:.2f} GiB, disk/step read "
        f"{r.get('disk_read_bytes_per_step', float('nan')) / 2**30:.2f} GiB, written "
        f"{r.get('disk_write_bytes_per_step', float('nan')) / 2**30:.2f} GiB"
    )
    return 0 if r["returncode"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())

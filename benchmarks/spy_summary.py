"""Summarise py-spy's collapsed stacks (benchmarks/host_probe.sh's spy.txt, benchmarks/ds_spy.sh's
*-spy.txt.gz): per thread of the training worker, the share of samples in each frame (self) and
under each function (inclusive).
  python benchmarks/spy_summary.py OUT/spy.txt [TOP]
"""

from __future__ import annotations

import gzip
import pathlib
import re
import sys
from collections import Counter, defaultdict

# a process frame: its quoted command line may itself hold ";" (the fork server's does)
PROCESS = re.compile(r'process (?P<pid>\d+):"(?P<cmd>.*?)";(?=process |thread |[^;]*\()')
WORKER = "zerofit/train/"  # a frame of the training loop: its process is a worker


def read(path: str) -> dict[str, list[tuple[list[str], int]]]:
    """Stacks per (process, thread), root first, of the worker processes only: those whose
    stacks hold a frame of zerofit's training loop (forked workers carry the fork server's
    command line, so it cannot tell them)."""
    out: dict[str, list[tuple[list[str], int]]] = defaultdict(list)
    name = pathlib.Path(path)
    text = gzip.decompress(name.read_bytes()).decode() if name.suffix == ".gz" else name.read_text()
    for line in text.splitlines():
        stack, _, count = line.rstrip("\n").rpartition(" ")
        procs = list(PROCESS.finditer(stack))
        if not procs:
            continue
        frames = stack[procs[-1].end() :].split(";")
        thread = frames[0] if frames and frames[0].startswith("thread") else "?"
        out[f"process {procs[-1]['pid']} {thread}"].append((frames[1:], int(count)))
    workers = {
        key.split(" thread")[0]
        for key, stacks in out.items()
        if any(WORKER in f for frames, _ in stacks for f in frames)
    }
    return {k: v for k, v in out.items() if k.split(" thread")[0] in workers}


def short(frame: str) -> str:
    return re.sub(r"\(.*site-packages/", "(", frame)


def summary(stacks: list[tuple[list[str], int]], top: int) -> None:
    total = sum(c for _, c in stacks)
    own: Counter[str] = Counter()
    under: Counter[str] = Counter()
    for frames, count in stacks:
        if frames:
            own[short(frames[-1])] += count
        for f in {short(f) for f in frames}:
            under[f] += count
    print(f"  {total} samples")
    print("  self:")
    for f, c in own.most_common(top):
        print(f"   {c / total:6.1%}  {f[:150]}")
    print("  inclusive:")
    for f, c in under.most_common(top * 2):
        print(f"   {c / total:6.1%}  {f[:150]}")


def main() -> None:
    top = int(sys.argv[2]) if len(sys.argv) > 2 else 25
    for thread, stacks in sorted(
        read(sys.argv[1]).items(), key=lambda kv: -sum(c for _, c in kv[1])
    ):
        print(thread)
        summary(stacks, top)


if __name__ == "__main__":
    main()

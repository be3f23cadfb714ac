"""Summarise py-spy's collapsed stacks (benchmarks/host_probe.sh's spy.txt): per thread of the
training worker, the share of samples in each frame (self) and under each function (inclusive).
  python benchmarks/spy_summary.py OUT/spy.txt [TOP]
"""

from __future__ import annotations

import pathlib
import re
import sys
from collections import Counter, defaultdict

PROCESS = re.compile(r'^process \d+:"(?P<cmd>[^"]*)"$')


def read(path: str) -> dict[str, list[tuple[list[str], int]]]:
    """Stacks per (process, thread), root first, of the worker processes only."""
    out: dict[str, list[tuple[list[str], int]]] = defaultdict(list)
    for line in pathlib.Path(path).read_text().splitlines():
        stack, _, count = line.rstrip("\n").rpartition(" ")
        frames = stack.split(";")
        procs = [f for f in frames if PROCESS.match(f)]
        if not procs or "worker" not in procs[-1]:
            continue
        rest = frames[frames.index(procs[-1]) + 1 :]
        thread = rest[0] if rest and rest[0].startswith("thread") else "?"
        out[f"{procs[-1][:40]} {thread}"].append((rest[1:], int(count)))
    return out


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

"""What a trustworthy checkpoint costs: manifest verification (cold and warm page cache), the
SHA-256 rate, and a Hugging Face export's time and peak host memory, on one real checkpoint.

Usage: python benchmarks/checkpoint_cost.py CKPT_DIR RUN_DIR OUT_JSON [--threads N ...]
Cold reads: each file is dropped from the page cache first (posix_fadvise DONTNEED after fsync),
which needs no privileges.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

from zerofit.checkpoint import manifest, verify


def drop_cache(root: Path) -> None:
    for rel in manifest.list_files(root) + [manifest.MANIFEST]:
        fd = os.open(root / rel, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def timed_verify(ckpt: Path, threads: int | None, cold: bool) -> float:
    if cold:
        drop_cache(ckpt)
    t = time.perf_counter()
    manifest.verify(ckpt, threads)
    return time.perf_counter() - t


def export_child(ckpt: str, run: str, out: str) -> None:
    from zerofit.export.run import export_checkpoint

    t = time.perf_counter()
    s = export_checkpoint(Path(ckpt), Path(run), Path(out), "bf16")
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(json.dumps({"export_s": time.perf_counter() - t, "peak_rss": peak, **s}, default=str))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("ckpt")
    p.add_argument("run")
    p.add_argument("out")
    p.add_argument("--threads", type=int, nargs="*", default=[1, 4, 16])
    a = p.parse_args()
    ckpt = Path(a.ckpt)
    files = json.loads((ckpt / manifest.MANIFEST).read_text())["files"]
    size = sum(f["size"] for f in files.values())
    res: dict = {"checkpoint": str(ckpt), "bytes": size, "files": len(files), "verify": []}
    verify(ckpt)  # warm the import path once
    for threads in a.threads:
        for cold in (True, False):
            s = timed_verify(ckpt, threads, cold)
            res["verify"].append({"threads": threads, "cold": cold, "s": s, "GBps": size / s / 1e9})
            print(f"verify {size / 1e9:.2f} GB, {threads} threads, {'cold' if cold else 'warm'}: "
                  f"{s:.2f} s = {size / s / 1e9:.2f} GB/s", flush=True)  # fmt: skip
    drop_cache(ckpt)
    out = Path(a.out).with_suffix("") / "hf"
    proc = subprocess.run(
        [sys.executable, __file__, "--export-child", str(ckpt), a.run, str(out)],
        capture_output=True,
        text=True,
    )
    if proc.returncode == 0:
        res["export"] = json.loads(proc.stdout.strip().splitlines()[-1])
        e = res["export"]
        print(f"export bf16: {e['export_s']:.1f} s, peak RSS {e['peak_rss'] / 2**30:.2f} GiB, "
              f"{e['total_bytes'] / 1e9:.2f} GB in {e['shards']} shard(s)")  # fmt: skip
    else:
        res["export_error"] = proc.stderr[-2000:]
        print(proc.stderr[-2000:])
    Path(a.out).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    if sys.argv[1:2] == ["--export-child"]:
        export_child(*sys.argv[2:5])
    else:
        main()

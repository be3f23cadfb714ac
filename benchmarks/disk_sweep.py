"""Issue 31: how fast the NVMe disk moves bytes under different access patterns, beside DeepSpeed's
own async_io handle (the path its swappers take), to see which one `zerofit plan --nvme-probe`
should time. Usage (GPU machine, async_io built): python benchmarks/disk_sweep.py DIR OUT.json
Each row: GB/s written (O_DIRECT, fsync'd) and read back, for SIZE bytes in BLOCK requests with
DEPTH in flight (threads), and DeepSpeed's aio_handle (1 MiB blocks, queue depth 8, its defaults)
on a pinned tensor of SIZE bytes, synchronous and with a read and a write in flight together."""

from __future__ import annotations

import json
import mmap
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor


def threads(path: str, size: int, block: int, depth: int) -> dict:
    blocks = size // block

    def run(write: bool) -> float:
        fd = os.open(path, (os.O_WRONLY | os.O_CREAT if write else os.O_RDONLY) | os.O_DIRECT)

        def lane(first: int) -> None:
            buf = mmap.mmap(-1, block)
            if write:
                buf.write(os.urandom(block))
            for i in range(first, blocks, depth):
                (os.pwrite(fd, buf, i * block) if write else os.preadv(fd, [buf], i * block))
            buf.close()

        t = time.perf_counter()
        with ThreadPoolExecutor(depth) as pool:
            list(pool.map(lane, range(depth)))
        if write:
            os.fsync(fd)
        os.close(fd)
        return blocks * block / (time.perf_counter() - t) / 1e9

    w = run(True)
    r = run(False)
    os.unlink(path)
    return {"how": "threads", "size": size, "block": block, "depth": depth, "write": w, "read": r}


def deepspeed_aio(folder: str, size: int) -> list[dict]:
    import torch
    from deepspeed.ops.op_builder import AsyncIOBuilder

    h = AsyncIOBuilder().load().aio_handle(2**20, 8, False, True, 1)
    a = torch.empty(size // 4, dtype=torch.float32).pin_memory()
    b = torch.empty(size // 4, dtype=torch.float32).pin_memory()
    a.uniform_()
    b.uniform_()
    fa, fb = os.path.join(folder, "a.bin"), os.path.join(folder, "b.bin")
    t = time.perf_counter()
    h.sync_pwrite(a, fa)
    w = size / (time.perf_counter() - t) / 1e9
    t = time.perf_counter()
    h.sync_pread(a, fa)
    r = size / (time.perf_counter() - t) / 1e9
    h.sync_pwrite(b, fb)
    # a read and a write in flight at once (as a swapper reading one sub-group while writing another)
    t = time.perf_counter()
    h.async_pread(a, fa)
    h.async_pwrite(b, fb + ".2")
    h.wait()
    both = 2 * size / (time.perf_counter() - t) / 1e9
    for f in (fa, fb, fb + ".2"):
        os.unlink(f)
    return [
        {
            "how": "deepspeed aio_handle",
            "size": size,
            "write": w,
            "read": r,
            "read+write together, GB/s moved": both,
        }
    ]


def main() -> None:
    folder, out = sys.argv[1], sys.argv[2]
    os.makedirs(folder, exist_ok=True)
    rows = []
    path = os.path.join(folder, "probe.bin")
    for size, block, depth in [
        (2**28, 2**20, 8),
        (2**28, 2**20, 1),
        (2**31, 2**20, 8),
        (2**31, 2**20, 32),
        (2**31, 2**23, 8),
        (2**33, 2**20, 8),
    ]:
        rows.append(threads(path, size, block, depth))
        print(json.dumps(rows[-1]), flush=True)
    for size in (2**30, 2**32):
        try:
            rows += deepspeed_aio(folder, size)
        except Exception as e:  # noqa: BLE001  (recorded: the sweep still reports the rest)
            rows.append({"how": "deepspeed aio_handle", "error": repr(e)})
        print(json.dumps(rows[-1]), flush=True)
    rows += [threads(path, 2**28, 2**20, 8)]  # the probe again, last
    print(json.dumps(rows[-1]), flush=True)
    with open(out, "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()

"""Every checkpoint ends with ``manifest.json``: each file's size and SHA-256, written last.

A file's SHA-256 is taken per 256 MiB block (``sha256`` for a file of one block, which
``sha256sum`` reproduces; ``blocks`` for larger ones, each ``dd bs=256M skip=i count=1 | sha256sum``)
so one big shard hashes on many cores: one DCP file per rank is the norm, 18 GB for a 1.5B model.
The save hashes in parallel (files dealt round-robin to the ranks, each rank hashing its blocks on
a thread pool, streaming), then rank 0 writes the manifest and renames ``step_N.tmp`` to
``step_N``: the rename stays the commit point. ``verify`` re-hashes the same way on one host before
anything is loaded, and names the first file that differs. Before that, `check_tree` refuses a
checkpoint holding anything but its own folders and regular files: a symbolic link anywhere (a
folder's included: the manifest would never see the files behind it), a FIFO, a socket, a device.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from zerofit.errors import UnsafeCheckpointError

MANIFEST = "manifest.json"
BLOCK = 256 * 2**20  # bytes hashed as one unit (one thread)
_READ = 8 * 2**20
VERSION = 1


def list_files(root: Path) -> list[str]:
    """Every file under ``root`` (relative POSIX paths, sorted), the manifest itself excluded."""
    out = []
    for dirpath, _, names in os.walk(root):
        for n in names:
            rel = Path(dirpath, n).relative_to(root).as_posix()
            if rel != MANIFEST:
                out.append(rel)
    return sorted(out)


def sha256_range(path: Path, start: int, length: int) -> str:
    h = hashlib.sha256()
    with open(path, "rb", buffering=0) as f:
        f.seek(start)
        left = length
        while left > 0 and (chunk := f.read(min(_READ, left))):
            h.update(chunk)  # releases the GIL: the thread pool hashes blocks in parallel
            left -= len(chunk)
    return h.hexdigest()


def sha256_file(path: Path) -> tuple[int, str]:
    """(size, SHA-256) of a whole file, as ``sha256sum`` prints it."""
    size = path.stat().st_size
    return size, sha256_range(path, 0, size)


def hash_files(root: Path, rels: Iterable[str], threads: int | None = None) -> dict[str, dict]:
    """Manifest entries for ``rels``: size and SHA-256, per block for files over one block."""
    sizes = {r: (root / r).stat().st_size for r in rels}
    tasks = [(r, off) for r, n in sizes.items() for off in range(0, max(n, 1), BLOCK)]
    tasks.sort(key=lambda t: -min(BLOCK, sizes[t[0]] - t[1]))  # big blocks first
    workers = max(1, min(threads or min(16, os.cpu_count() or 1), len(tasks)))
    with ThreadPoolExecutor(max_workers=workers) as pool:
        sums = pool.map(lambda t: sha256_range(root / t[0], t[1], BLOCK), tasks)
        by_block = dict(zip(tasks, sums, strict=True))
    out: dict[str, dict] = {}
    for r, n in sizes.items():
        blocks = [by_block[(r, off)] for off in range(0, max(n, 1), BLOCK)]
        entry: dict = {"size": n}
        if len(blocks) == 1:
            entry["sha256"] = blocks[0]
        else:
            entry["blocks"] = blocks
        out[r] = entry
    return out


def write_manifest(root: Path, files: dict[str, dict], step: int) -> None:
    body = {"version": VERSION, "block": BLOCK, "step": step, "files": dict(sorted(files.items()))}
    tmp = root / (MANIFEST + ".part")
    with open(tmp, "w") as f:
        json.dump(body, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    tmp.rename(root / MANIFEST)


def read_manifest(ckpt: Path) -> dict[str, dict]:
    path = ckpt / MANIFEST
    if not path.is_file():
        raise UnsafeCheckpointError(f"checkpoint {ckpt} has no {MANIFEST} (incomplete, or damaged)")
    try:
        body = json.loads(path.read_text())
        files = body["files"]
        if body.get("block", BLOCK) != BLOCK:
            raise ValueError(f"its hash block is {body.get('block')} bytes, not {BLOCK}")
        if not isinstance(files, dict) or not all(_entry_ok(v) for v in files.values()):
            raise ValueError("bad file entries")
    except (ValueError, KeyError, TypeError, UnicodeDecodeError) as e:
        raise UnsafeCheckpointError(
            f"checkpoint {ckpt}: {MANIFEST} is not a valid manifest ({e})"
        ) from None
    for rel in files:
        if rel.startswith("/") or ".." in Path(rel).parts:
            raise UnsafeCheckpointError(
                f"checkpoint {ckpt}: {MANIFEST} names a path outside it: {rel!r}"
            )
    return files


def _entry_ok(v: object) -> bool:
    if not isinstance(v, dict) or not isinstance(v.get("size"), int):
        return False
    blocks = v.get("blocks", [v.get("sha256")])
    return isinstance(blocks, list) and all(isinstance(b, str) for b in blocks)


def check_tree(ckpt: Path) -> None:
    """Raise UnsafeCheckpointError naming the first symbolic link (file or folder, the checkpoint's
    own folder included) or other non-regular entry under ``ckpt``: what the manifest cannot vouch
    for is never followed or read."""
    if ckpt.is_symlink():
        raise UnsafeCheckpointError(
            f"checkpoint {ckpt} is a symbolic link (name the folder it points to, if you trust it)"
        )
    for dirpath, dirs, names in os.walk(ckpt):  # a linked folder is listed, never entered
        dirs.sort()
        for name in sorted([*dirs, *names]):
            path = Path(dirpath, name)
            rel = path.relative_to(ckpt).as_posix()
            try:
                mode = os.lstat(path).st_mode
            except OSError as e:
                raise UnsafeCheckpointError(
                    f"checkpoint {ckpt}: {rel} cannot be read ({e.strerror or e})"
                ) from None
            if stat.S_ISLNK(mode):
                raise UnsafeCheckpointError(
                    f"checkpoint {ckpt}: {rel} is a symbolic link (a checkpoint holds its own "
                    "files only)"
                )
            if not (stat.S_ISDIR(mode) or stat.S_ISREG(mode)):
                raise UnsafeCheckpointError(f"checkpoint {ckpt}: {rel} is not a regular file")


def verify(ckpt: Path, threads: int | None = None) -> dict[str, dict]:
    """Raise UnsafeCheckpointError naming the first link or special file (`check_tree`), then the
    first missing, extra, resized or altered file. Returns the manifest's entries (every file)."""
    check_tree(ckpt)
    files = read_manifest(ckpt)
    present = set(list_files(ckpt))
    for rel in sorted(files):
        if rel not in present:
            raise UnsafeCheckpointError(f"checkpoint {ckpt}: {rel} is missing")
        if (ckpt / rel).is_symlink() or not (ckpt / rel).is_file():
            raise UnsafeCheckpointError(f"checkpoint {ckpt}: {rel} is not a regular file")
        size = (ckpt / rel).stat().st_size
        if size != files[rel]["size"]:
            raise UnsafeCheckpointError(
                f"checkpoint {ckpt}: {rel} is {size} bytes, the manifest says {files[rel]['size']}"
            )
    extra = sorted(present - set(files))
    if extra:
        raise UnsafeCheckpointError(f"checkpoint {ckpt}: {extra[0]} is not in the manifest")
    sums = hash_files(ckpt, sorted(files), threads)
    for rel in sorted(files):
        if sums[rel] != files[rel]:
            raise UnsafeCheckpointError(
                f"checkpoint {ckpt}: {rel} does not match its SHA-256 in the manifest"
            )
    return files

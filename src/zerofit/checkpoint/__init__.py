"""Atomic, verified, engine-portable checkpoints.

Layout of a complete checkpoint ``step_00000100/`` (written as ``step_00000100.tmp/``, renamed
when complete: the rename is the commit point):

    model/          the engine's own files (DCP for ddp/fsdp, DeepSpeed's for deepspeed)
    rank{r}.json    per-rank state: data position, RNG streams, loss scaler (JSON, no pickle)
    meta.json       step, engine, format, layout, model fingerprint, batch layout, schedule
    manifest.json   every other file's size and SHA-256; written last

Resume verifies the manifest before reading anything, then loads through the engine: its own
format directly, or any other engine's through the engine-neutral view (``neutral.py``).
"""

from __future__ import annotations

import itertools
import json
import os
import re
import shutil
from collections.abc import Collection
from pathlib import Path
from typing import Any

from zerofit.backends import checkpoint_files
from zerofit.checkpoint import manifest, rank_state
from zerofit.errors import DamagedFile, UnsafeCheckpointError, UserError
from zerofit.faults.report import describe_os_error, find_os_error

_STEP_DIR = re.compile(r"^step_(\d{8})$")
__all__ = [
    "UnsafeCheckpointError",
    "checkpoint_root",
    "complete_checkpoints",
    "latest_checkpoint",
    "read_meta",
    "save_checkpoint",
    "select_checkpoint",
    "step_dir",
]


def checkpoint_root(checkpoint_dir: str | None, run_dir: Path) -> Path:
    """Where a run's checkpoints live: ``checkpoint.dir``, else ``<run_dir>/checkpoints``."""
    return Path(checkpoint_dir) if checkpoint_dir else run_dir / "checkpoints"


def step_dir(root: Path, step: int) -> Path:
    return root / f"step_{step:08d}"


def step_dirs(root: Path) -> list[Path]:
    """Committed (renamed) checkpoint directories under ``root``, oldest first; not verified."""
    if not root.is_dir():
        return []
    return sorted(
        (p for p in root.iterdir() if _STEP_DIR.match(p.name) and p.is_dir()), key=lambda p: p.name
    )


def complete_checkpoints(root: Path) -> list[Path]:
    """Committed checkpoints that carry a manifest (cheap check; ``verify`` is the real one)."""
    return [p for p in step_dirs(root) if (p / manifest.MANIFEST).is_file()]


def latest_checkpoint(root: Path) -> Path | None:
    done = complete_checkpoints(root)
    return done[-1] if done else None


def read_meta(ckpt: Path) -> dict[str, Any]:
    path = ckpt / "meta.json"
    try:
        meta = json.loads(path.read_text())
    except FileNotFoundError:
        raise UnsafeCheckpointError(f"checkpoint {ckpt} has no meta.json") from None
    except (OSError, ValueError, UnicodeDecodeError):
        raise UnsafeCheckpointError(f"checkpoint {ckpt}: meta.json is not valid JSON") from None
    if not isinstance(meta, dict):
        raise UnsafeCheckpointError(f"checkpoint {ckpt}: meta.json is not a JSON object")
    missing = [k for k in ("step", "backend", "format", "world_size") if k not in meta]
    if missing:
        raise UnsafeCheckpointError(f"checkpoint {ckpt}: meta.json lacks {', '.join(missing)}")
    for key in ("step", "world_size"):
        if not isinstance(meta[key], int) or isinstance(meta[key], bool) or meta[key] < 0:
            raise UnsafeCheckpointError(
                f"checkpoint {ckpt}: meta.json has a bad {key}: {meta[key]!r}"
            )
    match = _STEP_DIR.match(ckpt.name)
    if match and int(match.group(1)) != meta["step"]:
        raise UnsafeCheckpointError(
            f"checkpoint {ckpt}: meta.json says step {meta['step']}, the directory step {int(match.group(1))}"
        )
    return meta


def verify(ckpt: Path) -> dict[str, Any]:
    """Manifest first (no link, every byte), then meta.json, then that every file the engine
    reads back is there (`check_layout`); returns the meta."""
    files = manifest.verify(ckpt)
    meta = read_meta(ckpt)
    check_layout(ckpt, meta, files)
    return meta


def check_layout(ckpt: Path, meta: dict[str, Any], files: Collection[str]) -> None:
    """UnsafeCheckpointError naming the first file a checkpoint of this meta must hold that
    ``files`` (its manifest, verified) lacks: meta.json, each rank's state, and the model files
    its format's engine writes (`zerofit.backends.checkpoint_files`)."""
    world, fmt = meta["world_size"], meta["format"]
    if world < 1:
        raise UnsafeCheckpointError(f"checkpoint {ckpt}: meta.json has a bad world_size: {world}")
    try:
        model = checkpoint_files(meta)
        if model is None:
            raise UnsafeCheckpointError(
                f"checkpoint {ckpt}: meta.json has an unknown format {fmt!r}"
            )
        ranks = ((f"rank{r}.json",) for r in range(world))
        for names in itertools.chain(
            [("meta.json",)], ranks, (tuple(f"model/{n}" for n in m) for m in model)
        ):
            if not any(n in files for n in names):
                raise UnsafeCheckpointError(
                    f"checkpoint {ckpt}: {names[0]} is missing ({fmt} on {world} rank(s) writes it)"
                )
    except (ValueError, KeyError, TypeError) as e:
        raise UnsafeCheckpointError(
            f"checkpoint {ckpt}: meta.json's layout is not one of format {fmt!r} ({e})"
        ) from None


def select_checkpoint(root: Path) -> tuple[Path, dict[str, Any], list[str]]:
    """The newest checkpoint under ``root`` that verifies, its meta, and one line per newer
    checkpoint that was skipped (damaged or incomplete). UserError when none verifies."""
    skipped: list[str] = []
    committed = step_dirs(root)
    newest = committed[-1].name if committed else ""
    for tmp in sorted(root.glob("step_*.tmp")) if root.is_dir() else []:
        if tmp.name[: -len(".tmp")] > newest:
            skipped.append(
                f"ignoring {tmp.name}: a save that never finished (it is not a checkpoint)"
            )
    for ckpt in reversed(committed):
        try:
            return ckpt, verify(ckpt), skipped
        except UserError as e:  # its line names the checkpoint in full: here, by its name
            why = str(e).removeprefix(f"checkpoint {ckpt}: ").removeprefix(f"checkpoint {ckpt} ")
            skipped.append(f"skipping damaged checkpoint {ckpt.name}: {why}")
    if skipped:
        raise UserError(f"--resume: no checkpoint under {root} verifies (newest: {skipped[0]})")
    raise UserError(f"--resume: no complete checkpoint under {root}")


def write_errors() -> tuple[type[BaseException], ...]:
    """What a failed write raises: OSError, or DCP's CheckpointException wrapping one per rank."""
    # local: DCP takes ~1 s to import; the launcher reads checkpoints and never writes one
    from torch.distributed.checkpoint.api import CheckpointException

    return (OSError, CheckpointException)


class SaveFailed(Exception):
    """A checkpoint could not be written; ``str(e)`` says why (errno and path where known)."""


def write_failure(exc: BaseException, where: Path) -> str:
    """Why a write under ``where`` failed. DCP's writer (torch's zip serializer) reports a short
    write as "unexpected pos" without the errno; then the filesystem itself is asked."""
    found = find_os_error(exc)
    if found is not None:
        return describe_os_error(exc) + ("" if found.filename else f" under {where}")
    probe = where if where.exists() else where.parent
    try:
        st = os.statvfs(probe)
        free = st.f_frsize * (st.f_bfree if os.geteuid() == 0 else st.f_bavail)
        if free < 16 * 2**20:
            return f"No space left on device (ENOSPC): {free / 2**20:.1f} MiB free under {probe}"
        test = probe / f".zerofit-write-test-{os.getpid()}"
        test.write_bytes(b"ok")
        test.unlink()
    except OSError as e:
        return describe_os_error(e)
    return f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"


def save_checkpoint(
    backend: Any,
    root: Path,
    step: int,
    rank_data: dict[str, Any],
    meta: dict[str, Any],
    keep_last: int,
) -> Path:
    """Collective: every rank calls it. Returns the final directory.

    A write that fails (``write_errors()``: a full disk, no permission, an I/O error) raises on the
    rank that met it; rank 0 removes the partial ``.tmp`` directory, so the previous checkpoint
    stays the newest complete one."""
    final = step_dir(root, step)
    tmp = final.with_name(final.name + ".tmp")
    try:
        _save(backend, root, step, rank_data, meta, keep_last, final, tmp)
    except write_errors() as e:
        reason = write_failure(e, tmp)  # before the cleanup frees the space it ran out of
        if backend.ctx.is_main:
            shutil.rmtree(tmp, ignore_errors=True)
        raise SaveFailed(reason) from e
    return final


def _save(
    backend: Any,
    root: Path,
    step: int,
    rank_data: dict[str, Any],
    meta: dict[str, Any],
    keep_last: int,
    final: Path,
    tmp: Path,
) -> None:
    ctx = backend.ctx
    if ctx.is_main:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    ctx.barrier()
    backend.save(tmp / "model")
    rank_state.write(tmp / f"rank{ctx.rank}.json", rank_data)
    if ctx.is_main:
        (tmp / "meta.json").write_text(json.dumps({**meta, "step": step}, indent=1))
    ctx.barrier()
    files = ctx.broadcast_object(manifest.list_files(tmp) if ctx.is_main else None)
    mine = manifest.hash_files(tmp, files[ctx.rank :: ctx.world_size])  # type: ignore[index]
    sums = ctx.gather_object(mine)
    if ctx.is_main:
        manifest.write_manifest(tmp, {k: v for part in sums for k, v in part.items()}, step)
        if final.exists():  # the same step saved again (a re-run after resume)
            shutil.rmtree(final)
        tmp.rename(final)
        for old in complete_checkpoints(root)[:-keep_last]:
            shutil.rmtree(old, ignore_errors=True)
    ctx.barrier()


def load_rank_state(
    ckpt: Path, meta: dict[str, Any], rank: int, world_size: int
) -> tuple[dict[str, Any], bool]:
    """This rank's saved state, and whether it is its own (same world size) or rank 0's."""
    own = meta["world_size"] == world_size
    try:
        return rank_state.read(ckpt / f"rank{rank if own else 0}.json"), own
    except DamagedFile as e:
        raise UnsafeCheckpointError(e.line(ckpt)) from None

"""Atomic, sharded checkpoints: `step_00000100.tmp/` is written, then renamed to `step_00000100/`.

Layout of a complete checkpoint directory:
    model/        the engine's sharded model+optimizer state (DCP for ddp/fsdp)
    rank{r}.pt    per-rank state: RNG, data position, loss scaler
    meta.json     written last, before the rename: step, model fingerprint, world size
A directory without meta.json, or still named *.tmp, is never picked for resume.
"""

from __future__ import annotations

import json
import random
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

from zerofit.errors import UserError

_STEP_DIR = re.compile(r"^step_(\d{8})$")


def step_dir(root: Path, step: int) -> Path:
    return root / f"step_{step:08d}"


def complete_checkpoints(root: Path) -> list[Path]:
    """Complete checkpoints under `root`, oldest first."""
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if _STEP_DIR.match(p.name) and (p / "meta.json").is_file()]
    return sorted(found, key=lambda p: p.name)


def latest_checkpoint(root: Path) -> Path | None:
    done = complete_checkpoints(root)
    return done[-1] if done else None


def read_meta(ckpt: Path) -> dict[str, Any]:
    meta = ckpt / "meta.json"
    if not meta.is_file():
        raise UserError(f"{ckpt} is not a complete zerofit checkpoint (no meta.json)")
    return json.loads(meta.read_text())


def check_compatible(ckpt: Path, fingerprint: dict[str, Any], backend: str) -> None:
    """Refuse a checkpoint written for another model or engine, naming the first difference."""
    meta = read_meta(ckpt)
    if meta.get("backend") != backend:
        raise UserError(
            f"checkpoint {ckpt} was written by backend '{meta.get('backend')}', this run uses '{backend}'"
        )
    saved = meta.get("fingerprint", {})
    for key in sorted(set(saved) | set(fingerprint)):
        if saved.get(key) != fingerprint.get(key):
            raise UserError(
                f"checkpoint {ckpt} is for a different model or config: {key} is "
                f"{saved.get(key)!r} there, {fingerprint.get(key)!r} here"
            )


def rng_state() -> dict[str, Any]:
    state = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def save_checkpoint(
    backend: Any,
    root: Path,
    step: int,
    rank_state: dict[str, Any],
    meta: dict[str, Any],
    keep_last: int,
) -> Path:
    """Collective: every rank calls it. Returns the final directory."""
    ctx = backend.ctx
    final = step_dir(root, step)
    tmp = final.with_name(final.name + ".tmp")
    if ctx.is_main:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    ctx.barrier()
    backend.save(tmp / "model")
    torch.save(rank_state, tmp / f"rank{ctx.rank}.pt")
    ctx.barrier()
    if ctx.is_main:
        (tmp / "meta.json").write_text(json.dumps({**meta, "step": step}, indent=1))
        if (
            final.exists()
        ):  # same step saved again (e.g. re-run after resume): replace atomically-ish
            shutil.rmtree(final)
        tmp.rename(final)
        for old in complete_checkpoints(root)[:-keep_last]:
            shutil.rmtree(old, ignore_errors=True)
    ctx.barrier()
    return final


def load_checkpoint(backend: Any, ckpt: Path) -> tuple[int, dict[str, Any]]:
    """Restore engine state; returns (step, this rank's saved state)."""
    meta = read_meta(ckpt)
    rank_file = ckpt / f"rank{backend.ctx.rank}.pt"
    if not rank_file.is_file():
        raise UserError(
            f"checkpoint {ckpt} has no state for rank {backend.ctx.rank} (saved with {meta.get('world_size')} ranks)"
        )
    backend.load(ckpt / "model")
    return int(meta["step"]), torch.load(rank_file, weights_only=False)

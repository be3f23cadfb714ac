"""Per-rank state (RNG streams, data position, loss scaler) as JSON: nothing to unpickle.

Tensors (torch's RNG states) are stored as base64 bytes; Python's and NumPy's Mersenne-Twister
states as lists of integers.
"""

from __future__ import annotations

import base64
import json
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch

from zerofit.errors import DamagedFile


def _b64(t: torch.Tensor) -> str:
    return base64.b64encode(t.numpy().tobytes()).decode("ascii")


def _unb64(s: str) -> torch.Tensor:
    return torch.frombuffer(
        bytearray(base64.b64decode(s, validate=True)), dtype=torch.uint8
    ).clone()


def rng_state() -> dict[str, Any]:
    version, words, gauss = random.getstate()
    kind, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)  # type: ignore[misc]
    state: dict[str, Any] = {
        "python": [version, list(words), gauss],
        "numpy": [kind, keys.tolist(), int(pos), int(has_gauss), float(cached)],
        "torch": _b64(torch.get_rng_state()),
    }
    if torch.cuda.is_available():
        state["cuda"] = _b64(torch.cuda.get_rng_state())
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    version, words, gauss = state["python"]
    random.setstate((int(version), tuple(int(w) for w in words), gauss))
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, np.array(keys, dtype=np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(_unb64(state["torch"]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(_unb64(state["cuda"]))


def write(path: Path, state: dict[str, Any]) -> None:
    path.write_text(json.dumps(state))


def read(path: Path) -> dict[str, Any]:
    try:
        state = json.loads(path.read_text())
    except OSError as e:
        raise DamagedFile(path, f"could not be read: {e.strerror or e}") from None
    except (ValueError, UnicodeDecodeError):
        raise DamagedFile(path, "is not valid JSON") from None
    if not isinstance(state, dict) or not {"data", "rng", "backend"} <= set(state):
        raise DamagedFile(path, "lacks data, rng or backend state")
    return state

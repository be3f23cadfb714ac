"""What crosses the launch -> worker boundary: the launcher's options and the prepared run (no
torch here: `zerofit.commands.train` and `zerofit.train.worker` import it at start-up)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from zerofit.config.schema import Config


@dataclass
class LaunchOptions:
    nnodes: int = 1
    node_rank: int = 0
    rdzv_endpoint: str | None = None
    rdzv_backend: str = "static"
    resume: str | None = None  # None: fresh run; "latest": newest checkpoint; or a path


@dataclass
class PreparedRun:
    cfg: Config
    run_dir: Path
    config_file: Path
    resume_from: Path | None

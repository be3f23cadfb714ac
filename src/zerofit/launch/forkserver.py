"""The launcher's fork server: the workers start as forks of one process that imported torch and the
worker's modules once, while the launcher was still preparing the run.

A worker started as a fresh interpreter spends ~2.5 CPU-s importing torch, its distributed
checkpoint and Dynamo (FSDP2 imports it) before its first line of training, every rank and every
restart, after the launcher has spent ~1.5 s importing torch itself. The server is started first
thing (before the launcher imports torch), so the two import side by side; each worker is then a
fork of a process that has run no torch op, holds no CUDA context and no thread.

What a fork does not get from a fresh start is restored by the rank's supervisor
(`zerofit.train.forked`): the launcher's environment at spawn time, its own session (a second stop
signal kills the rank's whole process group), the thread count the agent sets. The server is a
child of the launcher and ends when the launcher ends (multiprocessing's forkserver reads the
launcher's end of a pipe); a supervisor dies with the server and a worker with its supervisor
(`zerofit.faults.signals.die_with_parent`), so a launcher killed outright still takes its workers
with it.

DeepSpeed is never preloaded: importing it asks the CUDA driver which accelerator it runs on, and a
process that has initialised CUDA cannot pass a usable GPU to a fork.
"""

from __future__ import annotations

import atexit
import contextlib
import multiprocessing
import os
import signal
from multiprocessing import forkserver, resource_tracker
from pathlib import Path

# What every worker imports before it trains (torch-free names: nothing is imported here)
PRELOAD = (
    "torch",
    "torch.distributed.checkpoint",
    "torch._dynamo",  # FSDP2 imports it at the first fully_shard, every rank
    "zerofit.train.forked",
    "zerofit.train.run",
    "zerofit.backends.fsdp.runtime",
    "zerofit.backends.ddp.runtime",
)
# A Hugging Face model's workers also import transformers (`zerofit.models.hf_preload`), preloaded
# only for such a run (~3 s more in the server, which every other run would wait for) and only
# where no NVIDIA device is present: as with DeepSpeed, a library that asked CUDA anything at
# import would leave the forks no usable GPU, and transformers' import is not checked for that
HF_PRELOAD = ("zerofit.models.hf_preload",)
METHOD = "forkserver"


def preload_for(hf_model: bool) -> tuple[str, ...]:
    """What a run's workers import before it trains: `PRELOAD`, and with a Hugging Face model
    (`hf_model`) on a machine without NVIDIA devices, `HF_PRELOAD`."""
    gpu = any(Path("/dev").glob("nvidia[0-9]*"))
    return PRELOAD + (HF_PRELOAD if hf_model and not gpu else ())


def start(preload: tuple[str, ...] = PRELOAD) -> None:
    """Start this process's fork server now, importing `preload` while the caller goes on
    (multiprocessing skips a module that cannot be imported). It is stopped when this process
    exits: a launcher that refuses its input (exit 2) leaves no server importing on (it would
    read the end of its pipe only once its imports were done)."""
    if _server_pid() is None:
        multiprocessing.set_forkserver_preload(list(preload))
        # One OpenMP thread in the server: torch's import starts an OpenMP pool otherwise, and a
        # fork of a process whose pool exists hangs at its first parallel op (libgomp); each
        # worker sets its own count (`zerofit.train.forked`)
        saved = os.environ.get("OMP_NUM_THREADS")
        os.environ["OMP_NUM_THREADS"] = "1"
        try:
            forkserver.ensure_running()
        finally:
            if saved is None:
                del os.environ["OMP_NUM_THREADS"]
            else:
                os.environ["OMP_NUM_THREADS"] = saved
        atexit.register(_stop, _server_pid())


def _server_pid() -> int | None:
    return getattr(forkserver._forkserver, "_forkserver_pid", None)


def _stop(pid: int | None) -> None:
    if pid is not None and pid == _server_pid():
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def helper_pids() -> set[int]:
    """The launcher's helper processes that are not workers: the fork server and multiprocessing's
    resource tracker (pids of those running, from multiprocessing's own records)."""
    found = set()
    for pid in (_server_pid(), getattr(resource_tracker._resource_tracker, "_pid", None)):
        if pid:
            found.add(pid)
    return found
